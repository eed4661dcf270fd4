"""Candidate decode kernel: the cache's gate cumsum read and written head-major.

The cache keeps the FoX gate cumsum token-major, c [B, max_len, HQ] float32, so a key tile's gates are a
stride-HQ gather: one 4-byte value out of every 32-byte sector, about 12 % more memory traffic than the key
and value tiles at D = 64 (the measured PaTH-FoX / PaTH step at a 32K cache: 1.14).  This kernel addresses
the same buffer as c [B, HQ, max_len] (a head's gates contiguous, as in the forward), in the four places
that touch it: the appended rows' running sum and their store (``_append_rows``), the query's own cumsum,
the pending block and the key tiles.  Everything else is the shipped kernel's source (text replacements of
``codegen/triton/decode.py``), with the same launch arguments.

What it needs to be correct: a cache whose ``c`` buffer holds the head-major layout (the test builds one by
permuting a prefilled cache's gates).  Timed on the shipped (token-major) cache it reads the wrong gate
values from the right addresses: the step's time is the head-major layout's, its output is not
(``benchmarks/decode_probe.py --candidate-decode`` times it that way, beside the shipped step).
Shipping it means the cache layout changes for every reader: the Triton prefill and flush, the TVM decode
kernels, the reference decode and ``PaTHKVCache``'s accessors.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from kernel_variants import load_variant, module_source  # noqa: E402

import pathtune.codegen.triton.decode as decode  # noqa: E402

_REPLACEMENTS = [
    ("def _append_rows(knew_ptr, vnew_ptr, g_ptr, k_base, v_base, c_base, b, h, L, N, row_lo, row_hi,",
     "def _append_rows(knew_ptr, vnew_ptr, g_ptr, k_base, v_base, c_base, c_hs, b, h, L, N, row_lo, row_hi,"),
    ("run = tl.load(c_base + prev * HQ + hq,", "run = tl.load(c_base + hq * c_hs + prev,"),
    ("tl.store(c_base + nr[:, None] * HQ + hq[None, :], cn,",
     "tl.store(c_base + hq[None, :] * c_hs + nr[:, None], cn,"),
    ("_append_rows(knew_ptr, vnew_ptr, g_ptr, k_base, v_base, c_base, b, h,",
     "_append_rows(knew_ptr, vnew_ptr, g_ptr, k_base, v_base, c_base, max_len, b, h,"),
    ("c_i = tl.load(c_base + prev * HQ + hq_r,", "c_i = tl.load(c_base + hq_r * max_len + prev,"),
    ("cp_j = tl.load(c_base + pr[None, :] * HQ + hq_r[:, None],",
     "cp_j = tl.load(c_base + hq_r[:, None] * max_len + pr[None, :],"),
    ("c_j = tl.load(c_base + nr[None, :] * HQ + hq_r[:, None],",
     "c_j = tl.load(c_base + hq_r[:, None] * max_len + nr[None, :],"),
]

decode_kernel = load_variant(module_source(decode), "decode_kernel", "decode_gate_head_major", _REPLACEMENTS)
