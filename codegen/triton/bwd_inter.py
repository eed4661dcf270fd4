"""Backward between super-chunks (FlashAttention-2 style, two kernels).

For a query chunk c in super-chunk I and keys of an earlier super-chunk J the logits are
    S = Y_c Om_{I,J} KJ^T,   Om_{I,J} = What_{I-1} ... What_{J+1}   (identity for J = I-1)
with Y_c the queries carried to the start of I and KJ the keys carried to the end of J.
Given lse and delta, p and dS of every tile are independent, so:

* ``bwd_inter_dq_kernel`` (per query chunk, query head) walks J right to left and returns
  dY_c = scale * sum_J (dS_J KJ_J) Om_{I,J}^T.
* ``bwd_inter_dkv_kernel`` (per key tile of super-chunk J, kv head) walks the later super-chunks I
  left to right; it returns dKJ, the inter-super-chunk part of dV and adds its share of
  dOm_{I,J} = scale * Y^T dS KJ (one D x D per super-chunk pair, shared by the S / BLOCK_N key tiles
  of J: atomics).  Its step works on transposed tiles, s^T = KZ Y^T with KZ = KJ Om^T, so that
  dV += p^T dO and dKZ += dS^T Y take p^T and dS^T as they are (register A operands, no layout
  change per step) and the gate's key-side sum is a row sum per step.
Both add the FoX gate's contribution to dc (gradient of the gate cumsum).  The gate's logit bias
(c_q - c_k) * gate_scale is folded into a per-query and a per-key offset: the query's part shifts its
lse (lse2 - c_q * gate_scale, once per row), the key's part is one vector per key tile, so a gated
logit costs one subtraction more than an ungated one instead of three operations.  With GATE_MMA (the knob
bwd_gate_bias product) the key's part is not subtracted either: it rides in the logits' tensor-core product as
one more K = 16 step against its three bfloat16 parts (``gate_bias``), after which the step is the ungated one.
dkv builds its key tile's parts once per program and query head (a key tile's offsets are the same at every
step); dq, whose key tile changes every step, reads them from gp [HQ, N, 16] (``forward.gate_parts``, written
once per backward): built per step they issued more instructions than they saved (offline sm_90 at D 64, 351 ->
434 a step; read: 302).

Neither kernel carries a transition.  Every pair's Om_{I,J} is formed once per backward, laid out
like dOm ([n_pairs, H, BD, BD], entry pair_base + I * n_sc + J):
* head dims up to 128 (constexpr DB == BD): ``bwd_pair_transitions_kernel`` stores them in the scan's
  16-bit type (the walk itself stays float32 in registers); the kernels load the tile of the pair
  they are at (an L2 hit, 32 KB at BD = 128) and multiply on 16-bit tensor cores with float32
  accumulation (fp16 keeps tf32's 10-bit mantissa).  A running BD x BD float32 Om and the What tile
  that updates it held ~128 registers a thread across the walk at D = 128, the main cause of
  1.4-2.8 KB of spills per thread on sm_90.
* wider head dims (DB < BD, ``forward.transition_column_block``): a BD x BD float32 tile does not fit
  shared memory (256 KB at BD = 256); the pairs are float32 (``backward.superchunk_pairs``) and every
  product with them runs "full K, column-blocked output", out[:, cb] = A @ B[:, cb] with BD x DB
  blocks of B read from global memory:
  - dq: Z = Y Om goes block by block into a scratch row buffer of the program's own rows (scan
    dtype), is read back whole for the key loop, and dY[:, cb] += scale * dZ Om^T[:, cb] is added
    straight into the program's own rows of dy.
  - dkv: KZ = KJ Om^T through a scratch the same way; dKJ[:, cb] += scale * dKZ Om[:, cb] into the
    program's own rows of dkj; dOm[:, cb] += scale * dKZ^T KJ[:, cb] (atomics).
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._ops import mm
from .bwd_chain import _chain_prologue
from .bwd_intra import ones_column
from .gate_bias import add_product, bias_ones, bias_parts


@triton.jit
def _dq_keys(Zd, dO, lse2, delta, kj_ptr, v_ptr, gc_h, gp_h, key0, h, qk_scale, gate_scale,
             H: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr, C: tl.constexpr,
             S: tl.constexpr, BLOCK_N: tl.constexpr, DT: tl.constexpr, USE_GATE: tl.constexpr, INTERP: tl.constexpr,
             GATE_MMA: tl.constexpr):
    """(dZ, dS row sums): dZ = dS KJ of the program's queries (Zd: carried into the frame of the earlier
    super-chunk whose S keys start at token key0) over those keys, BLOCK_N a step: the float32 C x BD tile of
    that super-chunk; with the gate also each query row's sum of dS over those keys (the query side of dc),
    else zeros."""
    d = tl.arange(0, BD)
    dv = tl.arange(0, BDV)
    rn = tl.arange(0, BLOCK_N)
    dmask = (d < D)[None, :]
    dvmask = (dv < DV)[None, :]
    dZ = tl.zeros((C, BD), dtype=tl.float32)
    rs = tl.zeros((C,), dtype=tl.float32)
    if USE_GATE and GATE_MMA:
        ones = bias_ones(C)
    for t0 in range(0, S, BLOCK_N):
        krows = (key0 + t0 + rn).to(tl.int64)
        KJ = tl.load(kj_ptr + (krows[:, None] * H + h) * D + d[None, :], mask=dmask, other=0.0).to(DT)
        Vt = tl.load(v_ptr + (krows[:, None] * H + h) * DV + dv[None, :], mask=dvmask, other=0.0)
        if USE_GATE and GATE_MMA:   # the key offsets' bf16 parts (gp), then the logits' product onto them
            P = tl.load(gp_h + krows[:, None] * 16 + tl.arange(0, 16)[None, :])
            s = add_product(mm(ones, tl.trans(P), INTERP), Zd, tl.trans(KJ), INTERP) * qk_scale
        else:
            s = mm(Zd, tl.trans(KJ), INTERP) * qk_scale
            if USE_GATE:
                s -= (tl.load(gc_h + krows) * gate_scale)[None, :]
        p = tl.exp2(s - lse2[:, None])
        dp = mm(dO, tl.trans(Vt), INTERP)
        ds = p * (dp - delta[:, None])
        if USE_GATE:
            rs += tl.sum(ds, axis=1)
        dZ += mm(ds.to(DT), KJ, INTERP)
    return dZ, rs


@triton.jit
def bwd_inter_dq_kernel(
    y_ptr, kj_ptr, v_ptr, gc_ptr, do_ptr, lse_ptr, delta_ptr,
    dy_ptr, om_ptr, z_ptr, dc_ptr, gp_ptr,
    chunk_tok0, chunk_seq, seq_start, seq_end, seq_sc_base, seq_pair_base,
    n_chunks, qk_scale, gate_scale, scale, gate_nat, gc_hs,
    HQ: tl.constexpr, H: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    BD: tl.constexpr, BDV: tl.constexpr, C: tl.constexpr, S: tl.constexpr, BLOCK_N: tl.constexpr,
    DB: tl.constexpr, DT: tl.constexpr, TP: tl.constexpr, USE_GATE: tl.constexpr, INTERP: tl.constexpr,
    GATE_MMA: tl.constexpr = False,
):
    # om_ptr [n_pairs, H, BD, BD] holds every Om_{I,J} (scan dtype when DB == BD, else float32).
    # DB < BD: z_ptr [N, HQ, D] (scan dtype) is the scratch of Z = Y Om for this program's rows and
    # dy (zero-filled) accumulates in place; DB == BD: z_ptr unused, and every row of dy is stored here
    # (zeros in a sequence's first super-chunk: the launcher does not memset it).
    # gc_ptr, dc_ptr [HQ, gc_hs] float32 head-major: a head's gates contiguous.  With the gate the program adds
    # its query rows' sums of dS over every earlier super-chunk's keys to dc (the query side; the key side is
    # bwd_inter_dkv's, which ran before: no other program of this launch touches these rows of dc).
    n = n_chunks - 1 - tl.program_id(0)
    hq = tl.program_id(1)
    h = hq // (HQ // H)
    gc_h = gc_ptr + hq.to(tl.int64) * gc_hs
    gp_h = gp_ptr + hq.to(tl.int64) * gc_hs * 16     # GATE_MMA: the keys' offsets as bf16 parts [HQ, gc_hs, 16]
    tok0 = tl.load(chunk_tok0 + n)
    sid = tl.load(chunk_seq + n)
    s0 = tl.load(seq_start + sid)
    send = tl.load(seq_end + sid)
    sc_idx = ((tok0 - s0) // C) // (S // C)
    if sc_idx > 0:
        r = tl.arange(0, C)
        d = tl.arange(0, BD)
        dv = tl.arange(0, BDV)
        dmask = (d < D)[None, :]
        dvmask = (dv < DV)[None, :]
        rows = (tok0 + r).to(tl.int64)
        rmask = rows < send
        qoff = (rows[:, None] * HQ + hq) * D + d[None, :]
        Y = tl.load(y_ptr + qoff, mask=rmask[:, None] & dmask, other=0.0).to(tl.float32)
        dO = tl.load(do_ptr + (rows[:, None] * HQ + hq) * DV + dv[None, :], mask=rmask[:, None] & dvmask, other=0.0)
        lse2 = tl.load(lse_ptr + rows * HQ + hq, mask=rmask, other=0.0) * 1.4426950408889634
        delta = tl.load(delta_ptr + rows * HQ + hq, mask=rmask, other=0.0)
        if USE_GATE:    # the gate's query offset folded into the row's lse (module docstring)
            lse2 -= tl.load(gc_h + rows, mask=rmask, other=0.0) * gate_scale
        if DB == BD:
            pair_base = tl.load(seq_pair_base + sid)
            n_sc_seq = (send - s0 + S - 1) // S
            dpair = d[:, None] * BD + d[None, :]
            ymask = rmask[:, None] & dmask
            Yd = Y.to(DT)
            # with the gate each super-chunk's share is added into the program's own rows of dy (stored at the
            # first, read-modify-written after) instead of a C x BD float32 dY live through every key step, where
            # the gated step's tiles peak: offline sm_90 at D 128 the gated kernel spills 108 B per thread
            # instead of 472 (none in the key loop); H100 0.91-0.95x its time.  Without the gate the register
            # tile costs less than the round trips (the in-memory form 1.11-1.13x there).
            dY = tl.zeros((C, BD), dtype=tl.float32)
            rs = tl.zeros((C,), dtype=tl.float32)
            for step in range(0, sc_idx):
                jj = sc_idx - 1 - step
                om_base = om_ptr + ((pair_base + sc_idx * n_sc_seq + jj) * H + h) * BD * BD
                Zd = mm(Yd, tl.load(om_base + dpair).to(DT), INTERP).to(DT)
                dZ, rs_j = _dq_keys(Zd, dO, lse2, delta, kj_ptr, v_ptr, gc_h, gp_h, s0 + jj * S, h, qk_scale,
                                    gate_scale, H, D, DV, BD, BDV, C, S, BLOCK_N, DT, USE_GATE, INTERP, GATE_MMA)
                rs += rs_j
                upd = mm(dZ.to(DT), tl.trans(tl.load(om_base + dpair).to(DT)), INTERP)
                if USE_GATE:
                    upd = upd * scale
                    if step > 0:
                        upd += tl.load(dy_ptr + qoff, mask=ymask, other=0.0)
                    tl.store(dy_ptr + qoff, upd, mask=ymask)
                else:
                    dY += upd
            if not USE_GATE:
                tl.store(dy_ptr + qoff, dY * scale, mask=ymask)
        else:
            rs = tl.zeros((C,), dtype=tl.float32)
            pair_base = tl.load(seq_pair_base + sid)
            n_sc_seq = (send - s0 + S - 1) // S
            qrow = (rows * HQ + hq) * D
            for step in range(0, sc_idx):
                jj = sc_idx - 1 - step
                om_base = om_ptr + ((pair_base + sc_idx * n_sc_seq + jj) * H + h) * BD * BD
                tl.debug_barrier()      # every read of z and dy of the previous step is done
                for cb in tl.static_range(BD // DB):
                    if cb * DB < D:     # column blocks wholly past D are zero
                        e = cb * DB + tl.arange(0, DB)
                        Omb = tl.load(om_base + d[:, None] * BD + e[None, :])            # Om[:, cb]
                        tl.store(z_ptr + qrow[:, None] + e[None, :], tl.dot(Y, Omb, input_precision=TP).to(DT),
                                 mask=rmask[:, None] & (e < D)[None, :])
                tl.debug_barrier()
                Zd = tl.load(z_ptr + qoff, mask=rmask[:, None] & dmask, other=0.0)
                dZ, rs_j = _dq_keys(Zd, dO, lse2, delta, kj_ptr, v_ptr, gc_h, gp_h, s0 + jj * S, h, qk_scale,
                                    gate_scale, H, D, DV, BD, BDV, C, S, BLOCK_N, DT, USE_GATE, INTERP, GATE_MMA)
                rs += rs_j
                for cb in tl.static_range(BD // DB):
                    if cb * DB < D:
                        e = cb * DB + tl.arange(0, DB)
                        OmR = tl.load(om_base + e[:, None] * BD + d[None, :])            # Om[cb, :]
                        yptr = dy_ptr + qrow[:, None] + e[None, :]
                        ymask = rmask[:, None] & (e < D)[None, :]
                        upd = tl.dot(dZ, tl.trans(OmR), input_precision=TP) * scale
                        tl.store(yptr, tl.load(yptr, mask=ymask, other=0.0) + upd, mask=ymask)
        if USE_GATE:
            dcq = dc_ptr + hq.to(tl.int64) * gc_hs + rows
            tl.store(dcq, tl.load(dcq, mask=rmask, other=0.0) + rs * gate_nat, mask=rmask)
    elif DB == BD:  # a sequence's first super-chunk has no earlier keys: dY = 0 (dy is not memset at DB == BD)
        r0 = tl.arange(0, C)
        d0 = tl.arange(0, BD)
        rows0 = (tok0 + r0).to(tl.int64)
        tl.store(dy_ptr + (rows0[:, None] * HQ + hq) * D + d0[None, :], tl.zeros((C, BD), dtype=tl.float32),
                 mask=(rows0 < send)[:, None] & (d0 < D)[None, :])


@triton.jit
def _dkv_step(KZ, Vt, ck_s, Pk, dV, dKZ, dck, ones, y_ptr, do_ptr, lse_ptr, delta_ptr, gc_h, row, send, hq,
              qk_scale, gate_scale, HQ: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr,
              BDV: tl.constexpr, BLOCK_M: tl.constexpr, DT: tl.constexpr, USE_GATE: tl.constexpr,
              GATE_SUM_MMA: tl.constexpr, GATE_MMA: tl.constexpr, ROW_MASK: tl.constexpr, INTERP: tl.constexpr):
    """One step of ``_dkv_superchunk``: the BLOCK_M query rows from ``row``.  ROW_MASK: some of them may lie past
    the sequence's end (masked loads, p^T zeroed there); else every row is the sequence's, and the loads carry no
    predicates (and no column masks where D and DV are their own padded widths).  Masked loads cost the key-side
    loop a predicate and a zero fill per element: offline sm_90 at D 128, 908 SASS instructions a step gated
    (760 ungated) against 563 (425) unmasked.  GATE_MMA: the key offsets come in the logits' product, from their
    bf16 parts Pk [BLOCK_N, 16] (ck_s unused).  Returns (dV, dKZ, dck)."""
    r = tl.arange(0, BLOCK_M)
    d = tl.arange(0, BD)
    dv = tl.arange(0, BDV)
    rows = (row + r).to(tl.int64)
    yoff = (rows[:, None] * HQ + hq) * D + d[None, :]
    ooff = (rows[:, None] * HQ + hq) * DV + dv[None, :]
    if ROW_MASK:
        rmask = rows < send
        Yd = tl.load(y_ptr + yoff, mask=rmask[:, None] & (d < D)[None, :], other=0.0).to(DT)
        dO = tl.load(do_ptr + ooff, mask=rmask[:, None] & (dv < DV)[None, :], other=0.0)
        lse2 = tl.load(lse_ptr + rows * HQ + hq, mask=rmask, other=0.0) * 1.4426950408889634
        delta = tl.load(delta_ptr + rows * HQ + hq, mask=rmask, other=0.0)
    else:
        if D == BD:
            Yd = tl.load(y_ptr + yoff).to(DT)
        else:
            Yd = tl.load(y_ptr + yoff, mask=(d < D)[None, :], other=0.0).to(DT)
        if DV == BDV:
            dO = tl.load(do_ptr + ooff)
        else:
            dO = tl.load(do_ptr + ooff, mask=(dv < DV)[None, :], other=0.0)
        lse2 = tl.load(lse_ptr + rows * HQ + hq) * 1.4426950408889634
        delta = tl.load(delta_ptr + rows * HQ + hq)
    if USE_GATE and GATE_MMA:
        sT = add_product(mm(Pk, tl.trans(bias_ones(BLOCK_M)), INTERP), KZ, tl.trans(Yd), INTERP) * qk_scale
    else:
        sT = mm(KZ, tl.trans(Yd), INTERP) * qk_scale
    if USE_GATE:    # the gate's query offset in the rows' lse, its key offset per key row
        if ROW_MASK:
            lse2 -= tl.load(gc_h + rows, mask=rmask, other=0.0) * gate_scale
        else:
            lse2 -= tl.load(gc_h + rows) * gate_scale
        if not GATE_MMA:
            sT -= ck_s[:, None]
    pT = tl.exp2(sT - lse2[None, :])
    if ROW_MASK:
        pT = tl.where(rmask[None, :], pT, 0.0)
    dpT = mm(Vt, tl.trans(dO), INTERP)
    dsT = pT * (dpT - delta[None, :])
    dV += mm(pT.to(Vt.dtype), dO, INTERP)
    dsTd = dsT.to(DT)
    dKZ += mm(dsTd, Yd, INTERP)
    if USE_GATE:
        if GATE_SUM_MMA:
            dck += mm(dsTd, ones, INTERP)
        else:
            dck += tl.sum(dsT, axis=1)
    return dV, dKZ, dck


@triton.jit
def _dkv_superchunk(KZ, Vt, ck_s, Pk, dV, dck, y_ptr, do_ptr, lse_ptr, delta_ptr, gc_h, row0, send, hq, qk_scale,
                    gate_scale, HQ: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr,
                    BDV: tl.constexpr, S: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                    DT: tl.constexpr, USE_GATE: tl.constexpr, GATE_SUM_MMA: tl.constexpr, GATE_MMA: tl.constexpr,
                    INTERP: tl.constexpr):
    """One key tile (KZ = its keys carried into the later super-chunk's frame, Vt its values, ck_s its gate
    cumsums times gate_scale) against the query rows of that super-chunk from row0 (S of them, fewer in a sequence's
    last), BLOCK_M rows a step (``_dkv_step``), keys as rows:
    s^T = KZ Y^T, then dV += p^T dO and dKZ += dS^T Y with p^T and dS^T as they are; the gate's
    key-side sums -sum_i dS_ij as row sums of dS^T: a row reduction per step into dck (BLOCK_N,), or with
    GATE_SUM_MMA the product dS^T E into dck (BLOCK_N, 16), E a ones column padded to the MMA's 16 columns
    (``backward.gate_sums_by_mma``).  GATE_MMA: the key offsets from their bf16 parts Pk (``_dkv_step``).  gc_h: head
    hq's row of the head-major gate cumsum.  The steps whose rows all
    lie inside the sequence load without masks; a sequence's last super-chunk ends with one masked step where its
    length is not a multiple of BLOCK_M.
    Returns (dV, dKZ of this super-chunk, dck)."""
    dKZ = tl.zeros((BLOCK_N, BD), dtype=tl.float32)
    ones = ones_column(BLOCK_M, DT)
    n_rows = tl.minimum(send - row0, S)
    whole = n_rows - n_rows % BLOCK_M
    for m0 in range(0, whole, BLOCK_M):
        dV, dKZ, dck = _dkv_step(KZ, Vt, ck_s, Pk, dV, dKZ, dck, ones, y_ptr, do_ptr, lse_ptr, delta_ptr, gc_h,
                                 row0 + m0, send, hq, qk_scale, gate_scale, HQ, D, DV, BD, BDV, BLOCK_M, DT, USE_GATE,
                                 GATE_SUM_MMA, GATE_MMA, False, INTERP)
    if whole < n_rows:
        dV, dKZ, dck = _dkv_step(KZ, Vt, ck_s, Pk, dV, dKZ, dck, ones, y_ptr, do_ptr, lse_ptr, delta_ptr, gc_h,
                                 row0 + whole, send, hq, qk_scale, gate_scale, HQ, D, DV, BD, BDV, BLOCK_M, DT,
                                 USE_GATE, GATE_SUM_MMA, GATE_MMA, True, INTERP)
    return dV, dKZ, dck


@triton.jit
def bwd_inter_dkv_kernel(
    y_ptr, kj_ptr, v_ptr, gc_ptr, do_ptr, lse_ptr, delta_ptr,
    dkj_ptr, dv_ptr, dom_ptr, dc_ptr, om_ptr, kz_ptr,
    sc_tok0, sc_seq, seq_start, seq_end, seq_sc_base, seq_pair_base,
    qk_scale, gate_scale, scale, gate_nat, gc_hs,
    HQ: tl.constexpr, H: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    BD: tl.constexpr, BDV: tl.constexpr, C: tl.constexpr, S: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_M: tl.constexpr,
    DB: tl.constexpr, DT: tl.constexpr, TP: tl.constexpr, USE_GATE: tl.constexpr, GATE_SUM_MMA: tl.constexpr,
    INTERP: tl.constexpr, GATE_MMA: tl.constexpr = False,
):
    # om_ptr [n_pairs, H, BD, BD] holds every Om_{I,J} (scan dtype when DB == BD, else float32).
    # DB < BD: kz_ptr [N, H, D] (scan dtype) is the scratch of KZ = KJ Om^T for this program's key
    # rows and dkj accumulates in place per pair; DB == BD: kz_ptr unused.
    # gc_ptr, dc_ptr [HQ, gc_hs] float32 head-major: a key tile's gates (and their gradients) contiguous.
    # dv_ptr [N, H, DV] (v's type, or float32): every row stored once, the inter part of dV (the intra
    # kernels add the rest per token range).
    # BLOCK_M: query rows per step of the walk over a later super-chunk (the bwd_block_m knob; the
    # UT chunk is no unit here: p and dS of every query row are independent given lse and delta;
    # _dkv_superchunk)
    # one program per key tile of BLOCK_N keys (the earliest super-chunks, with the most later
    # queries, first); one program per super-chunk left 512 serial programs at 32K tokens
    j = tl.program_id(0) // (S // BLOCK_N)
    t0 = (tl.program_id(0) % (S // BLOCK_N)) * BLOCK_N
    h = tl.program_id(1)
    tokj = tl.load(sc_tok0 + j)
    sid = tl.load(sc_seq + j)
    s0 = tl.load(seq_start + sid)
    send = tl.load(seq_end + sid)
    if tokj + S >= send:    # a sequence's last super-chunk: no later queries, the inter part of its dV is zero
        rz = (tokj + t0 + tl.arange(0, BLOCK_N)).to(tl.int64)
        cz = tl.arange(0, BDV)
        tl.store(dv_ptr + (rz[:, None] * H + h) * DV + cz[None, :], tl.zeros((BLOCK_N, BDV), dv_ptr.dtype.element_ty),
                 mask=(rz < send)[:, None] & (cz < DV)[None, :])
    else:
        sc_base = tl.load(seq_sc_base + sid)
        pair_base = tl.load(seq_pair_base + sid)
        n_sc_seq = (send - s0 + S - 1) // S
        jl = j - sc_base
        d = tl.arange(0, BD)
        dv = tl.arange(0, BDV)
        rn = tl.arange(0, BLOCK_N)
        dmask = (d < D)[None, :]
        dvmask = (dv < DV)[None, :]
        dpair = d[:, None] * BD + d[None, :]
        krows = (tokj + t0 + rn).to(tl.int64)
        voff = (krows[:, None] * H + h) * DV + dv[None, :]
        # dV of the key tile summed over the query heads of its group: the program owns these rows of dv
        # (the inter part; the intra kernels add theirs later), so it stores them once, in dv's type
        dV = tl.zeros((BLOCK_N, BDV), dtype=tl.float32)
        for g_i in range(0, HQ // H):
            hq = h * (HQ // H) + g_i
            gc_h = gc_ptr + hq.to(tl.int64) * gc_hs
            koff = (krows[:, None] * H + h) * D + d[None, :]
            KJ = tl.load(kj_ptr + koff, mask=dmask, other=0.0)
            Vt = tl.load(v_ptr + voff, mask=dvmask, other=0.0)
            if USE_GATE:
                ck_s = tl.load(gc_h + krows) * gate_scale
            else:
                ck_s = tl.zeros((BLOCK_N,), dtype=tl.float32)
            if USE_GATE and GATE_MMA:   # the key tile's offsets as bf16 parts, once for the whole walk
                Pk = bias_parts(ck_s * (-1.0 / qk_scale))
            else:
                Pk = ck_s
            if GATE_SUM_MMA:    # the gate's key-side sums -sum_i dS_ij (column 0; _dkv_superchunk)
                dck = tl.zeros((BLOCK_N, 16), dtype=tl.float32)
            else:
                dck = tl.zeros((BLOCK_N,), dtype=tl.float32)
            if DB == BD:
                KJd = KJ.to(DT)
                for il in range(jl + 1, n_sc_seq):
                    om_base = om_ptr + ((pair_base + il * n_sc_seq + jl) * H + h) * BD * BD
                    KZ = mm(KJd, tl.trans(tl.load(om_base + dpair).to(DT)), INTERP).to(DT)
                    dV, dKZ, dck = _dkv_superchunk(KZ, Vt, ck_s, Pk, dV, dck, y_ptr, do_ptr, lse_ptr, delta_ptr, gc_h,
                                                   s0 + il * S, send, hq, qk_scale, gate_scale, HQ, D, DV, BD, BDV,
                                                   S, BLOCK_N, BLOCK_M, DT, USE_GATE, GATE_SUM_MMA, GATE_MMA, INTERP)
                    # dKJ read-modify-written per super-chunk (rows owned by this program; same layout
                    # for load and store) rather than a BLOCK_N x BD float32 tile live across the walk:
                    # on the H200 4.35 -> 3.76 ms at D=64 (4 warps, spilling), unchanged at D=128
                    dKZd = dKZ.to(DT)
                    tl.store(dkj_ptr + koff, tl.load(dkj_ptr + koff, mask=dmask, other=0.0)
                             + mm(dKZd, tl.load(om_base + dpair).to(DT), INTERP) * scale, mask=dmask)
                    pptr = dom_ptr + ((pair_base + il * n_sc_seq + jl) * H + h) * BD * BD + dpair
                    tl.atomic_add(pptr, mm(tl.trans(dKZd), KJd, INTERP) * scale, sem="relaxed")
                    # (after the last super-chunk this product is dead; prepare_state zero-fills that
                    # entry rather than branching here, which cost 64 KB more shared memory at D=128)
            else:
                krow = (krows * H + h) * D
                for il in range(jl + 1, n_sc_seq):
                    pair = ((pair_base + il * n_sc_seq + jl) * H + h) * BD * BD
                    tl.debug_barrier()      # every read of kz and dkj of the previous pair is done
                    for cb in tl.static_range(BD // DB):
                        if cb * DB < D:     # column blocks wholly past D are zero
                            e = cb * DB + tl.arange(0, DB)
                            OmR = tl.load(om_ptr + pair + e[:, None] * BD + d[None, :])          # Om[cb, :]
                            tl.store(kz_ptr + krow[:, None] + e[None, :],
                                     tl.dot(KJ.to(tl.float32), tl.trans(OmR), input_precision=TP).to(DT),
                                     mask=(e < D)[None, :])
                    tl.debug_barrier()
                    KZ = tl.load(kz_ptr + koff, mask=dmask, other=0.0)
                    dV, dKZ, dck = _dkv_superchunk(KZ, Vt, ck_s, Pk, dV, dck, y_ptr, do_ptr, lse_ptr, delta_ptr, gc_h,
                                                   s0 + il * S, send, hq, qk_scale, gate_scale, HQ, D, DV, BD, BDV,
                                                   S, BLOCK_N, BLOCK_M, DT, USE_GATE, GATE_SUM_MMA, GATE_MMA, INTERP)
                    for cb in tl.static_range(BD // DB):
                        if cb * DB < D:
                            e = cb * DB + tl.arange(0, DB)
                            emask = (e < D)[None, :]
                            Omb = tl.load(om_ptr + pair + d[:, None] * BD + e[None, :])          # Om[:, cb]
                            kptr = dkj_ptr + krow[:, None] + e[None, :]
                            upd = tl.dot(dKZ, Omb, input_precision=TP) * scale
                            tl.store(kptr, tl.load(kptr, mask=emask, other=0.0) + upd, mask=emask)
                            KJb = tl.load(kj_ptr + krow[:, None] + e[None, :], mask=emask, other=0.0)
                            dom = tl.dot(tl.trans(dKZ), KJb.to(tl.float32), input_precision=TP) * scale
                            tl.atomic_add(dom_ptr + pair + d[:, None] * BD + e[None, :], dom,
                                          mask=(d < D)[:, None] & emask, sem="relaxed")
            tl.debug_barrier()
            if USE_GATE:
                cptr = dc_ptr + hq.to(tl.int64) * gc_hs + krows
                if GATE_SUM_MMA:
                    dck_sum = tl.sum(dck, axis=1)
                else:
                    dck_sum = dck
                tl.store(cptr, tl.load(cptr) - dck_sum * gate_nat)
            tl.debug_barrier()
        tl.store(dv_ptr + voff, dV.to(dv_ptr.dtype.element_ty), mask=dvmask)


@triton.jit
def bwd_pair_transitions_kernel(
    what_ptr, om_ptr,
    sc_seq, seq_start, seq_end, seq_sc_base, seq_pair_base,
    H: tl.constexpr, BD: tl.constexpr, S: tl.constexpr, ROWS: tl.constexpr, TP: tl.constexpr,
):
    """Per (super-chunk I, kv head, ROWS rows): Om_{I,J} = What_{I-1} ... What_{J+1} (the identity
    for J = I - 1) for every J < I, stored in om_ptr's element type (the inter kernels' 16-bit
    operand) at pair entry pair_base + I * n_sc + J.  Walks J right to left with the rows of Om in
    float32 registers, Om_{I,J} = Om_{I,J+1} What_{J+1} at precision TP (one BD x BD What tile a
    step), so the rounding to 16 bits happens once per stored pair, not along the walk.  Entries
    J >= I are left unwritten: no kernel reads them."""
    il, nsc, sc_base, pair_base = _chain_prologue(tl.program_id(0), sc_seq, seq_start, seq_end, seq_sc_base,
                                                  seq_pair_base, S)
    h = tl.program_id(1)
    if il >= 1:
        rr = tl.program_id(2) * ROWS + tl.arange(0, ROWS)
        d = tl.arange(0, BD)
        tile = rr[:, None] * BD + d[None, :]
        row0 = (pair_base + il * nsc).to(tl.int64)
        Om = tl.where(rr[:, None] == d[None, :], 1.0, 0.0)
        tl.store(om_ptr + ((row0 + il - 1) * H + h) * BD * BD + tile, Om.to(om_ptr.dtype.element_ty))
        for step in range(0, il - 1):
            jl = il - 2 - step
            Wh = tl.load(what_ptr + (((sc_base + jl + 1).to(tl.int64) * H + h) * BD + d[:, None]) * BD + d[None, :])
            Om = tl.dot(Om, Wh, input_precision=TP)
            tl.store(om_ptr + ((row0 + jl) * H + h) * BD * BD + tile, Om.to(om_ptr.dtype.element_ty))
