"""Pass ``decode`` as S-TIR: one step of PaTH(-FoX) decoding, fused, plus the split merge.

``decode`` (one thread block per (batch, kv head, split)): for the cache positions p of its split,
    k_p <- k_p - beta_t (k_p . w_t) w_t     for p < L (math in fdt, rounded to the cache dtype,
                                             written back in place)
    k_L <- k_t, v_L <- v_t, c_L <- c_{L-1} + g_t      (the append, done by the split owning p = L)
then the G query heads of the group attend over the updated keys (logits scale * q.k plus the FoX
bias; online softmax). Each split writes its unnormalised (acc, m, l); ``decode_merge`` (one program
per (batch, query head)) combines them into o and the natural-log lse. The same order of operations
as runtime.reference.recurrent (per key: dot = k.w, a = beta * dot, k' = round(k - a w), s = q.k').

Thread layout (the kernel is memory bound: it reads K once, writes the updated K, reads V):

* a *row group* of ``tpr`` consecutive threads (a power of two <= 32, inside one warp) owns one key
  row at a time; thread ``lane`` of the group holds the row's elements d = (j*tpr + lane)*vec + v
  (j < D/(tpr*vec), v < vec): ``vec`` contiguous elements per access, so a row is read and written
  with one ``vec``-wide load/store per thread and j (e.g. 16 B = 8 bf16 per thread, 16 threads per
  D=128 row: one 256 B row per half warp);
* the block's ``threads / tpr`` row groups each take ``rpt`` rows per step (a step covers
  ``bn = (threads/tpr) * rpt`` consecutive rows, row p = p0 + t*bn + i*ng + grp): all the step's
  K and V vectors are loaded before any arithmetic (memory-level parallelism); with ``prefetch`` a
  second set of row registers holds the next step's loads while this step computes;
* the row reductions k.w and q_g.k (g < G) are per-thread partial sums over the thread's elements,
  then an xor butterfly of warp shuffles over the ``tpr`` lanes (every lane ends with the bitwise
  same sum);
* every row group keeps its own online-softmax state (m, l per query head, and its slice of acc
  [G, DV]) in registers over the whole split, so the main loop has no shared memory and no barrier;
  one shared-memory combine of the row groups at the end writes the split's (acc, m, l);
* the G query heads of a kv head share one read of each K and V row (GQA); math in ``fdt``.

Knobs (TVMParams, resolved by ``decode_layout``): decode_num_warps (threads), decode_splits,
decode_vec, decode_threads_per_row, decode_rows_per_thread (0 = auto; auto rows per thread come from
decode_block_n), decode_prefetch.

The same generator builds the kernel for the CPU (``gpu=False``, llvm; the numerics check): the
thread loops become serial loops around each phase, per-thread buffers get a leading thread index,
and the shuffle butterfly is replayed on those buffers in the same order (so the CPU build also
checks the index math, masks, the append, the split and row-group bookkeeping and the combine).
``tests/test_tvm_emulated.py`` runs the generated CUDA itself (shuffles included) on the CPU.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from tvm.script import tirx as T

from .stir_common import NEG_INF, barrier_macro, const

__all__ = ["DecodeLayout", "decode_layout", "decode_func", "merge_func", "decode_smem_bytes"]

_ESIZE = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}
MAX_ROWS_PER_THREAD = 8          # registers: rpt rows of K and V live in registers at once
AUTO_ROWS_PER_THREAD = 4         # rows per thread when the knob is 0 (auto)


@dataclass(frozen=True)
class DecodeLayout:
    """The decode kernel's thread layout, resolved from the knobs and the dims (see the module doc)."""

    threads: int    # threads per block (decode_num_warps * 32)
    tpr: int        # threads per key row (a power of two <= 32)
    vec: int        # elements per vector access
    rpt: int        # rows per thread per step
    splits: int     # split-K factor (blocks per (batch, kv head))
    prefetch: bool  # load step t+1 (a second set of row registers) before computing step t
    D: int
    DV: int

    @property
    def ng(self) -> int:        # row groups per block
        return self.threads // self.tpr

    @property
    def bn(self) -> int:        # rows per block step
        return self.ng * self.rpt

    @property
    def nj(self) -> int:        # vector accesses per thread per K row
        return self.D // (self.tpr * self.vec)

    @property
    def njv(self) -> int:       # ... per V row
        return self.DV // (self.tpr * self.vec)

    def describe(self) -> str:
        return (f"{self.threads} threads, {self.tpr} per row x {self.nj}x{self.vec} elements, {self.ng} row groups "
                f"x {self.rpt} rows = {self.bn} rows per step, {self.splits} splits"
                + (", prefetch" if self.prefetch else ""))


def _pow2_floor(n: int) -> int:
    return 1 << (max(int(n), 1).bit_length() - 1)


def decode_layout(params, D: int, DV: int, cdt: str) -> DecodeLayout:
    """Resolve the decode knobs (TVMParams) for head dims D, DV and cache dtype cdt.

    decode_vec (elements per access; 0 = 16 bytes of the cache dtype), decode_threads_per_row (0 = enough
    threads for one vector per thread per row, at most 32), decode_rows_per_thread (0 = min(4,
    decode_block_n / row groups), at least 1). Raises UnsupportedConfig for layouts that do not tile D/DV.
    """
    from .params import UnsupportedConfig

    threads = 32 * int(params.decode_num_warps)
    vec = int(params.decode_vec) or max(1, 16 // _ESIZE.get(cdt, 2))
    if vec & (vec - 1):
        raise UnsupportedConfig(f"decode_vec={vec} must be a power of two")
    while vec > 1 and (D % vec or DV % vec):
        if params.decode_vec:
            raise UnsupportedConfig(f"decode_vec={vec} does not divide D={D} and DV={DV}")
        vec //= 2
    tpr = int(params.decode_threads_per_row) or min(32, _pow2_floor(math.gcd(D // vec, DV // vec)))
    if tpr & (tpr - 1) or tpr > 32:
        raise UnsupportedConfig(f"decode_threads_per_row={tpr} must be a power of two <= 32 (one warp)")
    if D % (tpr * vec) or DV % (tpr * vec):
        raise UnsupportedConfig(f"decode_threads_per_row={tpr} x decode_vec={vec} must divide D={D} and DV={DV}")
    ng = threads // tpr
    rpt = int(params.decode_rows_per_thread) or max(1, min(AUTO_ROWS_PER_THREAD, int(params.decode_block_n) // ng))
    if rpt > MAX_ROWS_PER_THREAD:
        raise UnsupportedConfig(f"decode_rows_per_thread={rpt} > {MAX_ROWS_PER_THREAD} (registers)")
    return DecodeLayout(threads=threads, tpr=tpr, vec=vec, rpt=rpt, splits=int(params.decode_splits),
                        prefetch=bool(params.decode_prefetch), D=D, DV=DV)


def decode_smem_bytes(lay: DecodeLayout, G: int, fdt: str = "float32") -> int:
    """Shared memory of one decode block: the row groups' (acc, m, l) for the final combine."""
    return lay.ng * G * (lay.DV + 2) * _ESIZE[fdt]


def decode_func(lay: DecodeLayout, H: int, HQ: int, qdt: str, cdt: str, gated: bool, fdt: str = "float32",
                gpu: bool = True):
    """prim_func ``decode``: fused cache update + split attention of one decoding step.

    Arguments: q_t [B,HQ,D], k_t [B,H,D], v_t [B,H,DV] (qdt); w_t [B,H,D], beta_t [B,H] (fdt);
    g_t [B,HQ] (fdt, gated only); cache_k [B,ML,H,D], cache_v [B,ML,H,DV] (cdt, updated in place);
    cache_c [B,ML,HQ] (fdt, gated only, updated); o_part [B,HQ,NSPLIT,DV], ml_part [B,HQ,NSPLIT,2]
    (fdt, out); length L (int64: valid positions before this step); qk_scale, gate_scale (with
    log2 e), beta_max. gpu=False: the CPU form (serial thread loops; see the module doc).
    """
    D, DV = lay.D, lay.DV
    G = HQ // H
    NT, TPR, VEC, RPT, NG, BN, NJ, NJV = lay.threads, lay.tpr, lay.vec, lay.rpt, lay.ng, lay.bn, lay.nj, lay.njv
    NSPLIT = lay.splits
    PF = lay.prefetch
    EK, EV = NJ * VEC, NJV * VEC             # elements of a K / V row per thread
    NRED = RPT * G                            # logits reduced per step
    CV = G if G & (G - 1) == 0 and G <= 8 else 1  # vector width of the gate-cumsum loads (G floats per row)
    LOG_TPR = TPR.bit_length() - 1
    SM_ML = NG * G * DV                       # smem: acc [NG, G, DV], then (m, l) [NG, G, 2]
    SMEM = NG * G * (DV + 2)
    TS = 1 if gpu else NT                     # leading (thread) dim of per-thread buffers
    local = "local" if gpu else "global"
    zero = const(0, fdt)
    ninf = const(NEG_INF, fdt)
    FS = T.float64 if fdt == "float64" else T.float32
    barrier = barrier_macro(gpu)

    class _S:
        """The per-thread buffers (one namespace, so the phase macros take one argument)."""

        def __init__(self, **kw):
            self.__dict__.update(kw)

    # ------------------------------------------------------------ phases of one thread (ts: its slot)

    @T.macro
    def init(S, ts, tid, q_t, w_t, beta_t, g_t, cache_c, L, beta_max, vb, vh):
        lane = T.meta_var(tid % TPR)
        for j in T.unroll(NJ):
            for v in T.vectorized(VEC):
                S.wr[ts, j * VEC + v] = w_t[vb, vh, (j * TPR + lane) * VEC + v]
        for g in T.unroll(G):
            for j in T.unroll(NJ):
                for v in T.vectorized(VEC):
                    S.qr[ts, g, j * VEC + v] = T.Cast(fdt, q_t[vb, vh * G + g, (j * TPR + lane) * VEC + v])
        S.sc[ts, 0] = T.min(T.Cast(fdt, beta_t[vb, vh]), T.Cast(fdt, beta_max))
        for g in T.unroll(G):
            if gated:
                S.cl[ts, g] = T.if_then_else(L > 0, cache_c[vb, T.max(L - 1, T.int64(0)), vh * G + g], zero) \
                    + g_t[vb, vh * G + g]
            S.m[ts, g] = ninf
            S.l[ts, g] = zero
            for e in T.unroll(EV):
                S.acc[ts, g, e] = zero

    @T.macro
    def load(S, ts, tid, pr, k_t, v_t, cache_k, cache_v, cache_c, L, p1, vb, vh):
        """The step's K and V vectors (and gate cumsums) into registers; row L is the new token.
        pr: the thread's first row of the step (p0 + t*bn + grp); its rows are pr + i*ng."""
        lane = T.meta_var(tid % TPR)
        for i in T.unroll(RPT):
            p = T.meta_var(pr + i * NG)
            if p < p1:
                if p < L:
                    for j in T.unroll(NJ):
                        for v in T.vectorized(VEC):
                            S.kr[ts, i, j * VEC + v] = cache_k[vb, p, vh, (j * TPR + lane) * VEC + v]
                    for j in T.unroll(NJV):
                        for v in T.vectorized(VEC):
                            S.vr[ts, i, j * VEC + v] = cache_v[vb, p, vh, (j * TPR + lane) * VEC + v]
                    if gated:
                        for g0 in T.unroll(G // CV):
                            for g1 in T.vectorized(CV):
                                S.ck[ts, i, g0 * CV + g1] = cache_c[vb, p, vh * G + g0 * CV + g1]
                else:
                    for j in T.unroll(NJ):
                        for v in T.vectorized(VEC):
                            S.kr[ts, i, j * VEC + v] = T.Cast(cdt, k_t[vb, vh, (j * TPR + lane) * VEC + v])
                    for j in T.unroll(NJV):
                        for v in T.vectorized(VEC):
                            S.vr[ts, i, j * VEC + v] = T.Cast(cdt, v_t[vb, vh, (j * TPR + lane) * VEC + v])
                    if gated:
                        for g in T.unroll(G):
                            S.ck[ts, i, g] = S.cl[ts, g]
            else:
                for e in T.unroll(EK):
                    S.kr[ts, i, e] = T.Cast(cdt, 0)
                for e in T.unroll(EV):
                    S.vr[ts, i, e] = T.Cast(cdt, 0)
                if gated:
                    for g in T.unroll(G):
                        S.ck[ts, i, g] = zero

    @T.macro
    def dot_partial(S, ts):
        for i in T.unroll(RPT):
            S.red[ts, i] = zero
            for e in T.unroll(EK):
                S.red[ts, i] = S.red[ts, i] + T.Cast(fdt, S.kr[ts, i, e]) * S.wr[ts, e]

    @T.macro
    def update_store(S, ts, tid, pr, cache_k, cache_v, cache_c, L, p1, vb, vh):
        """k <- round(k - (beta dot) w) for rows < L; rows of the split written back (row L raw: the append)."""
        lane = T.meta_var(tid % TPR)
        for i in T.unroll(RPT):
            p = T.meta_var(pr + i * NG)
            if p < L:
                S.sc[ts, 1] = S.sc[ts, 0] * S.red[ts, i]
                for e in T.unroll(EK):
                    S.kr[ts, i, e] = T.Cast(cdt, T.Cast(fdt, S.kr[ts, i, e]) - S.sc[ts, 1] * S.wr[ts, e])
            if p < p1:
                for j in T.unroll(NJ):
                    for v in T.vectorized(VEC):
                        cache_k[vb, p, vh, (j * TPR + lane) * VEC + v] = S.kr[ts, i, j * VEC + v]
                if p == L:
                    for j in T.unroll(NJV):
                        for v in T.vectorized(VEC):
                            cache_v[vb, p, vh, (j * TPR + lane) * VEC + v] = S.vr[ts, i, j * VEC + v]
                    if gated:
                        if lane == 0:
                            for g in T.unroll(G):
                                cache_c[vb, p, vh * G + g] = S.cl[ts, g]

    @T.macro
    def logit_partial(S, ts):
        for i in T.unroll(RPT):
            for g in T.unroll(G):
                S.red[ts, i * G + g] = zero
                for e in T.unroll(EK):
                    S.red[ts, i * G + g] = S.red[ts, i * G + g] + S.qr[ts, g, e] * T.Cast(fdt, S.kr[ts, i, e])

    @T.macro
    def softmax(S, ts, pr, qk_scale, gate_scale, p1):
        """The row group's online softmax over its RPT rows of this step (identical on its lanes)."""
        for i in T.unroll(RPT):
            for g in T.unroll(G):
                if gated:
                    S.red[ts, i * G + g] = T.if_then_else(
                        pr + i * NG < p1,
                        S.red[ts, i * G + g] * T.Cast(fdt, qk_scale) + (S.cl[ts, g] - S.ck[ts, i, g])
                        * T.Cast(fdt, gate_scale), ninf)
                else:
                    S.red[ts, i * G + g] = T.if_then_else(
                        pr + i * NG < p1, S.red[ts, i * G + g] * T.Cast(fdt, qk_scale), ninf)
        for g in T.unroll(G):
            S.sc[ts, 2] = S.m[ts, g]
            for i in T.unroll(RPT):
                S.sc[ts, 2] = T.max(S.sc[ts, 2], S.red[ts, i * G + g])
            S.sc[ts, 3] = T.exp2(S.m[ts, g] - S.sc[ts, 2])                      # alpha
            S.sc[ts, 4] = zero
            for i in T.unroll(RPT):                                             # p (0 for rows outside the split)
                S.red[ts, i * G + g] = T.if_then_else(pr + i * NG < p1,
                                                      T.exp2(S.red[ts, i * G + g] - S.sc[ts, 2]), zero)
                S.sc[ts, 4] = S.sc[ts, 4] + S.red[ts, i * G + g]
            S.l[ts, g] = S.l[ts, g] * S.sc[ts, 3] + S.sc[ts, 4]
            for e in T.unroll(EV):
                S.acc[ts, g, e] = S.acc[ts, g, e] * S.sc[ts, 3]
                for i in T.unroll(RPT):
                    S.acc[ts, g, e] = S.acc[ts, g, e] + S.red[ts, i * G + g] * T.Cast(fdt, S.vr[ts, i, e])
            S.m[ts, g] = S.sc[ts, 2]

    @T.macro
    def to_smem(S, ts, tid, smem):
        lane = T.meta_var(tid % TPR)
        grp = T.meta_var(tid // TPR)
        for g in T.unroll(G):
            for j in T.unroll(NJV):
                for v in T.vectorized(VEC):
                    smem[(grp * G + g) * DV + (j * TPR + lane) * VEC + v] = S.acc[ts, g, j * VEC + v]
            if lane == 0:
                smem[SM_ML + (grp * G + g) * 2] = S.m[ts, g]
                smem[SM_ML + (grp * G + g) * 2 + 1] = S.l[ts, g]

    @T.macro
    def combine(tid, smem, o_part, ml_part, vb, vh, vsp):
        """The split's (acc, m, l) from the row groups' (one output element per thread and pass)."""
        cmb = T.alloc_buffer((TS, 3), fdt, scope=local)
        ts = T.meta_var(0 if gpu else tid)
        for k0 in T.serial((G * DV + NT - 1) // NT):
            if k0 * NT + tid < G * DV:
                g = T.meta_var((k0 * NT + tid) // DV)
                e = T.meta_var((k0 * NT + tid) % DV)
                cmb[ts, 0] = ninf
                for r in T.serial(NG):
                    cmb[ts, 0] = T.max(cmb[ts, 0], smem[SM_ML + (r * G + g) * 2])
                cmb[ts, 1] = zero
                cmb[ts, 2] = zero
                for r in T.serial(NG):
                    cmb[ts, 1] = cmb[ts, 1] + smem[(r * G + g) * DV + e] * T.exp2(smem[SM_ML + (r * G + g) * 2]
                                                                                   - cmb[ts, 0])
                    cmb[ts, 2] = cmb[ts, 2] + smem[SM_ML + (r * G + g) * 2 + 1] * T.exp2(
                        smem[SM_ML + (r * G + g) * 2] - cmb[ts, 0])
                o_part[vb, vh * G + g, vsp, e] = cmb[ts, 1]
                if e == 0:
                    ml_part[vb, vh * G + g, vsp, 0] = cmb[ts, 0]
                    ml_part[vb, vh * G + g, vsp, 1] = cmb[ts, 2]

    # ------------------------------------------------------------ lane reductions

    @T.macro
    def lane_sum_gpu(S, n):
        """red[0, x] <- sum over the TPR lanes of the row group (xor butterfly of warp shuffles)."""
        for s in T.unroll(LOG_TPR):
            for x in T.unroll(n):
                S.red[0, x] = S.red[0, x] + T.tvm_warp_shuffle_xor(T.uint32(0xFFFFFFFF), S.red[0, x],
                                                                    TPR >> (s + 1), 32, 32)

    @T.macro
    def lane_sum_cpu(S, n):
        """The same butterfly, in the same order, on the CPU form's per-thread buffers."""
        for s in T.serial(LOG_TPR):
            for tid, x in T.grid(NT, n):
                S.tmp[tid, x] = S.red[tid, x] + S.red[T.bitwise_xor(tid, TPR >> (s + 1)), x]
            for tid, x in T.grid(NT, n):
                S.red[tid, x] = S.tmp[tid, x]

    def buffers(ts, rows_only=False, suffix=""):
        """The per-thread buffers (registers on the GPU), named for readable generated code. rows_only: just the
        step's row registers (kr, vr, ck: the second set of a prefetching kernel)."""
        from tvm.script.ir_builder import IRBuilder

        rows = dict(kr=((ts, RPT, EK), cdt), vr=((ts, RPT, EV), cdt), ck=((ts, RPT, G if gated else 1), fdt))
        state = dict(wr=((ts, EK), fdt), qr=((ts, G, EK), fdt), cl=((ts, G), fdt), m=((ts, G), fdt),
                     l=((ts, G), fdt), acc=((ts, G, EV), fdt), red=((ts, NRED), fdt), sc=((ts, 5), fdt))
        if not gpu:
            state["tmp"] = ((ts, NRED), fdt)
        out = {}
        for name, (shape, dt) in (rows if rows_only else dict(rows, **state)).items():
            out[name] = T.alloc_buffer(shape, dt, scope=local)
            IRBuilder.name(f"{name}{suffix}_r", out[name])
        return out

    def second_set(S, ts):
        """A namespace sharing S's state buffers with its own row registers (the prefetch target)."""
        return _S(**dict(S.__dict__, **buffers(ts, rows_only=True, suffix="_b")))

    # ------------------------------------------------------------ one program (block)

    @T.macro
    def step_gpu(S, tid, pr, cache_k, cache_v, cache_c, L, p1, qk_scale, gate_scale, vb, vh):
        """Everything of one step after its loads (rows pr + i*ng of this thread's row group)."""
        dot_partial(S, 0)
        lane_sum_gpu(S, RPT)
        update_store(S, 0, tid, pr, cache_k, cache_v, cache_c, L, p1, vb, vh)
        logit_partial(S, 0)
        lane_sum_gpu(S, NRED)
        softmax(S, 0, pr, qk_scale, gate_scale, p1)

    @T.macro
    def program_gpu(q_t, k_t, v_t, w_t, beta_t, g_t, cache_k, cache_v, cache_c, o_part, ml_part, L, qk_scale,
                    gate_scale, beta_max, vb, vh, vsp):
        per: T.int64 = (L + T.int64(NSPLIT)) // T.int64(NSPLIT)      # ceil((L + 1) / NSPLIT) rows per split
        p0: T.int64 = T.Cast("int64", vsp) * per
        p1: T.int64 = T.min(p0 + per, L + T.int64(1))
        smem = T.alloc_buffer((SMEM,), fdt, scope="shared.dyn")
        for tid in T.thread_binding(NT, thread="threadIdx.x"):
            S = T.meta_var(_S(**buffers(1)))
            init(S, 0, tid, q_t, w_t, beta_t, g_t, cache_c, L, beta_max, vb, vh)
            if PF:
                # software prefetch: the next step's K/V/c loads are in flight while this step computes
                SB = T.meta_var(second_set(S, 1))
                load(S, 0, tid, p0 + T.Cast("int64", tid // TPR), k_t, v_t, cache_k, cache_v, cache_c, L, p1, vb, vh)
                for t2 in T.serial((T.max(p1 - p0, T.int64(0)) + 2 * BN - 1) // (2 * BN)):
                    pa: T.int64 = p0 + t2 * (2 * BN) + T.Cast("int64", tid // TPR)
                    load(SB, 0, tid, pa + BN, k_t, v_t, cache_k, cache_v, cache_c, L, p1, vb, vh)
                    step_gpu(S, tid, pa, cache_k, cache_v, cache_c, L, p1, qk_scale, gate_scale, vb, vh)
                    load(S, 0, tid, pa + 2 * BN, k_t, v_t, cache_k, cache_v, cache_c, L, p1, vb, vh)
                    step_gpu(SB, tid, pa + BN, cache_k, cache_v, cache_c, L, p1, qk_scale, gate_scale, vb, vh)
            else:
                for t in T.serial((T.max(p1 - p0, T.int64(0)) + BN - 1) // BN):
                    pr: T.int64 = p0 + t * BN + T.Cast("int64", tid // TPR)
                    load(S, 0, tid, pr, k_t, v_t, cache_k, cache_v, cache_c, L, p1, vb, vh)
                    step_gpu(S, tid, pr, cache_k, cache_v, cache_c, L, p1, qk_scale, gate_scale, vb, vh)
            to_smem(S, 0, tid, smem)
        barrier()
        for tid in T.thread_binding(NT, thread="threadIdx.x"):
            combine(tid, smem, o_part, ml_part, vb, vh, vsp)

    @T.macro
    def load_cpu(S, base, k_t, v_t, cache_k, cache_v, cache_c, L, p1, vb, vh):
        for tid in T.serial(NT):
            load(S, tid, tid, base + T.Cast("int64", tid // TPR), k_t, v_t, cache_k, cache_v, cache_c, L, p1, vb, vh)

    @T.macro
    def step_cpu(S, base, cache_k, cache_v, cache_c, L, p1, qk_scale, gate_scale, vb, vh):
        for tid in T.serial(NT):
            dot_partial(S, tid)
        lane_sum_cpu(S, RPT)
        for tid in T.serial(NT):
            update_store(S, tid, tid, base + T.Cast("int64", tid // TPR), cache_k, cache_v, cache_c, L, p1, vb, vh)
        for tid in T.serial(NT):
            logit_partial(S, tid)
        lane_sum_cpu(S, NRED)
        for tid in T.serial(NT):
            softmax(S, tid, base + T.Cast("int64", tid // TPR), qk_scale, gate_scale, p1)

    @T.macro
    def program_cpu(q_t, k_t, v_t, w_t, beta_t, g_t, cache_k, cache_v, cache_c, o_part, ml_part, L, qk_scale,
                    gate_scale, beta_max, vb, vh, vsp):
        per: T.int64 = (L + T.int64(NSPLIT)) // T.int64(NSPLIT)
        p0: T.int64 = T.Cast("int64", vsp) * per
        p1: T.int64 = T.min(p0 + per, L + T.int64(1))
        smem = T.alloc_buffer((SMEM,), fdt)
        S = T.meta_var(_S(**buffers(NT)))
        for tid in T.serial(NT):
            init(S, tid, tid, q_t, w_t, beta_t, g_t, cache_c, L, beta_max, vb, vh)
        if PF:                       # the GPU form's order: load t+1 before the compute of t
            SB = T.meta_var(second_set(S, NT))
            load_cpu(S, p0, k_t, v_t, cache_k, cache_v, cache_c, L, p1, vb, vh)
            for t2 in T.serial((T.max(p1 - p0, T.int64(0)) + 2 * BN - 1) // (2 * BN)):
                load_cpu(SB, p0 + t2 * (2 * BN) + BN, k_t, v_t, cache_k, cache_v, cache_c, L, p1, vb, vh)
                step_cpu(S, p0 + t2 * (2 * BN), cache_k, cache_v, cache_c, L, p1, qk_scale, gate_scale, vb, vh)
                load_cpu(S, p0 + t2 * (2 * BN) + 2 * BN, k_t, v_t, cache_k, cache_v, cache_c, L, p1, vb, vh)
                step_cpu(SB, p0 + t2 * (2 * BN) + BN, cache_k, cache_v, cache_c, L, p1, qk_scale, gate_scale, vb, vh)
        else:
            for t in T.serial((T.max(p1 - p0, T.int64(0)) + BN - 1) // BN):
                load_cpu(S, p0 + t * BN, k_t, v_t, cache_k, cache_v, cache_c, L, p1, vb, vh)
                step_cpu(S, p0 + t * BN, cache_k, cache_v, cache_c, L, p1, qk_scale, gate_scale, vb, vh)
        for tid in T.serial(NT):
            to_smem(S, tid, tid, smem)
        for tid in T.serial(NT):
            combine(tid, smem, o_part, ml_part, vb, vh, vsp)

    program = program_gpu if gpu else program_cpu

    @T.macro
    def launch(q_t, k_t, v_t, w_t, beta_t, g_t, cache_k, cache_v, cache_c, o_part, ml_part,
               L, qk_scale, gate_scale, beta_max):
        """One program per (batch, kv head, split): block indices on the GPU, loops on the CPU."""
        with T.sblock("root"):
            if gpu:
                for b in T.thread_binding(o_part.shape[0], thread="blockIdx.x"):
                    for h in T.thread_binding(H, thread="blockIdx.y"):
                        for sp in T.thread_binding(NSPLIT, thread="blockIdx.z"):
                            program(q_t, k_t, v_t, w_t, beta_t, g_t, cache_k, cache_v, cache_c, o_part, ml_part,
                                    L, qk_scale, gate_scale, beta_max, b, h, sp)
            else:
                for b, h, sp in T.grid(o_part.shape[0], H, NSPLIT):
                    program(q_t, k_t, v_t, w_t, beta_t, g_t, cache_k, cache_v, cache_c, o_part, ml_part,
                            L, qk_scale, gate_scale, beta_max, b, h, sp)

    if gated:
        @T.prim_func(s_tir=True)
        def decode(q_h: T.handle, k_h: T.handle, v_h: T.handle, w_h: T.handle, beta_h: T.handle, g_h: T.handle,
                   ck_h: T.handle, cv_h: T.handle, cc_h: T.handle, op_h: T.handle, ml_h: T.handle, L: T.int64,
                   qk_scale: FS, gate_scale: FS, beta_max: FS):
            T.func_attr({"global_symbol": "decode"})
            B = T.int64()
            ML = T.int64()
            q_t = T.match_buffer(q_h, (B, HQ, D), qdt)
            k_t = T.match_buffer(k_h, (B, H, D), qdt)
            v_t = T.match_buffer(v_h, (B, H, DV), qdt)
            w_t = T.match_buffer(w_h, (B, H, D), fdt)
            beta_t = T.match_buffer(beta_h, (B, H), fdt)
            g_t = T.match_buffer(g_h, (B, HQ), fdt)
            cache_k = T.match_buffer(ck_h, (B, ML, H, D), cdt)
            cache_v = T.match_buffer(cv_h, (B, ML, H, DV), cdt)
            cache_c = T.match_buffer(cc_h, (B, ML, HQ), fdt)
            o_part = T.match_buffer(op_h, (B, HQ, NSPLIT, DV), fdt)
            ml_part = T.match_buffer(ml_h, (B, HQ, NSPLIT, 2), fdt)
            launch(q_t, k_t, v_t, w_t, beta_t, g_t, cache_k, cache_v, cache_c, o_part, ml_part,
                   L, qk_scale, gate_scale, beta_max)
        return decode

    @T.prim_func(s_tir=True)
    def decode(q_h: T.handle, k_h: T.handle, v_h: T.handle, w_h: T.handle, beta_h: T.handle,
               ck_h: T.handle, cv_h: T.handle, op_h: T.handle, ml_h: T.handle, L: T.int64,
               qk_scale: FS, gate_scale: FS, beta_max: FS):
        T.func_attr({"global_symbol": "decode"})
        B = T.int64()
        ML = T.int64()
        q_t = T.match_buffer(q_h, (B, HQ, D), qdt)
        k_t = T.match_buffer(k_h, (B, H, D), qdt)
        v_t = T.match_buffer(v_h, (B, H, DV), qdt)
        w_t = T.match_buffer(w_h, (B, H, D), fdt)
        beta_t = T.match_buffer(beta_h, (B, H), fdt)
        cache_k = T.match_buffer(ck_h, (B, ML, H, D), cdt)
        cache_v = T.match_buffer(cv_h, (B, ML, H, DV), cdt)
        o_part = T.match_buffer(op_h, (B, HQ, NSPLIT, DV), fdt)
        ml_part = T.match_buffer(ml_h, (B, HQ, NSPLIT, 2), fdt)
        launch(q_t, k_t, v_t, w_t, beta_t, None, cache_k, cache_v, None, o_part, ml_part,
               L, qk_scale, gate_scale, beta_max)
    return decode


def merge_func(NSPLIT: int, HQ: int, DV: int, qdt: str, fdt: str = "float32", smem: str = "global"):
    """prim_func ``decode_merge``: o [B,HQ,DV] (qdt) and lse [B,HQ] (fdt, natural log) from the splits."""
    zero = const(0, fdt)
    ln2 = const(math.log(2.0), fdt)
    barrier = barrier_macro(smem != "global")

    @T.prim_func(s_tir=True)
    def decode_merge(op_h: T.handle, ml_h: T.handle, o_h: T.handle, lse_h: T.handle):
        T.func_attr({"global_symbol": "decode_merge"})
        B = T.int64()
        o_part = T.match_buffer(op_h, (B, HQ, NSPLIT, DV), fdt)
        ml_part = T.match_buffer(ml_h, (B, HQ, NSPLIT, 2), fdt)
        o = T.match_buffer(o_h, (B, HQ, DV), qdt)
        lse = T.match_buffer(lse_h, (B, HQ), fdt)
        for b, hq in T.grid(B, HQ):
            with T.sblock("program"):
                vb, vhq = T.axis.remap("SS", [b, hq])
                ml = T.sblock_alloc_buffer((2,), fdt, scope=smem)   # max, sum (one buffer: see online_softmax)
                oacc = T.sblock_alloc_buffer((DV,), fdt, scope=smem)
                barrier()
                for r in T.serial(1):
                    with T.sblock("mg_max"):
                        vr = T.axis.remap("S", [r])
                        a = T.sblock_alloc_buffer((1,), fdt, scope="local")
                        a[0] = const(NEG_INF, fdt)
                        for sp in T.serial(NSPLIT):
                            a[0] = T.max(a[0], ml_part[vb, vhq, sp, 0])
                        ml[0] = a[0]
                barrier()
                for r in T.serial(1):
                    with T.sblock("mg_sum"):
                        vr = T.axis.remap("S", [r])
                        a = T.sblock_alloc_buffer((1,), fdt, scope="local")
                        a[0] = zero
                        for sp in T.serial(NSPLIT):
                            a[0] = a[0] + ml_part[vb, vhq, sp, 1] * T.exp2(ml_part[vb, vhq, sp, 0] - ml[0])
                        ml[1] = a[0]
                barrier()
                for e in T.serial(DV):
                    with T.sblock("mg_o"):
                        ve = T.axis.remap("S", [e])
                        a = T.sblock_alloc_buffer((1,), fdt, scope="local")
                        a[0] = zero
                        for sp in T.serial(NSPLIT):
                            a[0] = a[0] + o_part[vb, vhq, sp, ve] * T.exp2(ml_part[vb, vhq, sp, 0] - ml[0])
                        oacc[ve] = a[0]
                barrier()
                for e in T.serial(DV):
                    with T.sblock("mg_store"):
                        ve = T.axis.remap("S", [e])
                        o[vb, vhq, ve] = T.Cast(qdt, oacc[ve] / ml[1])
                barrier()
                for r in T.serial(1):
                    with T.sblock("mg_lse"):
                        vr = T.axis.remap("S", [r])
                        lse[vb, vhq] = (ml[0] + T.log2(ml[1])) * ln2

    return decode_merge
