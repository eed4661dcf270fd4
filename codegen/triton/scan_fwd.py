"""Stage `blockwise_scan` (+ `fox_gate`), forward: one program per (query UT chunk, query head).

Query chunk c lies in super-chunk I.  The program
  1. builds the boundary-adjusted queries X = Q - tril(Q W^T) U and the diagonal tile
     S = tril(Q K^T) - tril(Q W^T) M (causal inside the chunk);
  2. scans the earlier chunks of I right to left: logits X K~_m^T, online softmax,
     then X <- X - (X W_m^T) U_m (the chunk transition, low rank);
  3. scans earlier super-chunks J right to left: plain FlashAttention over the transported
     keys KJ in tiles of BLOCK_N, then X <- X What_J (dense D x D transition).
Logits are scaled into base 2 (exp2).  Outputs o and the natural-log lse.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._ops import mm


@triton.jit
def _softmax_step(s, m_i, l_i, acc, v, INTERP: tl.constexpr):
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + mm(p.to(v.dtype), v, INTERP)
    return m_new, l_i, acc


@triton.jit
def scan_fwd_kernel(
    q_ptr, k_ptr, v_ptr, w_ptr, u_ptr, m_ptr, kt_ptr, kj_ptr, what_ptr, gc_ptr,
    o_ptr, lse_ptr,
    chunk_tok0, chunk_seq, seq_start, seq_end, seq_sc_base,
    n_chunks, qk_scale, gate_scale,
    HQ: tl.constexpr, H: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    BD: tl.constexpr, BDV: tl.constexpr, C: tl.constexpr, S: tl.constexpr, BLOCK_N: tl.constexpr,
    DT: tl.constexpr, TP: tl.constexpr, USE_GATE: tl.constexpr, INTERP: tl.constexpr,
):
    # heaviest chunks (latest in their sequence) first
    n = n_chunks - 1 - tl.program_id(0)
    hq = tl.program_id(1)
    h = hq // (HQ // H)
    tok0 = tl.load(chunk_tok0 + n)
    sid = tl.load(chunk_seq + n)
    s0 = tl.load(seq_start + sid)
    send = tl.load(seq_end + sid)
    sc_base = tl.load(seq_sc_base + sid)
    c_idx = (tok0 - s0) // C
    sc_idx = c_idx // (S // C)
    first_chunk_of_sc = sc_idx * (S // C)

    r = tl.arange(0, C)
    d = tl.arange(0, BD)
    dv = tl.arange(0, BDV)
    dmask = (d < D)[None, :]
    dvmask = (dv < DV)[None, :]
    rows = (tok0 + r).to(tl.int64)
    rmask = rows < send

    koff = (rows[:, None] * H + h) * D + d[None, :]
    Q = tl.load(q_ptr + (rows[:, None] * HQ + hq) * D + d[None, :], mask=rmask[:, None] & dmask, other=0.0).to(DT)
    K = tl.load(k_ptr + koff, mask=rmask[:, None] & dmask, other=0.0).to(DT)
    W = tl.load(w_ptr + koff, mask=rmask[:, None] & dmask, other=0.0).to(DT)
    U = tl.load(u_ptr + koff, mask=rmask[:, None] & dmask, other=0.0).to(DT)
    M = tl.load(m_ptr + (rows[:, None] * H + h) * C + r[None, :], mask=rmask[:, None], other=0.0)
    V = tl.load(v_ptr + (rows[:, None] * H + h) * DV + dv[None, :], mask=rmask[:, None] & dvmask, other=0.0)

    causal = r[:, None] >= r[None, :]
    QW = tl.where(causal, mm(Q, tl.trans(W), INTERP), 0.0)
    X = Q.to(tl.float32) - mm(QW.to(DT), U, INTERP)
    s = mm(Q, tl.trans(K), INTERP) - tl.dot(QW, M, input_precision=TP)

    if USE_GATE:
        c_q = tl.load(gc_ptr + rows * HQ + hq, mask=rmask, other=0.0)
        s = s * qk_scale + (c_q[:, None] - c_q[None, :]) * gate_scale
    else:
        s = s * qk_scale
    s = tl.where(causal & rmask[None, :], s, float("-inf"))
    m_i = tl.max(s, axis=1)
    p = tl.exp2(s - m_i[:, None])
    l_i = tl.sum(p, axis=1)
    acc = mm(p.to(V.dtype), V, INTERP)

    # 2. earlier chunks of this super-chunk, right to left (chunk-level low-rank transitions)
    for step in range(0, c_idx - first_chunk_of_sc):
        cc = c_idx - 1 - step
        krows = (s0 + cc * C + r).to(tl.int64)
        kof = (krows[:, None] * H + h) * D + d[None, :]
        Kt = tl.load(kt_ptr + kof, mask=dmask, other=0.0).to(DT)
        Wm = tl.load(w_ptr + kof, mask=dmask, other=0.0).to(DT)
        Um = tl.load(u_ptr + kof, mask=dmask, other=0.0).to(DT)
        Vm = tl.load(v_ptr + (krows[:, None] * H + h) * DV + dv[None, :], mask=dvmask, other=0.0)
        Xd = X.to(DT)
        s = mm(Xd, tl.trans(Kt), INTERP) * qk_scale
        if USE_GATE:
            c_k = tl.load(gc_ptr + krows * HQ + hq)
            s += (c_q[:, None] - c_k[None, :]) * gate_scale
        m_i, l_i, acc = _softmax_step(s, m_i, l_i, acc, Vm, INTERP)
        XW = mm(Xd, tl.trans(Wm), INTERP)
        X = X - mm(XW.to(DT), Um, INTERP)

    # 3. earlier super-chunks, right to left (plain FlashAttention on transported keys)
    rn = tl.arange(0, BLOCK_N)
    for step in range(0, sc_idx):
        jj = sc_idx - 1 - step
        Xd = X.to(DT)
        for t0 in range(0, S, BLOCK_N):
            krows = (s0 + jj * S + t0 + rn).to(tl.int64)
            KJ = tl.load(kj_ptr + (krows[:, None] * H + h) * D + d[None, :], mask=dmask, other=0.0).to(DT)
            Vt = tl.load(v_ptr + (krows[:, None] * H + h) * DV + dv[None, :], mask=dvmask, other=0.0)
            sj = mm(Xd, tl.trans(KJ), INTERP) * qk_scale
            if USE_GATE:
                c_kj = tl.load(gc_ptr + krows * HQ + hq)
                sj += (c_q[:, None] - c_kj[None, :]) * gate_scale
            m_i, l_i, acc = _softmax_step(sj, m_i, l_i, acc, Vt, INTERP)
        Wh = tl.load(what_ptr + (((sc_base + jj) * H + h) * BD + d[:, None]) * BD + d[None, :])
        X = tl.dot(X, Wh, input_precision=TP)

    o = acc / l_i[:, None]
    tl.store(o_ptr + (rows[:, None] * HQ + hq) * DV + dv[None, :], o.to(o_ptr.dtype.element_ty),
             mask=rmask[:, None] & dvmask)
    lse = (m_i + tl.log2(l_i)) * 0.6931471805599453
    tl.store(lse_ptr + rows * HQ + hq, lse, mask=rmask)
