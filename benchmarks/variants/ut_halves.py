"""Candidate for the forward's UT stage: ``ut_fused_kernel`` on the two halves of a chunk instead of
whole C x C tiles.

Same outputs as ``codegen/triton/ut.py: ut_fused_kernel`` (U, K~ and optionally w in the output
type, M float32 [N_tok, H, C]), same grid (one program per (UT chunk, kv head)).  The shipped kernel
inverts T = I + strictLower(diag(beta) W W^T) from its 16 x 16 diagonal blocks with four full C x C
products (F = Dinv E, F^2, (I - F)(I + F^2), X Dinv) and forms M = A strictLower(W K^T) with a fifth,
all at the UT precision (tf32x3: three MMA passes each): most of that work multiplies zero blocks.

Here the chunk is split into halves 1 and 2 of C / 2 rows, and every C x C quantity is kept as its
three non-zero blocks, each formed from the half's own loads (no slicing of register tiles):

    T11 = I + sL(b1 W1 W1^T),  T21 = b2 W2 W1^T,  T22 = I + sL(b2 W2 W2^T)
    inv11 = T11^{-1}, inv22 = T22^{-1}     row-by-row forward substitution in float32 registers
    X21 = -inv22 (T21 inv11)                (the only products of the inverse: two, of C/2)
    A = T^{-1} diag(b):  A11 = inv11 b1, A21 = X21 b1, A22 = inv22 b2
    M11 = A11 sL(L11),  M21 = A21 sL(L11) + A22 L21,  M22 = A22 sL(L22)     (L = W K^T; M12 = 0)
    U1 = A11 W1,  U2 = A21 W1 + A22 W2,  K~1 = K1 - M11^T W1 - M21^T W2,  K~2 = K2 - M22^T W2

Six products of (C/2)^3 at the UT precision instead of five of C^3 (C = 64: 3.3x fewer multiply-adds),
and six C/2 x C/2 x D applies instead of four C x C x D.  The substitution walks C/2 - 1 dependent rows
(31 at C = 64) where the shipped kernel walks 15 for its four 16-row blocks at once.

The row-by-row substitution is ``ut.py``'s ``_invert_unit_lower_16`` for any size (that one stays until
this candidate replaces the shipped kernel).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from pathtune.codegen.triton.ut import _apply, _gram, _operand, _pdot


@triton.jit
def _invert_unit_lower(N, R: tl.constexpr):
    """(I + N)^{-1} for a strictly lower R x R float32 tile, by forward substitution (row i of the
    inverse is e_i - sum_{j<i} N[i, j] row j)."""
    r = tl.arange(0, R)
    inv = tl.where(r[:, None] == r[None, :], 1.0, 0.0)
    for i in range(1, R):
        n_i = tl.sum(tl.where(r[:, None] == i, N, 0.0), axis=0)
        corr = tl.sum(n_i[:, None] * inv, axis=0)
        inv = tl.where(r[:, None] == i, inv - corr[None, :], inv)
    return inv


@triton.jit
def ut_halves_kernel(
    w_ptr, beta_ptr, k_ptr,
    u_ptr, kt_ptr, wd_ptr, m_ptr,
    chunk_tok0, chunk_seq, seq_end,
    H: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, DB: tl.constexpr, C: tl.constexpr,
    BETA_MAX: tl.constexpr, UP: tl.constexpr, AP: tl.constexpr, OP16: tl.constexpr, WRITE_W: tl.constexpr,
    INTERP: tl.constexpr,
):
    HB: tl.constexpr = C // 2
    n = tl.program_id(0)
    h = tl.program_id(1)
    tok0 = tl.load(chunk_tok0 + n)
    send = tl.load(seq_end + tl.load(chunk_seq + n))
    s = tl.arange(0, HB)
    db = tl.arange(0, DB)
    rows1 = (tok0 + s).to(tl.int64)
    rows2 = rows1 + HB
    in1 = rows1 < send
    in2 = rows2 < send

    G11 = tl.zeros((HB, HB), dtype=tl.float32)
    G21 = tl.zeros((HB, HB), dtype=tl.float32)
    G22 = tl.zeros((HB, HB), dtype=tl.float32)
    for d0 in tl.static_range(0, BD, DB):
        cols = (d0 + db < D)[None, :]
        W1 = _operand(tl.load(w_ptr + (rows1[:, None] * H + h) * D + d0 + db[None, :], mask=in1[:, None] & cols,
                              other=0.0), u_ptr, OP16)
        W2 = _operand(tl.load(w_ptr + (rows2[:, None] * H + h) * D + d0 + db[None, :], mask=in2[:, None] & cols,
                              other=0.0), u_ptr, OP16)
        G11 += _gram(W1, W1, UP, INTERP)
        G21 += _gram(W2, W1, UP, INTERP)
        G22 += _gram(W2, W2, UP, INTERP)
    b1 = tl.minimum(tl.load(beta_ptr + rows1 * H + h, mask=in1, other=0.0).to(tl.float32), BETA_MAX)
    b2 = tl.minimum(tl.load(beta_ptr + rows2 * H + h, mask=in2, other=0.0).to(tl.float32), BETA_MAX)
    strict = s[:, None] > s[None, :]
    inv11 = _invert_unit_lower(tl.where(strict, b1[:, None] * G11, 0.0), HB)
    inv22 = _invert_unit_lower(tl.where(strict, b2[:, None] * G22, 0.0), HB)
    X21 = -_pdot(inv22, _pdot(b2[:, None] * G21, inv11, UP), UP)
    A11 = inv11 * b1[None, :]
    A21 = X21 * b1[None, :]
    A22 = inv22 * b2[None, :]

    L11 = tl.zeros((HB, HB), dtype=tl.float32)
    L21 = tl.zeros((HB, HB), dtype=tl.float32)
    L22 = tl.zeros((HB, HB), dtype=tl.float32)
    for d0 in tl.static_range(0, BD, DB):
        cols = (d0 + db < D)[None, :]
        off1 = (rows1[:, None] * H + h) * D + d0 + db[None, :]
        off2 = (rows2[:, None] * H + h) * D + d0 + db[None, :]
        W1 = _operand(tl.load(w_ptr + off1, mask=in1[:, None] & cols, other=0.0), u_ptr, OP16)
        W2 = _operand(tl.load(w_ptr + off2, mask=in2[:, None] & cols, other=0.0), u_ptr, OP16)
        K1 = _operand(tl.load(k_ptr + off1, mask=in1[:, None] & cols, other=0.0), u_ptr, OP16)
        K2 = _operand(tl.load(k_ptr + off2, mask=in2[:, None] & cols, other=0.0), u_ptr, OP16)
        L11 += _gram(W1, K1, UP, INTERP)
        L21 += _gram(W2, K1, UP, INTERP)
        L22 += _gram(W2, K2, UP, INTERP)
    L11 = tl.where(strict, L11, 0.0)
    M11 = _pdot(A11, L11, UP)
    M21 = _pdot(A21, L11, UP) + _pdot(A22, L21, UP)
    M22 = _pdot(A22, tl.where(strict, L22, 0.0), UP)
    moff1 = (rows1[:, None] * H + h) * C + s[None, :]
    moff2 = (rows2[:, None] * H + h) * C + s[None, :]
    tl.store(m_ptr + moff1, M11, mask=in1[:, None])
    tl.store(m_ptr + moff1 + HB, tl.zeros((HB, HB), dtype=tl.float32), mask=in1[:, None])
    tl.store(m_ptr + moff2, M21, mask=in2[:, None])
    tl.store(m_ptr + moff2 + HB, M22, mask=in2[:, None])

    M11t = tl.trans(M11)
    M21t = tl.trans(M21)
    M22t = tl.trans(M22)
    for d0 in tl.static_range(0, BD, DB):
        cols = (d0 + db < D)[None, :]
        off1 = (rows1[:, None] * H + h) * D + d0 + db[None, :]
        off2 = (rows2[:, None] * H + h) * D + d0 + db[None, :]
        mask1 = in1[:, None] & cols
        mask2 = in2[:, None] & cols
        W1 = _operand(tl.load(w_ptr + off1, mask=mask1, other=0.0), u_ptr, OP16)
        W2 = _operand(tl.load(w_ptr + off2, mask=mask2, other=0.0), u_ptr, OP16)
        K1 = _operand(tl.load(k_ptr + off1, mask=mask1, other=0.0), u_ptr, OP16).to(tl.float32)
        K2 = _operand(tl.load(k_ptr + off2, mask=mask2, other=0.0), u_ptr, OP16).to(tl.float32)
        U1 = _apply(A11, W1, UP, AP, INTERP)
        U2 = _apply(A21, W1, UP, AP, INTERP) + _apply(A22, W2, UP, AP, INTERP)
        Kt1 = K1 - _apply(M11t, W1, UP, AP, INTERP) - _apply(M21t, W2, UP, AP, INTERP)
        Kt2 = K2 - _apply(M22t, W2, UP, AP, INTERP)
        tl.store(u_ptr + off1, U1.to(u_ptr.dtype.element_ty), mask=mask1)
        tl.store(u_ptr + off2, U2.to(u_ptr.dtype.element_ty), mask=mask2)
        tl.store(kt_ptr + off1, Kt1.to(kt_ptr.dtype.element_ty), mask=mask1)
        tl.store(kt_ptr + off2, Kt2.to(kt_ptr.dtype.element_ty), mask=mask2)
        if WRITE_W:
            tl.store(wd_ptr + off1, W1.to(wd_ptr.dtype.element_ty), mask=mask1)
            tl.store(wd_ptr + off2, W2.to(wd_ptr.dtype.element_ty), mask=mask2)


def ut_halves(kt_in, wt, bt, tables, H: int, D: int, C: int, params, out_dtype=torch.float32, write_w: bool = False,
              apply_mode=None, num_warps: int = 4):
    """``forward.ut_fused`` (same arguments and outputs: u, K~, m, w copy or None) launching
    ``ut_halves_kernel``, which takes ``ut_fused_kernel``'s arguments."""
    from kernel_variants import swapped

    from pathtune.codegen.triton import forward as fwd

    with swapped(fwd, "ut_fused_kernel", ut_halves_kernel):
        return fwd.ut_fused(kt_in, wt, bt, tables, H, D, C, params, out_dtype=out_dtype, write_w=write_w,
                            apply_mode=apply_mode, num_warps=num_warps)
