"""Candidate ``bwd_intra_walk_kernel``: two query chunks per program (the shipped kernel's signature and grid).

The shipped walk runs one chain per query chunk c (C rows): a right-to-left pass parking the states X_m,
then a left-to-right pass carrying G over key chunks m < c, each step a short chain of dependent C x C x D
products with atomic adds of the key-side gradients; it is latency-bound (one or two CTAs per SM).  Here
the program of an even chunk position L = 2j takes chunks L and L + 1 of its super-chunk together: their
2C tokens are contiguous, both walk the same key chunks (m <= L for L + 1, m < L for L), so every
product has 2C = 128 rows (full wgmma tiles), the key chunk's operands are loaded once for both, and the
key-side gradients of a step are summed over both chunks before their one atomic add.  Chunk L's rows
sit out the one step it does not take (m = L).  Programs of odd positions return at once.

Same scratch slots as the shipped kernel (X_m of chunk c at slot c (c - 1) / 2 + m of the super-chunk's
region), the carried G left in dY for ``bwd_intra_diag_kernel``, the same operations per row: gradients
equal the shipped kernel's up to the order of the atomic sums.
"""
from __future__ import annotations

import triton
import triton.language as tl

from pathtune.codegen.triton._ops import mm, tile_of


@triton.jit
def _acc(ptr, val, mask=None):
    tl.atomic_add(ptr, val, mask=mask, sem="relaxed")


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
    n = n_chunks - 1 - tl.program_id(0)     # latest chunks of a super-chunk (most work) first
    hq = tl.program_id(1)
    h = hq // (HQ // H)
    tok0, _sid, s0, send = tile_of(n, chunk_tok0, chunk_seq, seq_start, seq_end)
    L = ((tok0 - s0) // C) % (S // C)       # this chunk's position; the pair is (L, L + 1)
    if L % 2 == 0:
        tokI = tok0 - L * C
        r2 = tl.arange(0, 2 * C)
        r = tl.arange(0, C)
        d = tl.arange(0, BD)
        dv = tl.arange(0, BDV)
        dmask = (d < D)[None, :]
        dvmask = (dv < DV)[None, :]
        rows = (tok0 + r2).to(tl.int64)     # chunk L's rows, then chunk L + 1's (absent past the sequence)
        rmask = rows < send
        lo = r2 < C                          # rows of chunk L
        m2 = rmask[:, None] & dmask
        qoff = (rows[:, None] * HQ + hq) * D + d[None, :]
        koff = (rows[:, None] * H + h) * D + d[None, :]
        gc_h = gc_ptr + hq.to(tl.int64) * gc_hs
        dc_h = dc_ptr + hq.to(tl.int64) * gc_hs
        dO = tl.load(do_ptr + (rows[:, None] * HQ + hq) * DV + dv[None, :], mask=rmask[:, None] & dvmask, other=0.0)
        lse2 = tl.load(lse_ptr + rows * HQ + hq, mask=rmask, other=0.0) * 1.4426950408889634
        delta = tl.load(delta_ptr + rows * HQ + hq, mask=rmask, other=0.0)
        if USE_GATE:
            c_q = tl.load(gc_h + rows, mask=rmask, other=0.0)
        # the boundary-adjusted queries of both chunks: tril within each chunk
        same = (r2[:, None] // C) == (r2[None, :] // C)
        causal = same & (r2[:, None] >= r2[None, :])
        Q = tl.load(q_ptr + qoff, mask=m2, other=0.0).to(DT)
        Wc = tl.load(w_ptr + koff, mask=m2, other=0.0).to(DT)
        Uc = tl.load(u_ptr + koff, mask=m2, other=0.0).to(DT)
        QW = tl.where(causal, mm(Q, tl.trans(Wc), INTERP), 0.0)
        X = Q.to(tl.float32) - mm(QW.to(DT), Uc, INTERP)
        # each row's scratch slots: chunk c's region starts at slot c (c - 1) / 2 of the super-chunk's
        region = (hq * n_chunks + n - L).to(tl.int64) * (S // (2 * C))
        slot_row = region + tl.where(lo, L * (L - 1) // 2, (L + 1) * L // 2)        # [2C]
        xso = (r2 % C)[:, None] * BD + d[None, :]
        # key chunks the pair walks: m < L + 1 with chunk L + 1 in the sequence, else m < L (chunk L alone; a
        # step over key chunk L itself would read past a partial last chunk)
        top = L + (tok0 + C < send).to(tl.int32)
        # right-to-left: park X_m (chunk L + 1 from m = L, chunk L from m = L - 1), then X <- X P_m
        for t in range(0, top):
            tm = top - 1 - t
            takes = rmask & (~lo | (tm < L))       # rows whose chunk has a slot m = tm
            tl.store(xs_ptr + (slot_row + tm)[:, None] * (C * BD) + xso, X.to(DT), mask=takes[:, None])
            if tm > 0:
                trows = (tokI + tm * C + r).to(tl.int64)
                toff = (trows[:, None] * H + h) * D + d[None, :]
                Wt = tl.load(w_ptr + toff, mask=dmask, other=0.0).to(DT)
                Ut = tl.load(u_ptr + toff, mask=dmask, other=0.0).to(DT)
                XW = tl.where(takes[:, None], mm(X.to(DT), tl.trans(Wt), INTERP), 0.0)
                X = X - mm(XW.to(DT), Ut, INTERP)
        tl.debug_barrier()
        G = tl.load(dy_ptr + qoff, mask=m2, other=0.0)
        # left-to-right over key chunks m = 0 .. top - 1 (chunk L's rows sit out m = L)
        for mi in range(0, top):
            live = rmask & (~lo | (mi < L))
            Xd = tl.load(xs_ptr + (slot_row + mi)[:, None] * (C * BD) + xso, mask=live[:, None], other=0.0)
            krows = (tokI + mi * C + r).to(tl.int64)
            kof = (krows[:, None] * H + h) * D + d[None, :]
            kvof = (krows[:, None] * H + h) * DV + dv[None, :]
            Kt = tl.load(kt_ptr + kof, mask=dmask, other=0.0).to(DT)
            Wm = tl.load(w_ptr + kof, mask=dmask, other=0.0).to(DT)
            Um = tl.load(u_ptr + kof, mask=dmask, other=0.0).to(DT)
            Vm = tl.load(v_ptr + kvof, mask=dvmask, other=0.0)
            Gd = tl.where(live[:, None], G, 0.0).to(DT)
            Yl = mm(Xd, tl.trans(Wm), INTERP)
            _acc(du_ptr + kof, -mm(tl.trans(Yl.to(DT)), Gd, INTERP), dmask)
            dYl = (-mm(Gd, tl.trans(Um), INTERP)).to(DT)
            _acc(dw_ptr + kof, mm(tl.trans(dYl), Xd, INTERP), dmask)
            dX = G + mm(dYl, Wm, INTERP)
            s = mm(Xd, tl.trans(Kt), INTERP) * qk_scale
            if USE_GATE:
                c_k = tl.load(gc_h + krows)
                s += (c_q[:, None] - c_k[None, :]) * gate_scale
            p = tl.where(live[:, None], tl.exp2(s - lse2[:, None]), 0.0)
            _acc(dv_ptr + kvof, mm(tl.trans(p).to(Vm.dtype), dO, INTERP), dvmask)
            dp = mm(dO, tl.trans(Vm), INTERP)
            ds = p * (dp - delta[:, None])
            dsd = (ds * scale).to(DT)
            dX += mm(dsd, Kt, INTERP)
            _acc(dkt_ptr + kof, mm(tl.trans(dsd), Xd, INTERP), dmask)
            if USE_GATE:
                _acc(dc_h + krows, -tl.sum(ds, axis=0) * gate_nat)
            G = dX
        # G to the diagonal kernel in dY's storage (rows of chunk 0 took no step: dY as the inter kernels left it)
        tl.store(dy_ptr + qoff, G, mask=m2)
