"""Candidate for the backward's intra-super-chunk kernel: its three phases apart, each with its own live set.

Same signature, grid, scratch (``xs``: the same slots, in the scan dtype) and outputs as
``codegen/triton/bwd_intra.py: bwd_intra_kernel`` (one program per (query UT chunk c, query head),
latest chunks of a super-chunk first), so ``backward.py`` can launch it as is.  The math is the
shipped kernel's (docs/algorithm.md#inside-a-super-chunk); what differs is what each phase holds:

1. States (only where chunk c has earlier chunks in its super-chunk): Q~_c = Q - tril(Q W^T) U, then
   the right-to-left chain X <- X - (X W_m^T) U_m (float32 carry, products on scan-dtype operands),
   parking every state X_m in the program's scratch slots.  Q, W_c, U_c and tril(Q W^T) die here
   instead of living through the walk.
2. The walk over key chunks m, left to right, queries as rows, carrying G = dX (float32):
   Yl = X_m W_m^T, dYl = -G U_m^T, dU_m -= Yl^T G, dW_m += dYl^T X_m, G += dYl W_m; the logits
   X_m K~_m^T, P, dP = dO V_m^T, dS; dV_m += P^T dO, dK~_m += dS^T X_m, G += dS K~_m.  Live across it:
   G, dO and the per-query vectors (lse, delta, the gate cumsum and the query side of dc).
3. The diagonal tile and the boundary adjustment, from Q, W_c, K, M, U_c read again (L2) and
   tril(Q W^T) formed again: dU -= tril(QW)^T G first (G's 16-bit copy is the only state carried in),
   then S = Q K^T - tril(QW) M, dV, dc, dK, dM, dQW = tril(-G U_c^T - dS M^T), dW, and
   dq = G + dS K + dQW W_c (stored: owned here).

Queries are rows in every product (the fp32 U, K~, W of the backward's state are right-hand
operands, converted to the scan dtype once per load); P, dS, Yl, dYl reach the key-side products
transposed.  The key chunks of the two loops (states, walk) are addressed from int64 row indices
formed in the loop, as in the shipped kernel: an address tile that does not depend on the loop index
is hoisted out of it and held through it (on the H200 that alone made the shipped kernel 16% / 24%
slower at D = 128 / 64); the chunk's own tiles by a scalar base plus int32 offsets.
16-bit operands (scan dtype; dO, V in their own), float32 accumulation, the products with M float32
at precision TP; key-side gradients are float32 atomic adds, as in the shipped kernel (each key
chunk is shared by every later query chunk of its super-chunk and every query head of its group).
"""
from __future__ import annotations

import triton
import triton.language as tl

from pathtune.codegen.triton._ops import mm, tile_of


@triton.jit
def _acc(ptr, val, mask=None):
    tl.atomic_add(ptr, val, mask=mask, sem="relaxed")


@triton.jit
def bwd_intra_kernel(
    q_ptr, k_ptr, v_ptr, w_ptr, u_ptr, m_ptr, kt_ptr, gc_ptr, do_ptr, lse_ptr, delta_ptr, dy_ptr,
    dq_ptr, dk_ptr, dv_ptr, dw_ptr, du_ptr, dm_ptr, dkt_ptr, dc_ptr, xs_ptr,
    chunk_tok0, chunk_seq, seq_start, seq_end,
    n_chunks, qk_scale, gate_scale, scale, gate_nat,
    HQ: tl.constexpr, H: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    BD: tl.constexpr, BDV: tl.constexpr, C: tl.constexpr, S: tl.constexpr,
    DT: tl.constexpr, TP: tl.constexpr, USE_GATE: tl.constexpr, INTERP: tl.constexpr,
):
    n = n_chunks - 1 - tl.program_id(0)     # latest chunks of a super-chunk (most work) first
    hq = tl.program_id(1)
    h = hq // (HQ // H)
    tok0, sid, s0, send = tile_of(n, chunk_tok0, chunk_seq, seq_start, seq_end)
    c_idx = (tok0 - s0) // C
    ci = c_idx % (S // C)                   # position of the chunk inside its super-chunk
    tokI = tok0 - ci * C
    r = tl.arange(0, C)
    d = tl.arange(0, BD)
    dv = tl.arange(0, BDV)
    dmask = (d < D)[None, :]
    dvmask = (dv < DV)[None, :]
    rmask = (tok0 + r) < send
    m2 = rmask[:, None] & dmask
    # the chunk's own tiles: a scalar 64-bit base plus int32 offsets with constexpr strides
    ko = r[:, None] * (H * D) + d[None, :]              # [C, BD] of a kv-head tensor
    qo = r[:, None] * (HQ * D) + d[None, :]
    vo = r[:, None] * (H * DV) + dv[None, :]
    dqo = r[:, None] * (HQ * DV) + dv[None, :]
    mo = r[:, None] * (H * C) + r[None, :]              # M rows of the chunk
    kb = (tok0 * H + h) * D                             # this chunk's rows, kv head h
    qb = (tok0 * HQ + hq) * D
    qv = tok0 * HQ + hq                                 # per-query scalars (lse, delta, gate cumsum, dc)
    # scratch slots of the chain states X_m (m = ci-1 .. 0), as in the shipped kernel: S // (2C) per
    # chunk and query head; chunk ci of a super-chunk starting at chunk n - ci uses ci slots from ci (ci - 1) / 2
    slot0 = (hq * n_chunks + n - ci).to(tl.int64) * (S // (2 * C)) + ci * (ci - 1) // 2
    xs = xs_ptr + slot0 * C * BD
    xso = r[:, None] * BD + d[None, :]

    # ---- 1. the chain states, right to left from Q~_c
    if ci > 0:
        Q = tl.load(q_ptr + qb + qo, mask=m2, other=0.0).to(DT)
        Wc = tl.load(w_ptr + kb + ko, mask=m2, other=0.0).to(DT)
        Uc = tl.load(u_ptr + kb + ko, mask=m2, other=0.0).to(DT)
        QW = tl.where(r[:, None] >= r[None, :], mm(Q, tl.trans(Wc), INTERP), 0.0)
        X = Q.to(tl.float32) - mm(QW.to(DT), Uc, INTERP)
        for t in range(0, ci):
            tm = ci - 1 - t
            Xd = X.to(DT)
            tl.store(xs + tm * C * BD + xso, Xd)
            if t < ci - 1:
                trows = (tokI + tm * C + r).to(tl.int64)
                toff = (trows[:, None] * H + h) * D + d[None, :]
                Wt = tl.load(w_ptr + toff, mask=dmask, other=0.0).to(DT)
                Ut = tl.load(u_ptr + toff, mask=dmask, other=0.0).to(DT)
                X = X - mm(mm(Xd, tl.trans(Wt), INTERP).to(DT), Ut, INTERP)
        tl.debug_barrier()

    # ---- 2. the walk over the earlier key chunks, queries as rows, carrying G = dX
    dO = tl.load(do_ptr + (tok0 * HQ + hq) * DV + dqo, mask=rmask[:, None] & dvmask, other=0.0)
    G = tl.load(dy_ptr + qb + qo, mask=m2, other=0.0)
    lse2 = tl.load(lse_ptr + qv + r * HQ, mask=rmask, other=0.0) * 1.4426950408889634
    delta = tl.load(delta_ptr + qv + r * HQ, mask=rmask, other=0.0)
    if USE_GATE:
        c_q = tl.load(gc_ptr + qv + r * HQ, mask=rmask, other=0.0)
    dcq = tl.zeros((C,), dtype=tl.float32)
    for mi in range(0, ci):
        xr = (mi * C + r).to(tl.int64)
        Xd = tl.load(xs + xr[:, None] * BD + d[None, :])
        krow0 = tokI + mi * C
        krows = (krow0 + r).to(tl.int64)
        ko_l = (krows[:, None] * H + h) * D + d[None, :]
        vo_l = (krows[:, None] * H + h) * DV + dv[None, :]
        Wm = tl.load(w_ptr + ko_l, mask=dmask, other=0.0).to(DT)
        Um = tl.load(u_ptr + ko_l, mask=dmask, other=0.0).to(DT)
        Gd = G.to(DT)
        # chain step: Yl = X_m W_m^T, dYl = -G U_m^T
        Yl = mm(Xd, tl.trans(Wm), INTERP)
        dYl = -mm(Gd, tl.trans(Um), INTERP)
        _acc(du_ptr + ko_l, -mm(tl.trans(Yl.to(DT)), Gd, INTERP), dmask)
        dYld = dYl.to(DT)
        _acc(dw_ptr + ko_l, mm(tl.trans(dYld), Xd, INTERP), dmask)
        G += mm(dYld, Wm, INTERP)
        # logits of key chunk m
        Kt = tl.load(kt_ptr + ko_l, mask=dmask, other=0.0).to(DT)
        Vm = tl.load(v_ptr + vo_l, mask=dvmask, other=0.0)
        s = mm(Xd, tl.trans(Kt), INTERP) * qk_scale
        if USE_GATE:
            c_k = tl.load(gc_ptr + krow0 * HQ + hq + r * HQ)
            s += (c_q[:, None] - c_k[None, :]) * gate_scale
        p = tl.where(rmask[:, None], tl.exp2(s - lse2[:, None]), 0.0)
        dp = mm(dO, tl.trans(Vm), INTERP)
        ds = p * (dp - delta[:, None])
        _acc(dv_ptr + vo_l, mm(tl.trans(p.to(Vm.dtype)), dO, INTERP), dvmask)
        dsd = (ds * scale).to(DT)
        _acc(dkt_ptr + ko_l, mm(tl.trans(dsd), Xd, INTERP), dmask)
        G += mm(dsd, Kt, INTERP)
        if USE_GATE:
            dcq += tl.sum(ds, axis=1)
            _acc(dc_ptr + krow0 * HQ + hq + r * HQ, -tl.sum(ds, axis=0) * gate_nat)

    # ---- 3. the diagonal tile and the boundary adjustment of the queries
    causal = r[:, None] >= r[None, :]
    Q = tl.load(q_ptr + qb + qo, mask=m2, other=0.0).to(DT)
    Wc = tl.load(w_ptr + kb + ko, mask=m2, other=0.0).to(DT)
    QW = tl.where(causal, mm(Q, tl.trans(Wc), INTERP), 0.0)
    Gd = G.to(DT)
    _acc(du_ptr + kb + ko, -mm(tl.trans(QW.to(DT)), Gd, INTERP), m2)
    mb = (tok0 * H + h) * C
    K = tl.load(k_ptr + kb + ko, mask=m2, other=0.0).to(DT)
    M = tl.load(m_ptr + mb + mo, mask=rmask[:, None], other=0.0)
    s = (mm(Q, tl.trans(K), INTERP) - tl.dot(QW, M, input_precision=TP)) * qk_scale
    if USE_GATE:
        s += (c_q[:, None] - c_q[None, :]) * gate_scale
    p = tl.where(causal & rmask[:, None] & rmask[None, :], tl.exp2(s - lse2[:, None]), 0.0)
    Vc = tl.load(v_ptr + (tok0 * H + h) * DV + vo, mask=rmask[:, None] & dvmask, other=0.0)
    dp = mm(dO, tl.trans(Vc), INTERP)
    ds = p * (dp - delta[:, None])
    _acc(dv_ptr + (tok0 * H + h) * DV + vo, mm(tl.trans(p.to(Vc.dtype)), dO, INTERP), rmask[:, None] & dvmask)
    if USE_GATE:
        _acc(dc_ptr + qv + r * HQ, (dcq + tl.sum(ds, axis=1) - tl.sum(ds, axis=0)) * gate_nat, rmask)
    dsr = ds * scale
    dsd = dsr.to(DT)
    _acc(dk_ptr + kb + ko, mm(tl.trans(dsd), Q, INTERP), m2)
    _acc(dm_ptr + mb + mo, -tl.dot(tl.trans(QW), dsr, input_precision=TP), rmask[:, None])
    Uc = tl.load(u_ptr + kb + ko, mask=m2, other=0.0).to(DT)
    dQW = -mm(Gd, tl.trans(Uc), INTERP) - tl.dot(dsr, tl.trans(M), input_precision=TP)
    dQWd = tl.where(causal, dQW, 0.0).to(DT)
    _acc(dw_ptr + kb + ko, mm(tl.trans(dQWd), Q, INTERP), m2)
    G += mm(dsd, K, INTERP)
    G += mm(dQWd, Wc, INTERP)
    tl.store(dq_ptr + qb + qo, G.to(dq_ptr.dtype.element_ty), mask=m2)
