"""Stage ``blockwise_scan``, super-chunk level, as S-TIR: one program per (super-chunk, kv head).

Walks the super-chunk's UT chunks right to left with a running D x D matrix Suf (start I):

    KJ_m = K~_m Suf^T          keys transported to the END of the super-chunk  (stored in the scan dtype)
    Suf  = Suf - (Suf W_m^T) U_m   = Suf P_m                                     (macro ``transition_lowrank``)

and stores What_J = Suf = P_last ... P_first (float32, [n_sc, H, D, D]). The last super-chunk of each
sequence is read by no later query and is skipped (like the Triton kernel). Math in float32 on CUDA
cores: this stage is O(T D^2), small next to the scan.
"""
from __future__ import annotations

from tvm.script import tirx as T

from .stir_common import barrier_macro, const, keep_alive_macro, unroll_factor

__all__ = ["transport_macros", "transport_func", "transport_smem_bytes"]


def transport_macros(C: int, D: int, fdt: str, unroll: int = 1, sync: bool = False):
    """Pieces of the stage. The chunk tiles K~, W, U are read straight from global memory (L2): the only
    shared scratch is Suf (D x D) and Suf W^T (D x C)."""
    zero, one = const(0, fdt), const(1, fdt)
    uD, uC = unroll_factor(D, unroll), unroll_factor(C, unroll)
    barrier = barrier_macro(sync)

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
        for r, e in T.grid(C, D):
            with T.sblock("tr_kj"):
                vs = T.axis.opaque(sdom, step)
                vr, ve = T.axis.remap("SS", [r, e])
                a = T.sblock_alloc_buffer((1,), fdt, scope="local")
                a[0] = zero
                for d0 in T.serial(D // uD):
                    for d1 in T.unroll(uD):
                        a[0] = a[0] + T.Cast(fdt, kt[row0 - T.Cast("int64", vs * C) + T.Cast("int64", vr), h, d0 * uD + d1]) \
                            * Suf[ve, d0 * uD + d1]
                kj[row0 - T.Cast("int64", vs * C) + T.Cast("int64", vr), h, ve] = T.Cast(kj.dtype, a[0])

    @T.macro
    def transition_lowrank(Suf, w, u, SW, row0, step, sdom, h):
        """Suf <- Suf - (Suf W^T) U, i.e. Suf <- Suf P for P = I - W^T U (low rank C); W, U from global."""
        barrier()
        for e, r in T.grid(D, C):
            with T.sblock("tr_sw"):
                vs = T.axis.opaque(sdom, step)
                ve, vr = T.axis.remap("SS", [e, r])
                a = T.sblock_alloc_buffer((1,), fdt, scope="local")
                a[0] = zero
                for d0 in T.serial(D // uD):
                    for d1 in T.unroll(uD):
                        a[0] = a[0] + Suf[ve, d0 * uD + d1] * \
                            T.Cast(fdt, w[row0 - T.Cast("int64", vs * C) + T.Cast("int64", vr), h, d0 * uD + d1])
                SW[ve, vr] = a[0]
        barrier()
        for e, d in T.grid(D, D):
            with T.sblock("tr_su"):
                vs = T.axis.opaque(sdom, step)
                ve, vd = T.axis.remap("SS", [e, d])
                a = T.sblock_alloc_buffer((1,), fdt, scope="local")
                a[0] = Suf[ve, vd]
                for r0 in T.serial(C // uC):
                    for r1 in T.unroll(uC):
                        a[0] = a[0] - SW[ve, r0 * uC + r1] * \
                            T.Cast(fdt, u[row0 - T.Cast("int64", vs * C) + T.Cast("int64", r0 * uC + r1), h, vd])
                Suf[ve, vd] = a[0]

    return suffix_init, transport_keys, transition_lowrank


def transport_smem_bytes(C: int, D: int, fdt: str = "float32") -> int:
    return (D * D + D * C) * (8 if fdt == "float64" else 4)


def transport_func(C: int, S: int, H: int, D: int, kjdt: str, fdt: str = "float32", smem: str = "global",
                   unroll: int = 1):
    """prim_func ``transport``: (kt, w, u) -> (kj, what) for every (super-chunk, kv head).

    Arguments: kt/w/u [N,H,D] fdt, kj [N,H,D] kjdt (out), what [NSC,H,D,D] fdt (out),
    sc_tok0 [NSC], sc_seq [NSC], seq_end [NS] int64.
    """
    sync = smem != "global"
    suffix_init, transport_keys, transition_lowrank = transport_macros(C, D, fdt, unroll, sync)
    barrier = barrier_macro(sync)
    keep_alive = keep_alive_macro(sync)
    s = S // C

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
                Suf = T.sblock_alloc_buffer((D, D), fdt, scope=smem)
                SW = T.sblock_alloc_buffer((D, C), fdt, scope=smem)
                tok0 = T.meta_var(sc_tok0[vj])
                send = T.meta_var(seq_end[sc_seq[vj]])
                # the last super-chunk of a sequence is read by no later query: 0 steps, What = I
                # (a loop bound, not an `if` around the body: barriers must not sit inside a condition)
                nsteps = T.meta_var(T.if_then_else(tok0 + S < send, s, 0))
                row_last = T.meta_var(tok0 + (s - 1) * C)          # first row of the super-chunk's last chunk
                suffix_init(Suf)
                for step in T.serial(nsteps):
                    transport_keys(kt, Suf, kj, row_last, step, s, vh)
                    transition_lowrank(Suf, w, u, SW, row_last, step, s, vh)
                barrier()
                for e, d in T.grid(D, D):
                    with T.sblock("tr_store_what"):
                        ve, vd = T.axis.remap("SS", [e, d])
                        what[vj, vh, ve, vd] = Suf[ve, vd]
                keep_alive(what, (0, 0, 0, 0), tok0 < 0, [Suf, SW])

    return transport
