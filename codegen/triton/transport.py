"""Stage `blockwise_scan`, super-chunk level: one program per (super-chunk, kv head, row block).

Walks the super-chunk's UT chunks right to left with a running D x D matrix Suf (start I):
    KJ_m = K~_m Suf^T      keys transported to the END of the super-chunk
    Suf  = Suf P_m = Suf - (Suf W_m^T) U_m
and stores What_J = Suf = P_last ... P_first (D x D, float32).  Rows of Suf evolve
independently and column block r of KJ only needs row block r of Suf, so each program owns
ROWS rows of Suf (keeps D = 128 inside registers and shared memory).  K~, W and U may be
16-bit (a forward's state) or float32 (the backward's recompute); the products run at TP (``tdot``),
Suf stays float32.  Super-chunks that no
later query super-chunk reads (the last one of each sequence) are skipped.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._ops import tdot


@triton.jit
def superchunk_transport_kernel(
    kt_ptr, w_ptr, u_ptr,
    kj_ptr, what_ptr,
    sc_tok0, sc_seq, seq_end,
    H: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, C: tl.constexpr, S: tl.constexpr,
    ROWS: tl.constexpr, DT: tl.constexpr, TP: tl.constexpr, INTERP: tl.constexpr,
):
    j = tl.program_id(0)
    h = tl.program_id(1)
    rb = tl.program_id(2)
    tok0 = tl.load(sc_tok0 + j)
    send = tl.load(seq_end + tl.load(sc_seq + j))
    if tok0 + S < send:
        r = tl.arange(0, C)
        d = tl.arange(0, BD)
        e = rb * ROWS + tl.arange(0, ROWS)
        dmask = (d < D)[None, :]
        Suf = tl.where(e[:, None] == d[None, :], 1.0, 0.0)  # rows e of the identity
        for step in range(0, S // C):
            rows = (tok0 + (S // C - 1 - step) * C + r).to(tl.int64)
            off = (rows[:, None] * H + h) * D + d[None, :]
            Kt = tl.load(kt_ptr + off, mask=dmask, other=0.0)
            W = tl.load(w_ptr + off, mask=dmask, other=0.0)
            U = tl.load(u_ptr + off, mask=dmask, other=0.0)
            KJ = tdot(Kt, tl.trans(Suf), TP, INTERP)
            tl.store(kj_ptr + (rows[:, None] * H + h) * D + e[None, :], KJ.to(DT), mask=(e < D)[None, :])
            SW = tdot(Suf, tl.trans(W), TP, INTERP)
            Suf = Suf - tdot(SW, U, TP, INTERP)
        woff = ((j * H + h) * BD + e[:, None]) * BD + d[None, :]
        tl.store(what_ptr + woff, Suf)
