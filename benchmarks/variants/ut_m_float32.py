"""Baseline for the forward's 16-bit M: the UT stage with M stored as float32 whatever the scan's transition type
(``forward.ut_state_m_dtype`` answering float32; the diagonal inverse's scratch then lives in M's rows again).  The
forward's o and lse are the same bit for bit (tests/test_triton_forward.py); only the bytes M costs to write and to
read differ.

    python benchmarks/fwd_probe.py --candidates benchmarks/variants/ut_m_float32.py

times the public forward with it in place beside the shipped one (the ratio is float32 M / shipped).
"""
from __future__ import annotations

import torch


def ut_state_m_dtype(params, D: int, out_dtype: torch.dtype) -> torch.dtype:
    """float32 for every state (the UT stage before M followed the scan's 16-bit transition type)."""
    return torch.float32
