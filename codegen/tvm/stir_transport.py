"""Stage ``blockwise_scan``, super-chunk level, as S-TIR: one program per (super-chunk, kv head).

Walks the super-chunk's UT chunks right to left with a running D x D matrix Suf (start I):

    KJ_m = K~_m Suf^T          keys transported to the END of the super-chunk  (stored in the scan dtype)
    Suf  = Suf - (Suf W_m^T) U_m   = Suf P_m                                     (macro ``transition_lowrank``)

and stores What_J = Suf = P_last ... P_first (float32, [n_sc, H, D, D]). The last super-chunk of each
sequence is read by no later query and is skipped (like the Triton kernel). Math in float32 on CUDA
cores (register-tiled products): this stage is O(T D^2), small next to the scan.

Shared memory holds Suf, SW = Suf W^T and a slice of U (``transport_slice`` rows: the whole chunk when that
fits two blocks per SM, else 16 rows at a time). K~ and W are read straight from global memory as the row
operand of their products (a warp's threads share a row: one broadcast load, each element read once per
program); U, the column operand of Suf - SW U, is reused by every row of Suf and is staged.
"""
from __future__ import annotations

from tvm.script import tirx as T

from .stir_common import barrier_macro, const, keep_alive_macro, tiled_product_macro

__all__ = ["transport_macros", "transport_func", "transport_smem_bytes", "transport_slice"]

_TWO_BLOCKS = 112 * 1024   # shared memory per block that lets two blocks share an SM (sm_90: 228 KB less 1 KB each)


def transport_slice(C: int, D: int, fdt: str = "float32") -> int:
    """Rows of U staged at a time: C, else the largest power-of-two slice (>= 16) for two blocks per SM."""
    q = C
    while q > 16 and q % 2 == 0 and _smem(C, D, q, fdt) > _TWO_BLOCKS:
        q //= 2
    return q


def _smem(C: int, D: int, q: int, fdt: str) -> int:
    return (D * (D + 1) + D * (C + 1) + q * (D + 1)) * (8 if fdt == "float64" else 4)


def transport_smem_bytes(C: int, D: int, fdt: str = "float32") -> int:
    return _smem(C, D, transport_slice(C, D, fdt), fdt)


def transport_macros(C: int, D: int, fdt: str, unroll: int = 1, sync: bool = False, threads: int = 128):
    """Pieces of the stage; U is staged ``Q = transport_slice(C, D)`` rows at a time in Us (Q x D)."""
    zero, one = const(0, fdt), const(1, fdt)
    barrier = barrier_macro(sync)
    Q = transport_slice(C, D, fdt)

    def tp(name, M, N, K, a_at, b_at, out_buf, out_idx, value):
        return tiled_product_macro(name, 1, M, N, K, fdt, threads, unroll, a_at, b_at, out_buf, out_idx, value)

    def grow(c, s, r):
        """token of chunk row r at step s; ctx c = (row0, h)."""
        return c[0] - T.Cast("int64", s * C) + T.Cast("int64", r)

    # kj[rows] = K~ Suf^T;  bufs (kt, Suf, kj)
    kj_mm = tp("tr_kj", C, D, D, lambda b, c, s, p, r, d: T.Cast(fdt, b[0][grow(c, s, r), c[1], d]),
               lambda b, c, s, p, d, e: b[1][e, d], lambda b: b[2], lambda c, s, p, r, e: (grow(c, s, r), c[1], e),
               lambda b, c, s, p, r, e, a: T.Cast(b[2].dtype, a))
    # SW = Suf W^T, computed as (W Suf^T)^T so that W is the broadcast row operand;  bufs (w, Suf, SW)
    sw_mm = tp("tr_sw", C, D, D, lambda b, c, s, p, r, d: T.Cast(fdt, b[0][grow(c, s, r), c[1], d]),
               lambda b, c, s, p, d, e: b[1][e, d], lambda b: b[2], lambda c, s, p, r, e: (e, r),
               lambda b, c, s, p, r, e, a: a)
    # Suf <- Suf - SW[:, slice] U[slice] (each thread reads only its own Suf outputs: in place);  bufs (SW, Us, Suf)
    su_mm = tp("tr_su", D, D, Q, lambda b, c, q, p, e, r: b[0][e, q * Q + r], lambda b, c, q, p, r, d: b[1][r, d],
               lambda b: b[2], lambda c, q, p, e, d: (e, d), lambda b, c, q, p, e, d, a: b[2][e, d] - a)

    @T.macro
    def suffix_init(Suf):
        barrier()
        for e, d in T.grid(D, D):
            with T.sblock("tr_eye"):
                ve, vd = T.axis.remap("SS", [e, d])
                Suf[ve, vd] = T.if_then_else(ve == vd, one, zero)

    @T.macro
    def transport_keys(kt, Suf, kj, row0, step, sdom, h):
        """kj[chunk rows] = K~ Suf^T for the chunk whose first row is row0 - step * C (K~ read from kt)."""
        barrier()
        kj_mm((kt, Suf, kj), (row0, h), sdom, step)

    @T.macro
    def transition_lowrank(Suf, w, u, SW, Us, row0, step, sdom, h):
        """Suf <- Suf - (Suf W^T) U, i.e. Suf <- Suf P for P = I - W^T U (low rank C); U staged by slices.
        (No barrier before SW: it only reads Suf, like transport_keys before it.)"""
        sw_mm((w, Suf, SW), (row0, h), sdom, step)
        for q in T.serial(C // Q):
            barrier()
            for r, d in T.grid(Q, D):
                with T.sblock("tr_stage_u"):
                    vs = T.axis.opaque(sdom, step)
                    vq = T.axis.opaque(C // Q, q)
                    vr, vd = T.axis.remap("SS", [r, d])
                    Us[vr, vd] = T.Cast(fdt, u[row0 - T.Cast("int64", vs * C) + T.Cast("int64", vq * Q + vr), h, vd])
            barrier()
            su_mm((SW, Us, Suf), (), C // Q, q)

    return suffix_init, transport_keys, transition_lowrank


def transport_func(C: int, S: int, H: int, D: int, kjdt: str, fdt: str = "float32", smem: str = "global",
                   unroll: int = 1, threads: int = 128):
    """prim_func ``transport``: (kt, w, u) -> (kj, what) for every (super-chunk, kv head).

    Arguments: kt/w/u [N,H,D] fdt, kj [N,H,D] kjdt (out), what [NSC,H,D,D] fdt (out),
    sc_tok0 [NSC], sc_seq [NSC], seq_end [NS] int64.
    """
    sync = smem != "global"
    suffix_init, transport_keys, transition_lowrank = transport_macros(C, D, fdt, unroll, sync, threads)
    barrier = barrier_macro(sync)
    keep_alive = keep_alive_macro(sync)
    s = S // C
    Q = transport_slice(C, D, fdt)

    @T.prim_func(s_tir=True)
    def transport(kt_h: T.handle, w_h: T.handle, u_h: T.handle, kj_h: T.handle, what_h: T.handle,
                  sctok_h: T.handle, scseq_h: T.handle, send_h: T.handle):
        T.func_attr({"global_symbol": "transport"})
        N = T.int64()
        NSC = T.int64()
        NS = T.int64()
        kt = T.match_buffer(kt_h, (N, H, D), fdt)
        w = T.match_buffer(w_h, (N, H, D), fdt)
        u = T.match_buffer(u_h, (N, H, D), fdt)
        kj = T.match_buffer(kj_h, (N, H, D), kjdt)
        what = T.match_buffer(what_h, (NSC, H, D, D), fdt)
        sc_tok0 = T.match_buffer(sctok_h, (NSC,), "int64")
        sc_seq = T.match_buffer(scseq_h, (NSC,), "int64")
        seq_end = T.match_buffer(send_h, (NS,), "int64")
        for j, h in T.grid(NSC, H):
            with T.sblock("program"):
                vj, vh = T.axis.remap("SS", [j, h])
                # rows padded by one word: a warp reading one column of 32 rows hits 32 banks
                Suf = T.sblock_alloc_buffer((D, D + 1), fdt, scope=smem)
                SW = T.sblock_alloc_buffer((D, C + 1), fdt, scope=smem)
                Us = T.sblock_alloc_buffer((Q, D + 1), fdt, scope=smem)
                tok0 = T.meta_var(sc_tok0[vj])
                send = T.meta_var(seq_end[sc_seq[vj]])
                # the last super-chunk of a sequence is read by no later query: 0 steps, What = I
                # (a loop bound, not an `if` around the body: barriers must not sit inside a condition)
                nsteps = T.meta_var(T.if_then_else(tok0 + S < send, s, 0))
                row_last = T.meta_var(tok0 + (s - 1) * C)          # first row of the super-chunk's last chunk
                suffix_init(Suf)
                for step in T.serial(nsteps):
                    transport_keys(kt, Suf, kj, row_last, step, s, vh)
                    transition_lowrank(Suf, w, u, SW, Us, row_last, step, s, vh)
                barrier()
                for e, d in T.grid(D, D):
                    with T.sblock("tr_store_what"):
                        ve, vd = T.axis.remap("SS", [e, d])
                        what[vj, vh, ve, vd] = Suf[ve, vd]
                keep_alive(what, (0, 0, 0, 0), tok0 < 0, [Suf, SW, Us])

    return transport
