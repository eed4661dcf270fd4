"""Stage `ut_inverse` backward: from dU, dK~, dM (and the partial dW, dK the scan kernels
accumulated) to the final dw, dk and dbeta of every UT chunk.

``ut.ut_recompute_kernel`` first rebuilds a token range's UT state in one launch (the forward's fused stage,
plus A; ``backward.ut_recompute``).  Then ``ut_bwd_kernel`` runs the whole UT backward of one (chunk, kv head)
in one program.  Its C x C work (``_ut_grad_tiles``): the D-reductions W W^T, W K^T, W dK~^T, dU W^T over
64-wide column blocks, A read from the recompute's rows, T^{-1} = I - A strictLower(W W^T) (one product:
T^{-1} (I + N) = I with N = diag(beta) strictLower(W W^T)), every C x C gradient and dbeta.  Then dW and dK,
one column block at a time (``_ut_grad_apply``), from the tiles dL and dG + dG^T held in registers and the
recompute's A and M rows:

    dW = dW_acc - M dK~ + dL K + A^T dU + (dG + dG^T) W        dK = dK_acc + dK~ + dL^T W

The second pass re-reads the chunk's W, K, dK~ and dU from L2.  (Split in two kernels that passed dL and
dG + dG^T through a float32 buffer, the stage took 1.13-1.30x this one's time on the H100: the buffer's round
trip and the second launch's re-reads of A, M and the tiles were ~45 % of its DRAM traffic at D 128.  One
kernel holding every C x D tile at once spilled 2.6 KB per thread at D = 128 on sm_90 and ran at 17-31
TFLOP/s.)  At 4 warps: at 8 the stage took 1.15-1.28x the time.  W W^T, W K^T and T^{-1} run at the forward's
precision UP, the gradient products at GP (the spec's ut_grad_precision knob).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .ut import _chunk_rows, _pdot

# warps, from compile_check for sm_90 (see the README's stage table)
UT_BWD_WARPS = 4


@triton.jit
def _ut_grad_tiles(w_ptr, beta_ptr, k_ptr, du_ptr, dkt_ptr, dm_ptr, a_ptr, rows, rmask, h,
                   H: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, DB: tl.constexpr, C: tl.constexpr,
                   BETA_MAX: tl.constexpr, UP: tl.constexpr, GP: tl.constexpr):
    """The C x C work of one (chunk, kv head) of the UT backward: (A, dL, dG + dG^T, dbeta) from the D-reductions
    W W^T, W K^T, W dK~^T and dU W^T (over DB-wide column blocks), A ([N_tok, H, C] float32 rows) and dM.
    dbeta is zero where beta was clipped to BETA_MAX."""
    r = tl.arange(0, C)
    db = tl.arange(0, DB)
    Gm = tl.zeros((C, C), dtype=tl.float32)       # W W^T
    L = tl.zeros((C, C), dtype=tl.float32)        # W K^T
    WdKt = tl.zeros((C, C), dtype=tl.float32)     # W dK~^T
    dUWt = tl.zeros((C, C), dtype=tl.float32)     # dU W^T
    for d0 in range(0, BD, DB):
        mask2 = rmask[:, None] & (d0 + db < D)[None, :]
        off = (rows[:, None] * H + h) * D + d0 + db[None, :]
        W = tl.load(w_ptr + off, mask=mask2, other=0.0).to(tl.float32)
        K = tl.load(k_ptr + off, mask=mask2, other=0.0).to(tl.float32)
        Gm += _pdot(W, tl.trans(W), UP)
        L += _pdot(W, tl.trans(K), UP)
        dKt = tl.load(dkt_ptr + off, mask=mask2, other=0.0)
        WdKt = tl.dot(W, tl.trans(dKt), WdKt, input_precision=GP)
        dU = tl.load(du_ptr + off, mask=mask2, other=0.0)
        dUWt = tl.dot(dU, tl.trans(W), dUWt, input_precision=GP)
    beta_raw = tl.load(beta_ptr + rows * H + h, mask=rmask, other=0.0).to(tl.float32)
    beta = tl.minimum(beta_raw, BETA_MAX)
    strict = r[:, None] > r[None, :]
    L = tl.where(strict, L, 0.0)
    aoff = (rows[:, None] * H + h) * C + r[None, :]
    A = tl.load(a_ptr + aoff, mask=rmask[:, None], other=0.0)
    # T^{-1} = I - T^{-1} N = I - A strictLower(W W^T) (N = diag(beta) strictLower(W W^T)): one product
    # instead of recomputing the inverse
    Tinv = tl.where(r[:, None] == r[None, :], 1.0, 0.0) - _pdot(A, tl.where(strict, Gm, 0.0), UP)
    # K~ = K - M^T W  and  M = A strictLower(W K^T)
    dM = tl.load(dm_ptr + aoff, mask=rmask[:, None], other=0.0) - WdKt
    dL = tl.where(strict, tl.dot(tl.trans(A), dM, input_precision=GP), 0.0)
    # U = A W adds dU W^T to dA
    dA = tl.dot(dM, tl.trans(L), input_precision=GP) + dUWt
    # A = T^{-1} diag(beta),  T = I + strictLower(diag(beta) W W^T)
    dbeta = tl.sum(Tinv * dA, axis=0)
    dTinv = dA * beta[None, :]
    dT = -tl.dot(tl.dot(tl.trans(Tinv), dTinv, input_precision=GP), tl.trans(Tinv), input_precision=GP)
    dN = tl.where(strict, dT, 0.0)
    dbeta += tl.sum(dN * Gm, axis=1)
    dG = beta[:, None] * dN
    dbeta = tl.where(beta_raw < BETA_MAX, dbeta, 0.0)
    return A, dL, dG + tl.trans(dG), dbeta


@triton.jit
def _ut_grad_apply(w_ptr, k_ptr, du_ptr, dkt_ptr, dw_acc_ptr, dk_acc_ptr, dw_ptr, dk_ptr, A, M, dL, Sg,
                   rows, rmask, h, d0, H: tl.constexpr, D: tl.constexpr, DB: tl.constexpr, GP: tl.constexpr):
    """dW and dK of one DB-wide column block from the C x C tiles (module docstring), stored."""
    db = tl.arange(0, DB)
    mask2 = rmask[:, None] & (d0 + db < D)[None, :]
    off = (rows[:, None] * H + h) * D + d0 + db[None, :]
    W = tl.load(w_ptr + off, mask=mask2, other=0.0).to(tl.float32)
    dKt = tl.load(dkt_ptr + off, mask=mask2, other=0.0)
    dK = tl.load(dk_acc_ptr + off, mask=mask2, other=0.0) + dKt + tl.dot(tl.trans(dL), W, input_precision=GP)
    tl.store(dk_ptr + off, dK.to(dk_ptr.dtype.element_ty), mask=mask2)
    K = tl.load(k_ptr + off, mask=mask2, other=0.0).to(tl.float32)
    dW = tl.load(dw_acc_ptr + off, mask=mask2, other=0.0) + tl.dot(dL, K, input_precision=GP)
    dW -= tl.dot(M, dKt, input_precision=GP)
    dU = tl.load(du_ptr + off, mask=mask2, other=0.0)
    dW += tl.dot(tl.trans(A), dU, input_precision=GP)
    dW += tl.dot(Sg, W, input_precision=GP)
    tl.store(dw_ptr + off, dW.to(dw_ptr.dtype.element_ty), mask=mask2)


@triton.jit
def ut_bwd_kernel(
    w_ptr, beta_ptr, k_ptr, du_ptr, dkt_ptr, dm_ptr, dw_acc_ptr, dk_acc_ptr, a_ptr, m_ptr,
    dw_ptr, dk_ptr, dbeta_ptr,
    chunk_tok0, chunk_seq, seq_end,
    H: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, DB: tl.constexpr, C: tl.constexpr,
    BETA_MAX: tl.constexpr, UP: tl.constexpr, GP: tl.constexpr,
):
    """The whole UT backward of one (chunk, kv head), one program each (module docstring): dbeta, then dw and dk
    one DB-wide column block at a time.  Reads A and M ([N_tok, H, C] float32 rows, as the recompute stores them),
    dM, and the accumulators dK~, dU, dW, dK ([N_tok, H, D] float32) the transport and intra kernels filled."""
    n = tl.program_id(0)
    h = tl.program_id(1)
    rows, rmask = _chunk_rows(n, chunk_tok0, chunk_seq, seq_end, C)
    A, dL, Sg, dbeta = _ut_grad_tiles(w_ptr, beta_ptr, k_ptr, du_ptr, dkt_ptr, dm_ptr, a_ptr, rows, rmask, h,
                                      H, D, BD, DB, C, BETA_MAX, UP, GP)
    tl.store(dbeta_ptr + rows * H + h, dbeta.to(dbeta_ptr.dtype.element_ty), mask=rmask)
    M = tl.load(m_ptr + (rows[:, None] * H + h) * C + tl.arange(0, C)[None, :], mask=rmask[:, None], other=0.0)
    for d0 in tl.static_range(0, BD, DB):
        _ut_grad_apply(w_ptr, k_ptr, du_ptr, dkt_ptr, dw_acc_ptr, dk_acc_ptr, dw_ptr, dk_ptr, A, M, dL, Sg,
                       rows, rmask, h, d0, H, D, DB, GP)
