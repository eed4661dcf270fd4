"""Candidate transport backward on 16-bit tensor cores: ``bwd_transport_chain_kernel`` and
``bwd_transport_grads_kernel`` with every product's operands in a 16-bit type (the type of the u the launcher
passes: the range's recomputed state in the scan dtype; fp16 for a float32 state) instead of float32 at
``bwd_transition_precision`` (tf32: m16n8k8, W / U / K~ widened to float32 in shared memory).  Same arguments and
grids as the shipped kernels (codegen/triton/bwd_chain.py, built from its source by text replacement,
``kernel_variants``); TP is ignored.

Why: the chain kernel is latency-bound on its serial steps (one program per SM, 0.23 eligible warps per scheduler,
an instruction every 4.4 cycles; H100 Nsight Compute, NOTES.md Backward lead 6): 16-bit operands halve the MMA
instructions of every step (m16n8k16) and drop the widening conversions, and halve the operand tiles' shared memory.

Range: the suffix products Suf (norm <= 1 for beta in [0, 2]), W and U go to the 16-bit type as they are.  The
gradients do not have a bounded range (a loss's gradients in a bf16 model can sit below fp16's smallest normal), so
they are scaled by powers of two first, which comes off exactly afterwards:
  - chain: G's rows evolve independently (G <- G - (G U^T) W + dKJ^T K~, every product keeps G's rows), so each row
    e gets one scale for the whole walk, 2^-(floor(log2 max(|dWhat[e]|, |dKJ[:, e]|)) + 6) over the super-chunk
    (6 bits of headroom for what the walk adds), and the walk carries G in those units (float32), storing G_m
    unscaled;
  - grads: each stored G_m tile and each dKJ tile get one scale per tile (the products sum over G's rows, so a
    per-row scale would not come off).
fp16 keeps tf32's 10-bit mantissa; entries under 2^-14 of their scale's largest become subnormal.

    python benchmarks/dev_kernel_probe.py --only transport,e2e --D 64,128 --gates 1,0 \\
        --transport-v2 benchmarks/variants/bwd_transport_fp16.py

times both kernels on the captured launches and one fwd+bwd with them swapped in, with each gradient's relative
difference to the shipped kernels'; tests/test_triton_backward.py checks a ranged fwd+bwd with them against the
float64 oracle.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pathtune.codegen.triton.bwd_chain as chain_mod

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))      # benchmarks/: kernel_variants
from kernel_variants import load_variant_module, module_source  # noqa: E402

HELPERS = '''

from pathtune.codegen.triton._ops import interpreting as _interpreting
from pathtune.codegen.triton._ops import mm as _mm

_INTERP16 = tl.constexpr(_interpreting())


@triton.jit
def _op16(x, ref_ptr):
    """x in the 16-bit operand type: ref_ptr's element type when that is bf16, else fp16."""
    if ref_ptr.dtype.element_ty == tl.bfloat16:
        return x.to(tl.bfloat16)
    else:
        return x.to(tl.float16)


@triton.jit
def _exp2_floor(amax):
    """floor(log2(amax)) (at least -100): the power of two that scales amax near 1."""
    return tl.floor(tl.log2(tl.maximum(amax, 1e-30)))
'''

CHAIN = [
    ("""            W = tl.load(w_ptr + off, mask=dmask, other=0.0).to(tl.float32)
            U = tl.load(u_ptr + off, mask=dmask, other=0.0).to(tl.float32)
            Suf = Suf - tl.dot(tl.dot(Suf, tl.trans(W), input_precision=TP), U, input_precision=TP)
        G = tl.load(dwhat_ptr + ((j * H + h) * BD + e[:, None]) * BD + d[None, :])
        for back in range(0, NCH):
            rows = (tok0 + back * C + r).to(tl.int64)
            off = (rows[:, None] * H + h) * D + d[None, :]
            tl.store(gs_ptr + blk + back * ROWS * BD + so, G)
            W = tl.load(w_ptr + off, mask=dmask, other=0.0).to(tl.float32)
            U = tl.load(u_ptr + off, mask=dmask, other=0.0).to(tl.float32)
            Kt = tl.load(kt_ptr + off, mask=dmask, other=0.0).to(tl.float32)
            dKJ = tl.load(dkj_ptr + (rows[:, None] * H + h) * D + e[None, :], mask=emask, other=0.0)
            dYl = -tl.dot(G, tl.trans(U), input_precision=TP)          # ROWS x C
            G = G + tl.dot(dYl, W, input_precision=TP) + tl.dot(tl.trans(dKJ), Kt, input_precision=TP)
""", """            W = _op16(tl.load(w_ptr + off, mask=dmask, other=0.0), u_ptr)
            U = _op16(tl.load(u_ptr + off, mask=dmask, other=0.0), u_ptr)
            Suf = Suf - _mm(_op16(_mm(_op16(Suf, u_ptr), tl.trans(W), _INTERP16), u_ptr), U, _INTERP16)
        G = tl.load(dwhat_ptr + ((j * H + h) * BD + e[:, None]) * BD + d[None, :])
        # one power-of-two scale per row of G for the whole walk: its largest dWhat / dKJ entry near 2^-6
        amax = tl.max(tl.abs(G), axis=1)
        for back in range(0, NCH):
            rows = (tok0 + back * C + r).to(tl.int64)
            dKJ = tl.load(dkj_ptr + (rows[:, None] * H + h) * D + e[None, :], mask=emask, other=0.0)
            amax = tl.maximum(amax, tl.max(tl.abs(dKJ), axis=0))
        gexp = _exp2_floor(amax) + 6.0
        G = G * tl.exp2(-gexp)[:, None]
        for back in range(0, NCH):
            rows = (tok0 + back * C + r).to(tl.int64)
            off = (rows[:, None] * H + h) * D + d[None, :]
            tl.store(gs_ptr + blk + back * ROWS * BD + so, G * tl.exp2(gexp)[:, None])
            W = _op16(tl.load(w_ptr + off, mask=dmask, other=0.0), u_ptr)
            U = _op16(tl.load(u_ptr + off, mask=dmask, other=0.0), u_ptr)
            Kt = _op16(tl.load(kt_ptr + off, mask=dmask, other=0.0), u_ptr)
            dKJ = tl.load(dkj_ptr + (rows[:, None] * H + h) * D + e[None, :], mask=emask, other=0.0)
            dKJs = _op16(dKJ * tl.exp2(-gexp)[None, :], u_ptr)
            dYl = -_mm(_op16(G, u_ptr), tl.trans(U), _INTERP16)          # ROWS x C, G's units
            G = G + _mm(_op16(dYl, u_ptr), W, _INTERP16) + _mm(tl.trans(dKJs), Kt, _INTERP16)
"""),
]

GRADS = [
    ("""        W = tl.load(w_ptr + off, mask=dmask, other=0.0).to(tl.float32)
        U = tl.load(u_ptr + off, mask=dmask, other=0.0).to(tl.float32)
        so = tl.arange(0, ROWS)[:, None] * BD + d[None, :]""",
     """        W = _op16(tl.load(w_ptr + off, mask=dmask, other=0.0), u_ptr)
        U = _op16(tl.load(u_ptr + off, mask=dmask, other=0.0), u_ptr)
        so = tl.arange(0, ROWS)[:, None] * BD + d[None, :]"""),
    ("""            Yl = tl.dot(Sm, tl.trans(W), input_precision=TP)           # ROWS x C
            dYl = -tl.dot(Gm, tl.trans(U), input_precision=TP)         # ROWS x C
            dU -= tl.dot(tl.trans(Yl), Gm, input_precision=TP)
            dW += tl.dot(tl.trans(dYl), Sm, input_precision=TP)
            dKt += tl.dot(dKJ, Sm, input_precision=TP)
""", """            # one power-of-two scale per G_m tile and per dKJ tile (the products sum over their rows)
            gx = _exp2_floor(tl.max(tl.abs(Gm)))
            kx = _exp2_floor(tl.max(tl.abs(dKJ)))
            Gs = _op16(Gm * tl.exp2(-gx), u_ptr)
            S16 = _op16(Sm, u_ptr)
            Yl = _mm(S16, tl.trans(W), _INTERP16)                       # ROWS x C
            dYl = -_mm(Gs, tl.trans(U), _INTERP16)                     # ROWS x C, 2^-gx units
            dU -= _mm(tl.trans(_op16(Yl, u_ptr)), Gs, _INTERP16) * tl.exp2(gx)
            dW += _mm(tl.trans(_op16(dYl, u_ptr)), S16, _INTERP16) * tl.exp2(gx)
            dKt += _mm(_op16(dKJ * tl.exp2(-kx), u_ptr), S16, _INTERP16) * tl.exp2(kx)
"""),
]

_mod = load_variant_module(module_source(chain_mod), "bwd_transport_fp16", CHAIN + GRADS, append=HELPERS)
bwd_transport_chain_kernel = _mod.bwd_transport_chain_kernel
bwd_transport_grads_kernel = _mod.bwd_transport_grads_kernel
