"""Backward inside one super-chunk: one program per (query UT chunk c, query head).

For query chunk c of super-chunk I the forward chain inside I was X_c = Q~_c,
X_{m-1} = X_m P_m (m = c-1 .. first) with logits X_m K~_m^T, ending in Y_c = X_{first-1},
whose gradient dY_c the inter kernels produced.  Reverse mode walks m left to right carrying
G = dX_{m-1}; the states X_m it needs come from one right-to-left pass from Q~_c (the forward's
own chain, the same float32 operations) that parks each X_m, in the scan dtype it is used in,
in a per-program scratch slot; the reverse walk reads them back.  (Recomputing X_m from Q~_c
for every m instead took O(s^2) chunk transitions per query chunk -- at s = 16 chunks per
super-chunk about as many products as the whole backward step itself.)  Then the diagonal tile
S = tril(Q K^T) - tril(Q W^T) M and Q~ = Q - tril(Q W^T) U give dq (final, owned here).
The key-side gradients dK~, dU, dW, dM, dK, dV, dc of chunk m are shared by every later query
chunk of I (and every query head of a GQA group): they are added with atomics.  (One program
per super-chunk owned them without atomics but left the H200 with 512 serial programs at
32K tokens: 12.9 ms, the largest cost of the backward at T=4096.)  Both sides of dc are sums of
the same dS tiles: a key's column sums (atomics, as above) and a query row's row sums over its keys of this
super-chunk (one atomic vector add a walk step and one in the diagonal tile: summed in registers over the walk
instead, offline sm_90 spilled 1328 B per thread at D 128 against 792), so that dg = sum over i >= l of
(row sum - column sum) is exactly the cross-term sum of these dS values.
(The query side as d lse_i, which the row sums equal in exact arithmetic, left dg the rounding error of o in
delta summed over the rest of the sequence: 83 % of dg's error at D 128, T 2K.)

``bwd_intra_walk_pairs_kernel`` (the knob bwd_walk_chunks 2) walks two query chunks per program: positions 2p and
2p + 1 of a super-chunk (adjacent tokens) stacked as one tile of 2C rows, their chains being independent rows.
Each step's query-side products run on 2C rows (two warpgroups at 8 warps) and the key-side ones reduce over both
chains inside the product (K = 2C), so a key chunk's gradients are added once per pair: half the atomic traffic
per query row (offline at D 128, sm_90: also 0.86x the instructions and 0.28x the local memory traffic per query
row of the one-chunk walk, PaTH-FoX).  The pair walks m = 0 .. 2p; at m = 2p (the lower chain's own chunk, the
diagonal kernel's) the lower rows are masked out of p and keep their G.  Its chain states use the two chunks'
scratch slots (adjacent: 4p + 1 slots from chunk 2p's first): 2C-row blocks for m < 2p, the upper chain's C rows
at m = 2p.  The programs of odd positions end at once (same grid and arguments as the one-chunk walk); a last
chunk without a partner (an odd chunk count, or the sequence's end) walks alone with the upper rows masked.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._ops import chunk_and_head, mm, tile_of


@triton.jit
def ones_column(N: tl.constexpr, DT: tl.constexpr):
    """An [N, 16] tile of DT with ones in column 0, zeros after: x @ ones_column(K, DT) holds x's row sums in its
    column 0 (the backward's sums of dS for the gate gradient, on the MMA's 16 columns).  Here, not in
    gate_bias.py, which the forward's records are keyed by."""
    return ((tl.arange(0, N)[:, None] >= 0) & (tl.arange(0, 16)[None, :] == 0)).to(DT)


@triton.jit
def _acc(ptr, val, mask=None):
    tl.atomic_add(ptr, val, mask=mask, sem="relaxed")


@triton.jit
def _chunk_position(chunk_tok0, chunk_seq, seq_start, seq_end, HQ: tl.constexpr, C: tl.constexpr, S: tl.constexpr):
    """This program's query chunk n and head hq, the chunk's first token, its sequence's end and ci, the chunk's
    position in its super-chunk."""
    n, hq = chunk_and_head(HQ)
    tok0, _sid, s0, send = tile_of(n, chunk_tok0, chunk_seq, seq_start, seq_end)
    return n, hq, tok0, send, ((tok0 - s0) // C) % (S // C)


@triton.jit
def _program_tile(chunk_tok0, chunk_seq, seq_start, seq_end,
                  HQ: tl.constexpr, H: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
                  BD: tl.constexpr, BDV: tl.constexpr, C: tl.constexpr, S: tl.constexpr):
    """This program's query chunk and head: (hq, h, ci = the chunk's position in its super-chunk, tokI =
    the super-chunk's first token, rows, rmask, dmask, dvmask, m2, koff, qoff, voff)."""
    n, hq, tok0, send, ci = _chunk_position(chunk_tok0, chunk_seq, seq_start, seq_end, HQ, C, S)
    h = hq // (HQ // H)
    tokI = tok0 - ci * C
    r = tl.arange(0, C)
    d = tl.arange(0, BD)
    dv = tl.arange(0, BDV)
    dmask = (d < D)[None, :]
    dvmask = (dv < DV)[None, :]
    rows = (tok0 + r).to(tl.int64)
    rmask = rows < send
    m2 = rmask[:, None] & dmask
    koff = (rows[:, None] * H + h) * D + d[None, :]
    qoff = (rows[:, None] * HQ + hq) * D + d[None, :]
    voff = (rows[:, None] * H + h) * DV + dv[None, :]
    return n, hq, h, ci, tokI, rows, rmask, dmask, dvmask, m2, koff, qoff, voff


@triton.jit
def _row_stats(do_ptr, lse_ptr, delta_ptr, gc_h, rows, rmask, dvmask, hq, gate_scale,
               HQ: tl.constexpr, DV: tl.constexpr, BDV: tl.constexpr, USE_GATE: tl.constexpr):
    """dO, lse (base 2), delta and the gate cumsum times gate_scale (zeros without the gate) of the
    program's query rows (gc_h: head hq's row of the head-major gate cumsum).  With the gate the lse
    comes shifted by the row's gate offset, lse2 - c_q * gate_scale: a logit's bias (c_q - c_k) *
    gate_scale is then one subtraction of the key's offset, exp2(s * qk_scale - c_k * gate_scale - lse2)."""
    dv = tl.arange(0, BDV)
    dO = tl.load(do_ptr + (rows[:, None] * HQ + hq) * DV + dv[None, :], mask=rmask[:, None] & dvmask, other=0.0)
    lse2 = tl.load(lse_ptr + rows * HQ + hq, mask=rmask, other=0.0) * 1.4426950408889634
    delta = tl.load(delta_ptr + rows * HQ + hq, mask=rmask, other=0.0)
    if USE_GATE:
        cq_s = tl.load(gc_h + rows, mask=rmask, other=0.0) * gate_scale
        lse2 -= cq_s
    else:
        cq_s = tl.zeros_like(delta)
    return dO, lse2, delta, cq_s


@triton.jit
def _transition(X, w_ptr, u_ptr, t0, h, H: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, C: tl.constexpr,
                DT: tl.constexpr, INTERP: tl.constexpr):
    """X P_m = X - (X W_m^T) U_m for the chunk of tokens t0 .. t0 + C."""
    r = tl.arange(0, C)
    d = tl.arange(0, BD)
    dmask = (d < D)[None, :]
    toff = (((t0 + r).to(tl.int64))[:, None] * H + h) * D + d[None, :]
    Wt = tl.load(w_ptr + toff, mask=dmask, other=0.0).to(DT)
    Ut = tl.load(u_ptr + toff, mask=dmask, other=0.0).to(DT)
    return X - mm(mm(X.to(DT), tl.trans(Wt), INTERP).to(DT), Ut, INTERP)


@triton.jit
def _walk_step(G, Xd, act, LAST: tl.constexpr, k0, dO, lse2, delta, h, hq, rows,
               v_ptr, w_ptr, u_ptr, kt_ptr, gc_h, dv_ptr, dw_ptr, du_ptr, dkt_ptr, dc_h,
               qk_scale, gate_scale, scale, gate_nat,
               H: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
               C: tl.constexpr, DT: tl.constexpr, USE_GATE: tl.constexpr, INTERP: tl.constexpr,
               GATE_SUM_MMA: tl.constexpr = False):
    """One step of a walk over key chunk k0 .. k0 + C for the query rows of Xd (one chunk, or two stacked): the key
    side's gradients added, the carried G returned.  ``act``: the rows with a step here (their X rows, zero
    elsewhere, come in Xd); LAST: rows outside it keep their G (the lower chain at the upper one's extra step).
    GATE_SUM_MMA (knob bwd_gate_sums product): the gate's two sums of dS (over its rows for the keys, over its
    columns for the queries) as products of the 16-bit dS the key-side products take with a ones column, instead of
    two reductions across the tile's warps."""
    r = tl.arange(0, C)
    d = tl.arange(0, BD)
    dv = tl.arange(0, BDV)
    dmask = (d < D)[None, :]
    dvmask = (dv < DV)[None, :]
    krows = (k0 + r).to(tl.int64)
    kof = (krows[:, None] * H + h) * D + d[None, :]
    kvof = (krows[:, None] * H + h) * DV + dv[None, :]
    Kt = tl.load(kt_ptr + kof, mask=dmask, other=0.0).to(DT)
    Wm = tl.load(w_ptr + kof, mask=dmask, other=0.0).to(DT)
    Um = tl.load(u_ptr + kof, mask=dmask, other=0.0).to(DT)
    Vm = tl.load(v_ptr + kvof, mask=dvmask, other=0.0)
    Gd = G.to(DT)
    # the chain step X_{m-1} = X_m - (X_m W_m^T) U_m, G = dX_{m-1}; each product's atomic add follows it, so that no
    # finished C x D gradient stays live through the next products.  Rows without a step have Xd = 0, so their G
    # enters no key-side product (dU through Yl, dW through Xd)
    Yl = mm(Xd, tl.trans(Wm), INTERP)
    _acc(du_ptr + kof, -mm(tl.trans(Yl.to(DT)), Gd, INTERP), dmask)
    dYl = (-mm(Gd, tl.trans(Um), INTERP)).to(DT)
    _acc(dw_ptr + kof, mm(tl.trans(dYl), Xd, INTERP), dmask)
    dX = G + mm(dYl, Wm, INTERP)
    # logits of key chunk m
    s = mm(Xd, tl.trans(Kt), INTERP) * qk_scale
    if USE_GATE:    # the key's gate offset (the query's is in lse2: _row_stats)
        s -= (tl.load(gc_h + krows) * gate_scale)[None, :]
    p = tl.where(act[:, None], tl.exp2(s - lse2[:, None]), 0.0)
    _acc(dv_ptr + kvof, mm(tl.trans(p).to(Vm.dtype), dO, INTERP), dvmask)
    dp = mm(dO, tl.trans(Vm), INTERP)
    ds = p * (dp - delta[:, None])
    dsd = (ds * scale).to(DT)
    dX += mm(dsd, Kt, INTERP)
    dsdT = tl.trans(dsd)
    _acc(dkt_ptr + kof, mm(dsdT, Xd, INTERP), dmask)
    if USE_GATE:
        if GATE_SUM_MMA:    # column 0 of dS^T E (column sums) and dS E (row sums), E a ones column; dsd is dS * scale
            nat = gate_nat / scale
            _acc(dc_h + krows, -tl.sum(mm(dsdT, ones_column(Xd.shape[0], DT), INTERP), axis=1) * nat)
            _acc(dc_h + rows, tl.sum(mm(dsd, ones_column(C, DT), INTERP), axis=1) * nat, act)
        else:
            _acc(dc_h + krows, -tl.sum(ds, axis=0) * gate_nat)
            _acc(dc_h + rows, tl.sum(ds, axis=1) * gate_nat, act)
    if LAST:
        dX = tl.where(act[:, None], dX, G)
    return dX


@triton.jit
def bwd_intra_walk_kernel(
    q_ptr, k_ptr, v_ptr, w_ptr, u_ptr, m_ptr, kt_ptr, gc_ptr, do_ptr, lse_ptr, delta_ptr, dy_ptr,
    dq_ptr, dk_ptr, dv_ptr, dw_ptr, du_ptr, dm_ptr, dkt_ptr, dc_ptr, xs_ptr,
    chunk_tok0, chunk_seq, seq_start, seq_end,
    n_chunks, qk_scale, gate_scale, scale, gate_nat, gc_hs,
    HQ: tl.constexpr, H: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    BD: tl.constexpr, BDV: tl.constexpr, C: tl.constexpr, S: tl.constexpr,
    DT: tl.constexpr, TP: tl.constexpr, USE_GATE: tl.constexpr, INTERP: tl.constexpr,
    GATE_SUM_MMA: tl.constexpr = False,
):
    n, hq, h, ci, tokI, rows, rmask, dmask, dvmask, m2, koff, qoff, voff = _program_tile(
        chunk_tok0, chunk_seq, seq_start, seq_end, HQ, H, D, DV, BD, BDV, C, S)
    r = tl.arange(0, C)
    d = tl.arange(0, BD)
    causal = r[:, None] >= r[None, :]
    gc_h = gc_ptr + hq.to(tl.int64) * gc_hs     # gc, dc [HQ, gc_hs] head-major: this head's rows
    dc_h = dc_ptr + hq.to(tl.int64) * gc_hs
    dO, lse2, delta, cq_s = _row_stats(do_ptr, lse_ptr, delta_ptr, gc_h, rows, rmask, dvmask, hq, gate_scale,
                                       HQ, DV, BDV, USE_GATE)
    Q = tl.load(q_ptr + qoff, mask=m2, other=0.0).to(DT)
    Wc = tl.load(w_ptr + koff, mask=m2, other=0.0).to(DT)
    Uc = tl.load(u_ptr + koff, mask=m2, other=0.0).to(DT)
    QW = tl.where(causal, mm(Q, tl.trans(Wc), INTERP), 0.0)
    Xc = Q.to(tl.float32) - mm(QW.to(DT), Uc, INTERP)
    # the chain states X_m (m = ci-1 .. 0) of this query chunk, parked in its scratch slots:
    # S // (2C) slots per chunk and query head; a super-chunk of s' chunks starting at chunk n - ci
    # needs s' (s' - 1) / 2 of its s' * S // (2C), chunk ci the ci slots from ci (ci - 1) / 2 on
    slot0 = (hq * n_chunks + n - ci).to(tl.int64) * (S // (2 * C)) + ci * (ci - 1) // 2
    xs = xs_ptr + slot0 * C * BD
    xso = r[:, None] * BD + d[None, :]
    X = Xc
    for t in range(0, ci):
        tm = ci - 1 - t
        tl.store(xs + tm * C * BD + xso, X.to(DT))
        if t < ci - 1:
            X = _transition(X, w_ptr, u_ptr, tokI + tm * C, h, H, D, BD, C, DT, INTERP)
    tl.debug_barrier()
    G = tl.load(dy_ptr + qoff, mask=m2, other=0.0)
    for mi in range(0, ci):
        G = _walk_step(G, tl.load(xs + mi * C * BD + xso), rmask, False, tokI + mi * C, dO, lse2, delta, h, hq,
                       rows, v_ptr, w_ptr, u_ptr, kt_ptr, gc_h, dv_ptr, dw_ptr, du_ptr, dkt_ptr, dc_h,
                       qk_scale, gate_scale, scale, gate_nat, H, D, DV, BD, BDV, C, DT, USE_GATE, INTERP,
                       GATE_SUM_MMA)
    # G to the diagonal kernel in dY's storage (this program's tile, read above)
    tl.store(dy_ptr + qoff, G, mask=m2 & (ci > 0))


@triton.jit
def _pair_walk(
    q_ptr, v_ptr, w_ptr, u_ptr, kt_ptr, gc_ptr, do_ptr, lse_ptr, delta_ptr, dy_ptr,
    dv_ptr, dw_ptr, du_ptr, dkt_ptr, dc_ptr, xs_ptr,
    n, hq, tok0, send, ci, n_chunks, qk_scale, gate_scale, scale, gate_nat, gc_hs,
    HQ: tl.constexpr, H: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    BD: tl.constexpr, BDV: tl.constexpr, C: tl.constexpr, S: tl.constexpr,
    DT: tl.constexpr, USE_GATE: tl.constexpr, INTERP: tl.constexpr, GATE_SUM_MMA: tl.constexpr,
):
    """The walk of the query chunks at positions ci (even) and ci + 1 of their super-chunk, stacked (module
    docstring)."""
    h = hq // (HQ // H)
    R2: tl.constexpr = 2 * C
    r2 = tl.arange(0, R2)
    d = tl.arange(0, BD)
    dv = tl.arange(0, BDV)
    dmask = (d < D)[None, :]
    dvmask = (dv < DV)[None, :]
    lower = r2 < C                       # rows of chunk position ci; the others are position ci + 1's
    # the upper chunk exists: inside the super-chunk and the sequence (then chunk ci is whole, and its rows can be
    # loaded as a key chunk without row masks)
    has_upper = (ci + 1 < S // C) & (tok0 + C < send)
    rows = (tok0 + r2).to(tl.int64)
    rmask = (rows < send) & (lower | has_upper)
    m2 = rmask[:, None] & dmask
    qoff = (rows[:, None] * HQ + hq) * D + d[None, :]
    koff = (rows[:, None] * H + h) * D + d[None, :]
    tokI = tok0 - ci * C
    gc_h = gc_ptr + hq.to(tl.int64) * gc_hs
    dc_h = dc_ptr + hq.to(tl.int64) * gc_hs
    dO, lse2, delta, cq_s = _row_stats(do_ptr, lse_ptr, delta_ptr, gc_h, rows, rmask, dvmask, hq, gate_scale,
                                       HQ, DV, BDV, USE_GATE)
    # each chunk's boundary adjustment Q~ = Q - tril(Q W^T) U, on the stacked tile (the causal mask keeps the two
    # chunks apart)
    Q = tl.load(q_ptr + qoff, mask=m2, other=0.0).to(DT)
    Wc = tl.load(w_ptr + koff, mask=m2, other=0.0).to(DT)
    Uc = tl.load(u_ptr + koff, mask=m2, other=0.0).to(DT)
    same = (r2[:, None] // C == r2[None, :] // C) & (r2[:, None] >= r2[None, :])
    QW = tl.where(same, mm(Q, tl.trans(Wc), INTERP), 0.0)
    X = Q.to(tl.float32) - mm(QW.to(DT), Uc, INTERP)
    # the pair's scratch: chunk ci's slots and chunk ci + 1's, adjacent (2 ci + 1 slots of C rows): the stacked
    # state of step m < ci in slots 2m, 2m + 1, the upper chain's state of step ci in slot 2 ci
    slot0 = (hq * n_chunks + n - ci).to(tl.int64) * (S // (2 * C)) + ci * (ci - 1) // 2
    xs = xs_ptr + slot0 * C * BD
    xso = r2[:, None] * BD + d[None, :]
    # step ci: the upper chain's state alone (slot 2 ci); the lower chain starts at ci - 1 from its own Q~
    tl.store(xs + (2 * ci * C - C) * BD + xso, X.to(DT), mask=((~lower) & has_upper)[:, None])
    if (ci > 0) & has_upper:
        X = tl.where(lower[:, None], X, _transition(X, w_ptr, u_ptr, tokI + ci * C, h, H, D, BD, C, DT, INTERP))
    for t in range(1, ci + 1):
        tm = ci - t
        tl.store(xs + 2 * tm * C * BD + xso, X.to(DT))
        if tm > 0:
            X = _transition(X, w_ptr, u_ptr, tokI + tm * C, h, H, D, BD, C, DT, INTERP)
    tl.debug_barrier()
    G = tl.load(dy_ptr + qoff, mask=m2, other=0.0)
    for mi in range(0, ci):      # both chains step (rows past the sequence's end stay zero)
        G = _walk_step(G, tl.load(xs + 2 * mi * C * BD + xso), rmask, False, tokI + mi * C, dO, lse2, delta, h, hq,
                       rows, v_ptr, w_ptr, u_ptr, kt_ptr, gc_h, dv_ptr, dw_ptr, du_ptr, dkt_ptr, dc_h,
                       qk_scale, gate_scale, scale, gate_nat, H, D, DV, BD, BDV, C, DT, USE_GATE, INTERP,
                       GATE_SUM_MMA)
    if has_upper:    # step ci: the upper chain only
        act = rmask & ~lower
        Xd = tl.load(xs + (2 * ci * C - C) * BD + xso, mask=act[:, None], other=0.0)
        G = _walk_step(G, Xd, act, True, tokI + ci * C, dO, lse2, delta, h, hq,
                       rows, v_ptr, w_ptr, u_ptr, kt_ptr, gc_h, dv_ptr, dw_ptr, du_ptr, dkt_ptr, dc_h,
                       qk_scale, gate_scale, scale, gate_nat, H, D, DV, BD, BDV, C, DT, USE_GATE, INTERP,
                       GATE_SUM_MMA)
    # both chains' carried gradients to the diagonal kernel in dY's storage (a chain without steps stores back what
    # it read)
    tl.store(dy_ptr + qoff, G, mask=m2)


@triton.jit
def bwd_intra_walk_pairs_kernel(
    q_ptr, k_ptr, v_ptr, w_ptr, u_ptr, m_ptr, kt_ptr, gc_ptr, do_ptr, lse_ptr, delta_ptr, dy_ptr,
    dq_ptr, dk_ptr, dv_ptr, dw_ptr, du_ptr, dm_ptr, dkt_ptr, dc_ptr, xs_ptr,
    chunk_tok0, chunk_seq, seq_start, seq_end,
    n_chunks, qk_scale, gate_scale, scale, gate_nat, gc_hs,
    HQ: tl.constexpr, H: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    BD: tl.constexpr, BDV: tl.constexpr, C: tl.constexpr, S: tl.constexpr,
    DT: tl.constexpr, TP: tl.constexpr, USE_GATE: tl.constexpr, INTERP: tl.constexpr,
    GATE_SUM_MMA: tl.constexpr = False,
):
    """``bwd_intra_walk_kernel`` for two query chunks at once (bwd_walk_chunks 2; module docstring): on the same
    grid, the program of an even chunk position walks its chunk and the next one stacked, that of an odd one
    ends at once."""
    n, hq, tok0, send, ci = _chunk_position(chunk_tok0, chunk_seq, seq_start, seq_end, HQ, C, S)
    if ci % 2 == 0:
        _pair_walk(q_ptr, v_ptr, w_ptr, u_ptr, kt_ptr, gc_ptr, do_ptr, lse_ptr, delta_ptr, dy_ptr,
                   dv_ptr, dw_ptr, du_ptr, dkt_ptr, dc_ptr, xs_ptr,
                   n, hq, tok0, send, ci, n_chunks, qk_scale, gate_scale, scale, gate_nat, gc_hs,
                   HQ, H, D, DV, BD, BDV, C, S, DT, USE_GATE, INTERP, GATE_SUM_MMA)


@triton.jit
def bwd_intra_diag_kernel(
    q_ptr, k_ptr, v_ptr, w_ptr, u_ptr, m_ptr, kt_ptr, gc_ptr, do_ptr, lse_ptr, delta_ptr, dy_ptr,
    dq_ptr, dk_ptr, dv_ptr, dw_ptr, du_ptr, dm_ptr, dkt_ptr, dc_ptr, xs_ptr,
    chunk_tok0, chunk_seq, seq_start, seq_end,
    n_chunks, qk_scale, gate_scale, scale, gate_nat, gc_hs,
    HQ: tl.constexpr, H: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    BD: tl.constexpr, BDV: tl.constexpr, C: tl.constexpr, S: tl.constexpr,
    DT: tl.constexpr, TP: tl.constexpr, USE_GATE: tl.constexpr, INTERP: tl.constexpr,
):
    _n, hq, h, _ci, _tokI, rows, rmask, dmask, dvmask, m2, koff, qoff, voff = _program_tile(
        chunk_tok0, chunk_seq, seq_start, seq_end, HQ, H, D, DV, BD, BDV, C, S)
    r = tl.arange(0, C)
    causal = r[:, None] >= r[None, :]
    gc_h = gc_ptr + hq.to(tl.int64) * gc_hs     # gc, dc [HQ, gc_hs] head-major: this head's rows
    dc_h = dc_ptr + hq.to(tl.int64) * gc_hs
    dO, lse2, delta, cq_s = _row_stats(do_ptr, lse_ptr, delta_ptr, gc_h, rows, rmask, dvmask, hq, gate_scale,
                                       HQ, DV, BDV, USE_GATE)
    # the diagonal tile and the boundary adjustment of the queries; as in the walk, each gradient's
    # atomic add (or store) follows its product and each operand is loaded where it is needed: the walk's
    # carried G right before dQ and M again (an L2 hit) for dQW, instead of both live through every
    # product (sm_90, 4 warps: spills 1368 -> 352 B per thread at D 64, 1632 -> 640 B at D 128; on the
    # H200 0.77-0.83x the time)
    Q = tl.load(q_ptr + qoff, mask=m2, other=0.0).to(DT)
    Wc = tl.load(w_ptr + koff, mask=m2, other=0.0).to(DT)
    QW = tl.where(causal, mm(Q, tl.trans(Wc), INTERP), 0.0)
    M = tl.load(m_ptr + (rows[:, None] * H + h) * C + r[None, :], mask=rmask[:, None], other=0.0)
    K = tl.load(k_ptr + koff, mask=m2, other=0.0).to(DT)
    s = mm(Q, tl.trans(K), INTERP) - tl.dot(QW, M, input_precision=TP)
    s = s * qk_scale
    if USE_GATE:    # the keys' gate offsets (the queries' are in lse2: _row_stats)
        s -= cq_s[None, :]
    p = tl.where(causal & rmask[:, None] & rmask[None, :], tl.exp2(s - lse2[:, None]), 0.0)
    _acc(dv_ptr + voff, mm(tl.trans(p).to(dO.dtype), dO, INTERP), rmask[:, None] & dvmask)
    Vc = tl.load(v_ptr + voff, mask=rmask[:, None] & dvmask, other=0.0)
    ds = p * (mm(dO, tl.trans(Vc), INTERP) - delta[:, None])
    dsr = ds * scale
    if USE_GATE:    # both sides of dc (the tile's keys and its queries are the same rows)
        _acc(dc_h + rows, -tl.sum(ds, axis=0) * gate_nat, rmask)
        _acc(dc_h + rows, tl.sum(ds, axis=1) * gate_nat, rmask)
    _acc(dm_ptr + (rows[:, None] * H + h) * C + r[None, :],
         -tl.dot(tl.trans(QW), dsr, input_precision=TP), rmask[:, None])
    dsd = dsr.to(DT)
    _acc(dk_ptr + koff, mm(tl.trans(dsd), Q, INTERP), m2)
    G = tl.load(dy_ptr + qoff, mask=m2, other=0.0)     # the walk's carried query gradient
    dQ = G + mm(dsd, K, INTERP)
    Gd = G.to(DT)
    _acc(du_ptr + koff, -mm(tl.trans(QW.to(DT)), Gd, INTERP), m2)
    Uc = tl.load(u_ptr + koff, mask=m2, other=0.0).to(DT)
    M = tl.load(m_ptr + (rows[:, None] * H + h) * C + r[None, :], mask=rmask[:, None], other=0.0)
    dQW = tl.where(causal, -mm(Gd, tl.trans(Uc), INTERP) - tl.dot(dsr, tl.trans(M), input_precision=TP), 0.0)
    dQWd = dQW.to(DT)
    _acc(dw_ptr + koff, mm(tl.trans(dQWd), Q, INTERP), m2)
    dQ += mm(dQWd, Wc, INTERP)
    tl.store(dq_ptr + qoff, dQ.to(dq_ptr.dtype.element_ty), mask=m2)
