"""Backward through the transitions: super-chunk chain, then the key transport inside one.

``bwd_superchunk_chain_kernel`` (per sequence, kv head) turns dOm_{I,J} into dWhat_K:
    dWhat_K = sum_{I>K>J} Om_{I,K}^T dOm_{I,J} Om_{K,J}^T
computed per I with L_{I,K} = sum_{J<K} dOm_{I,J} Om_{K,J}^T  (L_{I,K+1} = L_{I,K} What_K^T + dOm_{I,K},
written over dOm in place) and then dWhat_K += Om_{I,K}^T L_{I,K} walking K right to left with
Om_{I,K-1} = Om_{I,K} What_K.  O(N_S^2) D x D products, N_S = super-chunks per sequence.

The transport backward reverses ``superchunk_transport_kernel`` in two kernels:
``bwd_transport_chain_kernel`` (per super-chunk, kv head, row block of Suf) replays the right-to-left
walk storing the states Suf_m, then walks left to right storing the gradients G_m = dSuf_m;
``bwd_transport_grads_kernel`` (per super-chunk, UT chunk, kv head) turns them into dK~, dW, dU of
its chunk, summing the row blocks in registers (no atomics).
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def bwd_superchunk_chain_kernel(
    what_ptr, dom_ptr, dwhat_ptr,
    seq_start, seq_end, seq_sc_base, seq_pair_base,
    H: tl.constexpr, BD: tl.constexpr, S: tl.constexpr, TP: tl.constexpr,
):
    sid = tl.program_id(0)
    h = tl.program_id(1)
    s0 = tl.load(seq_start + sid)
    send = tl.load(seq_end + sid)
    sc_base = tl.load(seq_sc_base + sid)
    pair_base = tl.load(seq_pair_base + sid)
    nsc = (send - s0 + S - 1) // S
    d = tl.arange(0, BD)
    dd = d[:, None] * BD + d[None, :]
    eye = tl.where(d[:, None] == d[None, :], 1.0, 0.0)
    for il in range(1, nsc):
        L = tl.zeros((BD, BD), dtype=tl.float32)
        for kl in range(0, il):
            pptr = dom_ptr + ((pair_base + il * nsc + kl) * H + h) * BD * BD + dd
            dom = tl.load(pptr)
            tl.debug_barrier()
            tl.store(pptr, L)
            Wk = tl.load(what_ptr + ((sc_base + kl) * H + h) * BD * BD + dd)
            L = tl.dot(L, tl.trans(Wk), input_precision=TP) + dom
        tl.debug_barrier()
        Om = eye
        for step in range(0, il):
            kl = il - 1 - step
            Lk = tl.load(dom_ptr + ((pair_base + il * nsc + kl) * H + h) * BD * BD + dd)
            wptr = dwhat_ptr + ((sc_base + kl) * H + h) * BD * BD + dd
            upd = tl.dot(tl.trans(Om), Lk, input_precision=TP)
            tl.store(wptr, tl.load(wptr) + upd)
            tl.debug_barrier()
            Wk = tl.load(what_ptr + ((sc_base + kl) * H + h) * BD * BD + dd)
            Om = tl.dot(Om, Wk, input_precision=TP)


@triton.jit
def bwd_transport_chain_kernel(
    kt_ptr, w_ptr, u_ptr, dkj_ptr, dwhat_ptr,
    suf_ptr, gs_ptr,
    sc_tok0, sc_seq, seq_end,
    H: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, C: tl.constexpr, S: tl.constexpr,
    ROWS: tl.constexpr, TP: tl.constexpr,
):
    """The serial half of the transport backward, per (super-chunk, kv head, ROWS rows of Suf): replays
    the right-to-left walk and stores every state Suf_m, then walks left to right with the gradient G
    of Suf and stores every G_m (G_{m+1} = G_m P_m^T + dKJ_m^T K~_m).  Rows of Suf and G evolve
    independently, so no program needs another's rows and nothing is added to shared outputs."""
    j = tl.program_id(0)
    h = tl.program_id(1)
    rb = tl.program_id(2)
    tok0 = tl.load(sc_tok0 + j)
    send = tl.load(seq_end + tl.load(sc_seq + j))
    if tok0 + S < send:
        NCH: tl.constexpr = S // C
        r = tl.arange(0, C)
        d = tl.arange(0, BD)
        e = rb * ROWS + tl.arange(0, ROWS)
        dmask = (d < D)[None, :]
        emask = (e < D)[None, :]
        blk = ((j * H + h) * (BD // ROWS) + rb).to(tl.int64) * NCH * ROWS * BD
        so = tl.arange(0, ROWS)[:, None] * BD + d[None, :]
        Suf = tl.where(e[:, None] == d[None, :], 1.0, 0.0)
        for step in range(0, NCH):
            rows = (tok0 + (NCH - 1 - step) * C + r).to(tl.int64)
            off = (rows[:, None] * H + h) * D + d[None, :]
            tl.store(suf_ptr + blk + step * ROWS * BD + so, Suf)
            W = tl.load(w_ptr + off, mask=dmask, other=0.0).to(tl.float32)
            U = tl.load(u_ptr + off, mask=dmask, other=0.0)
            Suf = Suf - tl.dot(tl.dot(Suf, tl.trans(W), input_precision=TP), U, input_precision=TP)
        G = tl.load(dwhat_ptr + ((j * H + h) * BD + e[:, None]) * BD + d[None, :])
        for back in range(0, NCH):
            rows = (tok0 + back * C + r).to(tl.int64)
            off = (rows[:, None] * H + h) * D + d[None, :]
            tl.store(gs_ptr + blk + back * ROWS * BD + so, G)
            W = tl.load(w_ptr + off, mask=dmask, other=0.0).to(tl.float32)
            U = tl.load(u_ptr + off, mask=dmask, other=0.0)
            Kt = tl.load(kt_ptr + off, mask=dmask, other=0.0)
            dKJ = tl.load(dkj_ptr + (rows[:, None] * H + h) * D + e[None, :], mask=emask, other=0.0)
            dYl = -tl.dot(G, tl.trans(U), input_precision=TP)          # ROWS x C
            G = G + tl.dot(dYl, W, input_precision=TP) + tl.dot(tl.trans(dKJ), Kt, input_precision=TP)


@triton.jit
def bwd_transport_grads_kernel(
    w_ptr, u_ptr, dkj_ptr, suf_ptr, gs_ptr,
    dkt_ptr, dw_ptr, du_ptr,
    sc_tok0, sc_seq, seq_end,
    H: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, C: tl.constexpr, S: tl.constexpr,
    ROWS: tl.constexpr, TP: tl.constexpr,
):
    """The parallel half, per (super-chunk, UT chunk m, kv head): dU_m, dW_m, dK~_m summed over the row
    blocks of the states Suf_m, G_m that ``bwd_transport_chain_kernel`` stored, and STORED: the
    program owns chunk m's rows, and the accumulators are still zero (bwd_intra adds to them after).
    (One kernel with row-block programs had to add these C x D products atomically, once per row
    block: on the H200 the atomics were 45-68 % of its time.)"""
    j = tl.program_id(0)
    m = tl.program_id(1)
    h = tl.program_id(2)
    tok0 = tl.load(sc_tok0 + j)
    send = tl.load(seq_end + tl.load(sc_seq + j))
    if tok0 + S < send:
        NCH: tl.constexpr = S // C
        r = tl.arange(0, C)
        d = tl.arange(0, BD)
        dmask = (d < D)[None, :]
        rows = (tok0 + m * C + r).to(tl.int64)
        off = (rows[:, None] * H + h) * D + d[None, :]
        W = tl.load(w_ptr + off, mask=dmask, other=0.0).to(tl.float32)
        U = tl.load(u_ptr + off, mask=dmask, other=0.0)
        so = tl.arange(0, ROWS)[:, None] * BD + d[None, :]
        dU = tl.zeros((C, BD), dtype=tl.float32)
        dW = tl.zeros((C, BD), dtype=tl.float32)
        dKt = tl.zeros((C, BD), dtype=tl.float32)
        for rb in range(0, BD // ROWS):
            e = rb * ROWS + tl.arange(0, ROWS)
            blk = ((j * H + h) * (BD // ROWS) + rb).to(tl.int64) * NCH * ROWS * BD
            Sm = tl.load(suf_ptr + blk + (NCH - 1 - m) * ROWS * BD + so)
            Gm = tl.load(gs_ptr + blk + m * ROWS * BD + so)
            dKJ = tl.load(dkj_ptr + (rows[:, None] * H + h) * D + e[None, :], mask=(e < D)[None, :], other=0.0)
            Yl = tl.dot(Sm, tl.trans(W), input_precision=TP)           # ROWS x C
            dYl = -tl.dot(Gm, tl.trans(U), input_precision=TP)         # ROWS x C
            dU -= tl.dot(tl.trans(Yl), Gm, input_precision=TP)
            dW += tl.dot(tl.trans(dYl), Sm, input_precision=TP)
            dKt += tl.dot(dKJ, Sm, input_precision=TP)
        tl.store(du_ptr + off, dU, mask=dmask)
        tl.store(dw_ptr + off, dW, mask=dmask)
        tl.store(dkt_ptr + off, dKt, mask=dmask)
