"""Candidate ``scan_intra_kernel``: the FoX gate's query offset left out of the kernel's softmax and added to
its lse at the end (same signature, same arguments as the shipped kernel in codegen/triton/scan_fwd.py, built
from its source by text replacement, ``kernel_variants``).

A gated logit of the shipped kernel is ``s * qk_scale + (c_q - c_k) * gate_scale``: per element a broadcast of
the query's and the key's gate cumsum, a subtraction and a multiply-add on top of the scale.  c_q is constant
along a query row, so it cancels in the softmax: here the row runs in the frame without it, a logit is
``s * qk_scale - ck_s`` with ``ck_s = c_k * gate_scale`` computed once per key chunk (C values), and the
row's lse gets ``c_q * gate_scale`` back before it is stored, as ``scan_inter_kernel`` (and the backward
kernels) already do.  o is unchanged (the shift is common to a row's numerator and denominator).  On the
H200 scan_intra takes 4-10 % longer with the gate than without (BENCHMARKS.md forward profile, T 2K / 4K).

``python benchmarks/scan_probe.py --candidates benchmarks/variants/scan_intra_gate_fold.py`` times it beside
the shipped kernel on the launch one forward makes and compares its outputs; tests/test_triton_forward.py
checks it against the shipped kernel and the oracle.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pathtune.codegen.triton.scan_fwd as scan_mod

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))      # benchmarks/: kernel_variants
from kernel_variants import load_variant, module_source  # noqa: E402

_FOLD = [
    # the diagonal tile: the keys' offsets only (a key of this chunk is a query of it too)
    ("        s = s * qk_scale + (c_q[:, None] - c_q[None, :]) * gate_scale\n",
     "        s = s * qk_scale - (c_q * gate_scale)[None, :]\n"),
    # the walk over earlier chunks
    ("            c_k = tl.load(gc_h + krows)\n            s += (c_q[:, None] - c_k[None, :]) * gate_scale\n",
     "            s -= (tl.load(gc_h + krows) * gate_scale)[None, :]\n"),
    # back to the true frame for the stored lse (o is shift invariant)
    ("    lse = (m_i + tl.log2(l_i)) * 0.6931471805599453\n",
     "    if USE_GATE:\n        m_i += c_q * gate_scale\n    lse = (m_i + tl.log2(l_i)) * 0.6931471805599453\n"),
]

scan_intra_kernel = load_variant(module_source(scan_mod), "scan_intra_kernel", "scan_intra_gate_fold", _FOLD)
