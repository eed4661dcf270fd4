"""The untuned config of the Triton backend per head dim (``TritonParams.heuristic``).

The values are the spec's table ``backends.triton.head_dim_defaults`` (specs/path_attention.yaml, with
the reasons for each row).  The spec hash leaves that table out (a record stores every knob value it
ran with), so a revision changes what runs where no record exists and retires no record.
"""
from __future__ import annotations


def heuristic_knobs(head_dim: int, head_dim_v: int | None = None) -> dict:
    """Knob values that differ from the spec defaults for these head dims (keyed by max(D, DV))."""
    from pathtune.specs import load_spec

    return load_spec().head_dim_defaults("triton", head_dim, head_dim_v)
