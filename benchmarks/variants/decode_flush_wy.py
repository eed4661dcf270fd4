"""Candidate decode kernels: the flush's key rotation in compact WY form over larger row blocks.

A flush step (every ~W one-token steps, or a multi-token step that would leave more than W rows pending)
rotates every frame key by the NP pending transitions and writes it back.  On the H200 a one-token flush
step takes 3.6-5.6x a plain step, a 4-token one ~6x, while rewriting the keys is a small part of that.

* One-token steps (shipped): each key tile just read by the attention loop is rotated by the NP transitions
  one after the other (``_rotate``: per transition a load of w and beta, a row reduction over the head dim
  and an update of the tile): NP dependent steps per tile.
* Multi-token steps (shipped): after the attention loop, a second pass over the split's rows in blocks of
  ``ROT_ROWS`` = 2048 / BD rows (32 at D = 64), each rotated by the compact WY form of the NP transitions
  (``_wy``: H_F .. H_{F+NP-1} = I - W^T T W, computed once; K <- K - (K W^T) M, two small tensor-core
  products): hundreds of small dependent load -> product -> store rounds per program.

``decode_kernel``: one-token flushes take the multi-token path too (no ``_rotate`` in the attention loop;
a second read of the split's keys), with blocks of 8192 / BD rows (128 at D = 64, 64 at D = 128).
``decode_kernel_rows``: only the multi-token flush's blocks grow to 8192 / BD rows.
Offline sm_90 builds (gated, the swept configs): 108 / 624 B of spills at D = 64 / 128 for the one-token
kernel (the shipped one: 0 / 28 B), 48 / 672 B for the multi-token one (shipped: 0 / 392 B).

Everything else is the shipped kernel's source (text replacements of ``codegen/triton/decode.py``), with the
same launch arguments: ``benchmarks/decode_probe.py --candidate-decode FILE[:NAME]`` times one of them beside
the shipped kernel.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from kernel_variants import load_variant, module_source  # noqa: E402

import pathtune.codegen.triton.decode as decode  # noqa: E402

_ROWS = ("            ROT_ROWS: tl.constexpr = 2048 // BD if BD <= 128 else 16\n",
         "            ROT_ROWS: tl.constexpr = 8192 // BD if BD <= 128 else 16\n")
# the one-token flush leaves the attention loop and takes the second, WY-form pass
_NO_TILE_ROTATION = ("        if TN == 1:\n            if flush:\n                Kr = _rotate(",
                     "        if False:\n            if flush:\n                Kr = _rotate(")
_SECOND_PASS_FOR_EVERY_FLUSH = ("    if TN > 1:\n        if flush:\n", "    if True:\n        if flush:\n")

decode_kernel = load_variant(module_source(decode), "decode_kernel", "decode_flush_wy",
                             [_ROWS, _NO_TILE_ROTATION, _SECOND_PASS_FOR_EVERY_FLUSH])
decode_kernel_rows = load_variant(module_source(decode), "decode_kernel", "decode_flush_rows", [_ROWS])
