"""Candidate forward scans with fewer operations per logit: the FoX gate's offsets enter in one fused multiply-add
and the softmax scale is folded into exp2's argument in both walks (``scan_intra_kernel`` and
``scan_inter_kernel`` of codegen/triton/scan_fwd.py rebuilt with a few lines replaced,
``kernel_variants.load_variant_module``).

scan_intra's walk forms ``s * qk_scale + (c_q - c_k) * gate_scale`` (a multiply, a subtraction, a multiply and an
add per logit) and runs the unscaled step (a subtraction of the row maximum before exp2); ungated it still
multiplies by qk_scale before that step.  Here the walk runs in a frame per query row, (c_q - c_ref) * gate_scale
off its logits (c_ref: the gate cumsum at the chunk's first token, so every offset stays small and exact to the
cumsum's rounding): a key's offset is ``c_k - c_ref`` (one subtraction per key, not per logit), the logit
``s - (c_k - c_ref) * gate_scale / qk_scale`` one fused multiply-add, and PaTH's scaled step follows (its
multiply-add folds the scale and the maximum into exp2's argument).  The frame is left before lse is stored.
Per walk step and thread (sm_90, D 64, 4 warps): ~100 fewer instructions gated, ~30 ungated.

scan_inter (the frame without c_q is the shipped one): ``s * qk_scale - c_k * gate_scale`` and the unscaled step
become ``s - c_k * gate_scale / qk_scale`` in one fused multiply-add and the scaled step (the ratio is 1 with the
gate inside the softmax scale, the default placement): ~60 fewer instructions per key tile and thread at D 128
(H100 T 16K forward 0.7-1.4 % faster alone; the offsets as a TMA block beside the keys instead cost the D 128
kernel 28 B more spills, which serialize its wgmma pipeline: ptxas C7513, 4 % slower).

``python benchmarks/fwd_probe.py --candidates benchmarks/variants/scan_gate_fma.py`` times the public forward
with both in place beside the shipped ones; tests/test_triton_forward.py checks them against the shipped forward.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pathtune.codegen.triton.scan_fwd as scan_mod

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))      # benchmarks/: kernel_variants
from kernel_variants import load_variant_module, module_source  # noqa: E402

INTRA_FRAME = [
    ("    acc = mm(p.to(V.dtype), V, INTERP)\n\n"
     "    # 2. earlier chunks of this super-chunk, right to left (chunk-level low-rank transitions)\n",
     "    acc = mm(p.to(V.dtype), V, INTERP)\n"
     "    if USE_GATE:     # the walk's frame: (c_q - c_ref) * gate_scale off each row's logits\n"
     "        c_ref = tl.load(gc_h + tok0)\n"
     "        m_i = m_i - (c_q - c_ref) * gate_scale\n"
     "        gate_ratio = gate_scale / qk_scale\n\n"
     "    # 2. earlier chunks of this super-chunk, right to left (chunk-level low-rank transitions)\n"),
    ("        s = mm(Xd, tl.trans(Kt), INTERP) * qk_scale\n"
     "        if USE_GATE:\n"
     "            c_k = tl.load(gc_h + krows)\n"
     "            s += (c_q[:, None] - c_k[None, :]) * gate_scale\n"
     "        m_i, l_i, acc = _softmax_step(s, m_i, l_i, acc, Vm, INTERP)\n",
     "        s = mm(Xd, tl.trans(Kt), INTERP)\n"
     "        if USE_GATE:\n"
     "            c_k = tl.load(gc_h + krows) - c_ref\n"
     "            s = tl.fma(tl.broadcast_to(c_k[None, :], s.shape), -gate_ratio, s)\n"
     "        m_i, l_i, acc = _softmax_step_scaled(s, m_i, l_i, acc, Vm, qk_scale, INTERP)\n"),
    ("    o = acc / l_i[:, None]\n"
     "    tl.store(o_ptr + (rows[:, None] * HQ + hq) * DV + dv[None, :], o.to(o_ptr.dtype.element_ty),\n",
     "    if USE_GATE:\n"
     "        m_i = m_i + (c_q - c_ref) * gate_scale\n"
     "    o = acc / l_i[:, None]\n"
     "    tl.store(o_ptr + (rows[:, None] * HQ + hq) * DV + dv[None, :], o.to(o_ptr.dtype.element_ty),\n"),
]

INTER_FMA = [
    ("            m_i = m_i - c_q * gate_scale\n",
     "            m_i = m_i - c_q * gate_scale\n"
     "            gate_ratio = gate_scale / qk_scale\n"),
    ("                if USE_GATE:\n"
     "                    c_kj = tl.load(gc_h + (k0 + t0) + rn)\n"
     "                    m_i, l_i, acc = _softmax_step(sj * qk_scale - (c_kj * gate_scale)[None, :], m_i, l_i, acc,\n"
     "                                                  Vt, INTERP)\n"
     "                else:\n"
     "                    m_i, l_i, acc = _softmax_step_scaled(sj, m_i, l_i, acc, Vt, qk_scale, INTERP)\n",
     "                if USE_GATE:\n"
     "                    c_kj = tl.load(gc_h + (k0 + t0) + rn)\n"
     "                    sj = tl.fma(tl.broadcast_to(c_kj[None, :], sj.shape), -gate_ratio, sj)\n"
     "                m_i, l_i, acc = _softmax_step_scaled(sj, m_i, l_i, acc, Vt, qk_scale, INTERP)\n"),
]

module = load_variant_module(module_source(scan_mod), "scan_gate_fma", INTRA_FRAME + INTER_FMA)
scan_intra_kernel = module.scan_intra_kernel
scan_inter_kernel = module.scan_inter_kernel
