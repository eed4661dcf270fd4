"""Candidate decode kernels: the flush's second pass over the split's keys software-pipelined.

On a flush step each program rotates its split's frame rows in compact WY form, one block of ``ROT_ROWS``
rows after the other: load -> two small products -> store, each block waiting on its own load.  On the H200
(B = 8, 32K cache) that pass takes ~0.9-1.1 ms for ~1 GiB of key traffic (~0.22 ms at full bandwidth).
Pipelining the block loop (``tl.range(..., num_stages=N)``) keeps the next blocks' loads in flight while a
block is rotated; blocks are disjoint rows, so a later load never reads a row an earlier store writes.

``decode_kernel`` pipelines the pass over 2 stages, ``decode_kernel_3`` over 3.  Everything else is the
shipped kernel's source (text replacements of ``codegen/triton/decode.py``), with the same launch arguments:
``benchmarks/decode_probe.py --candidate-decode FILE[:NAME]`` times one of them beside the shipped kernel.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from kernel_variants import load_variant, module_source  # noqa: E402

import pathtune.codegen.triton.decode as decode  # noqa: E402

_LOOP = "        for r0 in range(t_lo * BLOCK_N, row_hi, ROT_ROWS):\n"


def _pipelined(stages: int) -> tuple[str, str]:
    return _LOOP, f"        for r0 in tl.range(t_lo * BLOCK_N, row_hi, ROT_ROWS, num_stages={stages}):\n"


decode_kernel = load_variant(module_source(decode), "decode_kernel", "decode_flush_pipelined", [_pipelined(2)])
decode_kernel_3 = load_variant(module_source(decode), "decode_kernel", "decode_flush_pipelined3", [_pipelined(3)])
