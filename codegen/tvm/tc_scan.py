"""Stage ``blockwise_scan`` (+ ``fox_gate``), forward, on tensor cores: a TIRx kernel with mma.sync.

The same computation as stir_scan.scan_func (read that first), organised the FlashAttention-2 way:
one thread block per (query chunk, query head), ``num_warps`` warps, warp w owning query rows
[w*R, (w+1)*R) of the chunk (R = chunk_size / num_warps, a multiple of 16). Everything a warp
needs per row stays in registers: the moving query X [R, D] and the output accumulator [R, DV]
(f32 mma accumulator fragments), the running max / sum. Key-side tiles (K~ / KJ, V, W, U) are
staged in shared memory by the whole block and read as mma B fragments.

Tensor-core products (``Tx.warp.gemm`` -> mma.sync.m16n8k16, f16/bf16 operands, f32 accumulate):
    diagonal tile   QW = Q W^T,  X = Q - QW U,  S = Q K^T          (scan dtype)
    each chunk      S = X K~^T,  acc += P V,  XW = X W^T,  X -= XW U
    each tile       S = X KJ^T,  acc += P V
    dense transition X <- X What (D x D, once per super-chunk): f16 hi/lo split of both factors,
    3 products (about float32 accuracy, like tf32x3), for every transition_precision value.
CUDA-core float32: the diagonal correction S -= QW M (C^3 per chunk).
Macros: load_tok / load_gate (block-wide tile staging), a_tile + gemm_nt / gemm_nn_acc (K-split warp
gemms), softmax_pv (online softmax on the logit fragment, then P V), lowrank (X <- X - (X W^T) U),
logits (scale, FoX bias, causal mask), dense_transition.

Knobs (TVMParams): chunk_size, superchunk_size, block_n (key tile between super-chunks),
num_warps, scan_precision (fp16 | bf16). num_stages is not used (no cp.async pipeline yet).
"""
from __future__ import annotations

import math

from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx

from .params import KernelDims, TVMParams, UnsupportedConfig
from .stir_common import NEG_INF
from .tc_fragments import a_coord, a_slots, b_coord, b_slots, d_coord, d_slots, lay_A, lay_B, lay_D

__all__ = ["check_tc_supported", "tc_scan_func", "tc_smem_bytes"]

SMEM_LIMIT = 227 * 1024          # max dynamic shared memory per block on sm_90 (sm_80: 163 KiB)
PAD = 8                          # row padding (elements) of the 16-bit shared tiles
_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}


def _layout_bytes(params: TVMParams, dims: KernelDims):
    C, BN, D, DV = params.chunk_size, params.block_n, dims.D, dims.DV
    RK = max(C, BN)
    sb = _BYTES[params.scan_dtype()]
    vb = _BYTES[dims.dtype]
    # 16-bit tiles get PAD extra elements per row: the mma B-fragment reads then hit different banks
    Dp, DVp = D + PAD, DV + PAD
    # one region, three phases: W, U (chunk steps) | M (diagonal tile, after X is built) | What split into
    # f16 hi + lo (super-chunk transitions); the barriers between the phases make the reuse safe
    wu = max(2 * C * Dp * sb, C * C * 4, 2 * D * Dp * 2)
    parts = [("Kb", RK * Dp * sb), ("Vb", RK * DVp * vb), ("WU", wu), ("Xs", C * C * 4), ("ck", RK * 4)]
    offs, off = {}, 0
    for name, nbytes in parts:
        offs[name] = off
        off += (nbytes + 127) // 128 * 128
    offs.update(Wb=offs["WU"], Ub=offs["WU"] + C * Dp * sb, Ms=offs["WU"], Whi=offs["WU"], Wlo=offs["WU"] + D * Dp * 2)
    return offs, off


def tc_smem_bytes(params: TVMParams, dims: KernelDims) -> int:
    return _layout_bytes(params, dims)[1]


def check_tc_supported(params: TVMParams, dims: KernelDims) -> None:
    """Raise UnsupportedConfig for combinations the tensor-core scan cannot compile."""
    C, W = params.chunk_size, params.num_warps
    if params.scan_precision not in ("fp16", "bf16"):
        raise UnsupportedConfig("the tensor-core scan needs scan_precision fp16 or bf16 (mma.sync has no tf32 path "
                                "in TIRx); use the CUDA-core variant for tf32")
    if dims.dtype not in ("bfloat16", "float16"):
        raise UnsupportedConfig(f"the tensor-core scan needs bf16/fp16 q, k, v (got {dims.dtype})")
    if C % (16 * W):
        raise UnsupportedConfig(f"chunk_size {C} must be a multiple of 16 * num_warps = {16 * W} (each warp owns "
                                "whole 16-row mma tiles of the query chunk)")
    if dims.D % 16 or dims.DV % 16 or params.block_n % 16:
        raise UnsupportedConfig("D, DV and block_n must be multiples of 16 for mma.sync m16n8k16")
    need = tc_smem_bytes(params, dims)
    if need > SMEM_LIMIT:
        raise UnsupportedConfig(f"the tensor-core scan needs {need} B of shared memory (> {SMEM_LIMIT}); use a "
                                "smaller chunk_size or block_n")


def tc_scan_func(params: TVMParams, dims: KernelDims, debug: str = ""):
    """The TIRx prim_func ``scan`` (same arguments as stir_scan.scan_func, float32 side tensors).

    debug (tests only): "QW", "X", "S" store that diagonal-tile intermediate into o instead of the output."""
    check_tc_supported(params, dims)
    C, S, BN, W = params.chunk_size, params.superchunk_size, params.block_n, params.num_warps
    H, HQ, D, DV, G = dims.H, dims.HQ, dims.D, dims.DV, dims.G
    gated = dims.gated
    qdt = dims.dtype                       # q, k, v, o; also the P V operand dtype
    sdt = params.scan_dtype()              # operands of the scan products
    fdt = "float32"
    NT = 32 * W                            # threads per block
    R = C // W                             # query rows per warp
    Mt = R // 16
    RK = max(C, BN)
    s_per = S // C                         # chunks per super-chunk
    ntile = S // BN
    offs, smem_bytes = _layout_bytes(params, dims)
    ninf = NEG_INF
    ln2 = math.log(2.0)

    # fragment shapes (rows R, K-split of 16 for the B operand)
    nX, nACC = d_slots(Mt, D // 8), d_slots(Mt, DV // 8)
    nSC, nSB = d_slots(Mt, C // 8), d_slots(Mt, BN // 8)
    nXa = a_slots(Mt, D // 16)
    nQW = d_slots(Mt, C // 8)
    nrows = 2 * Mt                         # rows per thread: (mt, rM)

    def dc(s, lane, N):                    # (row within warp rows, col) of D slot s, [R, N]
        return d_coord(s, lane, Mt, N // 8)

    def ac(s, lane, K):
        return a_coord(s, lane, Mt, K // 16)

    def bc(s, lane, N):                    # B fragment [16, N]
        return b_coord(s, lane, 1, N // 8)

    def drow(s, N):                        # which of the thread's 2*Mt rows a D slot belongs to
        return (s // (4 * (N // 8))) * 2 + (s // 2) % 2

    # ---------------------------------------------------------------- macros
    @T.macro
    def load_tok(dst, nrows_, ncols, src, base, hh, nvalid, masked, tid):
        """dst[r, c] = src[base + r, hh, c] (cast to dst's dtype) for r < nrows_, block-wide (NT threads);
        masked: rows r >= nvalid are zero instead (past the end of the sequence)."""
        for i in T.serial((nrows_ * ncols + NT - 1) // NT):
            e = T.meta_var(i * NT + tid)
            if e < nrows_ * ncols:
                if masked:
                    dst[e // ncols, e % ncols] = T.if_then_else(
                        T.Cast("int64", e // ncols) < nvalid,
                        T.Cast(dst.dtype, src[base + T.Cast("int64", e // ncols), hh, e % ncols]), T.Cast(dst.dtype, 0))
                else:
                    dst[e // ncols, e % ncols] = T.Cast(dst.dtype, src[base + T.Cast("int64", e // ncols), hh, e % ncols])

    @T.macro
    def load_gate(dst, nrows_, src, base, hq, nvalid, masked, tid):
        """dst[r] = src[base + r, hq] (gate cumsum of the key rows), block-wide."""
        for i in T.serial((nrows_ + NT - 1) // NT):
            e = T.meta_var(i * NT + tid)
            if e < nrows_:
                if masked:
                    dst[e] = T.if_then_else(T.Cast("int64", e) < nvalid, src[base + T.Cast("int64", e), hq],
                                            T.float32(0))
                else:
                    dst[e] = src[base + T.Cast("int64", e), hq]

    @T.macro
    def zero_frag(F, n):
        f = F.local(n)
        for s in T.unroll(n):
            f[s] = T.float32(0)

    @T.macro
    def a_tile(A16, Aop, K, kt):
        """A16 [R, 16] = columns [16 kt, 16 kt + 16) of the A fragment Aop [R, K] (register copies).

        (Passing the region Aop[:, 16kt:16kt+16] to Tx.warp.gemm is wrong in TVM 0.27: the lowering applies
        the element offset to the packed 32-bit register view, i.e. it reads column block 2 kt.)"""
        a16 = A16.local(a_slots(Mt, 1))
        a = Aop.local(a_slots(Mt, K // 16))
        for j in T.unroll(a_slots(Mt, 1)):
            a16[j] = a[(j // 8) * 8 * (K // 16) + kt * 8 + j % 8]

    @T.macro
    def gemm_nt(Out, N, Aop, K, A16, Bsm, Bf, lane):
        """Out[R, N] = Aop[R, K] Bsm[:N, :K]^T   (Bsm in shared memory, rows = output columns)."""
        zero_frag(Out, d_slots(Mt, N // 8))
        bl = Bf.local(b_slots(1, N // 8))
        for kt in T.unroll(K // 16):
            for s in T.unroll(b_slots(1, N // 8)):
                kk = T.meta_var(bc(s, lane, N))
                bl[s] = Bsm[kk[1], kt * 16 + kk[0]]
            a_tile(A16, Aop, K, kt)
            Tx.warp.gemm(Out, A16, Bf, Out, transpose_A=False, transpose_B=False, alpha=1.0, beta=1.0)

    @T.macro
    def gemm_nn_acc(Out, N, Aop, K, A16, Bsm, Bf, lane):
        """Out[R, N] += Aop[R, K] Bsm[:K, :N]   (Bsm in shared memory, rows = reduction index)."""
        bl = Bf.local(b_slots(1, N // 8))
        for kt in T.unroll(K // 16):
            for s in T.unroll(b_slots(1, N // 8)):
                kk = T.meta_var(bc(s, lane, N))
                bl[s] = Bsm[kt * 16 + kk[0], kk[1]]
            a_tile(A16, Aop, K, kt)
            Tx.warp.gemm(Out, A16, Bf, Out, transpose_A=False, transpose_B=False, alpha=1.0, beta=1.0)

    @T.macro
    def to_operand(Af, Df, n, dt, sign):
        """A fragment = cast(dt, sign * D fragment) slot by slot (same [R, N] element per slot)."""
        a = Af.local(n)
        d = Df.local(n)
        for s in T.unroll(n):
            a[s] = T.Cast(dt, d[s] * T.float32(sign))

    @T.macro
    def logits(Sf, N, row0, cq, cks, qk_scale, gate_scale, diag, nvalid, lane):
        """Sf <- Sf * qk_scale (+ (c_q - c_k) * gate_scale); diagonal tile: causal + padded keys masked."""
        f = Sf.local(d_slots(Mt, N // 8))
        for s in T.unroll(d_slots(Mt, N // 8)):
            rc = T.meta_var(dc(s, lane, N))
            if gated:
                f[s] = f[s] * qk_scale + (cq[drow(s, N)] - cks[rc[1]]) * gate_scale
            else:
                f[s] = f[s] * qk_scale
            if diag:
                if rc[1] > row0 + rc[0] or T.Cast("int64", rc[1]) >= nvalid:
                    f[s] = T.float32(ninf)

    @T.macro
    def softmax_pv(Sf, N, Pf, A16v, Vsm, Bv, acc, m_i, l_i, lane):
        """Online softmax of the logit fragment Sf [R, N] (base 2), then acc += P V (P in q's dtype)."""
        f = Sf.local(d_slots(Mt, N // 8))
        a = acc.local(nACC)
        mx = T.alloc_buffer((1,), fdt, scope="local")
        rs = T.alloc_buffer((1,), fdt, scope="local")
        for i in T.unroll(nrows):
            mx[0] = m_i[i]
            for s in T.unroll(d_slots(Mt, N // 8)):
                if drow(s, N) == i:
                    mx[0] = T.max(mx[0], f[s])
            mx[0] = T.max(mx[0], T.tvm_warp_shuffle_xor(T.uint32(0xFFFFFFFF), mx[0], 1, 32, 32))
            mx[0] = T.max(mx[0], T.tvm_warp_shuffle_xor(T.uint32(0xFFFFFFFF), mx[0], 2, 32, 32))
            rs[0] = T.float32(0)
            for s in T.unroll(d_slots(Mt, N // 8)):
                if drow(s, N) == i:
                    f[s] = T.exp2(f[s] - mx[0])
                    rs[0] = rs[0] + f[s]
            rs[0] = rs[0] + T.tvm_warp_shuffle_xor(T.uint32(0xFFFFFFFF), rs[0], 1, 32, 32)
            rs[0] = rs[0] + T.tvm_warp_shuffle_xor(T.uint32(0xFFFFFFFF), rs[0], 2, 32, 32)
            alpha = T.meta_var(T.exp2(m_i[i] - mx[0]))
            l_i[i] = l_i[i] * alpha + rs[0]
            for s in T.unroll(nACC):
                if drow(s, DV) == i:
                    a[s] = a[s] * alpha
            m_i[i] = mx[0]
        to_operand(Pf, Sf, d_slots(Mt, N // 8), qdt, 1.0)
        gemm_nn_acc(acc, DV, Pf, N, A16v, Vsm, Bv, lane)

    @T.macro
    def lowrank(X, Xa, A16s, Wsm, Usm, XWf, XWa, Bk, Bu, lane):
        """X <- X - (X W^T) U  (the chunk transition P = I - W^T U, low rank C); Xa = X in sdt on entry."""
        gemm_nt(XWf, C, Xa, D, A16s, Wsm, Bk, lane)
        to_operand(XWa, XWf, nQW, sdt, -1.0)
        gemm_nn_acc(X, D, XWa, C, A16s, Usm, Bu, lane)

    @T.macro
    def dense_transition(X, Xh, Xl, A16w, Whi, Wlo, Bw, what, wsc, h, tid, lane):
        """X <- X What (D x D) on tensor cores, float32-accurate by splitting both factors into f16 hi + lo:
        X What ~ Xhi Whi + Xhi Wlo + Xlo Whi (f32 accumulation; relative error ~2^-22, like tf32x3)."""
        T.cuda.cta_sync()
        for i in T.serial((D * D + NT - 1) // NT):
            e = T.meta_var(i * NT + tid)
            if e < D * D:
                Whi[e // D, e % D] = T.Cast("float16", what[wsc, h, e // D, e % D])
                Wlo[e // D, e % D] = T.Cast("float16", what[wsc, h, e // D, e % D]
                                            - T.Cast(fdt, T.Cast("float16", what[wsc, h, e // D, e % D])))
        T.cuda.cta_sync()
        x = X.local(nX)
        xh = Xh.local(nX)
        xl = Xl.local(nX)
        for s in T.unroll(nX):
            xh[s] = T.Cast("float16", x[s])
            xl[s] = T.Cast("float16", x[s] - T.Cast(fdt, T.Cast("float16", x[s])))
        zero_frag(X, nX)
        gemm_nn_acc(X, D, Xh, D, A16w, Whi, Bw, lane)
        gemm_nn_acc(X, D, Xh, D, A16w, Wlo, Bw, lane)
        gemm_nn_acc(X, D, Xl, D, A16w, Whi, Bw, lane)

    # ---------------------------------------------------------------- the kernel
    FS = T.float32

    @T.macro
    def body(q, k, v, w, u, m, kt, kj, what, gc, o, lse, chunk_tok0, chunk_seq, seq_start, seq_end, seq_sc_base,
             qk_scale, gate_scale, NC):
        T.device_entry()
        bx, by = T.cta_id([NC, HQ])
        wid = T.warp_id([W])
        lane = T.lane_id([32])
        tid = T.thread_id([NT])
        pool = T.alloc_buffer((smem_bytes,), "uint8", scope="shared.dyn")
        Kb = T.decl_buffer((RK, D + PAD), sdt, data=pool.data, byte_offset=offs["Kb"], scope="shared.dyn")
        Vb = T.decl_buffer((RK, DV + PAD), qdt, data=pool.data, byte_offset=offs["Vb"], scope="shared.dyn")
        Wb = T.decl_buffer((C, D + PAD), sdt, data=pool.data, byte_offset=offs["Wb"], scope="shared.dyn")
        Ub = T.decl_buffer((C, D + PAD), sdt, data=pool.data, byte_offset=offs["Ub"], scope="shared.dyn")
        Ms = T.decl_buffer((C, C), fdt, data=pool.data, byte_offset=offs["Ms"], scope="shared.dyn")
        Xs = T.decl_buffer((C, C), fdt, data=pool.data, byte_offset=offs["Xs"], scope="shared.dyn")
        Whi = T.decl_buffer((D, D + PAD), "float16", data=pool.data, byte_offset=offs["Whi"], scope="shared.dyn")
        Wlo = T.decl_buffer((D, D + PAD), "float16", data=pool.data, byte_offset=offs["Wlo"], scope="shared.dyn")
        cks = T.decl_buffer((RK,), fdt, data=pool.data, byte_offset=offs["ck"], scope="shared.dyn")
        # register fragments
        X = T.alloc_buffer((R, D), fdt, scope="local", layout=lay_D(Mt, D // 8))
        acc = T.alloc_buffer((R, DV), fdt, scope="local", layout=lay_D(Mt, DV // 8))
        Xa = T.alloc_buffer((R, D), sdt, scope="local", layout=lay_A(Mt, D // 16))
        SC = T.alloc_buffer((R, C), fdt, scope="local", layout=lay_D(Mt, C // 8))
        SB = T.alloc_buffer((R, BN), fdt, scope="local", layout=lay_D(Mt, BN // 8))
        PC = T.alloc_buffer((R, C), qdt, scope="local", layout=lay_A(Mt, C // 16))
        PB = T.alloc_buffer((R, BN), qdt, scope="local", layout=lay_A(Mt, BN // 16))
        XWf = T.alloc_buffer((R, C), fdt, scope="local", layout=lay_D(Mt, C // 8))
        XWa = T.alloc_buffer((R, C), sdt, scope="local", layout=lay_A(Mt, C // 16))
        BkC = T.alloc_buffer((16, C), sdt, scope="local", layout=lay_B(1, C // 8))
        BkB = T.alloc_buffer((16, BN), sdt, scope="local", layout=lay_B(1, BN // 8))
        Bv = T.alloc_buffer((16, DV), qdt, scope="local", layout=lay_B(1, DV // 8))
        Bu = T.alloc_buffer((16, D), sdt, scope="local", layout=lay_B(1, D // 8))
        A16s = T.alloc_buffer((R, 16), sdt, scope="local", layout=lay_A(Mt, 1))
        A16w = T.alloc_buffer((R, 16), "float16", scope="local", layout=lay_A(Mt, 1))
        Xh = T.alloc_buffer((R, D), "float16", scope="local", layout=lay_A(Mt, D // 16))
        Xl = T.alloc_buffer((R, D), "float16", scope="local", layout=lay_A(Mt, D // 16))
        Bw = T.alloc_buffer((16, D), "float16", scope="local", layout=lay_B(1, D // 8))
        A16v = T.alloc_buffer((R, 16), qdt, scope="local", layout=lay_A(Mt, 1))
        m_i = T.alloc_buffer((nrows,), fdt, scope="local")
        l_i = T.alloc_buffer((nrows,), fdt, scope="local")
        cq = T.alloc_buffer((nrows,), fdt, scope="local")

        n = T.meta_var(NC - 1 - bx)                  # heaviest chunks (latest in their sequence) first
        h = T.meta_var(by // G)
        tok0 = T.meta_var(chunk_tok0[n])
        sid = T.meta_var(chunk_seq[n])
        s0 = T.meta_var(seq_start[sid])
        nvalid = T.meta_var(seq_end[sid] - chunk_tok0[n])
        c_idx = T.meta_var((chunk_tok0[n] - seq_start[sid]) // C)
        sc_idx = T.meta_var(c_idx // s_per)
        row0 = T.meta_var(wid * R)

        # ---- 1. diagonal tile: stage K, W, U, V, M (rows past the sequence end are zero)
        load_tok(Kb, C, D, k, tok0, h, nvalid, True, tid)
        load_tok(Wb, C, D, w, tok0, h, nvalid, True, tid)
        load_tok(Ub, C, D, u, tok0, h, nvalid, True, tid)
        load_tok(Vb, C, DV, v, tok0, h, nvalid, True, tid)
        if gated:
            load_gate(cks, C, gc, tok0, by, nvalid, True, tid)
        T.cuda.cta_sync()
        # queries of this warp's rows, straight from global memory into the A fragment
        xa = Xa.local(nXa)
        for s in T.unroll(nXa):
            rc = T.meta_var(ac(s, lane, D))
            xa[s] = T.if_then_else(T.Cast("int64", row0 + rc[0]) < nvalid,
                                   T.Cast(sdt, q[tok0 + T.Cast("int64", row0 + rc[0]), by, rc[1]]), T.Cast(sdt, 0))
        for i in T.unroll(nrows):
            m_i[i] = T.float32(ninf)
            l_i[i] = T.float32(0)
            if gated:
                cq[i] = T.if_then_else(
                    T.Cast("int64", row0 + (i // 2) * 16 + (i % 2) * 8 + lane // 4) < nvalid,
                    gc[tok0 + T.Cast("int64", row0 + (i // 2) * 16 + (i % 2) * 8 + lane // 4), by], T.float32(0))
        zero_frag(acc, nACC)
        # QW = tril(Q W^T);  X = Q - QW U
        gemm_nt(XWf, C, Xa, D, A16s, Wb, BkC, lane)
        qw = XWf.local(nQW)
        for s in T.unroll(nQW):
            rc = T.meta_var(dc(s, lane, C))
            if rc[1] > row0 + rc[0]:
                qw[s] = T.float32(0)
        x = X.local(nX)
        for s in T.unroll(nX):
            x[s] = T.Cast(fdt, xa[s])                       # same [R, D] element in A and D slots
        to_operand(XWa, XWf, nQW, sdt, -1.0)
        gemm_nn_acc(X, D, XWa, C, A16s, Ub, Bu, lane)
        # S = Q K^T - QW M   (QW M on CUDA cores in float32; M is staged where W and U were)
        gemm_nt(SC, C, Xa, D, A16s, Kb, BkC, lane)
        for s in T.unroll(nQW):
            rc = T.meta_var(dc(s, lane, C))
            Xs[row0 + rc[0], rc[1]] = qw[s]
        T.cuda.cta_sync()
        load_tok(Ms, C, C, m, tok0, h, nvalid, True, tid)
        T.cuda.cta_sync()
        sc = SC.local(nSC)
        corr = T.alloc_buffer((1,), fdt, scope="local")
        for s in T.unroll(nSC):
            rc = T.meta_var(dc(s, lane, C))
            corr[0] = T.float32(0)
            for l in T.serial(C):
                corr[0] = corr[0] + Xs[row0 + rc[0], l] * Ms[l, rc[1]]
            sc[s] = sc[s] - corr[0]
        logits(SC, C, row0, cq, cks, qk_scale, gate_scale, True, nvalid, lane)
        if debug != "" and debug != "O1":
            dbg_store(o, XWf if debug == "QW" else (X if debug == "X" else SC), D if debug == "X" else C,
                      tok0, row0, by, nvalid, lane)
        softmax_pv(SC, C, PC, A16v, Vb, Bv, acc, m_i, l_i, lane)
        if debug == "O1":
            a1 = acc.local(nACC)
            for s in T.unroll(nACC):
                rc = T.meta_var(dc(s, lane, DV))
                if T.Cast("int64", row0 + rc[0]) < nvalid:
                    o[tok0 + T.Cast("int64", row0 + rc[0]), by, rc[1]] = T.Cast(qdt, a1[s] / l_i[drow(s, DV)])

        # ---- 2. earlier chunks of this super-chunk, right to left
        for step in T.serial(c_idx - sc_idx * s_per):
            base = T.meta_var(tok0 - T.Cast("int64", (step + 1) * C))
            T.cuda.cta_sync()
            load_tok(Kb, C, D, kt, base, h, 0, False, tid)
            load_tok(Wb, C, D, w, base, h, 0, False, tid)
            load_tok(Ub, C, D, u, base, h, 0, False, tid)
            load_tok(Vb, C, DV, v, base, h, 0, False, tid)
            if gated:
                load_gate(cks, C, gc, base, by, 0, False, tid)
            T.cuda.cta_sync()
            to_operand(Xa, X, nX, sdt, 1.0)
            gemm_nt(SC, C, Xa, D, A16s, Kb, BkC, lane)
            logits(SC, C, row0, cq, cks, qk_scale, gate_scale, False, nvalid, lane)
            softmax_pv(SC, C, PC, A16v, Vb, Bv, acc, m_i, l_i, lane)
            lowrank(X, Xa, A16s, Wb, Ub, XWf, XWa, BkC, Bu, lane)

        # ---- 3. earlier super-chunks, right to left (FlashAttention on transported keys)
        for step in T.serial(sc_idx):
            to_operand(Xa, X, nX, sdt, 1.0)
            for t in T.serial(ntile):
                kbase = T.meta_var(s0 + T.Cast("int64", (sc_idx - 1 - step) * S + t * BN))
                T.cuda.cta_sync()
                load_tok(Kb, BN, D, kj, kbase, h, 0, False, tid)
                load_tok(Vb, BN, DV, v, kbase, h, 0, False, tid)
                if gated:
                    load_gate(cks, BN, gc, kbase, by, 0, False, tid)
                T.cuda.cta_sync()
                gemm_nt(SB, BN, Xa, D, A16s, Kb, BkB, lane)
                logits(SB, BN, row0, cq, cks, qk_scale, gate_scale, False, nvalid, lane)
                softmax_pv(SB, BN, PB, A16v, Vb, Bv, acc, m_i, l_i, lane)
            dense_transition(X, Xh, Xl, A16w, Whi, Wlo, Bw, what, seq_sc_base[sid] + sc_idx - 1 - T.Cast("int64", step),
                             h, tid, lane)

        # ---- normalise and store
        if debug == "":
            a = acc.local(nACC)
            for s in T.unroll(nACC):
                rc = T.meta_var(dc(s, lane, DV))
                if T.Cast("int64", row0 + rc[0]) < nvalid:
                    o[tok0 + T.Cast("int64", row0 + rc[0]), by, rc[1]] = T.Cast(qdt, a[s] / l_i[drow(s, DV)])
            for i in T.unroll(nrows):
                if lane % 4 == 0:
                    if T.Cast("int64", row0 + (i // 2) * 16 + (i % 2) * 8 + lane // 4) < nvalid:
                        lse[tok0 + T.Cast("int64", row0 + (i // 2) * 16 + (i % 2) * 8 + lane // 4), by] = \
                            (m_i[i] + T.log2(l_i[i])) * T.float32(ln2)

    if gated:
        @T.prim_func
        def scan(q_h: T.handle, k_h: T.handle, v_h: T.handle, w_h: T.handle, u_h: T.handle, m_h: T.handle,
                 kt_h: T.handle, kj_h: T.handle, what_h: T.handle, gc_h: T.handle, o_h: T.handle, lse_h: T.handle,
                 tok0_h: T.handle, cseq_h: T.handle, sstart_h: T.handle, send_h: T.handle, scbase_h: T.handle,
                 qk_scale: FS, gate_scale: FS):
            T.func_attr({"global_symbol": "scan"})
            N = T.int64()
            NC = T.int32()
            NS = T.int32()
            NW = T.int64()
            q = T.match_buffer(q_h, (N, HQ, D), qdt)
            k = T.match_buffer(k_h, (N, H, D), qdt)
            v = T.match_buffer(v_h, (N, H, DV), qdt)
            w = T.match_buffer(w_h, (N, H, D), fdt)
            u = T.match_buffer(u_h, (N, H, D), fdt)
            m = T.match_buffer(m_h, (N, H, C), fdt)
            kt = T.match_buffer(kt_h, (N, H, D), fdt)
            kj = T.match_buffer(kj_h, (N, H, D), sdt)
            what = T.match_buffer(what_h, (NW, H, D, D), fdt)
            gc = T.match_buffer(gc_h, (N, HQ), fdt)
            o = T.match_buffer(o_h, (N, HQ, DV), qdt)
            lse = T.match_buffer(lse_h, (N, HQ), fdt)
            chunk_tok0 = T.match_buffer(tok0_h, (NC,), "int64")
            chunk_seq = T.match_buffer(cseq_h, (NC,), "int64")
            seq_start = T.match_buffer(sstart_h, (NS,), "int64")
            seq_end = T.match_buffer(send_h, (NS,), "int64")
            seq_sc_base = T.match_buffer(scbase_h, (NS,), "int64")
            body(q, k, v, w, u, m, kt, kj, what, gc, o, lse, chunk_tok0, chunk_seq, seq_start, seq_end, seq_sc_base,
                 qk_scale, gate_scale, NC)
        return scan

    @T.prim_func
    def scan(q_h: T.handle, k_h: T.handle, v_h: T.handle, w_h: T.handle, u_h: T.handle, m_h: T.handle,
             kt_h: T.handle, kj_h: T.handle, what_h: T.handle, o_h: T.handle, lse_h: T.handle,
             tok0_h: T.handle, cseq_h: T.handle, sstart_h: T.handle, send_h: T.handle, scbase_h: T.handle,
             qk_scale: FS, gate_scale: FS):
        T.func_attr({"global_symbol": "scan"})
        N = T.int64()
        NC = T.int32()
        NS = T.int32()
        NW = T.int64()
        q = T.match_buffer(q_h, (N, HQ, D), qdt)
        k = T.match_buffer(k_h, (N, H, D), qdt)
        v = T.match_buffer(v_h, (N, H, DV), qdt)
        w = T.match_buffer(w_h, (N, H, D), fdt)
        u = T.match_buffer(u_h, (N, H, D), fdt)
        m = T.match_buffer(m_h, (N, H, C), fdt)
        kt = T.match_buffer(kt_h, (N, H, D), fdt)
        kj = T.match_buffer(kj_h, (N, H, D), sdt)
        what = T.match_buffer(what_h, (NW, H, D, D), fdt)
        o = T.match_buffer(o_h, (N, HQ, DV), qdt)
        lse = T.match_buffer(lse_h, (N, HQ), fdt)
        chunk_tok0 = T.match_buffer(tok0_h, (NC,), "int64")
        chunk_seq = T.match_buffer(cseq_h, (NC,), "int64")
        seq_start = T.match_buffer(sstart_h, (NS,), "int64")
        seq_end = T.match_buffer(send_h, (NS,), "int64")
        seq_sc_base = T.match_buffer(scbase_h, (NS,), "int64")
        body(q, k, v, w, u, m, kt, kj, what, None, o, lse, chunk_tok0, chunk_seq, seq_start, seq_end, seq_sc_base,
             qk_scale, gate_scale, NC)
    return scan
