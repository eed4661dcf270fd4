"""Candidate for the backward's intra-super-chunk kernel: keys as rows, three phases, 16-bit operands.

Same signature, grid, scratch (``xs``, the same slots) and outputs as ``codegen/triton/bwd_intra.py:
bwd_intra_kernel`` (one program per (query UT chunk c, query head), latest chunks of a super-chunk
first), so ``backward.py`` can launch it as is.  The math is the shipped kernel's
(docs/algorithm.md#inside-a-super-chunk); what differs is the order and the layouts:

1. States.  Q~_c = Q - tril(Q W^T) U, then the right-to-left chain X <- X - (X W_m^T) U_m (float32
   carry, products on scan-dtype operands), parking every state X_m in the program's scratch slots
   in the scan dtype (the shipped layout).  Q, W_c, U_c and tril(Q W^T) die here: they are reloaded
   for phase 3 instead of being held through the walk.
2. Walk over key chunks m left to right carrying the query gradient TRANSPOSED, GT = G^T (BD x C,
   float32).  Every C x C tile is formed with keys as rows ([key, query]):
       Yl^T = W_m X_m^T,  dYl^T = -U_m G^T,  s^T = K~_m X_m^T,  dP^T = V_m dO^T
   so the four key-side gradients take them as the A operand with no transpose:
       dU_m -= Yl^T G,  dW_m += dYl^T X_m,  dK~_m += dS^T X_m,  dV_m += P^T dO
   and the carried gradient is updated as  GT += W_m^T dYl^T + K~_m^T dS^T  (transposes of loaded
   tiles only).  The live set across the walk is GT, dO and the per-query vectors (lse, delta, the
   gate cumsum and its gradient).
3. The diagonal tile, keys as rows: S^T = K Q^T - M^T tril(Q W^T)^T, then
       dK += dS^T Q,  dV += P^T dO,  dM -= tril(QW)^T dS,  dU -= tril(QW)^T G,
       dQW^T = triu(-U_c G^T - M dS^T),  dW += dQW^T Q,  dq^T = GT + K^T dS^T + W_c^T dQW^T
   and dq is stored (transposed addressing, owned by this program).

Operands of the C x D products are 16-bit (the scan dtype for Q, W, U, K, K~, X, G, P / dS rounded
as the shipped kernel rounds them; dO and V in their own dtype); accumulation is float32; the
products with M stay float32 at precision TP.  Key-side gradients are float32 atomic adds, as in the
shipped kernel (each key chunk is shared by every later query chunk of its super-chunk and every
query head of its GQA group).
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
    # addresses: a scalar 64-bit base per tile plus int32 offsets with constexpr strides
    # (row-major [token, dim] tiles and their transposes)
    ko = r[:, None] * (H * D) + d[None, :]              # [C, BD] of a kv-head tensor
    qo = r[:, None] * (HQ * D) + d[None, :]
    qTo = r[None, :] * (HQ * D) + d[:, None]
    vo = r[:, None] * (H * DV) + dv[None, :]
    dqo = r[:, None] * (HQ * DV) + dv[None, :]
    mo = r[:, None] * (H * C) + r[None, :]              # M rows of the chunk
    mTo = r[None, :] * (H * C) + r[:, None]
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
                tb = ((tokI + tm * C) * H + h) * D
                Wt = tl.load(w_ptr + tb + ko, mask=dmask, other=0.0).to(DT)
                Ut = tl.load(u_ptr + tb + ko, mask=dmask, other=0.0).to(DT)
                X = X - mm(mm(Xd, tl.trans(Wt), INTERP).to(DT), Ut, INTERP)
        tl.debug_barrier()

    # ---- 2. the walk over the earlier key chunks, keys as rows, carrying G^T
    # per-query vectors (lse, delta, gate cumsum) are read where they are used: in the [key, query]
    # layout a query-indexed vector costs C / 4 registers a thread, and the loop keeps none of them live
    dO = tl.load(do_ptr + (tok0 * HQ + hq) * DV + dqo, mask=rmask[:, None] & dvmask, other=0.0)
    # G^T: column i is the gradient of query row i
    GT = tl.load(dy_ptr + qb + qTo, mask=rmask[None, :] & (d < D)[:, None], other=0.0)
    for mi in range(0, ci):
        Xd = tl.load(xs + mi * C * BD + xso)
        krow0 = tokI + mi * C
        kbm = (krow0 * H + h) * D
        Wm = tl.load(w_ptr + kbm + ko, mask=dmask, other=0.0).to(DT)
        Um = tl.load(u_ptr + kbm + ko, mask=dmask, other=0.0).to(DT)
        GTd = GT.to(DT)
        # chain step: Yl = X_m W_m^T, dYl = -G U_m^T, both [key, query]
        YlT = mm(Wm, tl.trans(Xd), INTERP)
        dYlT = -mm(Um, GTd, INTERP)
        _acc(du_ptr + kbm + ko, -mm(YlT.to(DT), tl.trans(GTd), INTERP), dmask)
        dYlTd = dYlT.to(DT)
        _acc(dw_ptr + kbm + ko, mm(dYlTd, Xd, INTERP), dmask)
        GT += mm(tl.trans(Wm), dYlTd, INTERP)
        # logits of key chunk m, [key, query]
        Kt = tl.load(kt_ptr + kbm + ko, mask=dmask, other=0.0).to(DT)
        vbm = (krow0 * H + h) * DV
        Vm = tl.load(v_ptr + vbm + vo, mask=dvmask, other=0.0)
        sT = mm(Kt, tl.trans(Xd), INTERP) * qk_scale
        lse2 = tl.load(lse_ptr + qv + r * HQ, mask=rmask, other=0.0) * 1.4426950408889634
        if USE_GATE:
            c_q = tl.load(gc_ptr + qv + r * HQ, mask=rmask, other=0.0)
            c_k = tl.load(gc_ptr + krow0 * HQ + hq + r * HQ)
            sT += (c_q[None, :] - c_k[:, None]) * gate_scale
        pT = tl.where(rmask[None, :], tl.exp2(sT - lse2[None, :]), 0.0)
        dpT = mm(Vm, tl.trans(dO), INTERP)
        delta = tl.load(delta_ptr + qv + r * HQ, mask=rmask, other=0.0)
        dsT = pT * (dpT - delta[None, :])
        _acc(dv_ptr + vbm + vo, mm(pT.to(Vm.dtype), dO, INTERP), dvmask)
        dsTd = (dsT * scale).to(DT)
        _acc(dkt_ptr + kbm + ko, mm(dsTd, Xd, INTERP), dmask)
        GT += mm(tl.trans(Kt), dsTd, INTERP)
        if USE_GATE:
            _acc(dc_ptr + qv + r * HQ, tl.sum(dsT, axis=0) * gate_nat, rmask)
            _acc(dc_ptr + krow0 * HQ + hq + r * HQ, -tl.sum(dsT, axis=1) * gate_nat)

    # ---- 3. the diagonal tile and the boundary adjustment of the queries, keys as rows
    causalT = r[:, None] <= r[None, :]      # [key, query]: key <= query
    Q = tl.load(q_ptr + qb + qo, mask=m2, other=0.0).to(DT)
    Wc = tl.load(w_ptr + kb + ko, mask=m2, other=0.0).to(DT)
    # tril(Q W^T)^T: [w token, query]
    QWT = tl.where(causalT, mm(Wc, tl.trans(Q), INTERP), 0.0)
    GTd = GT.to(DT)
    _acc(du_ptr + kb + ko, -mm(QWT.to(DT), tl.trans(GTd), INTERP), m2)
    # S^T = K Q^T - M^T tril(Q W^T)^T; M^T (keys as rows): entry (j, a) = M[a, j]
    mb = (tok0 * H + h) * C
    K = tl.load(k_ptr + kb + ko, mask=m2, other=0.0).to(DT)
    MT = tl.load(m_ptr + mb + mTo, mask=rmask[None, :], other=0.0)
    sT = (mm(K, tl.trans(Q), INTERP) - tl.dot(MT, QWT, input_precision=TP)) * qk_scale
    lse2 = tl.load(lse_ptr + qv + r * HQ, mask=rmask, other=0.0) * 1.4426950408889634
    if USE_GATE:
        c_q = tl.load(gc_ptr + qv + r * HQ, mask=rmask, other=0.0)
        c_k = tl.load(gc_ptr + qv + r * HQ, mask=rmask, other=0.0)
        sT += (c_q[None, :] - c_k[:, None]) * gate_scale
    pT = tl.where(causalT & rmask[:, None] & rmask[None, :], tl.exp2(sT - lse2[None, :]), 0.0)
    Vc = tl.load(v_ptr + (tok0 * H + h) * DV + vo, mask=rmask[:, None] & dvmask, other=0.0)
    dpT = mm(Vc, tl.trans(dO), INTERP)
    delta = tl.load(delta_ptr + qv + r * HQ, mask=rmask, other=0.0)
    dsT = pT * (dpT - delta[None, :])
    _acc(dv_ptr + (tok0 * H + h) * DV + vo, mm(pT.to(Vc.dtype), dO, INTERP), rmask[:, None] & dvmask)
    if USE_GATE:
        _acc(dc_ptr + qv + r * HQ, tl.sum(dsT, axis=0) * gate_nat, rmask)
        _acc(dc_ptr + qv + r * HQ, -tl.sum(dsT, axis=1) * gate_nat, rmask)
    dsrT = dsT * scale
    dsTd = dsrT.to(DT)
    _acc(dk_ptr + kb + ko, mm(dsTd, Q, INTERP), m2)
    _acc(dm_ptr + mb + mo, -tl.dot(QWT, tl.trans(dsrT), input_precision=TP), rmask[:, None])
    # dQW^T = triu(-U_c G^T - M dS^T)
    Uc = tl.load(u_ptr + kb + ko, mask=m2, other=0.0).to(DT)
    M = tl.load(m_ptr + mb + mo, mask=rmask[:, None], other=0.0)
    dQWT = -mm(Uc, GTd, INTERP) - tl.dot(M, dsrT, input_precision=TP)
    dQWTd = tl.where(causalT, dQWT, 0.0).to(DT)
    _acc(dw_ptr + kb + ko, mm(dQWTd, Q, INTERP), m2)
    GT += mm(tl.trans(K), dsTd, INTERP)
    GT += mm(tl.trans(Wc), dQWTd, INTERP)
    tl.store(dq_ptr + qb + qTo, GT.to(dq_ptr.dtype.element_ty), mask=rmask[None, :] & (d < D)[:, None])
