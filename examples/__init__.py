"""Examples that use pathtune (run from the repository root: ``python -m examples.<name>``)."""
