"""Candidate for the key-side backward between super-chunks (``bwd_inter_dkv_kernel``): keys as rows.

Shipped, per step over BLOCK_M query rows: ``s = Y KZ^T`` ([BLOCK_M, BLOCK_N]), then ``dV += p^T dO`` and
``dKZ += dS^T Y`` -- the transposed probability tiles are the A operands of two products, so the
compiler moves p and dS between register layouts (or through shared memory) every step, and the FoX
gate's key-side sums need a live [BLOCK_M, BLOCK_N] float32 tile (summed over rows once per program).

Here the step works on the transposed tiles from the start: ``s^T = KZ Y^T`` ([BLOCK_N, BLOCK_M]), so
``dV += p^T dO`` and ``dKZ += dS^T Y`` take p^T and dS^T as they are (A operands from registers, as
FlashAttention-2's key-side loop), the transposed operands are Y and dO (B operands, read from shared
memory in either order), and the gate's key-side sum is a row sum of dS^T per step (a reduction inside
the threads that own a row) into a BLOCK_N vector, with no extra tile live.  Text replacements of
``codegen/triton/bwd_inter.py``; same signature and launch.
"""
from __future__ import annotations

import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernel_variants import load_variant_module, module_source  # noqa: E402

import pathtune.codegen.triton.bwd_inter as bwd_inter  # noqa: E402

_STEP_SHIPPED = """                        s = mm(Yd, tl.trans(KZ), INTERP) * qk_scale
                        if USE_GATE:
                            c_q = tl.load(gc_ptr + rows * HQ + hq, mask=rmask, other=0.0)
                            s += (c_q[:, None] - c_k[None, :]) * gate_scale
                        p = tl.where(rmask[:, None], tl.exp2(s - lse2[:, None]), 0.0)
                        dp = mm(dO, tl.trans(Vt), INTERP)
                        ds = p * (dp - delta[:, None])
                        dV += mm(tl.trans(p).to(Vt.dtype), dO, INTERP)
                        dKZ += mm(tl.trans(ds).to(DT), Yd, INTERP)
                        if USE_GATE:
                            dsacc += ds
"""
_STEP_ROWS = """                        sT = mm(KZ, tl.trans(Yd), INTERP) * qk_scale
                        if USE_GATE:
                            c_q = tl.load(gc_ptr + rows * HQ + hq, mask=rmask, other=0.0)
                            sT += (c_q[None, :] - c_k[:, None]) * gate_scale
                        pT = tl.where(rmask[None, :], tl.exp2(sT - lse2[None, :]), 0.0)
                        dpT = mm(Vt, tl.trans(dO), INTERP)
                        dsT = pT * (dpT - delta[None, :])
                        dV += mm(pT.to(Vt.dtype), dO, INTERP)
                        dKZ += mm(dsT.to(DT), Yd, INTERP)
                        if USE_GATE:
                            dck += tl.sum(dsT, axis=1)
"""
_REPLACEMENTS = (
    ("            dsacc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)\n",
     "            dck = tl.zeros((BLOCK_N,), dtype=tl.float32)\n"),
    (_STEP_SHIPPED, _STEP_ROWS),
    ("tl.store(cptr, tl.load(cptr) - tl.sum(dsacc, axis=0) * gate_nat)",
     "tl.store(cptr, tl.load(cptr) - dck * gate_nat)"),
)


@functools.lru_cache(maxsize=None)
def kernel():
    """The keys-as-rows ``bwd_inter_dkv_kernel``, built once per process."""
    src = module_source(bwd_inter)
    if src.count(_STEP_SHIPPED) != 2:     # the whole-tile and the column-blocked walk share the step
        raise ValueError("bwd_inter_rows: the shipped dkv step changed; update the replacement")
    return load_variant_module(src, "bwd_inter_rows", _REPLACEMENTS).bwd_inter_dkv_kernel
