"""Stage `ut_inverse` (+ key boundary adjustment): one program per (UT chunk, kv head).

For chunk m with rows W (C x D, unit-norm w), beta (C), K (C x D):
    T  = I + strictLower(diag(beta) W W^T)       inverted by blocked forward substitution (float32)
    A  = T^{-1} diag(beta)                        (lower triangular)
    U  = A W                                      P_m = I - W^T U = H_last ... H_first
    M  = A strictLower(W K^T)                     used by the diagonal tile of the scan
    K~ = K - M^T W                                row j = (H_last ... H_{j+1} k_j)^T
Outputs U, K~ ([N_tok, H, D]: float32 for the backward and the decode prefill, the scan's 16-bit type
for a forward, whose scan and transport read them as 16-bit operands) and M ([N_tok, H, C]: float32, or for a
forward whose scan rounds it to fp16 / bf16 anyway that type, ``forward.ut_state_m_dtype``).

``ut_fused_kernel`` (the forward) and ``ut_recompute_kernel`` (the backward's per-range state, plus A) run one
body, ``_ut_stage``.

Two kernels: ``ut_chunk_kernel`` (the C x C work: W W^T and W K^T over column blocks, the inverse,
A and M; A goes to a float32 [N_tok, H, C] buffer) and ``ut_apply_kernel`` (U and K~, one program per
64-wide column block of D).

The inverse is built from 16 x 16 diagonal blocks passed through a float32 scratch tile per
(chunk, head) (L2 resident).  ``ut_diag_inverse_kernel`` inverts the diagonal blocks by
row-wise substitution, one warp per block: the 15 dependent steps are latency-bound, so they
run in many small programs instead of inside the wide chunk program.  The chunk kernels then
finish the inverse with a few full-tile tensor-core products (``_blocked_inverse``).
(Substitution row by row over the whole C x C tile spilled 40 KB per thread on sm_90.)

UP, the stage's precision (the spec's ut_precision knob), applies to every product of float32 tiles
(``_pdot``): "fp16x3" multiplies each as three fp16 tensor-core passes of a row / column scaled
hi + lo split (~22 bits, like tf32x3, at twice tf32's rate and on half the operand registers, but
the scales' row and column reductions cost more than that saves in ut_fused_kernel on the H200);
"tf32x3" / "tf32" / "ieee" are Triton's float32 modes.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._ops import interpreting, mm

_INTERP = tl.constexpr(interpreting())   # Triton picks interpreter or compiler when a module is imported


@triton.jit
def _pow2_exponent(amax):
    """floor(log2(amax)) of each largest magnitude (at least 2^-100): the power of two that scales it near 1."""
    return tl.floor(tl.log2(tl.maximum(amax, 1e-30)))


@triton.jit
def _split(x, scale, dt: tl.constexpr):
    """x * scale as hi + lo parts of 16-bit type dt (hi + lo carries ~22 bits in fp16, 16 in bf16)."""
    xs = x * scale
    hi = xs.to(dt)
    return hi, (xs - hi.to(tl.float32)).to(dt)


@triton.jit
def _pdot(a, b, UP: tl.constexpr):
    """a @ b of two float32 tiles with float32 accumulation at the UT stage's precision UP.

    "fp16x3": a's rows and b's columns are first scaled by powers of two that bring their largest
    entry near 1 (no fp16 overflow or early underflow, whatever the entries' range: A grows when a
    chunk's w are nearly dependent), split into hi + lo fp16 parts, and multiplied as
    hi hi + hi lo + lo hi; the scales come off exactly afterwards.  Else tl.dot in mode UP."""
    if UP == "fp16x3":
        ea = _pow2_exponent(tl.max(tl.abs(a), axis=1))
        eb = _pow2_exponent(tl.max(tl.abs(b), axis=0))
        ah, al = _split(a, tl.exp2(-ea)[:, None], tl.float16)
        bh, bl = _split(b, tl.exp2(-eb)[None, :], tl.float16)
        if _INTERP:   # fp16 x fp16 products are exact in float32: the GPU's fp32-accumulated MMA
            ah, al, bh, bl = ah.to(tl.float32), al.to(tl.float32), bh.to(tl.float32), bl.to(tl.float32)
            p = (tl.dot(ah, bh, input_precision="ieee")
                 + (tl.dot(ah, bl, input_precision="ieee") + tl.dot(al, bh, input_precision="ieee")))
        else:
            p = tl.dot(ah, bh) + (tl.dot(ah, bl) + tl.dot(al, bh))
        return p * tl.exp2(ea)[:, None] * tl.exp2(eb)[None, :]
    else:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision=UP)


@triton.jit
def _chunk_rows(n, chunk_tok0, chunk_seq, seq_end, C: tl.constexpr):
    """Token rows (int64) of UT chunk n and which of them lie inside its sequence."""
    tok0 = tl.load(chunk_tok0 + n)
    send = tl.load(seq_end + tl.load(chunk_seq + n))
    rows = (tok0 + tl.arange(0, C)).to(tl.int64)
    return rows, rows < send


@triton.jit
def _invert_unit_lower_16(Nbb):
    """(I + Nbb)^{-1} for a strictly lower 16 x 16 block, by forward substitution."""
    r = tl.arange(0, 16)
    inv = tl.where(r[:, None] == r[None, :], 1.0, 0.0)
    for i in range(1, 16):
        n_i = tl.sum(tl.where(r[:, None] == i, Nbb, 0.0), axis=0)
        corr = tl.sum(n_i[:, None] * inv, axis=0)
        inv = tl.where(r[:, None] == i, inv - corr[None, :], inv)
    return inv


@triton.jit
def ut_diag_inverse_kernel(
    w_ptr, beta_ptr, scratch_ptr,
    chunk_tok0, chunk_seq, seq_end,
    H: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, DB: tl.constexpr, C: tl.constexpr,
    BETA_MAX: tl.constexpr, UP: tl.constexpr,
):
    """Diagonal 16 x 16 blocks of (I + strictLower(diag(beta) W W^T))^{-1}, into the scratch tiles.

    Grid (n_chunks * C // 16, H); launch with one warp.  W W^T at the UT stage's precision UP, like
    ut_chunk_kernel's.
    """
    pid = tl.program_id(0)
    h = tl.program_id(1)
    n = pid // (C // 16)
    bi = pid % (C // 16)
    tok0 = tl.load(chunk_tok0 + n)
    send = tl.load(seq_end + tl.load(chunk_seq + n))
    s = tl.arange(0, 16)
    d = tl.arange(0, DB)
    rows = (tok0 + bi * 16 + s).to(tl.int64)
    rmask = rows < send
    # products over DB-wide column blocks: a 16 x 16 x BD broadcast product spilled 528 B per
    # thread at D = 128
    G = tl.zeros((16, 16), dtype=tl.float32)
    for d0 in tl.static_range(0, BD, DB):
        W = tl.load(w_ptr + (rows[:, None] * H + h) * D + d0 + d[None, :],
                    mask=rmask[:, None] & (d0 + d < D)[None, :], other=0.0).to(tl.float32)
        G += _pdot(W, tl.trans(W), UP)
    beta = tl.minimum(tl.load(beta_ptr + rows * H + h, mask=rmask, other=0.0).to(tl.float32), BETA_MAX)
    Nbb = tl.where(s[:, None] > s[None, :], beta[:, None] * G, 0.0)
    inv = _invert_unit_lower_16(Nbb)
    base = scratch_ptr + (n * H + h).to(tl.int64) * C * C
    tl.store(base + (bi * 16 + s[:, None]) * C + bi * 16 + s[None, :], inv)


@triton.jit
def _blocked_inverse(N, base, C: tl.constexpr, UP: tl.constexpr):
    """(I + N)^{-1} for a strictly lower C x C tile N, from the inverted 16 x 16 diagonal blocks
    that ut_diag_inverse_kernel left in the scratch tile at base (``_finish_inverse``)."""
    r = tl.arange(0, C)
    blockdiag = (r // 16)[:, None] == (r // 16)[None, :]
    Dinv = tl.load(base + r[:, None] * C + r[None, :], mask=blockdiag, other=0.0)
    return _finish_inverse(N, Dinv, C, UP, 16)


@triton.jit
def _finish_inverse(N, Dinv, C: tl.constexpr, UP: tl.constexpr, SB: tl.constexpr):
    """(I + N)^{-1} for a strictly lower C x C tile N, given Dinv, the inverses of its SB x SB
    diagonal blocks (a block-diagonal C x C tile).

    With D the block diagonal of T = I + N and E its strictly block-lower rest,
    T = D (I + F) with F = Dinv E strictly block-lower, so F^(C/SB) = 0 and
    (I + F)^{-1} = (I - F)(I + F^2)(I + F^4)...  -- log2(C/SB) + 2 full-tile tensor-core products
    and no serial block-row substitution (that took ~16 dependent scratch round trips per chunk).
    """
    r = tl.arange(0, C)
    blockdiag = (r // SB)[:, None] == (r // SB)[None, :]
    eye = tl.where(r[:, None] == r[None, :], 1.0, 0.0)
    F = _pdot(Dinv, tl.where(blockdiag, 0.0, N), UP)
    X = eye - F
    P = F
    for k in tl.static_range(6):  # C // SB block rows: F^2, F^4, ... while F^(2^(k+1)) != 0
        if (2 << k) < C // SB:
            P = _pdot(P, P, UP)
            X = _pdot(X, eye + P, UP)
    return _pdot(X, Dinv, UP)


@triton.jit
def _block_row(scratch_ptr, first, i, send, h, H: tl.constexpr, SB: tl.constexpr, RS: tl.constexpr):
    """Row i of the SB x SB block of N that each of the chunk's rows belongs to ([C, SB]), read from the
    first SB float32 words of the scratch rows (RS words a (token, head) row) where ``_diagonal_block_inverses``
    parks the blocks."""
    row_i = (first + i).to(tl.int64)
    return tl.load(scratch_ptr + (row_i * H + h)[:, None] * RS + tl.arange(0, SB)[None, :],
                   mask=(row_i < send)[:, None], other=0.0)


@triton.jit
def _diagonal_block_inverses(N, scratch_ptr, tok0, send, h, H: tl.constexpr, C: tl.constexpr, SB: tl.constexpr,
                             RS: tl.constexpr):
    """The inverses of the SB x SB diagonal blocks of I + N (N strictly lower, C x C float32), as a
    block-diagonal C x C tile, by forward substitution: the C / SB blocks advance together, one row per
    step (SB - 1 dependent steps).  Substitution rather than a product formula: (I - N)(I + N^2)(I + N^4)
    (I + N^8) cancels entries of ~1e6 down to ~2 in float32 when the w of a block are nearly parallel at
    beta = 2.  SB (the spec's ut_diag_block) trades these serial steps, which set the kernel's time, for
    the merge products of ``_finish_inverse`` (two more per halving of SB).

    Layout: the blocks of N go to the first SB float32 words of this chunk's scratch rows (``scratch_ptr``, RS
    words per (token, head): the float32 rows of m, [N_tok, H, C], or those of a 16-bit U seen as float32; M or U
    overwrites them later).  The inverse is held transposed as a [C, SB] tile, ``it[b*SB + c, k]``
    = entry (k, c) of block b's inverse, so a step's product with row i of every block is a reduction over
    the tile's last axis, which stays inside one warp (shuffles, no barrier; a [C/SB, SB, SB] tile reduces
    across the warps, through shared memory, at every step).  The rows of N a step needs come back from the
    scratch and do not depend on earlier steps.  The inverse returns to the C x C layout through the same words.
    Rows outside ``send`` (past a sequence end) read back as 0: they only meet later rows of the
    lower-triangular products."""
    r = tl.arange(0, C)
    k = tl.arange(0, SB)
    rows = (tok0 + r).to(tl.int64)
    rmask = rows < send
    blockdiag = (r // SB)[:, None] == (r // SB)[None, :]
    tl.store(scratch_ptr + (rows[:, None] * H + h) * RS + (r % SB)[None, :], N, mask=blockdiag & rmask[:, None])
    tl.debug_barrier()
    first = tok0 + (r // SB) * SB           # first token row of the block row (b, c) belongs to
    it = tl.where((r % SB)[:, None] == k[None, :], 1.0, 0.0)
    n_i = _block_row(scratch_ptr, first, 1, send, h, H, SB, RS)
    for i in tl.static_range(1, SB):
        corr = tl.sum(n_i * it, axis=1)
        it = tl.where(k[None, :] == i, it - corr[:, None], it)
        if i + 1 < SB:
            n_i = _block_row(scratch_ptr, first, i + 1, send, h, H, SB, RS)
    tl.debug_barrier()                      # every row of N is read before the inverse overwrites it
    inv_rows = (first[:, None] + k[None, :]).to(tl.int64)
    tl.store(scratch_ptr + (inv_rows * H + h) * RS + (r % SB)[:, None], it, mask=inv_rows < send)
    tl.debug_barrier()
    return tl.load(scratch_ptr + (rows[:, None] * H + h) * RS + (r % SB)[None, :],
                   mask=blockdiag & rmask[:, None], other=0.0)


@triton.jit
def _operand(x, OPDT: tl.constexpr):
    """x rounded to OPDT when that is a 16-bit type (a compact state's), else as loaded (tl.float32)."""
    if OPDT == tl.float32:
        return x
    else:
        return x.to(OPDT)


@triton.jit
def _gram(a, b, UP: tl.constexpr, INTERP: tl.constexpr):
    """a @ b^T with float32 accumulation.  16-bit inputs of one type multiply on 16-bit tensor
    cores, which is exact here (a product of two 16-bit numbers fits float32): the same result as
    tf32x3 in one pass.  Anything else multiplies in float32 at precision UP."""
    if a.dtype == b.dtype and (a.dtype == tl.bfloat16 or a.dtype == tl.float16):
        return mm(a, tl.trans(b), INTERP)
    else:
        return _pdot(a.to(tl.float32), tl.trans(b.to(tl.float32)), UP)


@triton.jit
def _apply(A, X, UP: tl.constexpr, AP: tl.constexpr, INTERP: tl.constexpr):
    """A @ X for a float32 C x C tile A and a C x DB input tile X.  AP == "split": X 16-bit, A
    taken as hi + lo in X's type (two 16-bit tensor-core passes, X exact), each row of A first scaled
    by a power of two that brings its largest entry near 1 (a guard: |A| stays below ~3 for random
    unit w, also with more tokens than head dims, but no bound holds for every input), so that
    neither part overflows fp16 and the split keeps ~22 (fp16) / 16 (bf16) bits relative to that
    row's largest entry; the scale comes off exactly afterwards.  Else float32 operands at precision
    UP (``_pdot``)."""
    if AP == "split":
        e = _pow2_exponent(tl.max(tl.abs(A), axis=1))
        hi, lo = _split(A, tl.exp2(-e)[:, None], X.dtype)
        return (mm(hi, X, INTERP) + mm(lo, X, INTERP)) * tl.exp2(e)[:, None]
    else:
        return _pdot(A, X.to(tl.float32), UP)


@triton.jit
def ut_chunk_kernel(
    w_ptr, beta_ptr, k_ptr,
    a_ptr, m_ptr, scratch_ptr,
    chunk_tok0, chunk_seq, seq_end,
    H: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, DB: tl.constexpr, C: tl.constexpr,
    BETA_MAX: tl.constexpr, UP: tl.constexpr,
):
    """The C x C half of the UT stage: A = T^{-1} diag(beta) and M = A strictLower(W K^T), stored
    (float32, [N_tok, H, C] rows) for ``ut_apply_kernel``.  W W^T and W K^T are accumulated over
    DB-wide column blocks, so no C x D tile is live (at D = 128 the single-kernel UT stage held W,
    K, U and K~ at once: 255 registers and 1.6 KB of spills per thread on sm_90).

    UP: the precision of every product (``_pdot``)."""
    n = tl.program_id(0)
    h = tl.program_id(1)
    rows, rmask = _chunk_rows(n, chunk_tok0, chunk_seq, seq_end, C)
    r = tl.arange(0, C)
    db = tl.arange(0, DB)

    Gm = tl.zeros((C, C), dtype=tl.float32)
    L = tl.zeros((C, C), dtype=tl.float32)
    for d0 in tl.static_range(0, BD, DB):
        mask2 = rmask[:, None] & (d0 + db < D)[None, :]
        off = (rows[:, None] * H + h) * D + d0 + db[None, :]
        W = tl.load(w_ptr + off, mask=mask2, other=0.0).to(tl.float32)
        K = tl.load(k_ptr + off, mask=mask2, other=0.0).to(tl.float32)
        Gm += _pdot(W, tl.trans(W), UP)
        L += _pdot(W, tl.trans(K), UP)
    beta = tl.load(beta_ptr + rows * H + h, mask=rmask, other=0.0).to(tl.float32)
    beta = tl.minimum(beta, BETA_MAX)
    strict = r[:, None] > r[None, :]
    N = tl.where(strict, beta[:, None] * Gm, 0.0)
    Tinv = _blocked_inverse(N, scratch_ptr + (n * H + h).to(tl.int64) * C * C, C, UP)
    A = Tinv * beta[None, :]
    M = _pdot(A, tl.where(strict, L, 0.0), UP)
    coff = (rows[:, None] * H + h) * C + r[None, :]
    tl.store(a_ptr + coff, A, mask=rmask[:, None])
    tl.store(m_ptr + coff, M, mask=rmask[:, None])


@triton.jit
def ut_apply_kernel(
    w_ptr, k_ptr, a_ptr, m_ptr,
    u_ptr, kt_ptr, wd_ptr,
    chunk_tok0, chunk_seq, seq_end,
    H: tl.constexpr, D: tl.constexpr, DB: tl.constexpr, C: tl.constexpr, UP: tl.constexpr,
    WRITE_W: tl.constexpr,
):
    """The C x D half of the UT stage, one program per (chunk, kv head, DB-wide column block):
    U = A W (P_m = I - W^T U = H_last ... H_first) and K~ = K - M^T W (row j = (H_last ... H_{j+1} k_j)^T),
    stored in the element type of u_ptr / kt_ptr.  WRITE_W: also store W in wd_ptr's (16-bit) type,
    the copy the forward scan and transport read instead of the float32 input."""
    n = tl.program_id(0)
    h = tl.program_id(1)
    d0 = tl.program_id(2) * DB
    rows, rmask = _chunk_rows(n, chunk_tok0, chunk_seq, seq_end, C)
    r = tl.arange(0, C)
    db = tl.arange(0, DB)
    mask2 = rmask[:, None] & (d0 + db < D)[None, :]
    off = (rows[:, None] * H + h) * D + d0 + db[None, :]
    coff = (rows[:, None] * H + h) * C + r[None, :]
    A = tl.load(a_ptr + coff, mask=rmask[:, None], other=0.0)
    M = tl.load(m_ptr + coff, mask=rmask[:, None], other=0.0)
    W = tl.load(w_ptr + off, mask=mask2, other=0.0).to(tl.float32)
    K = tl.load(k_ptr + off, mask=mask2, other=0.0).to(tl.float32)
    tl.store(u_ptr + off, _pdot(A, W, UP).to(u_ptr.dtype.element_ty), mask=mask2)
    tl.store(kt_ptr + off, (K - _pdot(tl.trans(M), W, UP)).to(kt_ptr.dtype.element_ty), mask=mask2)
    if WRITE_W:
        tl.store(wd_ptr + off, W.to(wd_ptr.dtype.element_ty), mask=mask2)


@triton.jit
def _ut_stage(
    w_ptr, beta_ptr, k_ptr,
    u_ptr, kt_ptr, wd_ptr, m_ptr, a_ptr, scratch_ptr,
    chunk_tok0, chunk_seq, seq_end,
    H: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, DB: tl.constexpr, C: tl.constexpr,
    BETA_MAX: tl.constexpr, UP: tl.constexpr, AP: tl.constexpr, OPDT: tl.constexpr, RS: tl.constexpr,
    WRITE_A: tl.constexpr, WRITE_UK: tl.constexpr, WRITE_W: tl.constexpr, INTERP: tl.constexpr, SB: tl.constexpr,
):
    """The whole UT stage of one (chunk, kv head), program (n, h): the body of ``ut_fused_kernel`` (the forward)
    and ``ut_recompute_kernel`` (the backward's per-range state), so that a recompute of a forward's state
    equals it bit for bit.

    W W^T and W K^T accumulate over DB-wide column blocks (``_gram``: exact on 16-bit tensor cores for 16-bit
    operands); the SB x SB diagonal inverses by substitution, each step inside one warp, through the float32
    scratch rows at ``scratch_ptr`` (RS words per (token, head); ``_diagonal_block_inverses``), the block merges
    at UP; U = A W and K~ = K - M^T W per column block at AP (``_apply``), re-reading the W / K column block (an
    L2 hit: the first loop just read it) instead of keeping a C x D tile live.  M is stored in m's element type.

    OPDT: the type w and k are taken in (``_operand``): a compact state's 16-bit type, so that every product
    with them runs on 16-bit tensor cores, exact up to that rounding; tl.float32 for w and k as loaded.
    WRITE_A: A = T^{-1} diag(beta) as float32 rows of a_ptr ([N_tok, H, C]; the UT backward reads them).
    WRITE_UK: U, K~ (and with WRITE_W the copy of w in wd's type); without it only M (and A)."""
    n = tl.program_id(0)
    h = tl.program_id(1)
    rows, rmask = _chunk_rows(n, chunk_tok0, chunk_seq, seq_end, C)
    r = tl.arange(0, C)
    db = tl.arange(0, DB)

    Gm = tl.zeros((C, C), dtype=tl.float32)
    for d0 in tl.static_range(0, BD, DB):
        mask2 = rmask[:, None] & (d0 + db < D)[None, :]
        W = _operand(tl.load(w_ptr + (rows[:, None] * H + h) * D + d0 + db[None, :], mask=mask2, other=0.0), OPDT)
        Gm += _gram(W, W, UP, INTERP)
    beta = tl.minimum(tl.load(beta_ptr + rows * H + h, mask=rmask, other=0.0).to(tl.float32), BETA_MAX)
    strict = r[:, None] > r[None, :]
    N = tl.where(strict, beta[:, None] * Gm, 0.0)
    Dinv = _diagonal_block_inverses(N, scratch_ptr, tl.load(chunk_tok0 + n),
                                    tl.load(seq_end + tl.load(chunk_seq + n)), h, H, C, SB, RS)
    A = _finish_inverse(N, Dinv, C, UP, SB) * beta[None, :]
    coff = (rows[:, None] * H + h) * C + r[None, :]
    if WRITE_A:
        tl.store(a_ptr + coff, A, mask=rmask[:, None])
    # W K^T after the inverse, so that only one C x C accumulator is live through it
    L = tl.zeros((C, C), dtype=tl.float32)
    for d0 in tl.static_range(0, BD, DB):
        mask2 = rmask[:, None] & (d0 + db < D)[None, :]
        off = (rows[:, None] * H + h) * D + d0 + db[None, :]
        L += _gram(_operand(tl.load(w_ptr + off, mask=mask2, other=0.0), OPDT),
                   _operand(tl.load(k_ptr + off, mask=mask2, other=0.0), OPDT), UP, INTERP)
    M = _pdot(A, tl.where(strict, L, 0.0), UP)
    tl.debug_barrier()   # every thread has read its Dinv entries from the scratch before M or U overwrites them
    tl.store(m_ptr + coff, M.to(m_ptr.dtype.element_ty), mask=rmask[:, None])
    if WRITE_UK:
        Mt = tl.trans(M)
        for d0 in tl.static_range(0, BD, DB):
            mask2 = rmask[:, None] & (d0 + db < D)[None, :]
            off = (rows[:, None] * H + h) * D + d0 + db[None, :]
            W = _operand(tl.load(w_ptr + off, mask=mask2, other=0.0), OPDT)
            K = _operand(tl.load(k_ptr + off, mask=mask2, other=0.0), OPDT).to(tl.float32)
            tl.store(u_ptr + off, _apply(A, W, UP, AP, INTERP).to(u_ptr.dtype.element_ty), mask=mask2)
            tl.store(kt_ptr + off, (K - _apply(Mt, W, UP, AP, INTERP)).to(kt_ptr.dtype.element_ty), mask=mask2)
            if WRITE_W:
                tl.store(wd_ptr + off, W.to(wd_ptr.dtype.element_ty), mask=mask2)


@triton.jit
def ut_fused_kernel(
    w_ptr, beta_ptr, k_ptr,
    u_ptr, kt_ptr, wd_ptr, m_ptr, scratch_ptr,
    chunk_tok0, chunk_seq, seq_end,
    H: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, DB: tl.constexpr, C: tl.constexpr,
    BETA_MAX: tl.constexpr, UP: tl.constexpr, AP: tl.constexpr, OPDT: tl.constexpr, RS: tl.constexpr,
    WRITE_W: tl.constexpr, INTERP: tl.constexpr, SB: tl.constexpr,
):
    """The forward's UT stage of one (chunk, kv head) in one program (``_ut_stage``): the outputs of
    ut_diag_inverse, ut_chunk and ut_apply (U, K~, M and the optional copy of w) without their float32 A / M
    round trip or scratch tile.  Grid (n_chunks, H).  M in m's element type: fp16 / bf16 where the scan rounds
    it to that type anyway (``forward.ut_state_m_dtype``), and then the inverse's scratch rows are U's (RS = D / 2
    float32 words a row, written before U is); else float32, and the scratch rows are M's (RS = C)."""
    _ut_stage(w_ptr, beta_ptr, k_ptr, u_ptr, kt_ptr, wd_ptr, m_ptr, m_ptr, scratch_ptr,
              chunk_tok0, chunk_seq, seq_end,
              H, D, BD, DB, C, BETA_MAX, UP, AP, OPDT, RS, False, True, WRITE_W, INTERP, SB)


@triton.jit
def ut_recompute_kernel(
    w_ptr, beta_ptr, k_ptr,
    u_ptr, kt_ptr, wd_ptr, m_ptr, a_ptr,
    chunk_tok0, chunk_seq, seq_end,
    H: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, DB: tl.constexpr, C: tl.constexpr,
    BETA_MAX: tl.constexpr, UP: tl.constexpr, AP: tl.constexpr, OPDT: tl.constexpr, WRITE_UK: tl.constexpr,
    WRITE_W: tl.constexpr, INTERP: tl.constexpr, SB: tl.constexpr,
):
    """The backward's UT stage of one (chunk, kv head) in one program (``_ut_stage``, what the forward's
    ``ut_fused_kernel`` computes), plus A = T^{-1} diag(beta) as float32 [N_tok, H, C] rows for ``ut_bwd_kernel``;
    M float32, its rows the inverse's scratch.  Grid (n_chunks, H).

    WRITE_UK: also U, K~ (and with WRITE_W the 16-bit copy of w) for the per-range stages; without it only
    A and M (a range that reads a kept state's U, K~)."""
    _ut_stage(w_ptr, beta_ptr, k_ptr, u_ptr, kt_ptr, wd_ptr, m_ptr, a_ptr, m_ptr,
              chunk_tok0, chunk_seq, seq_end,
              H, D, BD, DB, C, BETA_MAX, UP, AP, OPDT, C, True, WRITE_UK, WRITE_W, INTERP, SB)
