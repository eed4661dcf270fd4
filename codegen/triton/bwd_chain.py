"""Backward through the transitions: super-chunk chain, then the key transport inside one.

``bwd_superchunk_chain_kernel`` (per sequence, kv head) turns dOm_{I,J} into dWhat_K:
    dWhat_K = sum_{I>K>J} Om_{I,K}^T dOm_{I,J} Om_{K,J}^T
computed per I with L_{I,K} = sum_{J<K} dOm_{I,J} Om_{K,J}^T  (L_{I,K+1} = L_{I,K} What_K^T + dOm_{I,K},
written over dOm in place) and then dWhat_K += Om_{I,K}^T L_{I,K} walking K right to left with
Om_{I,K-1} = Om_{I,K} What_K.  O(N_S^2) D x D products, N_S = super-chunks per sequence.

``bwd_transport_kernel`` (per super-chunk, kv head, row block of Suf) reverses
``superchunk_transport_kernel``: it replays the right-to-left walk to store the states Suf_m,
then walks left to right accumulating dSuf and emits dK~, dW, dU (atomic adds: row blocks
of one chunk land on the same rows).
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
def bwd_transport_kernel(
    kt_ptr, w_ptr, u_ptr, dkj_ptr, dwhat_ptr,
    dkt_ptr, dw_ptr, du_ptr, scratch_ptr,
    sc_tok0, sc_seq, seq_end,
    H: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, C: tl.constexpr, S: tl.constexpr,
    ROWS: tl.constexpr, TP: tl.constexpr,
):
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
        base = scratch_ptr + ((j * H + h) * (BD // ROWS) + rb).to(tl.int64) * NCH * ROWS * BD
        so = tl.arange(0, ROWS)[:, None] * BD + d[None, :]
        Suf = tl.where(e[:, None] == d[None, :], 1.0, 0.0)
        for step in range(0, NCH):
            rows = (tok0 + (NCH - 1 - step) * C + r).to(tl.int64)
            off = (rows[:, None] * H + h) * D + d[None, :]
            tl.store(base + step * ROWS * BD + so, Suf)
            W = tl.load(w_ptr + off, mask=dmask, other=0.0).to(tl.float32)
            U = tl.load(u_ptr + off, mask=dmask, other=0.0)
            Suf = Suf - tl.dot(tl.dot(Suf, tl.trans(W), input_precision=TP), U, input_precision=TP)
        tl.debug_barrier()
        G = tl.load(dwhat_ptr + ((j * H + h) * BD + e[:, None]) * BD + d[None, :])
        for back in range(0, NCH):
            step = NCH - 1 - back
            rows = (tok0 + back * C + r).to(tl.int64)
            off = (rows[:, None] * H + h) * D + d[None, :]
            Sm = tl.load(base + step * ROWS * BD + so)
            W = tl.load(w_ptr + off, mask=dmask, other=0.0).to(tl.float32)
            U = tl.load(u_ptr + off, mask=dmask, other=0.0)
            Kt = tl.load(kt_ptr + off, mask=dmask, other=0.0)
            dKJ = tl.load(dkj_ptr + (rows[:, None] * H + h) * D + e[None, :], mask=emask, other=0.0)
            Yl = tl.dot(Sm, tl.trans(W), input_precision=TP)           # ROWS x C
            dYl = -tl.dot(G, tl.trans(U), input_precision=TP)          # ROWS x C
            tl.atomic_add(du_ptr + off, -tl.dot(tl.trans(Yl), G, input_precision=TP), mask=dmask)
            tl.atomic_add(dw_ptr + off, tl.dot(tl.trans(dYl), Sm, input_precision=TP), mask=dmask)
            tl.atomic_add(dkt_ptr + off, tl.dot(dKJ, Sm, input_precision=TP), mask=dmask)
            G = G + tl.dot(dYl, W, input_precision=TP) + tl.dot(tl.trans(dKJ), Kt, input_precision=TP)
