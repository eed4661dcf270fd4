"""Stage `ut_inverse` (+ key boundary adjustment): one program per (UT chunk, kv head).

For chunk m with rows W (C x D, unit-norm w), beta (C), K (C x D):
    T  = I + strictLower(diag(beta) W W^T)       solved by forward substitution (float32)
    A  = T^{-1} diag(beta)                        (lower triangular)
    U  = A W                                      P_m = I - W^T U = H_last ... H_first
    M  = A strictLower(W K^T)                     used by the diagonal tile of the scan
    K~ = K - M^T W                                row j = (H_last ... H_{j+1} k_j)^T
Outputs U, K~ (float32, [N_tok, H, D]) and M (float32, [N_tok, H, C]).
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def ut_chunk_kernel(
    w_ptr, beta_ptr, k_ptr,
    u_ptr, kt_ptr, m_ptr,
    chunk_tok0, chunk_seq, seq_end,
    H: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, C: tl.constexpr,
    BETA_MAX: tl.constexpr,
):
    n = tl.program_id(0)
    h = tl.program_id(1)
    tok0 = tl.load(chunk_tok0 + n)
    send = tl.load(seq_end + tl.load(chunk_seq + n))
    r = tl.arange(0, C)
    d = tl.arange(0, BD)
    rows = (tok0 + r).to(tl.int64)
    rmask = rows < send
    mask2 = rmask[:, None] & (d < D)[None, :]
    off = (rows[:, None] * H + h) * D + d[None, :]

    W = tl.load(w_ptr + off, mask=mask2, other=0.0).to(tl.float32)
    K = tl.load(k_ptr + off, mask=mask2, other=0.0).to(tl.float32)
    beta = tl.load(beta_ptr + rows * H + h, mask=rmask, other=0.0).to(tl.float32)
    beta = tl.minimum(beta, BETA_MAX)

    strict = r[:, None] > r[None, :]
    G = tl.dot(W, tl.trans(W), input_precision="ieee")
    N = tl.where(strict, beta[:, None] * G, 0.0)
    # (I + N)^{-1} row by row: row_i = e_i - sum_{k<i} N[i, k] row_k
    Tinv = tl.where(r[:, None] == r[None, :], 1.0, 0.0)
    for i in range(1, C):
        n_i = tl.sum(tl.where(r[:, None] == i, N, 0.0), axis=0)
        corr = tl.sum(n_i[:, None] * Tinv, axis=0)
        Tinv = tl.where(r[:, None] == i, Tinv - corr[None, :], Tinv)
    A = Tinv * beta[None, :]

    U = tl.dot(A, W, input_precision="ieee")
    WK = tl.dot(W, tl.trans(K), input_precision="ieee")
    M = tl.dot(A, tl.where(strict, WK, 0.0), input_precision="ieee")
    Kt = K - tl.dot(tl.trans(M), W, input_precision="ieee")

    tl.store(u_ptr + off, U, mask=mask2)
    tl.store(kt_ptr + off, Kt, mask=mask2)
    moff = (rows[:, None] * H + h) * C + r[None, :]
    tl.store(m_ptr + moff, M, mask=rmask[:, None])
