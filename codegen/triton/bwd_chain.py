"""Backward through the transitions: super-chunk chain, then the key transport inside one.

``bwd_superchunk_chain_kernel`` (per sequence, kv head) turns dOm_{I,J} into dWhat_K:
    dWhat_K = sum_{I>K>J} Om_{I,K}^T dOm_{I,J} Om_{K,J}^T
computed per I with L_{I,K} = sum_{J<K} dOm_{I,J} Om_{K,J}^T  (L_{I,K+1} = L_{I,K} What_K^T + dOm_{I,K},
written over dOm in place) and then dWhat_K += Om_{I,K}^T L_{I,K} walking K right to left with
Om_{I,K-1} = Om_{I,K} What_K.  O(N_S^2) D x D products, N_S = super-chunks per sequence.

Wide head dims (padded BD above 64: a BD x BD float32 tile per operand exceeds shared memory) run the
same sums in three kernels that hold ROWS x BD or BD x CB blocks only, parallel over super-chunks:
``bwd_chain_rows_kernel`` (per super-chunk I, kv head, ROWS rows) writes L_{I,K+1} over the slot of
dOm_{I,K} (rows of L evolve independently: L_{I,K+1}[rb] = L_{I,K}[rb] What_K^T + dOm_{I,K}[rb]);
``bwd_chain_dwhat_kernel`` (per super-chunk K, kv head, CB x CB block of dWhat_K) sums
Om_{I,K}[:, cb]^T L_{I,K}[:, cb2] over I > K, carrying Om_{I,K}[:, cb] (columns evolve independently:
Om_{I+1,K} = What_I Om_{I,K}) or reading it from the precomputed pairs; and
``bwd_superchunk_pairs_kernel`` (per super-chunk I, kv head, ROWS rows) writes Om_{I,J}[rb] for every
J < I (Om_{I,J} = Om_{I,J+1} What_{J+1}), which the column-blocked inter kernels read (DB < BD).
Every product runs "full K, column-blocked output" on CB columns of the right operand at a time.

The transport backward reverses ``superchunk_transport_kernel`` in two kernels:
``bwd_transport_chain_kernel`` (per super-chunk, kv head, row block of Suf) replays the right-to-left
walk storing the states Suf_m, then walks left to right storing the gradients G_m = dSuf_m;
``bwd_transport_grads_kernel`` (per super-chunk, UT chunk, kv head) turns them into dK~, dW, dU of
its chunk, summing the row blocks in registers (no atomics).

``gate_grad_kernel`` turns the gate cumsum's gradient dc into dg (a reversed cumsum per sequence).
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._ops import interpreting, mm

_INTERP = tl.constexpr(interpreting())   # Triton picks interpreter or compiler when a module is imported


@triton.jit
def _op16(x, ref_ptr):
    """x in the transport backward's 16-bit operand type: ref_ptr's element type when that is bf16, else fp16."""
    if ref_ptr.dtype.element_ty == tl.bfloat16:
        return x.to(tl.bfloat16)
    else:
        return x.to(tl.float16)


@triton.jit
def _pow2_floor(amax):
    """floor(log2(amax)) (at least -100): the power of two that scales amax near 1."""
    return tl.floor(tl.log2(tl.maximum(amax, 1e-30)))


@triton.jit
def _tdot(a, b, ref_ptr, TP: tl.constexpr):
    """a @ b of the transport backward, float32 accumulation: "fp16" on 16-bit operands (``_op16``; the caller
    scales gradients into range first), else float32 operands in matmul mode TP."""
    if TP == "fp16":
        return mm(_op16(a, ref_ptr), _op16(b, ref_ptr), _INTERP)
    else:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision=TP)


@triton.jit
def _operand(x, ref_ptr, TP: tl.constexpr):
    """A loaded operand tile of the transport backward in its product type (``_tdot``)."""
    if TP == "fp16":
        return _op16(x, ref_ptr)
    else:
        return x.to(tl.float32)


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
def _chain_prologue(n, sc_seq, seq_start, seq_end, seq_sc_base, seq_pair_base, S: tl.constexpr):
    """(index of super-chunk n inside its sequence, the sequence's super-chunk count, first super-chunk,
    first pair entry) of global super-chunk n."""
    sid = tl.load(sc_seq + n)
    nsc = (tl.load(seq_end + sid) - tl.load(seq_start + sid) + S - 1) // S
    sc_base = tl.load(seq_sc_base + sid)
    return n - sc_base, nsc, sc_base, tl.load(seq_pair_base + sid)


@triton.jit
def bwd_chain_rows_kernel(
    what_ptr, dom_ptr,
    sc_seq, seq_start, seq_end, seq_sc_base, seq_pair_base,
    H: tl.constexpr, BD: tl.constexpr, S: tl.constexpr, ROWS: tl.constexpr, CB: tl.constexpr,
    TP: tl.constexpr,
):
    """Per (super-chunk I, kv head, ROWS rows): overwrites the slot of dOm_{I,K} with L_{I,K+1} for
    1 <= K <= I - 2 (the slot of dOm_{I,0} already holds L_{I,1} = dOm_{I,0}); afterwards the slot
    of (I, K - 1) holds L_{I,K} for every 1 <= K < I.  Each step reads the slot it overwrites (the
    dOm term) block by block, then reloads the rows whole for the next product."""
    il, nsc, sc_base, pair_base = _chain_prologue(tl.program_id(0), sc_seq, seq_start, seq_end, seq_sc_base,
                                                  seq_pair_base, S)
    h = tl.program_id(1)
    if il >= 2:
        rr = tl.program_id(2) * ROWS + tl.arange(0, ROWS)
        d = tl.arange(0, BD)
        c = tl.arange(0, CB)
        row0 = (pair_base + il * nsc).to(tl.int64)
        rows = rr[:, None] * BD + d[None, :]
        L = tl.load(dom_ptr + (row0 * H + h) * BD * BD + rows)
        for kl in range(1, il - 1):
            slot = dom_ptr + ((row0 + kl) * H + h) * BD * BD
            wk = what_ptr + ((sc_base + kl).to(tl.int64) * H + h) * BD * BD
            for cb in range(0, BD // CB):
                e = cb * CB + c
                Wb = tl.load(wk + e[:, None] * BD + d[None, :])                  # What_K[cb, :]
                ptr = slot + rr[:, None] * BD + e[None, :]
                tl.store(ptr, tl.dot(L, tl.trans(Wb), input_precision=TP) + tl.load(ptr))
            tl.debug_barrier()
            L = tl.load(slot + rows)


@triton.jit
def bwd_chain_dwhat_kernel(
    what_ptr, om_ptr, dom_ptr, dwhat_ptr,
    sc_seq, seq_start, seq_end, seq_sc_base, seq_pair_base,
    H: tl.constexpr, BD: tl.constexpr, S: tl.constexpr, CB: tl.constexpr, HAS_OM: tl.constexpr,
    TP: tl.constexpr,
):
    """Per (super-chunk K, kv head, CB x CB block (cb, cb2)): dWhat_K[cb, cb2] = sum_{I>K}
    Om_{I,K}[:, cb]^T L_{I,K}[:, cb2], L as ``bwd_chain_rows_kernel`` left it, STORED (zero for
    a sequence's first and last super-chunk).  HAS_OM: Om_{I,K} read from om_ptr (every pair,
    ``bwd_superchunk_pairs_kernel``); else its columns cb carried, Om_{I+1,K} = What_I Om_{I,K}."""
    k = tl.program_id(0)
    kl, nsc, sc_base, pair_base = _chain_prologue(k, sc_seq, seq_start, seq_end, seq_sc_base, seq_pair_base, S)
    h = tl.program_id(1)
    NB: tl.constexpr = BD // CB
    e = (tl.program_id(2) // NB) * CB + tl.arange(0, CB)
    e2 = (tl.program_id(2) % NB) * CB + tl.arange(0, CB)
    d = tl.arange(0, BD)
    acc = tl.zeros((CB, CB), dtype=tl.float32)
    if kl >= 1:
        A = tl.where(d[:, None] == e[None, :], 1.0, 0.0)                          # Om_{K+1,K}[:, cb]
        for il in range(kl + 1, nsc):
            pair = (pair_base + il * nsc + kl).to(tl.int64)
            if HAS_OM:
                A = tl.load(om_ptr + (pair * H + h) * BD * BD + d[:, None] * BD + e[None, :])
            Lb = tl.load(dom_ptr + ((pair - 1) * H + h) * BD * BD + d[:, None] * BD + e2[None, :])
            acc += tl.dot(tl.trans(A), Lb, input_precision=TP)
            if not HAS_OM:   # (after the last super-chunk What is zero and A dead)
                Wi = tl.load(what_ptr + ((sc_base + il).to(tl.int64) * H + h) * BD * BD
                             + d[:, None] * BD + d[None, :])
                A = tl.dot(Wi, A, input_precision=TP)
    tl.store(dwhat_ptr + (k.to(tl.int64) * H + h) * BD * BD + e[:, None] * BD + e2[None, :], acc)


@triton.jit
def bwd_superchunk_pairs_kernel(
    what_ptr, om_ptr,
    sc_seq, seq_start, seq_end, seq_sc_base, seq_pair_base,
    H: tl.constexpr, BD: tl.constexpr, S: tl.constexpr, ROWS: tl.constexpr, CB: tl.constexpr,
    TP: tl.constexpr,
):
    """Per (super-chunk I, kv head, ROWS rows): Om_{I,J}[rb] = What_{I-1} ... What_{J+1} (the
    identity for J = I - 1) for every J < I, at om_ptr's pair entry I * n_sc + J (laid out like dOm;
    entries J >= I are left unwritten: no kernel reads them).  Walks J right to left,
    Om_{I,J} = Om_{I,J+1} What_{J+1}, storing each block of columns and reloading the rows whole."""
    il, nsc, sc_base, pair_base = _chain_prologue(tl.program_id(0), sc_seq, seq_start, seq_end, seq_sc_base,
                                                  seq_pair_base, S)
    h = tl.program_id(1)
    if il >= 1:
        rr = tl.program_id(2) * ROWS + tl.arange(0, ROWS)
        d = tl.arange(0, BD)
        c = tl.arange(0, CB)
        row0 = (pair_base + il * nsc).to(tl.int64)
        rows = rr[:, None] * BD + d[None, :]
        Om = tl.where(rr[:, None] == d[None, :], 1.0, 0.0)
        tl.store(om_ptr + ((row0 + il - 1) * H + h) * BD * BD + rows, Om)
        for step in range(0, il - 1):
            jl = il - 2 - step
            wj = what_ptr + ((sc_base + jl + 1).to(tl.int64) * H + h) * BD * BD
            slot = om_ptr + ((row0 + jl) * H + h) * BD * BD
            for cb in range(0, BD // CB):
                e = cb * CB + c
                Wb = tl.load(wj + d[:, None] * BD + e[None, :])                  # What_{J+1}[:, cb]
                tl.store(slot + rr[:, None] * BD + e[None, :], tl.dot(Om, Wb, input_precision=TP))
            tl.debug_barrier()
            Om = tl.load(slot + rows)


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
    independently, so no program needs another's rows and nothing is added to shared outputs.
    u and K~ come in the scan's 16-bit type (a range's recompute) or float32 (a one-range state): the
    products widen them to float32, as they do w; at TP "fp16" every operand goes to a 16-bit type instead
    (``_tdot``), Suf as it is (norm <= 1), G in the units of one power-of-two scale per row for the whole walk
    (rows of G evolve independently), 2^-6 times its largest dWhat / dKJ entry, and G_m stored unscaled."""
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
            W = _operand(tl.load(w_ptr + off, mask=dmask, other=0.0), u_ptr, TP)
            U = _operand(tl.load(u_ptr + off, mask=dmask, other=0.0), u_ptr, TP)
            Suf = Suf - _tdot(_tdot(Suf, tl.trans(W), u_ptr, TP), U, u_ptr, TP)
        G = tl.load(dwhat_ptr + ((j * H + h) * BD + e[:, None]) * BD + d[None, :])
        if TP == "fp16":    # each row's scale: its largest dWhat / dKJ entry (over the super-chunk) near 2^-6
            amax = tl.max(tl.abs(G), axis=1)
            for back in range(0, NCH):
                rows = (tok0 + back * C + r).to(tl.int64)
                dKJ = tl.load(dkj_ptr + (rows[:, None] * H + h) * D + e[None, :], mask=emask, other=0.0)
                amax = tl.maximum(amax, tl.max(tl.abs(dKJ), axis=0))
            gexp = _pow2_floor(amax) + 6.0
            G = G * tl.exp2(-gexp)[:, None]
        for back in range(0, NCH):
            rows = (tok0 + back * C + r).to(tl.int64)
            off = (rows[:, None] * H + h) * D + d[None, :]
            if TP == "fp16":
                tl.store(gs_ptr + blk + back * ROWS * BD + so, G * tl.exp2(gexp)[:, None])
            else:
                tl.store(gs_ptr + blk + back * ROWS * BD + so, G)
            W = _operand(tl.load(w_ptr + off, mask=dmask, other=0.0), u_ptr, TP)
            U = _operand(tl.load(u_ptr + off, mask=dmask, other=0.0), u_ptr, TP)
            Kt = _operand(tl.load(kt_ptr + off, mask=dmask, other=0.0), u_ptr, TP)
            dKJ = tl.load(dkj_ptr + (rows[:, None] * H + h) * D + e[None, :], mask=emask, other=0.0)
            if TP == "fp16":
                dKJ = dKJ * tl.exp2(-gexp)[None, :]
            dYl = -_tdot(G, tl.trans(U), u_ptr, TP)          # ROWS x C
            G = G + _tdot(dYl, W, u_ptr, TP) + _tdot(tl.trans(dKJ), Kt, u_ptr, TP)


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
    program owns chunk m's rows (bwd_intra adds to them after).  A sequence's last super-chunk has no
    transport gradient: its programs store zeros in its rows, so the three buffers need no memset.
    (One kernel with row-block programs had to add these C x D products atomically, once per row
    block: on the H200 the atomics were 45-68 % of its time.)  At TP "fp16" each G_m tile and each dKJ tile
    gets one power-of-two scale (the products sum over their rows), which comes off each product."""
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
        W = _operand(tl.load(w_ptr + off, mask=dmask, other=0.0), u_ptr, TP)
        U = _operand(tl.load(u_ptr + off, mask=dmask, other=0.0), u_ptr, TP)
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
            if TP == "fp16":    # G_m and dKJ scaled by powers of two sg, sk (the products' operands: _tdot)
                sg = tl.exp2(_pow2_floor(tl.max(tl.abs(Gm))))
                sk = tl.exp2(_pow2_floor(tl.max(tl.abs(dKJ))))
                Gm = Gm / sg
                dKJ = dKJ / sk
                Sm = _op16(Sm, u_ptr)
            else:
                sg = 1.0
                sk = 1.0
            Yl = _tdot(Sm, tl.trans(W), u_ptr, TP)           # ROWS x C
            dYl = -_tdot(Gm, tl.trans(U), u_ptr, TP)         # ROWS x C, G_m's units
            dU -= _tdot(tl.trans(Yl), Gm, u_ptr, TP) * sg
            dW += _tdot(tl.trans(dYl), Sm, u_ptr, TP) * sg
            dKt += _tdot(dKJ, Sm, u_ptr, TP) * sk
        tl.store(du_ptr + off, dU, mask=dmask)
        tl.store(dw_ptr + off, dW, mask=dmask)
        tl.store(dkt_ptr + off, dKt, mask=dmask)
    else:   # the sequence's last super-chunk: zeros in its rows (those before the sequence's end)
        r = tl.arange(0, C)
        d = tl.arange(0, BD)
        rows = (tok0 + m * C + r).to(tl.int64)
        off = (rows[:, None] * H + h) * D + d[None, :]
        zmask = (rows < send)[:, None] & (d < D)[None, :]
        zero = tl.zeros((C, BD), dtype=tl.float32)
        tl.store(du_ptr + off, zero, mask=zmask)
        tl.store(dw_ptr + off, zero, mask=zmask)
        tl.store(dkt_ptr + off, zero, mask=zmask)


@triton.jit
def gate_grad_kernel(dc_ptr, dg_ptr, seq_start, seq_end, dc_hs, HQ: tl.constexpr, BH: tl.constexpr,
                     BT: tl.constexpr, SPAN: tl.constexpr):
    """dg_l = sum of dc_i over i >= l in l's sequence (c is the inclusive cumsum of g), one program per
    (sequence, span of SPAN tokens, BH query heads); dc [HQ, dc_hs] float32 head-major in, dg [N, HQ]
    token-major out (in its own dtype).

    The program first sums the sequence's tokens after its span (a re-read of at most the sequence's
    length), then scans its span from the end in tiles of BT tokens (a reversed cumsum per tile).  The
    running total is a float32 pair (hi, lo) with hi + lo the sum (Fast2Sum), so a long sequence's sum
    keeps float64-like accuracy before the final rounding."""
    sid = tl.program_id(0)
    hs = tl.program_id(2) * BH + tl.arange(0, BH)
    hmask = hs < HQ
    dc_h = hs[None, :].to(tl.int64) * dc_hs      # each head's row of dc
    s0 = tl.load(seq_start + sid)
    s1 = tl.load(seq_end + sid)
    a = s0 + tl.program_id(1).to(tl.int64) * SPAN
    r = tl.arange(0, BT)
    hi = tl.zeros((BH,), dtype=tl.float32)
    lo = tl.zeros((BH,), dtype=tl.float32)
    if a < s1:
        b = tl.minimum(a + SPAN, s1)
        for t0 in range(b, s1, BT):           # everything after the span: its sum only
            t = t0 + r
            x = tl.load(dc_ptr + dc_h + t[:, None], mask=(t < s1)[:, None] & hmask[None, :], other=0.0)
            y = lo + tl.sum(x, axis=0)
            new_hi = hi + y
            lo = y - (new_hi - hi)
            hi = new_hi
        for i in range(0, tl.cdiv(b - a, BT)):
            t = b - (i + 1) * BT + r
            mask = (t >= a)[:, None] & hmask[None, :]
            x = tl.load(dc_ptr + dc_h + t[:, None], mask=mask, other=0.0)
            part = tl.cumsum(x, axis=0, reverse=True)
            dg = (hi[None, :] + (lo[None, :] + part)).to(dg_ptr.dtype.element_ty)
            tl.store(dg_ptr + t[:, None] * HQ + hs[None, :], dg, mask=mask)
            y = lo + tl.sum(x, axis=0)
            new_hi = hi + y
            lo = y - (new_hi - hi)
            hi = new_hi
