"""Backward preprocessing: one program per (query UT chunk, query head).

Computes delta = rowsum(dO * O) - dlse, the FlashAttention softmax-gradient term (dlse: the gradient of the
returned log-sum-exp, when the loss uses it), and with CHAIN recomputes Y_c, the chunk's queries carried to
the START of their super-chunk (Y = Q~_c P_{c-1} ... P_first, exactly the scan state when the forward leaves
the super-chunk; without CHAIN the backward reads the forward's own, or needs none).  The gate gradient dc
is not touched here: both of its sides are sums of the dS tiles the later kernels compute (see
``backward.py``).
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._ops import chunk_and_head, mm, tile_of


@triton.jit
def bwd_prep_kernel(
    q_ptr, w_ptr, u_ptr, o_ptr, do_ptr, dlse_ptr,
    y_ptr, delta_ptr,
    chunk_tok0, chunk_seq, seq_start, seq_end,
    HQ: tl.constexpr, H: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    BD: tl.constexpr, BDV: tl.constexpr, C: tl.constexpr, S: tl.constexpr,
    DT: tl.constexpr, INTERP: tl.constexpr, HAS_DLSE: tl.constexpr, CHAIN: tl.constexpr = True,
):
    n, hq = chunk_and_head(HQ)
    h = hq // (HQ // H)
    tok0, sid, s0, send = tile_of(n, chunk_tok0, chunk_seq, seq_start, seq_end)
    c_idx = (tok0 - s0) // C
    first = (c_idx // (S // C)) * (S // C)

    r = tl.arange(0, C)
    dv = tl.arange(0, BDV)
    rows = (tok0 + r).to(tl.int64)
    rmask = rows < send

    ov = (rows[:, None] * HQ + hq) * DV + dv[None, :]
    ovmask = rmask[:, None] & (dv < DV)[None, :]
    o = tl.load(o_ptr + ov, mask=ovmask, other=0.0).to(tl.float32)
    do = tl.load(do_ptr + ov, mask=ovmask, other=0.0).to(tl.float32)
    delta = tl.sum(o * do, axis=1)
    if HAS_DLSE:
        # d lse_i / d S_ij = p_ij, so a gradient on lse enters dS = p (dp - delta) as -dlse in delta
        dlse = tl.load(dlse_ptr + rows * HQ + hq, mask=rmask, other=0.0)
        delta -= dlse
    tl.store(delta_ptr + rows * HQ + hq, delta, mask=rmask)
    if CHAIN:
        _queries_at_superchunk_start(q_ptr, w_ptr, u_ptr, y_ptr, rows, rmask, hq, h, c_idx, first, s0,
                                     HQ, H, D, BD, C, DT, INTERP)


@triton.jit
def _queries_at_superchunk_start(q_ptr, w_ptr, u_ptr, y_ptr, rows, rmask, hq, h, c_idx, first, s0,
                                 HQ: tl.constexpr, H: tl.constexpr, D: tl.constexpr, BD: tl.constexpr,
                                 C: tl.constexpr, DT: tl.constexpr, INTERP: tl.constexpr):
    """Y of the program's query rows: Q~ by the chunk's boundary adjustment, then the chain over the earlier
    chunks of the super-chunk (first .. c_idx - 1, right to left), stored into y_ptr."""
    r = tl.arange(0, C)
    d = tl.arange(0, BD)
    dmask = (d < D)[None, :]
    koff = (rows[:, None] * H + h) * D + d[None, :]
    Q = tl.load(q_ptr + (rows[:, None] * HQ + hq) * D + d[None, :], mask=rmask[:, None] & dmask, other=0.0).to(DT)
    W = tl.load(w_ptr + koff, mask=rmask[:, None] & dmask, other=0.0).to(DT)
    U = tl.load(u_ptr + koff, mask=rmask[:, None] & dmask, other=0.0).to(DT)
    causal = r[:, None] >= r[None, :]
    QW = tl.where(causal, mm(Q, tl.trans(W), INTERP), 0.0)
    X = Q.to(tl.float32) - mm(QW.to(DT), U, INTERP)
    for step in range(0, c_idx - first):
        cc = c_idx - 1 - step
        krows = (s0 + cc * C + r).to(tl.int64)
        kof = (krows[:, None] * H + h) * D + d[None, :]
        Wm = tl.load(w_ptr + kof, mask=dmask, other=0.0).to(DT)
        Um = tl.load(u_ptr + kof, mask=dmask, other=0.0).to(DT)
        XW = mm(X.to(DT), tl.trans(Wm), INTERP)
        X = X - mm(XW.to(DT), Um, INTERP)
    tl.store(y_ptr + (rows[:, None] * HQ + hq) * D + d[None, :], X, mask=rmask[:, None] & dmask)
