"""Candidate decode kernel: the flush's WY products at tf32 (one tensor-core pass) instead of tf32x3.

On a flush step each program rotates its split's frame rows in compact WY form, k <- k - (k W^T) M, per block
of ``ROT_ROWS`` rows: two products at fp32 accuracy (three tf32 passes each for a 16-bit cache).  On the H200
(B = 8, 32K cache) that pass takes ~0.9-1.1 ms for ~1 GiB of key traffic (~0.22 ms at full bandwidth), and
pipelining its block loop changed nothing (``H200-20261203T104700Z-decode-candidates-probe.json``): the
products are the suspect.  At tf32 a 16-bit key is exact and w, M carry ~5e-4 relative error per flush,
below the cache's own rounding per flush (bf16: ~2e-3); the decode accuracy tests would have to agree before
such a kernel ships.  Timing only here.

Everything else is the shipped kernel's source (a text replacement of ``codegen/triton/decode.py``), with the
same launch arguments: ``benchmarks/decode_probe.py --candidate-decode FILE`` times it beside the shipped
kernel.  The interpreter computes tf32 products in fp32: its test checks the source, not the rounding.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from kernel_variants import load_variant, module_source  # noqa: E402

import pathtune.codegen.triton.decode as decode  # noqa: E402

_PASS = ("            Kf = Kf - _fdot(_fdot(Kf, tl.trans(Wm), F32), M, F32)\n",
         "            if F32:\n"
         "                Kf = Kf - _fdot(_fdot(Kf, tl.trans(Wm), F32), M, F32)\n"
         "            else:\n"
         "                KW = tl.dot(Kf, tl.trans(Wm), input_precision=\"tf32\")\n"
         "                Kf = Kf - tl.dot(KW, M, input_precision=\"tf32\")\n")

decode_kernel = load_variant(module_source(decode), "decode_kernel", "decode_flush_tf32", [_PASS])
