"""Candidate for the forward scan's softmax: the scale and the FoX gate folded into fewer operations per
logit, as text replacements of ``codegen/triton/scan_fwd.py`` (both kernels keep their signatures).

Shipped, per logit of a key tile: ``s * qk_scale`` (a multiply), with the gate ``+ (c_q - c_k) *
gate_scale`` (a subtract and a multiply-add), then ``exp2(s - m)``.  Here:

* PaTH: the raw logits go to the softmax, whose row maximum is taken before scaling (``qk_scale`` > 0)
  and whose ``exp2(s * qk_scale - m)`` is one multiply-add;
* PaTH-FoX: ``c_q`` is constant along a row, so it cancels in the softmax: the scan runs in the frame
  without it (the partial lse shifted by ``- c_q * gate_scale`` on entry, the final one shifted back on
  store), and a logit costs one multiply-add, ``s * qk_scale - c_k * gate_scale`` (``c_k * gate_scale``
  formed once per key).
"""
from __future__ import annotations

import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernel_variants import load_variant_module, module_source  # noqa: E402

import pathtune.codegen.triton.scan_fwd as scan_fwd  # noqa: E402

_HELPER = '''


@triton.jit
def _softmax_step_scaled(s, m_i, l_i, acc, v, qk_scale, INTERP: tl.constexpr):
    """_softmax_step of the logits s * qk_scale (qk_scale > 0), the scaling folded into exp2's argument."""
    m_new = tl.maximum(m_i, tl.max(s, axis=1) * qk_scale)
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s * qk_scale - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + mm(p.to(v.dtype), v, INTERP)
    return m_new, l_i, acc
'''

# scan_intra_kernel: the diagonal tile and the walk in the frame without c_q, the lse shifted back on store
_INTRA = [
    ("        s = s * qk_scale + (c_q[:, None] - c_q[None, :]) * gate_scale",
     "        s = s * qk_scale - (c_q * gate_scale)[None, :]"),
    ("""        s = mm(Xd, tl.trans(Kt), INTERP) * qk_scale
        if USE_GATE:
            c_k = tl.load(gc_ptr + krows * HQ + hq)
            s += (c_q[:, None] - c_k[None, :]) * gate_scale
        m_i, l_i, acc = _softmax_step(s, m_i, l_i, acc, Vm, INTERP)""",
     """        s = mm(Xd, tl.trans(Kt), INTERP)
        if USE_GATE:
            c_k = tl.load(gc_ptr + krows * HQ + hq)
            m_i, l_i, acc = _softmax_step(s * qk_scale - (c_k * gate_scale)[None, :], m_i, l_i, acc, Vm, INTERP)
        else:
            m_i, l_i, acc = _softmax_step_scaled(s, m_i, l_i, acc, Vm, qk_scale, INTERP)"""),
    ("    lse = (m_i + tl.log2(l_i)) * 0.6931471805599453\n",
     "    if USE_GATE:\n        m_i = m_i + c_q * gate_scale\n    lse = (m_i + tl.log2(l_i)) * 0.6931471805599453\n"),
]
# scan_inter_kernel: the same frame for the walk over the earlier super-chunks
_INTER = [
    ("            c_q = tl.load(gc_ptr + q_base + r * HQ, mask=rmask, other=0.0)\n",
     "            c_q = tl.load(gc_ptr + q_base + r * HQ, mask=rmask, other=0.0)\n"
     "            m_i = m_i - c_q * gate_scale\n"),
    ("""                sj = mm(Xd, tl.trans(KJ), INTERP) * qk_scale
                if USE_GATE:
                    c_kj = tl.load(gc_ptr + (k0 + t0) * HQ + hq + rn * HQ)
                    sj += (c_q[:, None] - c_kj[None, :]) * gate_scale
                m_i, l_i, acc = _softmax_step(sj, m_i, l_i, acc, Vt, INTERP)""",
     """                sj = mm(Xd, tl.trans(KJ), INTERP)
                if USE_GATE:
                    c_kj = tl.load(gc_ptr + (k0 + t0) * HQ + hq + rn * HQ)
                    m_i, l_i, acc = _softmax_step(sj * qk_scale - (c_kj * gate_scale)[None, :], m_i, l_i, acc,
                                                  Vt, INTERP)
                else:
                    m_i, l_i, acc = _softmax_step_scaled(sj, m_i, l_i, acc, Vt, qk_scale, INTERP)"""),
    ("        tl.store(lse_ptr + q_base + r * HQ, (m_i + tl.log2(l_i)) * 0.6931471805599453, mask=rmask)\n",
     "        if USE_GATE:\n            m_i = m_i + c_q * gate_scale\n"
     "        tl.store(lse_ptr + q_base + r * HQ, (m_i + tl.log2(l_i)) * 0.6931471805599453, mask=rmask)\n"),
]


@functools.lru_cache(maxsize=None)
def kernels() -> dict:
    """{shipped kernel name: folded variant}: scan_intra_kernel and scan_inter_kernel from one module,
    built once per process."""
    mod = load_variant_module(module_source(scan_fwd), "scan_folded", _INTRA + _INTER, append=_HELPER)
    return {name: getattr(mod, name) for name in ("scan_intra_kernel", "scan_inter_kernel")}
