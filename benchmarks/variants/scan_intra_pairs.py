"""Candidate for stage `blockwise_scan`'s intra-super-chunk kernel: two query chunks per program.

Same signature, grid and outputs as ``codegen/triton/scan_fwd.py: scan_intra_kernel`` (one program per
(UT chunk, query head)), so a probe can swap it in.  Programs of even chunks (index inside the sequence)
that have a successor chunk exit at once; a program of an odd chunk b takes the pair (a = b - 1, b): both
diagonal tiles, b's step over a, then one walk over the earlier chunks of the super-chunk for both
chains, each key chunk's K~, W, U, V loaded once for the two.  The two chains are independent, so
their products can overlap (the single-chunk walk is a serial chain of M = 64 products).  The last
chunk of a sequence with an even index runs as a pair with an empty partner (rows past the end are
masked on store).
"""
from __future__ import annotations

import triton
import triton.language as tl

from pathtune.codegen.triton._ops import mm, tdot, tile_of
from pathtune.codegen.triton.scan_fwd import _softmax_step


@triton.jit
def _diagonal(q_ptr, k_ptr, v_ptr, w_ptr, u_ptr, m_ptr, gc_ptr, tok0, send, hq, h, qk_scale, gate_scale,
              HQ: tl.constexpr, H: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr,
              BDV: tl.constexpr, C: tl.constexpr, DT: tl.constexpr, TP: tl.constexpr, USE_GATE: tl.constexpr,
              INTERP: tl.constexpr):
    """One chunk's diagonal tile: the boundary-adjusted queries X, the softmax state (m, l, acc) and the
    gate cumsum of its rows (zeros without a gate)."""
    r = tl.arange(0, C)
    d = tl.arange(0, BD)
    dv = tl.arange(0, BDV)
    dmask = (d < D)[None, :]
    rows = (tok0 + r).to(tl.int64)
    rmask = rows < send
    koff = (rows[:, None] * H + h) * D + d[None, :]
    Q = tl.load(q_ptr + (rows[:, None] * HQ + hq) * D + d[None, :], mask=rmask[:, None] & dmask, other=0.0).to(DT)
    K = tl.load(k_ptr + koff, mask=rmask[:, None] & dmask, other=0.0).to(DT)
    W = tl.load(w_ptr + koff, mask=rmask[:, None] & dmask, other=0.0).to(DT)
    U = tl.load(u_ptr + koff, mask=rmask[:, None] & dmask, other=0.0).to(DT)
    M = tl.load(m_ptr + (rows[:, None] * H + h) * C + r[None, :], mask=rmask[:, None], other=0.0)
    V = tl.load(v_ptr + (rows[:, None] * H + h) * DV + dv[None, :], mask=rmask[:, None] & (dv < DV)[None, :],
                other=0.0)
    causal = r[:, None] >= r[None, :]
    QW = tl.where(causal, mm(Q, tl.trans(W), INTERP), 0.0)
    X = Q.to(tl.float32) - mm(QW.to(DT), U, INTERP)
    s = mm(Q, tl.trans(K), INTERP) - tdot(QW, M, TP, INTERP)
    if USE_GATE:
        c_q = tl.load(gc_ptr + rows * HQ + hq, mask=rmask, other=0.0)
        s = s * qk_scale + (c_q[:, None] - c_q[None, :]) * gate_scale
    else:
        c_q = tl.zeros((C,), dtype=tl.float32)
        s = s * qk_scale
    # every row keeps its own key: a chunk wholly past the sequence end (an empty partner) stays finite
    s = tl.where(causal & (rmask[None, :] | (r[:, None] == r[None, :])), s, float("-inf"))
    m_i = tl.max(s, axis=1)
    p = tl.exp2(s - m_i[:, None])
    return X, m_i, tl.sum(p, axis=1), mm(p.to(V.dtype), V, INTERP), c_q


@triton.jit
def _key_chunk(kt_ptr, w_ptr, u_ptr, v_ptr, gc_ptr, tok0, send, hq, h,
               HQ: tl.constexpr, H: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr,
               BDV: tl.constexpr, C: tl.constexpr, DT: tl.constexpr, USE_GATE: tl.constexpr):
    """K~, W, U (scan dtype), V and the gate cumsum (zeros without a gate) of the earlier chunk at tok0; rows
    past the sequence end (a pair's last, partial chunk a) read as 0."""
    r = tl.arange(0, C)
    d = tl.arange(0, BD)
    dv = tl.arange(0, BDV)
    krows = (tok0 + r).to(tl.int64)
    kmask = krows < send
    dmask = kmask[:, None] & (d < D)[None, :]
    kof = (krows[:, None] * H + h) * D + d[None, :]
    Kt = tl.load(kt_ptr + kof, mask=dmask, other=0.0).to(DT)
    Wm = tl.load(w_ptr + kof, mask=dmask, other=0.0).to(DT)
    Um = tl.load(u_ptr + kof, mask=dmask, other=0.0).to(DT)
    Vm = tl.load(v_ptr + (krows[:, None] * H + h) * DV + dv[None, :], mask=kmask[:, None] & (dv < DV)[None, :],
                 other=0.0)
    if USE_GATE:
        c_k = tl.load(gc_ptr + krows * HQ + hq, mask=kmask, other=0.0)
    else:
        c_k = tl.zeros((C,), dtype=tl.float32)
    return Kt, Wm, Um, Vm, c_k


@triton.jit
def _step(X, c_q, m_i, l_i, acc, Kt, Wm, Um, Vm, c_k, qk_scale, gate_scale, DT: tl.constexpr,
          USE_GATE: tl.constexpr, INTERP: tl.constexpr):
    """One chain's step over an earlier chunk: its logits into the online softmax, then the chunk
    transition X <- X - (X W^T) U."""
    Xd = X.to(DT)
    s = mm(Xd, tl.trans(Kt), INTERP) * qk_scale
    if USE_GATE:
        s += (c_q[:, None] - c_k[None, :]) * gate_scale
    m_i, l_i, acc = _softmax_step(s, m_i, l_i, acc, Vm, INTERP)
    return X - mm(mm(Xd, tl.trans(Wm), INTERP).to(DT), Um, INTERP), m_i, l_i, acc


@triton.jit
def _store(o_ptr, lse_ptr, x_ptr, X, m_i, l_i, acc, tok0, send, hq,
           HQ: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
           C: tl.constexpr, WRITE_X: tl.constexpr):
    r = tl.arange(0, C)
    d = tl.arange(0, BD)
    dv = tl.arange(0, BDV)
    rows = (tok0 + r).to(tl.int64)
    rmask = rows < send
    o = acc / l_i[:, None]
    tl.store(o_ptr + (rows[:, None] * HQ + hq) * DV + dv[None, :], o.to(o_ptr.dtype.element_ty),
             mask=rmask[:, None] & (dv < DV)[None, :])
    tl.store(lse_ptr + rows * HQ + hq, (m_i + tl.log2(l_i)) * 0.6931471805599453, mask=rmask)
    if WRITE_X:
        tl.store(x_ptr + (rows[:, None] * HQ + hq) * D + d[None, :], X, mask=rmask[:, None] & (d < D)[None, :])


@triton.jit
def scan_intra_pair_kernel(
    q_ptr, k_ptr, v_ptr, w_ptr, u_ptr, m_ptr, kt_ptr, gc_ptr,
    o_ptr, lse_ptr, x_ptr,
    chunk_tok0, chunk_seq, seq_start, seq_end,
    n_chunks, qk_scale, gate_scale,
    HQ: tl.constexpr, H: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    BD: tl.constexpr, BDV: tl.constexpr, C: tl.constexpr, S: tl.constexpr,
    DT: tl.constexpr, TP: tl.constexpr, USE_GATE: tl.constexpr, WRITE_X: tl.constexpr,
    INTERP: tl.constexpr,
):
    n = n_chunks - 1 - tl.program_id(0)     # heaviest chunks (latest in their super-chunk) first
    hq = tl.program_id(1)
    h = hq // (HQ // H)
    tok0, sid, s0, send = tile_of(n, chunk_tok0, chunk_seq, seq_start, seq_end)
    c_idx = (tok0 - s0) // C
    if (c_idx % 2 == 1) | (tok0 + C >= send):
        a_tok0 = tok0 - (c_idx % 2) * C
        b_tok0 = a_tok0 + C
        a_idx = (a_tok0 - s0) // C
        Xa, ma, la, acca, ca = _diagonal(q_ptr, k_ptr, v_ptr, w_ptr, u_ptr, m_ptr, gc_ptr, a_tok0, send, hq, h,
                                         qk_scale, gate_scale, HQ, H, D, DV, BD, BDV, C, DT, TP, USE_GATE, INTERP)
        Xb, mb, lb, accb, cb = _diagonal(q_ptr, k_ptr, v_ptr, w_ptr, u_ptr, m_ptr, gc_ptr, b_tok0, send, hq, h,
                                         qk_scale, gate_scale, HQ, H, D, DV, BD, BDV, C, DT, TP, USE_GATE, INTERP)
        # b's step over chunk a (the pair's off-diagonal block), then both chains over the earlier chunks of
        # the super-chunk, right to left, each key chunk loaded once for the two
        Kt, Wm, Um, Vm, c_k = _key_chunk(kt_ptr, w_ptr, u_ptr, v_ptr, gc_ptr, a_tok0, send, hq, h,
                                         HQ, H, D, DV, BD, BDV, C, DT, USE_GATE)
        Xb, mb, lb, accb = _step(Xb, cb, mb, lb, accb, Kt, Wm, Um, Vm, c_k, qk_scale, gate_scale, DT, USE_GATE, INTERP)
        first = (a_idx // (S // C)) * (S // C)
        for step in range(0, a_idx - first):
            k_tok0 = s0 + (a_idx - 1 - step) * C
            Kt, Wm, Um, Vm, c_k = _key_chunk(kt_ptr, w_ptr, u_ptr, v_ptr, gc_ptr, k_tok0, send, hq, h,
                                             HQ, H, D, DV, BD, BDV, C, DT, USE_GATE)
            Xa, ma, la, acca = _step(Xa, ca, ma, la, acca, Kt, Wm, Um, Vm, c_k, qk_scale, gate_scale, DT, USE_GATE,
                                     INTERP)
            Xb, mb, lb, accb = _step(Xb, cb, mb, lb, accb, Kt, Wm, Um, Vm, c_k, qk_scale, gate_scale, DT, USE_GATE,
                                     INTERP)
        _store(o_ptr, lse_ptr, x_ptr, Xa, ma, la, acca, a_tok0, send, hq, HQ, D, DV, BD, BDV, C, WRITE_X)
        _store(o_ptr, lse_ptr, x_ptr, Xb, mb, lb, accb, b_tok0, send, hq, HQ, D, DV, BD, BDV, C, WRITE_X)
