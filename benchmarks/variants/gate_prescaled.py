"""Candidate FoX gate handling in the forward scans (same arguments and grids as the shipped ``scan_intra_kernel``
and ``scan_inter_kernel`` of codegen/triton/scan_fwd.py, built from its source by text replacement,
``kernel_variants``).

The gate costs the forward 0.05 ms in each scan at D64 T 2K (BENCHMARKS.md's profile: scan_intra 0.590 vs 0.539
ms PaTH, scan_inter 0.317 vs 0.268), as much as the D64 PaTH-FoX forward at T 2K misses 2.5x SDPA by.  Two changes:

- ``scan_intra_kernel``: the logit bias ``(c_q - c_k) * gate_scale`` is formed per element (a subtraction and a
  multiplication on top of the scaling, per logit of the diagonal tile and of every walk step).  Here the gate
  offsets are scaled once per row / per key column and the logit is ``s * qk_scale + (cq_s - ck_s)``: one
  subtraction and one fused multiply-add per logit.  (The difference of two scaled offsets rounds once more than
  the scaled difference: ~1e-7 of |c| * gate_scale, as the backward and scan_inter already take it.)
- ``scan_inter_kernel``: each key tile's gate offsets were a plain load issued after the tile's product and used
  right away; here the next tile's offsets are loaded at the top of the step (carried to the next step), so their
  latency hides behind the step's products and softmax.

    python benchmarks/scan_probe.py --head-dims 64,128 --seq-len 2048 --candidates benchmarks/variants/gate_prescaled.py
    python benchmarks/fwd_probe.py --seq-lens 2048,16384 --no-fla --candidates benchmarks/variants/gate_prescaled.py

tests/test_triton_forward.py checks a FoX forward with them against the shipped kernels and the float64 oracle.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pathtune.codegen.triton.scan_fwd as scan_mod

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))      # benchmarks/: kernel_variants
from kernel_variants import load_variant_module, module_source  # noqa: E402

INTRA = [
    ("        c_q = tl.load(gc_h + rows, mask=rmask, other=0.0)\n"
     "        s = s * qk_scale + (c_q[:, None] - c_q[None, :]) * gate_scale\n",
     "        cq_s = tl.load(gc_h + rows, mask=rmask, other=0.0) * gate_scale\n"
     "        s = s * qk_scale + (cq_s[:, None] - cq_s[None, :])\n"),
    ("        s = mm(Xd, tl.trans(Kt), INTERP) * qk_scale\n"
     "        if USE_GATE:\n"
     "            c_k = tl.load(gc_h + krows)\n"
     "            s += (c_q[:, None] - c_k[None, :]) * gate_scale\n",
     "        s = mm(Xd, tl.trans(Kt), INTERP)\n"
     "        if USE_GATE:\n"
     "            ck_s = tl.load(gc_h + krows) * gate_scale\n"
     "            s = s * qk_scale + (cq_s[:, None] - ck_s[None, :])\n"
     "        else:\n"
     "            s = s * qk_scale\n"),
]
INTER = [
    ("            for t0 in range(0, S, BLOCK_N):\n",
     "            if USE_GATE:    # the first key tile's scaled gate offsets; each step loads the next tile's\n"
     "                ck_next = tl.load(gc_h + k0 + rn) * gate_scale\n"
     "            for t0 in range(0, S, BLOCK_N):\n"
     "                if USE_GATE:\n"
     "                    ck_s = ck_next\n"
     "                    ck_next = tl.load(gc_h + (k0 + t0 + BLOCK_N) + rn, mask=(t0 + BLOCK_N + rn) < S,\n"
     "                                      other=0.0) * gate_scale\n"),
    ("                    c_kj = tl.load(gc_h + (k0 + t0) + rn)\n"
     "                    m_i, l_i, acc = _softmax_step(sj * qk_scale - (c_kj * gate_scale)[None, :], m_i, l_i, acc,\n"
     "                                                  Vt, INTERP)\n",
     "                    m_i, l_i, acc = _softmax_step(sj * qk_scale - ck_s[None, :], m_i, l_i, acc, Vt, INTERP)\n"),
]

_mod = load_variant_module(module_source(scan_mod), "gate_prescaled", INTRA + INTER)
scan_intra_kernel = _mod.scan_intra_kernel
scan_inter_kernel = _mod.scan_inter_kernel
