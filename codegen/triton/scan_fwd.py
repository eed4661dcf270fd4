"""Stage `blockwise_scan` (+ `fox_gate`), forward, in two kernels.

``scan_intra_kernel``, one program per (query UT chunk c, query head), c in super-chunk I:
  1. the boundary-adjusted queries X = Q - tril(Q W^T) U and the diagonal tile
     S = tril(Q K^T) - tril(Q W^T) M (causal inside the chunk);
  2. the earlier chunks of I right to left: logits X K~_m^T, online softmax, then
     X <- X - (X W_m^T) U_m (the chunk transition, low rank).
  It writes o and lse of this partial softmax and, when earlier super-chunks exist, X (the
  queries carried to the start of I, float32).  K~, W and U are read as the forward's 16-bit
  copies (``forward.prepare_state``): one load per operand, no conversion in the walk.
``scan_inter_kernel``, one program per (BLOCK_M query rows, query head) of a super-chunk I > 0:
  3. plain FlashAttention over the transported keys KJ of the super-chunks J < I, right to
     left, then X <- X What_J (dense D x D transition), merged into the partial softmax.
Splitting keeps the second kernel a lean FlashAttention loop (few live tiles, its own query
tile BLOCK_M, no chunk-level work) -- the bulk of the forward at long T.
Logits are scaled into base 2 (exp2).  Outputs o and the natural-log lse.  In scan_inter the
softmax scale is folded into exp2's multiply-add, and with the FoX gate the walk runs in the frame
without the query's gate cumsum c_q (constant along a row, so it cancels in the softmax: the partial
lse is shifted by -c_q on entry and back on store), so a logit costs one multiply-add,
s * scale - c_k, instead of three operations.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._ops import chunk_and_head, mm, tdot, tile_of
from .gate_bias import add_product, bias_ones


@triton.jit
def _accumulate_pv(acc, p, v, INTERP: tl.constexpr):
    """acc + p @ v, accumulated in the MMA itself on the GPU (float32 acc, 16-bit p and v)."""
    if INTERP:
        return acc + mm(p, v, INTERP)
    else:
        return tl.dot(p, v, acc)


@triton.jit
def _softmax_step(s, m_i, l_i, acc, v, INTERP: tl.constexpr):
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = _accumulate_pv(acc * alpha[:, None], p.to(v.dtype), v, INTERP)
    return m_new, l_i, acc


@triton.jit
def _softmax_step_scaled(s, m_i, l_i, acc, v, qk_scale, INTERP: tl.constexpr):
    """_softmax_step of the logits s * qk_scale (qk_scale > 0), the scaling folded into exp2's argument."""
    m_new = tl.maximum(m_i, tl.max(s, axis=1) * qk_scale)
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s * qk_scale - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = _accumulate_pv(acc * alpha[:, None], p.to(v.dtype), v, INTERP)
    return m_new, l_i, acc


@triton.jit
def scan_intra_kernel(
    q_ptr, k_ptr, v_ptr, w_ptr, u_ptr, m_ptr, gc_ptr,
    o_ptr, lse_ptr, x_ptr, y_ptr,
    kt_walk, w_walk, u_walk, v_walk, gp_walk,
    chunk_tok0, chunk_seq, seq_start, seq_end,
    qk_scale, gate_scale, gc_hs,
    HQ: tl.constexpr, H: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    BD: tl.constexpr, BDV: tl.constexpr, C: tl.constexpr, S: tl.constexpr,
    DT: tl.constexpr, TP: tl.constexpr, USE_GATE: tl.constexpr, WRITE_X: tl.constexpr,
    INTERP: tl.constexpr, TMA: tl.constexpr = False, WALK_STAGES: tl.constexpr = 1, WRITE_Y: tl.constexpr = False,
    GATE_MMA: tl.constexpr = False,
):
    """One UT chunk of queries: its diagonal tile, then the walk over the earlier chunks of its super-chunk.

    kt_walk, w_walk, u_walk, v_walk: what the walk reads.  TMA: tensor descriptors over the [N, H * D] /
    [N, H * DV] views of K~, W, U and V with [C, D] / [C, DV] blocks (``forward.intra_walk_operands``;
    D == BD, DV == BDV): a walk step's four tiles arrive by TMA copies, no address tiles and no masks
    (a chunk before the query's lies wholly inside its sequence); else the tensors themselves.
    WALK_STAGES (knob ``intra_num_stages``): software-pipelining stages of the walk's loads.  WRITE_Y: also
    store the queries carried to the start of their super-chunk in y's type (what the inter kernel starts from,
    X, rounded once): the backward's inter-super-chunk stages read them (bwd_forward_state keep_inter / keep).
    GATE_MMA (gate_bias product): the walk takes the keys' gate offsets from their bf16 parts gp_walk [HQ, gc_hs, 16]
    (``gate_bias``; with TMA a tensor descriptor over its [HQ * gc_hs, 16] view with [C, 16] blocks) by a K = 16
    product, in the frame without the query's offset (its running max shifted by -c_q after the diagonal tile and
    back before the lse is stored), so that a walk step is the ungated one.
    """
    n, hq = chunk_and_head(HQ)
    h = hq // (HQ // H)
    tok0, sid, s0, send = tile_of(n, chunk_tok0, chunk_seq, seq_start, seq_end)
    c_idx = (tok0 - s0) // C
    first_chunk_of_sc = (c_idx // (S // C)) * (S // C)

    r = tl.arange(0, C)
    d = tl.arange(0, BD)
    dv = tl.arange(0, BDV)
    dmask = (d < D)[None, :]
    dvmask = (dv < DV)[None, :]
    rows = (tok0 + r).to(tl.int64)
    rmask = rows < send
    gc_h = gc_ptr + hq.to(tl.int64) * gc_hs     # gc [HQ, gc_hs] head-major: this head's gates

    koff = (rows[:, None] * H + h) * D + d[None, :]
    qoff = (rows[:, None] * HQ + hq) * D + d[None, :]
    Q = tl.load(q_ptr + qoff, mask=rmask[:, None] & dmask, other=0.0).to(DT)
    K = tl.load(k_ptr + koff, mask=rmask[:, None] & dmask, other=0.0).to(DT)
    W = tl.load(w_ptr + koff, mask=rmask[:, None] & dmask, other=0.0).to(DT)
    U = tl.load(u_ptr + koff, mask=rmask[:, None] & dmask, other=0.0).to(DT)
    M = tl.load(m_ptr + (rows[:, None] * H + h) * C + r[None, :], mask=rmask[:, None], other=0.0)
    V = tl.load(v_ptr + (rows[:, None] * H + h) * DV + dv[None, :], mask=rmask[:, None] & dvmask, other=0.0)

    causal = r[:, None] >= r[None, :]
    QW = tl.where(causal, mm(Q, tl.trans(W), INTERP), 0.0)
    X = Q.to(tl.float32) - mm(QW.to(DT), U, INTERP)
    s = mm(Q, tl.trans(K), INTERP) - tdot(QW, M, TP, INTERP)

    if USE_GATE:
        c_q = tl.load(gc_h + rows, mask=rmask, other=0.0)
        s = s * qk_scale + (c_q[:, None] - c_q[None, :]) * gate_scale
    else:
        s = s * qk_scale
    s = tl.where(causal & rmask[None, :], s, float("-inf"))
    m_i = tl.max(s, axis=1)
    p = tl.exp2(s - m_i[:, None])
    l_i = tl.sum(p, axis=1)
    acc = mm(p.to(V.dtype), V, INTERP)
    if USE_GATE and GATE_MMA:
        m_i = m_i - c_q * gate_scale        # the walk's frame: without the query's offset
        ones = bias_ones(C)
        gp_h = hq.to(tl.int64) * gc_hs

    # 2. earlier chunks of this super-chunk, right to left (chunk-level low-rank transitions)
    for step in tl.range(0, c_idx - first_chunk_of_sc, num_stages=WALK_STAGES):
        cc = c_idx - 1 - step
        krows = (s0 + cc * C + r).to(tl.int64)
        if TMA:
            krow = (s0 + cc * C).to(tl.int32)
            Kt = kt_walk.load([krow, (h * D).to(tl.int32)]).to(DT)
            Wm = w_walk.load([krow, (h * D).to(tl.int32)]).to(DT)
            Um = u_walk.load([krow, (h * D).to(tl.int32)]).to(DT)
            Vm = v_walk.load([krow, (h * DV).to(tl.int32)])
        else:
            kof = (krows[:, None] * H + h) * D + d[None, :]
            Kt = tl.load(kt_walk + kof, mask=dmask, other=0.0).to(DT)
            Wm = tl.load(w_walk + kof, mask=dmask, other=0.0).to(DT)
            Um = tl.load(u_walk + kof, mask=dmask, other=0.0).to(DT)
            Vm = tl.load(v_walk + (krows[:, None] * H + h) * DV + dv[None, :], mask=dvmask, other=0.0)
        Xd = X.to(DT)
        if USE_GATE and GATE_MMA:
            if TMA:
                P = gp_walk.load([(gp_h + s0 + cc * C).to(tl.int32), 0])
            else:
                P = tl.load(gp_walk + (gp_h + krows)[:, None] * 16 + tl.arange(0, 16)[None, :])
            s = add_product(mm(ones, tl.trans(P), INTERP), Xd, tl.trans(Kt), INTERP)
            m_i, l_i, acc = _softmax_step_scaled(s, m_i, l_i, acc, Vm, qk_scale, INTERP)
        else:
            s = mm(Xd, tl.trans(Kt), INTERP) * qk_scale
            if USE_GATE:
                c_k = tl.load(gc_h + krows)
                s += (c_q[:, None] - c_k[None, :]) * gate_scale
            m_i, l_i, acc = _softmax_step(s, m_i, l_i, acc, Vm, INTERP)
        XW = mm(Xd, tl.trans(Wm), INTERP)
        X = X - mm(XW.to(DT), Um, INTERP)

    if USE_GATE and GATE_MMA:
        m_i = m_i + c_q * gate_scale
    o = acc / l_i[:, None]
    tl.store(o_ptr + (rows[:, None] * HQ + hq) * DV + dv[None, :], o.to(o_ptr.dtype.element_ty),
             mask=rmask[:, None] & dvmask)
    lse = (m_i + tl.log2(l_i)) * 0.6931471805599453
    tl.store(lse_ptr + rows * HQ + hq, lse, mask=rmask)
    if WRITE_X:
        tl.store(x_ptr + qoff, X, mask=rmask[:, None] & dmask)
    if WRITE_Y:     # the same queries in y's (the scan's) type, kept for the backward (bwd_forward_state)
        tl.store(y_ptr + qoff, X.to(y_ptr.dtype.element_ty), mask=rmask[:, None] & dmask)


@triton.jit
def scan_inter_kernel(
    x_ptr, kj_ptr, v_ptr, what_ptr, gc_ptr, gp_ptr, o_part_ptr,
    o_ptr, lse_ptr,
    blk_tok0, blk_seq, seq_start, seq_end, seq_sc_base,
    n_blocks, qk_scale, gate_scale, gc_hs,
    HQ: tl.constexpr, H: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    BD: tl.constexpr, BDV: tl.constexpr, BLOCK_M: tl.constexpr, S: tl.constexpr, BLOCK_N: tl.constexpr,
    DB: tl.constexpr, DT: tl.constexpr, TP: tl.constexpr, USE_GATE: tl.constexpr, INTERP: tl.constexpr,
    TMA: tl.constexpr = False, GATE_MMA: tl.constexpr = False,
):
    """Merge the earlier super-chunks into the partial softmax of ``scan_intra_kernel``.

    o_part (float32) and lse hold the partial result; o (q's dtype) and lse receive the final one.
    x [N, HQ, D] float32 holds the queries at the start of their super-chunk; it is overwritten.
    gc [HQ, gc_hs] float32, head-major: the gates of a key tile are contiguous.
    GATE_MMA (gate_bias product): the keys' offsets come as bf16 parts gp [HQ, gc_hs, 16] (``gate_bias``; with
    TMA a tensor descriptor over its [HQ * gc_hs, 16] view with [BLOCK_N, 16] blocks) and enter each logit tile
    as a K = 16 product with ones that the tile's X KJ^T product accumulates onto: the loop then does the
    ungated softmax step, no per-logit subtraction and no offset loads in the accumulator's column layout.
    Blocks of the first super-chunk of a sequence only convert o_part to o.
    DB (``forward.transition_column_block``): DB == BD multiplies X by the whole BD x BD What_J;
    DB < BD (wide head dims) writes X What_J one DB-column block at a time, each from the full X
    (read before the first write) and a BD x DB block of What_J.
    TMA: kj_ptr and v_ptr are tensor descriptors over the [N, H * D] / [N, H * DV] views with blocks
    [BLOCK_N, D] / [BLOCK_N, DV] (``forward.inter_operands``; D == BD, DV == BDV): the key and value
    tiles arrive by TMA copies, no address tiles in registers and no masks (a super-chunk J < I lies
    wholly inside the sequence); else block pointers.
    """
    n = n_blocks - 1 - tl.program_id(0)     # latest blocks (most super-chunks to scan) first
    hq = tl.program_id(1)
    h = hq // (HQ // H)
    tok0, sid, s0, send = tile_of(n, blk_tok0, blk_seq, seq_start, seq_end)
    sc_base = tl.load(seq_sc_base + sid)
    sc_idx = (tok0 - s0) // S

    # Block pointers (a 64-bit scalar base, 32-bit strides and offsets inside the tile) rather
    # than tiles of per-element 64-bit pointers, which cost two registers per element and made
    # this kernel spill.  Their row extent ends at the sequence end, so boundary checks mask the
    # rows of the next sequence.
    r = tl.arange(0, BLOCK_M)
    n_rows = (send - tok0).to(tl.int32)
    rmask = r < n_rows
    q_base = tok0.to(tl.int64) * HQ + hq
    o_blk = tl.make_block_ptr(o_part_ptr + q_base * DV, (n_rows, DV), (HQ * DV, 1), (0, 0), (BLOCK_M, BDV), (1, 0))
    acc = tl.load(o_blk, boundary_check=(0, 1), padding_option="zero")
    # the partial softmax as a state with l = 1 at m = its lse (base 2)
    m_i = tl.load(lse_ptr + q_base + r * HQ, mask=rmask, other=0.0) * 1.4426950408889634
    l_i = tl.full((BLOCK_M,), 1.0, tl.float32)
    if sc_idx > 0:
        # X (float32) lives in its buffer between super-chunks, only its scan-dtype copy Xd in the
        # key loop: the loop holds FlashAttention's tiles and no more
        x_blk = tl.make_block_ptr(x_ptr + q_base * D, (n_rows, D), (HQ * D, 1), (0, 0), (BLOCK_M, BD), (1, 0))
        if USE_GATE:
            gc_h = gc_ptr + hq.to(tl.int64) * gc_hs
            c_q = tl.load(gc_h + tok0 + r, mask=rmask, other=0.0)
            m_i = m_i - c_q * gate_scale
            if GATE_MMA:
                ones = bias_ones(BLOCK_M)
                gp_h = hq.to(tl.int64) * gc_hs
        rn = tl.arange(0, BLOCK_N)
        for step in range(0, sc_idx):
            jj = sc_idx - 1 - step
            Xd = tl.load(x_blk, boundary_check=(0, 1), padding_option="zero").to(DT)
            k0 = (s0 + jj * S).to(tl.int64)
            if not TMA:
                k_blk = tl.make_block_ptr(kj_ptr + (k0 * H + h) * D, (S, D), (H * D, 1), (0, 0), (BLOCK_N, BD),
                                          (1, 0))
                v_blk = tl.make_block_ptr(v_ptr + (k0 * H + h) * DV, (S, DV), (H * DV, 1), (0, 0), (BLOCK_N, BDV),
                                          (1, 0))
            for t0 in range(0, S, BLOCK_N):
                if TMA:
                    krow = (k0 + t0).to(tl.int32)
                    KJ = kj_ptr.load([krow, (h * D).to(tl.int32)]).to(DT)
                    Vt = v_ptr.load([krow, (h * DV).to(tl.int32)])
                else:
                    KJ = tl.load(k_blk, boundary_check=(1,), padding_option="zero").to(DT)
                    Vt = tl.load(v_blk, boundary_check=(1,), padding_option="zero")
                    k_blk = tl.advance(k_blk, (BLOCK_N, 0))
                    v_blk = tl.advance(v_blk, (BLOCK_N, 0))
                if USE_GATE and GATE_MMA:
                    # the keys' gate offsets as a K = 16 product of their bf16 parts (gate_bias), the logits'
                    # product accumulated onto it
                    if TMA:
                        P = gp_ptr.load([(gp_h + k0 + t0).to(tl.int32), 0])
                    else:
                        P = tl.load(gp_ptr + (gp_h + k0 + t0 + rn)[:, None] * 16 + tl.arange(0, 16)[None, :])
                    sj = add_product(mm(ones, tl.trans(P), INTERP), Xd, tl.trans(KJ), INTERP)
                    m_i, l_i, acc = _softmax_step_scaled(sj, m_i, l_i, acc, Vt, qk_scale, INTERP)
                elif USE_GATE:
                    sj = mm(Xd, tl.trans(KJ), INTERP)
                    c_kj = tl.load(gc_h + (k0 + t0) + rn)
                    m_i, l_i, acc = _softmax_step(sj * qk_scale - (c_kj * gate_scale)[None, :], m_i, l_i, acc,
                                                  Vt, INTERP)
                else:
                    sj = mm(Xd, tl.trans(KJ), INTERP)
                    m_i, l_i, acc = _softmax_step_scaled(sj, m_i, l_i, acc, Vt, qk_scale, INTERP)
            if jj > 0:
                d = tl.arange(0, BD)
                if DB == BD:
                    Wh = tl.load(what_ptr + (((sc_base + jj) * H + h) * BD + d[:, None]) * BD + d[None, :])
                    X = tl.load(x_blk, boundary_check=(0, 1), padding_option="zero")
                    tl.debug_barrier()
                    tl.store(x_blk, tdot(X, Wh, TP, INTERP), boundary_check=(0, 1))
                else:
                    # in place: every thread holds its part of the whole X before any column is written
                    X = tl.load(x_blk, boundary_check=(0, 1), padding_option="zero")
                    tl.debug_barrier()
                    wh_base = what_ptr + ((sc_base + jj) * H + h) * BD * BD
                    for cb in tl.static_range(BD // DB):
                        if cb * DB < D:     # column blocks wholly past D hold nothing to store
                            e = cb * DB + tl.arange(0, DB)
                            Wh = tl.load(wh_base + d[:, None] * BD + e[None, :])
                            xb_blk = tl.make_block_ptr(x_ptr + q_base * D, (n_rows, D), (HQ * D, 1), (0, cb * DB),
                                                       (BLOCK_M, DB), (1, 0))
                            tl.store(xb_blk, tdot(X, Wh, TP, INTERP), boundary_check=(0, 1))
                tl.debug_barrier()
        if USE_GATE:
            m_i = m_i + c_q * gate_scale
        tl.store(lse_ptr + q_base + r * HQ, (m_i + tl.log2(l_i)) * 0.6931471805599453, mask=rmask)
    o_out = tl.make_block_ptr(o_ptr + q_base * DV, (n_rows, DV), (HQ * DV, 1), (0, 0), (BLOCK_M, BDV), (1, 0))
    tl.store(o_out, (acc / l_i[:, None]).to(o_ptr.dtype.element_ty), boundary_check=(0, 1))
