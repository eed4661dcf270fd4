"""Small S-TIR helpers shared by the stage generators (masked tile loads, typed constants).

Conventions of every S-TIR stage in this package:
* a prim_func body is ``for <program ids> in T.grid(...): with T.sblock("program"): ...``; the program
  ids become blockIdx.* on the GPU (schedule.py) and plain loops on the CPU;
* every piece of work inside a program is a leaf sblock over spatial iterators only (its own loops are
  its innermost loops); an outer (serial) loop var it needs is bound as ``T.axis.opaque`` and declared
  first. A reduction is a loop INSIDE the leaf into a "local" accumulator (one element, or a register
  tile: ``tiled_product_macro``, whose spatial iterators are then tile indices), then the stores
  (a register accumulator on the GPU; an S-TIR reduction block into shared memory would need
  barriers inside the spare-thread guard). schedule.py relies on exactly this to bind threads;
* a leaf stores to ONE buffer (the GPU schedule guards spare threads with an `if`, and TVM cannot
  place a barrier between two stores inside that `if`); loops whose trip count depends on the data
  are loop bounds, never an `if` around work that needs barriers.
"""
from __future__ import annotations

import tvm
from tvm.script import tirx as T

__all__ = ["const", "barrier_macro", "keep_alive_macro", "load_rows_macro", "online_softmax_macro", "unroll_factor",
           "tile_shape", "tiled_product_macro",
           "NEG_INF"]

NEG_INF = -3.0e38  # finite "minus infinity" for running maxima (keeps exp2(m - m_new) NaN-free)


def const(value, dtype: str):
    return tvm.tirx.const(value, dtype)


def unroll_factor(extent: int, unroll: int) -> int:
    """Inner unroll of a reduction loop of ``extent`` iterations (1 unless ``unroll`` divides it)."""
    return unroll if unroll > 1 and extent % unroll == 0 else 1


def barrier_macro(enabled: bool):
    """Macro ``barrier``: a thread-block barrier before each leaf of a GPU build (nothing on the CPU).

    Explicit barriers between leaves make every leaf race-free by construction (a leaf only reads
    what earlier leaves wrote, and each of its threads writes distinct elements), and keep TVM's
    barrier planner from wanting one inside a spare-thread guard, which it cannot do."""

    @T.macro
    def barrier():
        if enabled:
            T.evaluate(T.tvm_storage_sync("shared.dyn"))

    return barrier


def keep_alive_macro(sync: bool = False):
    """Macro ``keep_alive(sink, idx, never, bufs)``: the last leaf of a GPU program reads every scratch buffer
    under a condition that never holds at run time (``never``, e.g. ``tok0 < 0``) and stores to ``sink``.

    TVM's storage planners (StorageRewrite, MergeSharedMemoryAllocations) reuse a buffer's memory as soon as
    its last statement is done. They reason about one thread: two statements of the same leaf (one thread's
    loop reading buffer X, then its loop writing buffer Y) may share memory while another thread is still in
    the first loop. With every scratch buffer live to the end there is no reuse at all; the kernels reuse
    memory explicitly (one buffer for several roles, separated by barriers) instead."""
    barrier = barrier_macro(sync)

    @T.macro
    def keep_alive(sink, idx, never, bufs):
        barrier()
        for r in T.serial(1):
            with T.sblock("keep_alive"):
                vr = T.axis.remap("S", [r])
                if never:
                    sink[idx] = T.Cast(sink.dtype, _first_elements_sum(bufs)) + T.Cast(sink.dtype, vr)

    return keep_alive


def _first_elements_sum(bufs):
    """Sum of the first and last element of each buffer (touching both keeps the whole buffer allocated:
    TVM also mishandles shared buffers that shrink to <= 32 bits)."""
    total = None
    for b in bufs:
        for idx in (tuple([0] * len(b.shape)), tuple(int(n) - 1 for n in b.shape)):
            x = T.Cast("float32", b[idx])
            total = x if total is None else total + x
    return total


def load_rows_macro(sync: bool = False):
    barrier = barrier_macro(sync)

    @T.macro
    def load_rows_masked(dst, src, tok0, send, h, R, Dd):
        """dst[r, d] = src[tok0 + r, h, d] (cast to dst's dtype) for rows before ``send``, else 0."""
        barrier()
        for r, d in T.grid(R, Dd):
            with T.sblock("load_rows"):
                vr, vd = T.axis.remap("SS", [r, d])
                dst[vr, vd] = T.if_then_else(tok0 + T.Cast("int64", vr) < send,
                                             T.Cast(dst.dtype, src[tok0 + T.Cast("int64", vr), h, vd]),
                                             T.Cast(dst.dtype, 0))

    return load_rows_masked


def online_softmax_macro(rows: int, DV: int, fdt: str, pdt: str, unroll: int = 1, sync: bool = False):
    """Macro ``online_softmax``: the FlashAttention update of (m, l, acc) for ``rows`` query rows.

    Lg[:, :ncols] holds base-2 logits (masked entries at NEG_INF); it is overwritten with P. P is
    rounded to ``pdt`` (v's dtype in the forward scan, as the mma does) before P V is accumulated
    in fdt. ``st`` [>=4, rows] holds the row state: st[0] = m (running max), st[1] = l (running sum),
    st[2], st[3] scratch. (One state buffer rather than four: TVM's shared-memory merge mishandles
    buffers of <= 32 bits, which per-row buffers become for a single row.)
    """
    zero = const(0, fdt)
    barrier = barrier_macro(sync)

    @T.macro
    def online_softmax(Lg, Vb, ncols, st, acc):
        uc = T.meta_var(unroll_factor(ncols, unroll))
        barrier()
        for i in T.serial(rows):
            with T.sblock("sm_mnew"):
                vi = T.axis.remap("S", [i])
                a = T.sblock_alloc_buffer((1,), fdt, scope="local")
                a[0] = st[0, vi]
                for j0 in T.serial(ncols // uc):
                    for j1 in T.unroll(uc):
                        a[0] = T.max(a[0], Lg[vi, j0 * uc + j1])
                st[2, vi] = a[0]
        barrier()
        for i, j in T.grid(rows, ncols):
            with T.sblock("sm_exp"):
                vi, vj = T.axis.remap("SS", [i, j])
                Lg[vi, vj] = T.exp2(Lg[vi, vj] - st[2, vi])
        barrier()
        for i in T.serial(rows):
            with T.sblock("sm_sum"):
                vi = T.axis.remap("S", [i])
                a = T.sblock_alloc_buffer((1,), fdt, scope="local")
                a[0] = zero
                for j0 in T.serial(ncols // uc):
                    for j1 in T.unroll(uc):
                        a[0] = a[0] + Lg[vi, j0 * uc + j1]
                st[3, vi] = a[0]
        barrier()
        for i, e in T.grid(rows, DV):
            with T.sblock("sm_pv_acc"):
                vi, ve = T.axis.remap("SS", [i, e])
                a = T.sblock_alloc_buffer((1,), fdt, scope="local")
                a[0] = acc[vi, ve] * T.exp2(st[0, vi] - st[2, vi])
                for j0 in T.serial(ncols // uc):
                    for j1 in T.unroll(uc):
                        a[0] = a[0] + T.Cast(fdt, T.Cast(pdt, Lg[vi, j0 * uc + j1])) * T.Cast(fdt, Vb[j0 * uc + j1, ve])
                acc[vi, ve] = a[0]
        barrier()
        for i in T.serial(rows):
            with T.sblock("sm_state_l"):
                vi = T.axis.remap("S", [i])
                st[1, vi] = st[1, vi] * T.exp2(st[0, vi] - st[2, vi]) + st[3, vi]
        barrier()
        for i in T.serial(rows):
            with T.sblock("sm_state_m"):
                vi = T.axis.remap("S", [i])
                st[0, vi] = st[2, vi]

    return online_softmax


def tile_shape(M: int, N: int, threads: int, max_outputs: int = 32):
    """Register tile (RI, RJ) of one thread for an M x N product: the largest RI * RJ <= max_outputs (RJ >= RI,
    powers of two dividing M, N) that still leaves at least ``threads`` tiles; 1 x 1 when even that leaves fewer."""
    best = (1, 1)
    for ri in (1, 2, 4, 8):
        for rj in (1, 2, 4, 8):
            if M % ri or N % rj or ri * rj > max_outputs or rj < ri or (M // ri) * (N // rj) < threads:
                continue
            if ri * rj > best[0] * best[1] or (ri * rj == best[0] * best[1] and rj - ri < best[1] - best[0]):
                best = (ri, rj)
    return best


def tiled_product_macro(name: str, P: int, M: int, N: int, K: int, fdt: str, threads: int, unroll: int,
                        a_at, b_at, out_buf, out_idx, value, guard=None, max_outputs: int = 32):
    """Macro ``mm(bufs, ctx, odom, oval)``: a leaf computing P independent M x N products sum_k A(i, k) B(k, j)
    with a register tile per thread (tile_shape).

    A thread owns rows i = ti + (M/RI)*ii and columns j = tj + (N/RJ)*jj (strided, so a warp's threads read
    consecutive columns / rows: with a row stride of D+1 words in shared memory both are bank-conflict free).
    Per k it loads RI values of A and RJ of B into registers for RI*RJ FMAs (one output per thread needs two
    shared loads per FMA). Expressions come from Python callables of (bufs, ctx, vs, p, ...):
    a_at(.., i, k), b_at(.., k, j), out_buf(bufs), out_idx(ctx, vs, p, i, j), value(.., i, j, acc) and
    guard(ctx, vs, p, i, j) (None: store every output). ``vs`` is an enclosing serial loop var bound as opaque
    (odom, oval) -- pass (1, 0) when there is none. The k loop order is the one-output-per-thread order."""
    RI, RJ = tile_shape(M, N, max(1, threads // P), max_outputs)
    MI, NJ = M // RI, N // RJ
    uk = unroll_factor(K, unroll)
    zero = const(0, fdt)
    ok = guard if guard is not None else (lambda c, s, p, i, j: True)

    @T.macro
    def mm(bufs, ctx, odom, oval):
        for pp, ti, tj in T.grid(P, MI, NJ):
            with T.sblock(name):
                vs = T.axis.opaque(odom, oval)
                vp, vi, vj = T.axis.remap("SSS", [pp, ti, tj])
                acc = T.sblock_alloc_buffer((RI, RJ), fdt, scope="local")
                af = T.sblock_alloc_buffer((RI,), fdt, scope="local")
                bf = T.sblock_alloc_buffer((RJ,), fdt, scope="local")
                for ii in T.unroll(RI):
                    for jj in T.unroll(RJ):
                        acc[ii, jj] = zero
                for k0 in T.serial(K // uk):
                    for k1 in T.unroll(uk):
                        for ii in T.unroll(RI):
                            af[ii] = a_at(bufs, ctx, vs, vp, vi + MI * ii, k0 * uk + k1)
                        for jj in T.unroll(RJ):
                            bf[jj] = b_at(bufs, ctx, vs, vp, k0 * uk + k1, vj + NJ * jj)
                        for ii in T.unroll(RI):
                            for jj in T.unroll(RJ):
                                acc[ii, jj] = acc[ii, jj] + af[ii] * bf[jj]
                for ii in T.unroll(RI):
                    for jj in T.unroll(RJ):
                        if ok(ctx, vs, vp, vi + MI * ii, vj + NJ * jj):
                            T.buffer_store(out_buf(bufs),
                                           value(bufs, ctx, vs, vp, vi + MI * ii, vj + NJ * jj, acc[ii, jj]),
                                           out_idx(ctx, vs, vp, vi + MI * ii, vj + NJ * jj))

    return mm
