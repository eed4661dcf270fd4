"""Candidate kernels that GPU probes time next to the shipped ones (not part of the package: editing
them changes no source hash, so no performance record retires)."""
