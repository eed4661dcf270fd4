"""Stage ``ut_inverse`` (+ key boundary adjustment) as S-TIR: one program per (UT chunk, kv head).

For chunk m with rows W (C x D), beta (C), K (C x D), all in float32 (spec: numerics.float32):

    G  = strictLower(diag(beta) W W^T)
    T^-1 = (I + G)^-1           forward substitution, row by row       (macro ``ut_inverse``)
    A  = T^-1 diag(beta)        lower triangular
    U  = A W                    P_m = I - W^T U = H_last ... H_first  (macro ``ut_apply``)
    M  = A strictLower(W K^T)   used by the diagonal tile of the scan (macro ``boundary_keys``)
    K~ = K - M^T W              row j = (H_last ... H_{j+1} k_j)^T

Outputs (token-major, like the Triton backend): u, kt [N, H, D] and m [N, H, C], float32.
Rows past the end of a sequence are padding (w = k = 0, beta = 0) and are never stored.

The macros are used by the prim_func here and by the CPU stage tests. ``smem`` is the storage scope
of the per-program scratch: "global" for the CPU (llvm) build, "shared.dyn" for the GPU build
(schedule.py binds threads). ``unroll`` is the inner unroll of the reduction loops.
"""
from __future__ import annotations

from tvm.script import tirx as T

from .stir_common import barrier_macro, const, keep_alive_macro, load_rows_macro, unroll_factor

__all__ = ["ut_macros", "ut_func", "ut_smem_bytes"]


def ut_macros(C: int, D: int, fdt: str, unroll: int = 1, sync: bool = False):
    """The reusable pieces of the stage, closed over the chunk size C, head dim D and float dtype.

    Shared-memory footprint (GPU): W and two C x max(C, D) scratch tiles; K, M, U and K~ go straight
    to / from global memory (M is re-read from global after a barrier), so chunk_size 128 fits too.
    """
    zero, one = const(0, fdt), const(1, fdt)
    uD, uC = unroll_factor(D, unroll), unroll_factor(C, unroll)
    barrier = barrier_macro(sync)

    def krow(k, tok0, send, r, h, d):
        """k[tok0 + r, h, d] as fdt, 0 past the end of the sequence."""
        return T.if_then_else(tok0 + T.Cast("int64", r) < send, T.Cast(fdt, k[tok0 + T.Cast("int64", r), h, d]), zero)

    @T.macro
    def ut_inverse(Ws, bs, G, Tinv):
        """Tinv <- A = (I + strictLower(diag(b) W W^T))^-1 diag(b); forward substitution over the rows."""
        barrier()
        for i, j in T.grid(C, C):
            with T.sblock("ut_gram"):
                vi, vj = T.axis.remap("SS", [i, j])
                a = T.sblock_alloc_buffer((1,), fdt, scope="local")
                a[0] = zero
                for k0 in T.serial(D // uD):
                    for k1 in T.unroll(uD):
                        a[0] = a[0] + Ws[vi, k0 * uD + k1] * Ws[vj, k0 * uD + k1]
                G[vi, vj] = T.if_then_else(vi > vj, bs[vi] * a[0], zero)
        # row i of T^-1 = e_i - sum_{k<i} G[i, k] row_k. Column j only ever reads column j of the
        # earlier rows, so each column is one independent sequential solve (one thread on the GPU),
        # kept in a per-thread array and stored row by row as it is produced.
        barrier()
        for j in T.serial(C):
            with T.sblock("ut_fsub"):
                vj = T.axis.remap("S", [j])
                col = T.sblock_alloc_buffer((C,), fdt, scope="local")
                for i in T.serial(C):
                    col[i] = T.if_then_else(i == vj, one, zero)
                    for k in T.serial(i):
                        col[i] = col[i] - G[i, k] * col[k]
                    Tinv[i, vj] = col[i]
        barrier()
        for i, j in T.grid(C, C):
            with T.sblock("ut_scale"):
                vi, vj = T.axis.remap("SS", [i, j])
                Tinv[vi, vj] = Tinv[vi, vj] * bs[vj]

    @T.macro
    def ut_apply(A, Ws, u, tok0, send, h):
        """u[rows] = A W (so that the chunk transition is P = I - W^T U)."""
        barrier()
        for i, d in T.grid(C, D):
            with T.sblock("ut_u"):
                vi, vd = T.axis.remap("SS", [i, d])
                a = T.sblock_alloc_buffer((1,), fdt, scope="local")
                a[0] = zero
                for j0 in T.serial(C // uC):
                    for j1 in T.unroll(uC):
                        a[0] = a[0] + A[vi, j0 * uC + j1] * Ws[j0 * uC + j1, vd]
                if tok0 + T.Cast("int64", vi) < send:
                    u[tok0 + T.Cast("int64", vi), h, vd] = a[0]

    @T.macro
    def boundary_keys(A, Ws, k, WK, m, kt, tok0, send, h):
        """m[rows] = M = A strictLower(W K^T);  kt[rows] = K~ = K - M^T W (row j = (H_last ... H_{j+1} k_j)^T)."""
        barrier()
        for i, j in T.grid(C, C):
            with T.sblock("bk_wk"):
                vi, vj = T.axis.remap("SS", [i, j])
                a = T.sblock_alloc_buffer((1,), fdt, scope="local")
                a[0] = zero
                for d0 in T.serial(D // uD):
                    for d1 in T.unroll(uD):
                        a[0] = a[0] + Ws[vi, d0 * uD + d1] * krow(k, tok0, send, vj, h, d0 * uD + d1)
                WK[vi, vj] = T.if_then_else(vi > vj, a[0], zero)
        barrier()
        for i, j in T.grid(C, C):
            with T.sblock("bk_m"):
                vi, vj = T.axis.remap("SS", [i, j])
                a = T.sblock_alloc_buffer((1,), fdt, scope="local")
                a[0] = zero
                for l0 in T.serial(C // uC):
                    for l1 in T.unroll(uC):
                        a[0] = a[0] + A[vi, l0 * uC + l1] * WK[l0 * uC + l1, vj]
                if tok0 + T.Cast("int64", vi) < send:
                    m[tok0 + T.Cast("int64", vi), h, vj] = a[0]
        barrier()
        for j, d in T.grid(C, D):
            with T.sblock("bk_kt"):
                vj, vd = T.axis.remap("SS", [j, d])
                a = T.sblock_alloc_buffer((1,), fdt, scope="local")
                a[0] = krow(k, tok0, send, vj, h, vd)
                for i0 in T.serial(C // uC):
                    for i1 in T.unroll(uC):
                        a[0] = a[0] - krow(m, tok0, send, i0 * uC + i1, h, vj) * Ws[i0 * uC + i1, vd]
                if tok0 + T.Cast("int64", vj) < send:
                    kt[tok0 + T.Cast("int64", vj), h, vd] = a[0]

    return ut_inverse, ut_apply, boundary_keys


def ut_smem_bytes(C: int, D: int, fdt: str = "float32") -> int:
    nb = 8 if fdt == "float64" else 4
    return (C * D + 2 * C * max(C, D) + C) * nb


def ut_func(C: int, H: int, D: int, kdt: str, fdt: str = "float32", smem: str = "global", unroll: int = 1):
    """prim_func ``ut``: (w, beta, k) -> (u, kt, m) for every (chunk, kv head); see module docstring.

    Arguments: w [N,H,D] fdt, beta [N,H] fdt, k [N,H,D] kdt, u/kt [N,H,D] fdt (out), m [N,H,C] fdt (out),
    chunk_tok0 [nc], chunk_seq [nc], seq_end [ns] int64, beta_max (scalar: beta is clipped to it).
    """
    sync = smem != "global"
    ut_inverse, ut_apply, boundary_keys = ut_macros(C, D, fdt, unroll, sync)
    barrier = barrier_macro(sync)
    load_rows_masked = load_rows_macro(sync)
    keep_alive = keep_alive_macro(sync)
    zero = const(0, fdt)
    E = max(C, D)
    FS = T.float64 if fdt == "float64" else T.float32  # scalar parameter type

    @T.prim_func(s_tir=True)
    def ut(w_h: T.handle, beta_h: T.handle, k_h: T.handle, u_h: T.handle, kt_h: T.handle, m_h: T.handle,
           tok0_h: T.handle, cseq_h: T.handle, send_h: T.handle, beta_max: FS):
        T.func_attr({"global_symbol": "ut"})
        N = T.int64()
        NC = T.int64()
        NS = T.int64()
        w = T.match_buffer(w_h, (N, H, D), fdt)
        beta = T.match_buffer(beta_h, (N, H), fdt)
        k = T.match_buffer(k_h, (N, H, D), kdt)
        u = T.match_buffer(u_h, (N, H, D), fdt)
        kt = T.match_buffer(kt_h, (N, H, D), fdt)
        m = T.match_buffer(m_h, (N, H, C), fdt)
        chunk_tok0 = T.match_buffer(tok0_h, (NC,), "int64")
        chunk_seq = T.match_buffer(cseq_h, (NC,), "int64")
        seq_end = T.match_buffer(send_h, (NS,), "int64")
        for n, h in T.grid(NC, H):
            with T.sblock("program"):
                vn, vh = T.axis.remap("SS", [n, h])
                Ws = T.sblock_alloc_buffer((C, D), fdt, scope=smem)
                bs = T.sblock_alloc_buffer((C,), fdt, scope=smem)
                S1 = T.sblock_alloc_buffer((C, E), fdt, scope=smem)    # G, then W K^T
                S2 = T.sblock_alloc_buffer((C, E), fdt, scope=smem)    # T^-1, then A (in place)
                tok0 = T.meta_var(chunk_tok0[vn])
                send = T.meta_var(seq_end[chunk_seq[vn]])
                load_rows_masked(Ws, w, tok0, send, vh, C, D)
                barrier()
                for r in T.serial(C):
                    with T.sblock("ut_load_beta"):
                        vr = T.axis.remap("S", [r])
                        bs[vr] = T.if_then_else(tok0 + T.Cast("int64", vr) < send,
                                                T.min(T.Cast(fdt, beta[tok0 + T.Cast("int64", vr), vh]),
                                                      T.Cast(fdt, beta_max)), zero)
                ut_inverse(Ws, bs, S1, S2)
                ut_apply(S2, Ws, u, tok0, send, vh)
                boundary_keys(S2, Ws, k, S1, m, kt, tok0, send, vh)
                keep_alive(u, (0, 0, 0), tok0 < 0, [Ws, bs, S1, S2])

    return ut
