"""Candidate ``bwd_intra_walk_kernel``: two query chunks per program, stacked into one 2C-row tile.

The shipped walk gives every query chunk c of a super-chunk its own program, which walks the key chunks m < c
and adds each step's key-side gradients (dU_m, dW_m, dK~_m, dV_m: four C x D float32 tiles, 128 KB at D 128) with
atomics.  The chains of two query chunks are independent rows, and their key-side products sum over query rows:
stacked as one 2C-row tile (chunk positions 2p and 2p + 1 of a super-chunk, adjacent tokens), every step's
query-side products run on 2C rows (two warpgroups at 8 warps, wgmma M = 64 each) and the key-side products
reduce over both chains inside the MMA (K = 2C), so a key chunk's gradients leave the program once per pair:
half the atomic traffic of the shipped walk per query row, the same products per query row.

The pair walks m = 0 .. 2p (the upper chain's steps); at m = 2p the lower chain (position 2p) has no step: its
rows are masked out of p and their carried gradient kept.  The chain states X_m are parked in the shipped
scratch slots of the two chunks (their regions are adjacent: 2 * (2p) + 1 slots from chunk 2p's first), as
128-row blocks for m < 2p and the upper chain's 64 rows alone at m = 2p.  A super-chunk's last chunk without a
partner (an odd number of chunks, or the sequence ending) runs alone with the upper rows masked.

Same signature and grid as the shipped kernel (``tests/test_triton_backward.py``, ``benchmarks/dev_kernel_probe.py
--intra-v2``): the programs of odd chunk positions end at once.  Meant for 8 warps at one pipelining stage
(``LAUNCH_OPTIONS``); at 4 warps one warpgroup holds both chains' 2C rows.

Offline (``compile_check`` on sm_90, bf16, PaTH-FoX / PaTH), per step of the loop over key chunks and thread:

    D 128  shipped (4 warps, 64 rows):  1825 / 1332 instructions, local loads 116 / 45, stores 68 / 7, atomics 66 / 64
           pairs   (8 warps, 128 rows): 1565 / 1099 instructions, local loads  40 / 37, stores 11 / 5, atomics 34 / 32
    D 64   shipped: 1203 / 853, local loads 10 / 0, atomics 34 / 32 (two programs per multiprocessor)
           pairs:   1144 / 796, local loads  3 / 0, atomics 18 / 16 (one program of 8 warps)

i.e. per query row at D 128 0.86x / 0.83x the instructions, 0.28x / 0.81x the local memory accesses and half the
atomics, with two warpgroups per multiprocessor instead of one (180 KB of shared memory); at D 64 0.95x / 0.93x the
instructions at the same occupancy.

    python benchmarks/dev_kernel_probe.py --D 64,128 --T 4096,16384 --gates 1,0 --only intra,e2e \\
        --intra-v2 benchmarks/variants/walk_pairs.py
"""
from __future__ import annotations

import triton
import triton.language as tl

from pathtune.codegen.triton._ops import chunk_and_head, mm, tile_of
from pathtune.codegen.triton.bwd_intra import _acc, _row_stats


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
def _step(G, Xd, act, LAST: tl.constexpr, k0, dO, lse2, delta, h, hq, rows,
          v_ptr, w_ptr, u_ptr, kt_ptr, gc_h, dv_ptr, dw_ptr, du_ptr, dkt_ptr, dc_h,
          qk_scale, gate_scale, scale, gate_nat,
          H: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
          C: tl.constexpr, DT: tl.constexpr, USE_GATE: tl.constexpr, INTERP: tl.constexpr):
    """One step of the stacked walk over key chunk k0 .. k0 + C: the key side's gradients added, the carried G
    returned.  ``act``: the rows with a step here (their X rows, zero elsewhere, come in Xd); LAST: rows outside it
    keep their G (the lower chain at the upper one's extra step)."""
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
    # the chain step X_{m-1} = X_m - (X_m W_m^T) U_m, G = dX_{m-1}: rows without a step have Xd = 0, so their G
    # enters no key-side product (dU through Yl, dW through Xd)
    Yl = mm(Xd, tl.trans(Wm), INTERP)
    _acc(du_ptr + kof, -mm(tl.trans(Yl.to(DT)), Gd, INTERP), dmask)
    dYl = (-mm(Gd, tl.trans(Um), INTERP)).to(DT)
    _acc(dw_ptr + kof, mm(tl.trans(dYl), Xd, INTERP), dmask)
    dX = G + mm(dYl, Wm, INTERP)
    s = mm(Xd, tl.trans(Kt), INTERP) * qk_scale
    if USE_GATE:
        s -= (tl.load(gc_h + krows) * gate_scale)[None, :]
    p = tl.where(act[:, None], tl.exp2(s - lse2[:, None]), 0.0)
    _acc(dv_ptr + kvof, mm(tl.trans(p).to(Vm.dtype), dO, INTERP), dvmask)
    dp = mm(dO, tl.trans(Vm), INTERP)
    ds = p * (dp - delta[:, None])
    dsd = (ds * scale).to(DT)
    dX += mm(dsd, Kt, INTERP)
    _acc(dkt_ptr + kof, mm(tl.trans(dsd), Xd, INTERP), dmask)
    if USE_GATE:
        _acc(dc_h + krows, -tl.sum(ds, axis=0) * gate_nat)
        _acc(dc_h + rows, tl.sum(ds, axis=1) * gate_nat, act)
    if LAST:
        dX = tl.where(act[:, None], dX, G)
    return dX


@triton.jit
def _pair_walk(
    q_ptr, v_ptr, w_ptr, u_ptr, kt_ptr, gc_ptr, do_ptr, lse_ptr, delta_ptr, dy_ptr,
    dv_ptr, dw_ptr, du_ptr, dkt_ptr, dc_ptr, xs_ptr,
    n, hq, tok0, send, ci, n_chunks, qk_scale, gate_scale, scale, gate_nat, gc_hs,
    HQ: tl.constexpr, H: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    BD: tl.constexpr, BDV: tl.constexpr, C: tl.constexpr, S: tl.constexpr,
    DT: tl.constexpr, USE_GATE: tl.constexpr, INTERP: tl.constexpr,
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
        G = _step(G, tl.load(xs + 2 * mi * C * BD + xso), rmask, False, tokI + mi * C, dO, lse2, delta, h, hq,
                  rows, v_ptr, w_ptr, u_ptr, kt_ptr, gc_h, dv_ptr, dw_ptr, du_ptr, dkt_ptr, dc_h,
                  qk_scale, gate_scale, scale, gate_nat, H, D, DV, BD, BDV, C, DT, USE_GATE, INTERP)
    if has_upper:    # step ci: the upper chain only
        act = rmask & ~lower
        Xd = tl.load(xs + (2 * ci * C - C) * BD + xso, mask=act[:, None], other=0.0)
        G = _step(G, Xd, act, True, tokI + ci * C, dO, lse2, delta, h, hq,
                  rows, v_ptr, w_ptr, u_ptr, kt_ptr, gc_h, dv_ptr, dw_ptr, du_ptr, dkt_ptr, dc_h,
                  qk_scale, gate_scale, scale, gate_nat, H, D, DV, BD, BDV, C, DT, USE_GATE, INTERP)
    # both chains' carried gradients to the diagonal kernel in dY's storage (a chain without steps stores back what
    # it read)
    tl.store(dy_ptr + qoff, G, mask=m2)


@triton.jit
def bwd_intra_walk_kernel(
    q_ptr, k_ptr, v_ptr, w_ptr, u_ptr, m_ptr, kt_ptr, gc_ptr, do_ptr, lse_ptr, delta_ptr, dy_ptr,
    dq_ptr, dk_ptr, dv_ptr, dw_ptr, du_ptr, dm_ptr, dkt_ptr, dc_ptr, xs_ptr,
    chunk_tok0, chunk_seq, seq_start, seq_end,
    n_chunks, qk_scale, gate_scale, scale, gate_nat, gc_hs,
    HQ: tl.constexpr, H: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    BD: tl.constexpr, BDV: tl.constexpr, C: tl.constexpr, S: tl.constexpr,
    DT: tl.constexpr, TP: tl.constexpr, USE_GATE: tl.constexpr, INTERP: tl.constexpr,
):
    n, hq = chunk_and_head(HQ)
    tok0, _sid, s0, send = tile_of(n, chunk_tok0, chunk_seq, seq_start, seq_end)
    ci = ((tok0 - s0) // C) % (S // C)
    if ci % 2 == 0:      # the pair's program is its even position's; the odd position's has nothing to do
        _pair_walk(q_ptr, v_ptr, w_ptr, u_ptr, kt_ptr, gc_ptr, do_ptr, lse_ptr, delta_ptr, dy_ptr,
                   dv_ptr, dw_ptr, du_ptr, dkt_ptr, dc_ptr, xs_ptr,
                   n, hq, tok0, send, ci, n_chunks, qk_scale, gate_scale, scale, gate_nat, gc_hs,
                   HQ, H, D, DV, BD, BDV, C, S, DT, USE_GATE, INTERP)


# the launch this candidate is meant for (benchmarks/dev_kernel_probe.py: timed so beside the launcher's warps, and
# so in its ``e2e`` swap): two warpgroups, one per chain; two pipelining stages need 279 KB of shared memory at D 128
LAUNCH_OPTIONS = {"bwd_intra_walk_kernel": {"num_warps": 8, "num_stages": 1}}
