"""Stage ``ut_inverse`` (+ key boundary adjustment) as S-TIR: one program per (UT chunk, kv head).

For chunk m with rows W (C x D), beta (C), K (C x D), all in float32 (spec: numerics.float32):

    G  = strictLower(diag(beta) W W^T)
    T^-1 = (I + G)^-1           by blocks: 16 x 16 diagonal blocks by forward substitution, then
                                log2(C/16) levels merging block pairs  (macro ``ut_inverse``)
    A  = T^-1 diag(beta)        lower triangular
    U  = A W                    P_m = I - W^T U = H_last ... H_first  (macro ``ut_apply``)
    M  = A strictLower(W K^T)   used by the diagonal tile of the scan (macro ``boundary_keys``)
    K~ = K - M^T W              row j = (H_last ... H_{j+1} k_j)^T

Outputs (token-major, like the Triton backend): u, kt [N, H, D] and m [N, H, C], float32.
Rows past the end of a sequence are padding (w = k = 0, beta = 0) and are never stored.

The macros are used by the prim_func here and by the CPU stage tests. ``smem`` is the storage scope
of the per-program scratch: "global" for the CPU (llvm) build, "shared.dyn" for the GPU build
(schedule.py binds threads). ``unroll`` is the inner unroll of the reduction loops; ``threads`` sizes the
register tiles of the products (an output's summation order does not depend on them).
"""
from __future__ import annotations

from tvm.script import tirx as T

from .stir_common import barrier_macro, const, keep_alive_macro, load_rows_macro, tiled_product_macro

__all__ = ["ut_macros", "ut_func", "ut_smem_bytes"]


def _inverse_block(C: int) -> int:
    """Diagonal block size of the blocked inverse: 16, or the whole chunk when C / 16 is not a power of two."""
    b = min(16, C)
    n = C // b
    return b if C % b == 0 and n & (n - 1) == 0 else C


def ut_macros(C: int, D: int, fdt: str, unroll: int = 1, sync: bool = False, threads: int = 128):
    """The reusable pieces of the stage, closed over the chunk size C, head dim D and float dtype.

    Products are register-tiled leaves (stir_common.tiled_product_macro, tiles sized for ``threads``). Buffers
    are indexed [row, col] only, so the GPU build can pad their rows (stride D+1 / C+1: no bank conflicts).
    """
    zero, one = const(0, fdt), const(1, fdt)
    barrier = barrier_macro(sync)
    B = _inverse_block(C)

    def tp(name, P, M, N, K, a_at, b_at, out_buf, out_idx, value, guard=None):
        return tiled_product_macro(name, P, M, N, K, fdt, threads, unroll, a_at, b_at, out_buf, out_idx, value, guard)

    def valid(c, r):
        """row r of the chunk is a token of the sequence (ctx c = (tok0, send, h))."""
        return c[0] + T.Cast("int64", r) < c[1]

    def grow(c, r):
        return c[0] + T.Cast("int64", r)

    # G = strictLower(diag(b) W W^T);  bufs (Ws, bs, G)
    gram = tp("ut_gram", 1, C, C, D, lambda b, c, s, p, i, k: b[0][i, k], lambda b, c, s, p, k, j: b[0][j, k],
              lambda b: b[2], lambda c, s, p, i, j: (i, j),
              lambda b, c, s, p, i, j, a: T.if_then_else(i > j, b[1][i] * a, zero))

    # T^-1 = (I + G)^-1 by blocks. X_jj = inverse of the B x B diagonal block (below); then levels s = B, 2B, ..
    # merge pairs of s x s blocks: [[X1, 0], [L21, X2]]^-1 has lower block -X2 (L21 X1) with L21 = G21.
    # Y = G21 X1 is parked in G's (zero, unused) strict upper triangle at the mirrored block. bufs (G, X)
    levels = []
    s = B
    while s < C:
        def ya(b, c, sv, p, i, k, s=s):
            return b[0][2 * s * p + s + i, 2 * s * p + k]

        def yb(b, c, sv, p, k, j, s=s):
            return b[1][2 * s * p + k, 2 * s * p + j]

        def xa(b, c, sv, p, i, k, s=s):
            return b[1][2 * s * p + s + i, 2 * s * p + s + k]

        def xb(b, c, sv, p, k, j, s=s):
            return b[0][2 * s * p + k, 2 * s * p + s + j]

        levels.append((tp(f"ut_inv_y{s}", C // (2 * s), s, s, s, ya, yb, lambda b: b[0],
                          lambda c, sv, p, i, j, s=s: (2 * s * p + i, 2 * s * p + s + j),
                          lambda b, c, sv, p, i, j, a: a),
                       tp(f"ut_inv_x{s}", C // (2 * s), s, s, s, xa, xb, lambda b: b[1],
                          lambda c, sv, p, i, j, s=s: (2 * s * p + s + i, 2 * s * p + j),
                          lambda b, c, sv, p, i, j, a: -a)))
        s *= 2

    @T.macro
    def _done(G, X):
        T.evaluate(0)

    def chain(lv):
        """the levels as a chain of macros (TVMScript cannot loop over a Python list)."""
        if lv == len(levels):
            return _done
        ya_mm, xb_mm = levels[lv]
        rest = chain(lv + 1)

        @T.macro
        def level(G, X):
            barrier()
            ya_mm((G, X), (), 1, 0)
            barrier()
            xb_mm((G, X), (), 1, 0)
            rest(G, X)

        return level

    inverse_levels = chain(0)

    @T.macro
    def ut_inverse(Ws, bs, G, Tinv):
        """Tinv <- A = (I + strictLower(diag(b) W W^T))^-1 diag(b); G is scratch (its upper triangle too)."""
        barrier()
        gram((Ws, bs, G), (), 1, 0)
        # diagonal blocks: one thread per column, forward substitution over the B rows of its block with the
        # column in registers (fully unrolled: constant indices); zeros above the block.
        barrier()
        for j in T.serial(C):
            with T.sblock("ut_fsub"):
                vj = T.axis.remap("S", [j])
                col = T.sblock_alloc_buffer((B,), fdt, scope="local")
                for i in T.unroll(B):
                    col[i] = T.if_then_else(i == vj % B, one, zero)
                    for k in T.unroll(B):
                        col[i] = col[i] - T.if_then_else(k < i, G[vj // B * B + i, vj // B * B + k] * col[k], zero)
                for i in T.unroll(B):
                    Tinv[vj // B * B + i, vj] = col[i]
                for i in T.serial(C):
                    if i < vj // B * B:
                        Tinv[i, vj] = zero
        inverse_levels(G, Tinv)
        barrier()
        for i, j in T.grid(C, C):
            with T.sblock("ut_scale"):
                vi, vj = T.axis.remap("SS", [i, j])
                Tinv[vi, vj] = Tinv[vi, vj] * bs[vj]

    # u = A W;  bufs (A, Ws, u), ctx (tok0, send, h)
    apply_mm = tp("ut_u", 1, C, D, C, lambda b, c, s, p, i, k: b[0][i, k], lambda b, c, s, p, k, j: b[1][k, j],
                  lambda b: b[2], lambda c, s, p, i, j: (grow(c, i), c[2], j), lambda b, c, s, p, i, j, a: a,
                  lambda c, s, p, i, j: valid(c, i))

    @T.macro
    def ut_apply(A, Ws, u, tok0, send, h):
        """u[rows] = A W (so that the chunk transition is P = I - W^T U)."""
        barrier()
        apply_mm((A, Ws, u), (tok0, send, h), 1, 0)

    # WK = strictLower(W K^T);  bufs (Ws, Ks, WK)
    wk_mm = tp("bk_wk", 1, C, C, D, lambda b, c, s, p, i, k: b[0][i, k], lambda b, c, s, p, k, j: b[1][j, k],
               lambda b: b[2], lambda c, s, p, i, j: (i, j),
               lambda b, c, s, p, i, j, a: T.if_then_else(i > j, a, zero))
    # M = A WK;  bufs (A, WK, Ms)
    m_mm = tp("bk_m", 1, C, C, C, lambda b, c, s, p, i, k: b[0][i, k], lambda b, c, s, p, k, j: b[1][k, j],
              lambda b: b[2], lambda c, s, p, i, j: (i, j), lambda b, c, s, p, i, j, a: a)
    # K~ = K - M^T W: row j of K~ sums over the rows i of M's column j;  bufs (Ms, Ws, kt, k)
    kt_mm = tp("bk_kt", 1, C, D, C, lambda b, c, s, p, j, i: b[0][i, j], lambda b, c, s, p, i, d: b[1][i, d],
               lambda b: b[2], lambda c, s, p, j, d: (grow(c, j), c[2], d),
               lambda b, c, s, p, j, d, a: T.Cast(fdt, b[3][grow(c, j), c[2], d]) - a,
               lambda c, s, p, j, d: valid(c, j))

    def gload(buf, c, r, col):
        """buf[tok0 + r, h, col] as fdt, 0 past the end of the sequence (ctx c = (tok0, send, h))."""
        return T.if_then_else(valid(c, r), T.Cast(fdt, buf[grow(c, r), c[2], col]), zero)

    # the low-memory forms (chunk_size 128 at D 128: no K tile, no M tile): K and M read from global memory
    wk_g_mm = tp("bk_wk", 1, C, C, D, lambda b, c, s, p, i, k: b[0][i, k], lambda b, c, s, p, k, j: gload(b[1], c, j, k),
                 lambda b: b[2], lambda c, s, p, i, j: (i, j),
                 lambda b, c, s, p, i, j, a: T.if_then_else(i > j, a, zero))
    m_g_mm = tp("bk_m", 1, C, C, C, lambda b, c, s, p, i, k: b[0][i, k], lambda b, c, s, p, k, j: b[1][k, j],
                lambda b: b[2], lambda c, s, p, i, j: (grow(c, i), c[2], j), lambda b, c, s, p, i, j, a: a,
                lambda c, s, p, i, j: valid(c, i))
    kt_g_mm = tp("bk_kt", 1, C, D, C, lambda b, c, s, p, j, i: gload(b[0], c, i, j), lambda b, c, s, p, i, d: b[1][i, d],
                 lambda b: b[2], lambda c, s, p, j, d: (grow(c, j), c[2], d),
                 lambda b, c, s, p, j, d, a: T.Cast(fdt, b[3][grow(c, j), c[2], d]) - a,
                 lambda c, s, p, j, d: valid(c, j))

    @T.macro
    def boundary_lowmem(A, Ws, k, WK, m, kt, tok0, send, h):
        """WK = strictLower(W K^T), m[rows] = M = A WK, kt[rows] = K - M^T W, with K and M read from global
        (M after a barrier: the block's own stores are visible to it)."""
        barrier()
        wk_g_mm((Ws, k, WK), (tok0, send, h), 1, 0)
        barrier()
        m_g_mm((A, WK, m), (tok0, send, h), 1, 0)
        barrier()
        kt_g_mm((m, Ws, kt, k), (tok0, send, h), 1, 0)

    @T.macro
    def boundary_wk(Ws, Ks, WK):
        """WK = strictLower(W K^T) (K staged in Ks)."""
        barrier()
        wk_mm((Ws, Ks, WK), (), 1, 0)

    @T.macro
    def boundary_keys(A, Ws, k, WK, Ms, m, kt, tok0, send, h):
        """m[rows] = M = A WK;  kt[rows] = K~ = K - M^T W (row j = (H_last ... H_{j+1} k_j)^T)."""
        barrier()
        m_mm((A, WK, Ms), (), 1, 0)
        barrier()
        for i, j in T.grid(C, C):
            with T.sblock("bk_m_store"):
                vi, vj = T.axis.remap("SS", [i, j])
                if tok0 + T.Cast("int64", vi) < send:
                    m[tok0 + T.Cast("int64", vi), h, vj] = Ms[vi, vj]
        barrier()
        kt_mm((Ms, Ws, kt, k), (tok0, send, h), 1, 0)

    return ut_inverse, ut_apply, boundary_wk, boundary_keys, boundary_lowmem


SMEM_LIMIT = 227 * 1024   # dynamic shared memory per block on sm_90


def _smem(C: int, D: int, nb: int, lowmem: bool) -> int:
    if lowmem:   # W, G / W K^T, T^-1 / A
        return (C * (D + 1) + 2 * C * (C + 1) + C) * nb
    return (C * (D + 1) + C * (max(C, D) + 1) + 2 * C * (C + 1) + C) * nb


def ut_lowmem(C: int, D: int, fdt: str = "float32") -> bool:
    """The K and M tiles do not fit next to W, G and T^-1 (chunk_size 128 at D 128): read them from global."""
    return _smem(C, D, 8 if fdt == "float64" else 4, False) > SMEM_LIMIT


def ut_smem_bytes(C: int, D: int, fdt: str = "float32") -> int:
    return _smem(C, D, 8 if fdt == "float64" else 4, ut_lowmem(C, D, fdt))


def ut_func(C: int, H: int, D: int, kdt: str, fdt: str = "float32", smem: str = "global", unroll: int = 1,
            threads: int = 128):
    """prim_func ``ut``: (w, beta, k) -> (u, kt, m) for every (chunk, kv head); see module docstring.

    Arguments: w [N,H,D] fdt, beta [N,H] fdt, k [N,H,D] kdt, u/kt [N,H,D] fdt (out), m [N,H,C] fdt (out),
    chunk_tok0 [nc], chunk_seq [nc], seq_end [ns] int64, beta_max (scalar: beta is clipped to it).
    """
    sync = smem != "global"
    ut_inverse, ut_apply, boundary_wk, boundary_keys, boundary_lowmem = ut_macros(C, D, fdt, unroll, sync, threads)
    # the choice follows the GPU's float32 footprint (the CPU float64 build takes the same path)
    lowmem = ut_lowmem(C, D)
    XW = C + 1 if lowmem else max(C, D) + 1
    S2_SHAPE = (1, 2) if lowmem else (C, C + 1)
    barrier = barrier_macro(sync)
    load_rows_masked = load_rows_macro(sync)
    keep_alive = keep_alive_macro(sync)
    zero = const(0, fdt)
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
                # rows padded by one word: a warp reading one column of 32 rows hits 32 banks
                Ws = T.sblock_alloc_buffer((C, D + 1), fdt, scope=smem)
                bs = T.sblock_alloc_buffer((C,), fdt, scope=smem)
                X = T.sblock_alloc_buffer((C, XW), fdt, scope=smem)        # K (staged), then T^-1, then A
                S1 = T.sblock_alloc_buffer((C, C + 1), fdt, scope=smem)    # G (+ inverse scratch), then M
                S2 = T.sblock_alloc_buffer(S2_SHAPE, fdt, scope=smem)      # W K^T (low-memory form: unused)
                tok0 = T.meta_var(chunk_tok0[vn])
                send = T.meta_var(seq_end[chunk_seq[vn]])
                load_rows_masked(Ws, w, tok0, send, vh, C, D)
                if not lowmem:
                    load_rows_masked(X, k, tok0, send, vh, C, D)
                barrier()
                for r in T.serial(C):
                    with T.sblock("ut_load_beta"):
                        vr = T.axis.remap("S", [r])
                        bs[vr] = T.if_then_else(tok0 + T.Cast("int64", vr) < send,
                                                T.min(T.Cast(fdt, beta[tok0 + T.Cast("int64", vr), vh]),
                                                      T.Cast(fdt, beta_max)), zero)
                if not lowmem:
                    boundary_wk(Ws, X, S2)
                ut_inverse(Ws, bs, S1, X)
                ut_apply(X, Ws, u, tok0, send, vh)
                if lowmem:
                    boundary_lowmem(X, Ws, k, S1, m, kt, tok0, send, vh)
                    keep_alive(u, (0, 0, 0), tok0 < 0, [Ws, bs, X, S1])
                else:
                    boundary_keys(X, Ws, k, S2, S1, m, kt, tok0, send, vh)
                    keep_alive(u, (0, 0, 0), tok0 < 0, [Ws, bs, X, S1, S2])

    return ut
