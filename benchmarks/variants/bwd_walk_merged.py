"""Candidate ``bwd_intra_walk_kernel``: the walk over earlier UT chunks with 8 tensor-core products per step
instead of 10 (same signature, same arguments as the shipped kernel in codegen/triton/bwd_intra.py).

Per key chunk m the shipped step multiplies X_m by W_m^T and by K~_m^T (two C x C x D products) and adds
dY_l W_m and dS K~_m into dX (two C x D x C products).  Both pairs share an operand, so here W_m and K~_m are
loaded as ONE 2C x D tile WK = [W_m; K~_m] (a row-selected load), and

    [Y_l | S] = X_m WK^T             one C x 2C x D product instead of two C x C x D
    dX = G + [dY_l | dS] WK          one C x D x 2C product instead of two C x D x C

with the C x 2C tiles split / joined by a reshape (no slicing in Triton).  Same FLOPs, two fewer MMA waits on
a step whose chain G -> dY_l -> dX is latency-bound (the walk runs at ~100 TFLOP/s on the H200).  The key-side
gradients keep their own products and atomic adds (a merged [dW; dK~] would hold a 2C x D float32 tile live:
128 registers a thread at D = 128 and 4 warps).

``python benchmarks/dev_kernel_probe.py --only intra --intra-v2 benchmarks/variants/bwd_walk_merged.py`` times
it beside the shipped walk on the same captured launch; tests/test_triton_backward.py checks its gradients.
"""
from __future__ import annotations

import triton
import triton.language as tl

from pathtune.codegen.triton._ops import mm
from pathtune.codegen.triton.bwd_intra import _acc, _program_tile, _row_stats


@triton.jit
def _split_cols(x, C: tl.constexpr):
    """(x[:, :C], x[:, C:]) of a C x 2C tile."""
    return tl.split(tl.permute(tl.reshape(x, (C, 2, C)), (0, 2, 1)))


@triton.jit
def _join_cols(a, b, C: tl.constexpr):
    """[a | b], the C x 2C tile of two C x C tiles."""
    return tl.reshape(tl.permute(tl.join(a, b), (0, 2, 1)), (C, 2 * C))


@triton.jit
def bwd_intra_walk_kernel(
    q_ptr, k_ptr, v_ptr, w_ptr, u_ptr, m_ptr, kt_ptr, gc_ptr, do_ptr, lse_ptr, delta_ptr, dy_ptr,
    dq_ptr, dk_ptr, dv_ptr, dw_ptr, du_ptr, dm_ptr, dkt_ptr, dc_ptr, xs_ptr,
    chunk_tok0, chunk_seq, seq_start, seq_end,
    n_chunks, qk_scale, gate_scale, scale, gate_nat, gc_hs,
    HQ: tl.constexpr, H: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    BD: tl.constexpr, BDV: tl.constexpr, C: tl.constexpr, S: tl.constexpr,
    DT: tl.constexpr, TP: tl.constexpr, USE_GATE: tl.constexpr, INTERP: tl.constexpr,
):
    n, hq, h, ci, tokI, rows, rmask, dmask, dvmask, m2, koff, qoff, voff = _program_tile(
        n_chunks, chunk_tok0, chunk_seq, seq_start, seq_end, HQ, H, D, DV, BD, BDV, C, S)
    r = tl.arange(0, C)
    r2 = tl.arange(0, 2 * C)
    top = (r2 < C)[:, None]       # rows of WK from W (the chain), the rest from K~ (the logits)
    d = tl.arange(0, BD)
    dv = tl.arange(0, BDV)
    causal = r[:, None] >= r[None, :]
    gc_h = gc_ptr + hq.to(tl.int64) * gc_hs
    dc_h = dc_ptr + hq.to(tl.int64) * gc_hs
    dO, lse2, delta, c_q = _row_stats(do_ptr, lse_ptr, delta_ptr, gc_h, rows, rmask, dvmask, hq,
                                      HQ, DV, BDV, USE_GATE)
    Q = tl.load(q_ptr + qoff, mask=m2, other=0.0).to(DT)
    Wc = tl.load(w_ptr + koff, mask=m2, other=0.0).to(DT)
    Uc = tl.load(u_ptr + koff, mask=m2, other=0.0).to(DT)
    QW = tl.where(causal, mm(Q, tl.trans(Wc), INTERP), 0.0)
    Xc = Q.to(tl.float32) - mm(QW.to(DT), Uc, INTERP)
    # the chain states X_m, parked in this program's scratch slots (as the shipped kernel)
    slot0 = (hq * n_chunks + n - ci).to(tl.int64) * (S // (2 * C)) + ci * (ci - 1) // 2
    xs = xs_ptr + slot0 * C * BD
    xso = r[:, None] * BD + d[None, :]
    X = Xc
    for t in range(0, ci):
        tm = ci - 1 - t
        tl.store(xs + tm * C * BD + xso, X.to(DT))
        if t < ci - 1:
            trows = (tokI + tm * C + r).to(tl.int64)
            toff = (trows[:, None] * H + h) * D + d[None, :]
            Wt = tl.load(w_ptr + toff, mask=dmask, other=0.0).to(DT)
            Ut = tl.load(u_ptr + toff, mask=dmask, other=0.0).to(DT)
            X = X - mm(mm(X.to(DT), tl.trans(Wt), INTERP).to(DT), Ut, INTERP)
    tl.debug_barrier()
    G = tl.load(dy_ptr + qoff, mask=m2, other=0.0)
    for mi in range(0, ci):
        Xd = tl.load(xs + mi * C * BD + xso)
        krows = (tokI + mi * C + r).to(tl.int64)
        kof = (krows[:, None] * H + h) * D + d[None, :]
        kvof = (krows[:, None] * H + h) * DV + dv[None, :]
        wkrows = (tokI + mi * C + r2 % C).to(tl.int64)
        wkof = (wkrows[:, None] * H + h) * D + d[None, :]
        WK = tl.load(tl.where(top, w_ptr + wkof, kt_ptr + wkof), mask=dmask, other=0.0).to(DT)
        Um = tl.load(u_ptr + kof, mask=dmask, other=0.0).to(DT)
        Vm = tl.load(v_ptr + kvof, mask=dvmask, other=0.0)
        Gd = G.to(DT)
        Yl, s = _split_cols(mm(Xd, tl.trans(WK), INTERP), C)
        _acc(du_ptr + kof, -mm(tl.trans(Yl.to(DT)), Gd, INTERP), dmask)
        dYl = (-mm(Gd, tl.trans(Um), INTERP)).to(DT)
        _acc(dw_ptr + kof, mm(tl.trans(dYl), Xd, INTERP), dmask)
        s = s * qk_scale
        if USE_GATE:
            c_k = tl.load(gc_h + krows)
            s += (c_q[:, None] - c_k[None, :]) * gate_scale
        p = tl.where(rmask[:, None], tl.exp2(s - lse2[:, None]), 0.0)
        _acc(dv_ptr + kvof, mm(tl.trans(p).to(Vm.dtype), dO, INTERP), dvmask)
        ds = p * (mm(dO, tl.trans(Vm), INTERP) - delta[:, None])
        dsd = (ds * scale).to(DT)
        _acc(dkt_ptr + kof, mm(tl.trans(dsd), Xd, INTERP), dmask)
        if USE_GATE:
            _acc(dc_h + krows, -tl.sum(ds, axis=0) * gate_nat)
        G = G + mm(_join_cols(dYl, dsd, C), WK, INTERP)
    tl.store(dy_ptr + qoff, G, mask=m2 & (ci > 0))
