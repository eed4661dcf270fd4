"""Stage ``blockwise_scan`` (+ ``fox_gate``), forward, as S-TIR: one program per (query chunk, query head).

The CUDA-core / CPU form of the scan; the tensor-core kernel (tc_scan.py) computes the same steps.
Query chunk c lies in super-chunk I. The program
  1. boundary-adjusts its queries and builds the diagonal tile (macro ``boundary_queries`` and
     ``diag_logits``):  X = Q - tril(Q W^T) U,   S = tril(Q K^T) - tril(Q W^T) M;
  2. scans the earlier chunks of I right to left: logits X K~_m^T, online softmax, then the low-rank
     chunk transition X <- X - (X W_m^T) U_m (macro ``lowrank_update``);
  3. scans the earlier super-chunks J right to left: FlashAttention over the transported keys KJ in
     tiles of block_n keys, then the dense transition X <- X What_J (macro ``dense_transition``).
Logits are in base 2 (qk_scale and gate_scale carry log2 e); the FoX bias (macro ``logits``) adds
(c_i - c_j) * gate_scale. Outputs o (q's dtype) and the natural-log lse.

Rounding model (the same as the mma kernel): matmul operands are cast to the scan dtype ``sdt``
(w, U, K~, the moving query X; P is cast to v's dtype) and every product is accumulated in ``fdt``.
With sdt = fdt = float64 the function is exact, which is what the CPU tests check.
"""
from __future__ import annotations

import math

from tvm.script import tirx as T

from .stir_common import NEG_INF, barrier_macro, const, keep_alive_macro, online_softmax_macro, unroll_factor

__all__ = ["scan_macros", "scan_func", "scan_smem_bytes"]

LN2 = math.log(2.0)


def scan_macros(C: int, R: int, D: int, DV: int, fdt: str, sdt: str, vdt: str, unroll: int = 1,
                sync: bool = False):
    """Pieces of the scan. C: chunk rows, R: rows of the key-tile buffers (max(C, block_n))."""
    zero = const(0, fdt)
    ninf = const(NEG_INF, fdt)
    uD, uC = unroll_factor(D, unroll), unroll_factor(C, unroll)
    online_softmax = online_softmax_macro(C, DV, fdt, vdt, unroll, sync)
    barrier = barrier_macro(sync)

    def f(x):  # operand in the scan dtype, widened for the product
        return T.Cast(fdt, T.Cast(sdt, x))

    @T.macro
    def boundary_queries(Qs, Ws, Us, QW, X):
        """QW = tril(Q W^T) (fdt);  X = Q - QW U  (row i = q_i^T H_i ... H_first)."""
        barrier()
        for i, j in T.grid(C, C):
            with T.sblock("bq_qw"):
                vi, vj = T.axis.remap("SS", [i, j])
                a = T.sblock_alloc_buffer((1,), fdt, scope="local")
                a[0] = zero
                for d0 in T.serial(D // uD):
                    for d1 in T.unroll(uD):
                        a[0] = a[0] + f(Qs[vi, d0 * uD + d1]) * f(Ws[vj, d0 * uD + d1])
                QW[vi, vj] = T.if_then_else(vi >= vj, a[0], zero)
        barrier()
        for i, d in T.grid(C, D):
            with T.sblock("bq_x"):
                vi, vd = T.axis.remap("SS", [i, d])
                a = T.sblock_alloc_buffer((1,), fdt, scope="local")
                a[0] = f(Qs[vi, vd])
                for j0 in T.serial(C // uC):
                    for j1 in T.unroll(uC):
                        a[0] = a[0] - f(QW[vi, j0 * uC + j1]) * f(Us[j0 * uC + j1, vd])
                X[vi, vd] = a[0]

    @T.macro
    def diag_logits(Qs, Ks, QW, Ms, Lg):
        """Lg[:, :C] = Q K^T - QW M (raw scores of the diagonal tile; masked later)."""
        barrier()
        for i, j in T.grid(C, C):
            with T.sblock("diag_logits"):
                vi, vj = T.axis.remap("SS", [i, j])
                a = T.sblock_alloc_buffer((1,), fdt, scope="local")
                a[0] = zero
                for d0 in T.serial(D // uD):
                    for d1 in T.unroll(uD):
                        a[0] = a[0] + f(Qs[vi, d0 * uD + d1]) * f(Ks[vj, d0 * uD + d1])
                for l0 in T.serial(C // uC):
                    for l1 in T.unroll(uC):
                        a[0] = a[0] - QW[vi, l0 * uC + l1] * Ms[l0 * uC + l1, vj]
                Lg[vi, vj] = a[0]

    @T.macro
    def qk_logits(X, Kb, Lg, ncols):
        """Lg[:, :ncols] = X K^T with X (fdt) cast to the scan dtype."""
        barrier()
        for i, j in T.grid(C, ncols):
            with T.sblock("qk_logits"):
                vi, vj = T.axis.remap("SS", [i, j])
                a = T.sblock_alloc_buffer((1,), fdt, scope="local")
                a[0] = zero
                for d0 in T.serial(D // uD):
                    for d1 in T.unroll(uD):
                        a[0] = a[0] + f(X[vi, d0 * uD + d1]) * f(Kb[vj, d0 * uD + d1])
                Lg[vi, vj] = a[0]

    @T.macro
    def logits(Lg, ncols, cq, ck, qk_scale, gate_scale, gated, diag, nvalid):
        """Scale (and FoX-bias) raw scores in place; on the diagonal tile mask j > i and padded keys."""
        barrier()
        for i, j in T.grid(C, ncols):
            with T.sblock("fox_logits"):
                vi, vj = T.axis.remap("SS", [i, j])
                if diag:
                    if gated:
                        Lg[vi, vj] = T.if_then_else(
                            vj <= vi and T.Cast("int64", vj) < nvalid,
                            Lg[vi, vj] * T.Cast(fdt, qk_scale) + (cq[vi] - ck[vj]) * T.Cast(fdt, gate_scale), ninf)
                    else:
                        Lg[vi, vj] = T.if_then_else(vj <= vi and T.Cast("int64", vj) < nvalid,
                                                    Lg[vi, vj] * T.Cast(fdt, qk_scale), ninf)
                else:
                    if gated:
                        Lg[vi, vj] = Lg[vi, vj] * T.Cast(fdt, qk_scale) + (cq[vi] - ck[vj]) * T.Cast(fdt, gate_scale)
                    else:
                        Lg[vi, vj] = Lg[vi, vj] * T.Cast(fdt, qk_scale)

    @T.macro
    def lowrank_update(X, Wb, Ub, XW):
        """X <- X P = X - (X W^T) U for the chunk transition P = I - W^T U."""
        barrier()
        for i, j in T.grid(C, C):
            with T.sblock("lr_xw"):
                vi, vj = T.axis.remap("SS", [i, j])
                a = T.sblock_alloc_buffer((1,), fdt, scope="local")
                a[0] = zero
                for d0 in T.serial(D // uD):
                    for d1 in T.unroll(uD):
                        a[0] = a[0] + f(X[vi, d0 * uD + d1]) * f(Wb[vj, d0 * uD + d1])
                XW[vi, vj] = a[0]
        barrier()
        for i, d in T.grid(C, D):
            with T.sblock("lr_update"):
                vi, vd = T.axis.remap("SS", [i, d])
                a = T.sblock_alloc_buffer((1,), fdt, scope="local")
                a[0] = X[vi, vd]
                for j0 in T.serial(C // uC):
                    for j1 in T.unroll(uC):
                        a[0] = a[0] - f(XW[vi, j0 * uC + j1]) * f(Ub[j0 * uC + j1, vd])
                X[vi, vd] = a[0]

    @T.macro
    def dense_transition(X, what, sc_top, step, NW, h, Tmp):
        """X <- X What_J, J = sc_top - step (D x D super-chunk transition, float32 on CUDA cores)."""
        barrier()
        for i, e in T.grid(C, D):
            with T.sblock("dt_mm"):
                vs = T.axis.opaque(NW, step)
                vi, ve = T.axis.remap("SS", [i, e])
                a = T.sblock_alloc_buffer((1,), fdt, scope="local")
                a[0] = zero
                for d0 in T.serial(D // uD):
                    for d1 in T.unroll(uD):
                        a[0] = a[0] + X[vi, d0 * uD + d1] * what[sc_top - T.Cast("int64", vs), h, d0 * uD + d1, ve]
                Tmp[vi, ve] = a[0]
        barrier()
        for i, d in T.grid(C, D):
            with T.sblock("dt_copy"):
                vi, vd = T.axis.remap("SS", [i, d])
                X[vi, vd] = Tmp[vi, vd]

    return dict(boundary_queries=boundary_queries, diag_logits=diag_logits, qk_logits=qk_logits,
                logits=logits, online_softmax=online_softmax, lowrank_update=lowrank_update,
                dense_transition=dense_transition)


def _nbytes(dt: str) -> int:
    return {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8}[dt]


def scan_smem_bytes(C: int, BN: int, D: int, DV: int, fdt: str, sdt: str, vdt: str) -> int:
    """Scratch bytes of one program of scan_func (every buffer live to the end: see keep_alive_macro)."""
    R = max(C, BN)
    f, sb, vb = _nbytes(fdt), _nbytes(sdt), _nbytes(vdt)
    return (3 * C * D * sb + R * D * sb + R * DV * vb + 2 * C * C * f + 2 * C * D * f + C * R * f + C * DV * f
            + 5 * C * f + R * f)


def scan_func(C: int, S: int, BN: int, H: int, HQ: int, D: int, DV: int, qdt: str, sdt: str,
              gated: bool, fdt: str = "float32", smem: str = "global", unroll: int = 1):
    """prim_func ``scan``: the forward scan over every (query chunk, query head).

    Arguments: q [N,HQ,D], k [N,H,D], v [N,H,DV] (qdt); w, u, kt [N,H,D], m [N,H,C] (fdt);
    kj [N,H,D] (sdt); what [NW,H,D,D] (fdt); gc [N,HQ] (fdt, only when gated); o [N,HQ,DV] (qdt, out);
    lse [N,HQ] (fdt, out); chunk_tok0, chunk_seq [NC], seq_start, seq_end, seq_sc_base [NS] (int64);
    qk_scale, gate_scale (scalars of type fdt, both include log2 e).
    """
    R = max(C, BN)
    Wd = max(D, DV)
    G = HQ // H
    s = S // C
    ntile = S // BN
    sync = smem != "global"
    mac = scan_macros(C, R, D, DV, fdt, sdt, qdt, unroll, sync)
    barrier = barrier_macro(sync)
    keep_alive = keep_alive_macro(sync)
    boundary_queries, diag_logits, qk_logits = mac["boundary_queries"], mac["diag_logits"], mac["qk_logits"]
    logits, online_softmax = mac["logits"], mac["online_softmax"]
    lowrank_update, dense_transition = mac["lowrank_update"], mac["dense_transition"]
    zero, ninf = const(0, fdt), const(NEG_INF, fdt)
    ln2 = const(LN2, fdt)
    FS = T.float64 if fdt == "float64" else T.float32  # scalar parameter type

    @T.macro
    def load_rows(dst, src, tok0, nvalid, hh):
        """dst[r, d] = src[tok0 + r, hh, d] cast to the scan dtype, 0 for rows >= nvalid."""
        barrier()
        for r, d in T.grid(C, D):
            with T.sblock("load_diag"):
                vr, vd = T.axis.remap("SS", [r, d])
                dst[vr, vd] = T.if_then_else(T.Cast("int64", vr) < nvalid,
                                             T.Cast(sdt, src[tok0 + T.Cast("int64", vr), hh, vd]), T.Cast(sdt, 0))

    @T.macro
    def load_chunk(dst, src, tok0, step, NC, hh):
        """dst[r, d] = src[row, hh, d] for the rows of the chunk `step + 1` chunks before tok0."""
        barrier()
        for r, d in T.grid(C, D):
            with T.sblock("load_chunk"):
                vs = T.axis.opaque(NC, step)
                vr, vd = T.axis.remap("SS", [r, d])
                dst[vr, vd] = T.Cast(sdt, src[tok0 - T.Cast("int64", (vs + 1) * C - vr), hh, vd])

    @T.macro
    def body(q, k, v, w, u, m, kt, kj, what, gc, o, lse, chunk_tok0, chunk_seq, seq_start, seq_end,
             seq_sc_base, qk_scale, gate_scale, NC, NW, vn, vhq):
        Qs = T.sblock_alloc_buffer((C, D), sdt, scope=smem)
        Kb = T.sblock_alloc_buffer((R, D), sdt, scope=smem)
        Vb = T.sblock_alloc_buffer((R, DV), qdt, scope=smem)
        Wb = T.sblock_alloc_buffer((C, D), sdt, scope=smem)
        Ub = T.sblock_alloc_buffer((C, D), sdt, scope=smem)
        Mb = T.sblock_alloc_buffer((C, C), fdt, scope=smem)
        X = T.sblock_alloc_buffer((C, D), fdt, scope=smem)
        QW = T.sblock_alloc_buffer((C, C), fdt, scope=smem)
        Lg = T.sblock_alloc_buffer((C, R), fdt, scope=smem)
        Tmp = T.sblock_alloc_buffer((C, D), fdt, scope=smem)
        acc = T.sblock_alloc_buffer((C, DV), fdt, scope=smem)
        st = T.sblock_alloc_buffer((4, C), fdt, scope=smem)   # row state: m, l, scratch (online_softmax)
        cq = T.sblock_alloc_buffer((C,), fdt, scope=smem)
        ck = T.sblock_alloc_buffer((R,), fdt, scope=smem)
        n = T.meta_var(NC - 1 - vn)            # heaviest chunks (latest in their sequence) first
        h = T.meta_var(vhq // G)
        tok0 = T.meta_var(chunk_tok0[n])
        sid = T.meta_var(chunk_seq[n])
        s0 = T.meta_var(seq_start[sid])
        send = T.meta_var(seq_end[sid])
        c_idx = T.meta_var((tok0 - s0) // C)
        sc_idx = T.meta_var(c_idx // s)
        nvalid = T.meta_var(send - tok0)
        # ---- 1. diagonal tile
        load_rows(Qs, q, tok0, nvalid, vhq)
        load_rows(Kb, k, tok0, nvalid, h)
        load_rows(Wb, w, tok0, nvalid, h)
        load_rows(Ub, u, tok0, nvalid, h)
        barrier()
        for r, e in T.grid(C, DV):
            with T.sblock("load_diag_v"):
                vr, ve = T.axis.remap("SS", [r, e])
                Vb[vr, ve] = T.if_then_else(T.Cast("int64", vr) < nvalid, v[tok0 + T.Cast("int64", vr), h, ve],
                                            T.Cast(qdt, 0))
        barrier()
        for r, c in T.grid(C, C):
            with T.sblock("load_diag_m"):
                vr, vc = T.axis.remap("SS", [r, c])
                Mb[vr, vc] = T.if_then_else(T.Cast("int64", vr) < nvalid, m[tok0 + T.Cast("int64", vr), h, vc], zero)
        if gated:
            barrier()
            for r in T.serial(C):
                with T.sblock("load_diag_cq"):
                    vr = T.axis.remap("S", [r])
                    cq[vr] = T.if_then_else(T.Cast("int64", vr) < nvalid, gc[tok0 + T.Cast("int64", vr), vhq], zero)
            barrier()
            for r in T.serial(C):
                with T.sblock("load_diag_ck"):
                    vr = T.axis.remap("S", [r])
                    ck[vr] = T.if_then_else(T.Cast("int64", vr) < nvalid, gc[tok0 + T.Cast("int64", vr), vhq], zero)
        barrier()
        for r in T.serial(C):
            with T.sblock("init_m"):
                vr = T.axis.remap("S", [r])
                st[0, vr] = ninf
        barrier()
        for r in T.serial(C):
            with T.sblock("init_l"):
                vr = T.axis.remap("S", [r])
                st[1, vr] = zero
        barrier()
        for r, e in T.grid(C, DV):
            with T.sblock("init_acc"):
                vr, ve = T.axis.remap("SS", [r, e])
                acc[vr, ve] = zero
        boundary_queries(Qs, Wb, Ub, QW, X)
        diag_logits(Qs, Kb, QW, Mb, Lg)
        logits(Lg, C, cq, ck, qk_scale, gate_scale, gated, True, nvalid)
        online_softmax(Lg, Vb, C, st, acc)
        # ---- 2. earlier chunks of this super-chunk, right to left (low-rank transitions)
        for step in T.serial(c_idx - sc_idx * s):
            load_chunk(Kb, kt, tok0, step, NC, h)
            load_chunk(Wb, w, tok0, step, NC, h)
            load_chunk(Ub, u, tok0, step, NC, h)
            barrier()
            for r, e in T.grid(C, DV):
                with T.sblock("load_chunk_v"):
                    vs = T.axis.opaque(NC, step)
                    vr, ve = T.axis.remap("SS", [r, e])
                    Vb[vr, ve] = v[tok0 - T.Cast("int64", (vs + 1) * C - vr), h, ve]
            if gated:
                barrier()
                for r in T.serial(C):
                    with T.sblock("load_chunk_gate"):
                        vs = T.axis.opaque(NC, step)
                        vr = T.axis.remap("S", [r])
                        ck[vr] = gc[tok0 - T.Cast("int64", (vs + 1) * C - vr), vhq]
            qk_logits(X, Kb, Lg, C)
            logits(Lg, C, cq, ck, qk_scale, gate_scale, gated, False, nvalid)
            online_softmax(Lg, Vb, C, st, acc)
            lowrank_update(X, Wb, Ub, QW)
        # ---- 3. earlier super-chunks, right to left (FlashAttention on transported keys)
        for step in T.serial(sc_idx):
            for t in T.serial(ntile):
                barrier()
                for r, d in T.grid(BN, D):
                    with T.sblock("load_tile"):
                        vs = T.axis.opaque(NW, step)
                        vt = T.axis.opaque(ntile, t)
                        vr, vd = T.axis.remap("SS", [r, d])
                        Kb[vr, vd] = kj[s0 + T.Cast("int64", (sc_idx - 1 - vs) * S + vt * BN + vr), h, vd]
                barrier()
                for r, e in T.grid(BN, DV):
                    with T.sblock("load_tile_v"):
                        vs = T.axis.opaque(NW, step)
                        vt = T.axis.opaque(ntile, t)
                        vr, ve = T.axis.remap("SS", [r, e])
                        Vb[vr, ve] = v[s0 + T.Cast("int64", (sc_idx - 1 - vs) * S + vt * BN + vr), h, ve]
                if gated:
                    barrier()
                    for r in T.serial(BN):
                        with T.sblock("load_tile_gate"):
                            vs = T.axis.opaque(NW, step)
                            vt = T.axis.opaque(ntile, t)
                            vr = T.axis.remap("S", [r])
                            ck[vr] = gc[s0 + T.Cast("int64", (sc_idx - 1 - vs) * S + vt * BN + vr), vhq]
                qk_logits(X, Kb, Lg, BN)
                logits(Lg, BN, cq, ck, qk_scale, gate_scale, gated, False, nvalid)
                online_softmax(Lg, Vb, BN, st, acc)
            dense_transition(X, what, seq_sc_base[sid] + sc_idx - 1, step, NW, h, Tmp)
        # ---- normalise and store
        barrier()
        for r, e in T.grid(C, DV):
            with T.sblock("store_o"):
                vr, ve = T.axis.remap("SS", [r, e])
                if T.Cast("int64", vr) < nvalid:
                    o[tok0 + T.Cast("int64", vr), vhq, ve] = T.Cast(qdt, acc[vr, ve] / st[1, vr])
        barrier()
        for r in T.serial(C):
            with T.sblock("store_lse"):
                vr = T.axis.remap("S", [r])
                if T.Cast("int64", vr) < nvalid:
                    lse[tok0 + T.Cast("int64", vr), vhq] = (st[0, vr] + T.log2(st[1, vr])) * ln2
        keep_alive(lse, (0, 0), tok0 < 0, [Qs, Kb, Vb, Wb, Ub, Mb, X, QW, Lg, Tmp, acc, st, cq, ck])

    if gated:
        @T.prim_func(s_tir=True)
        def scan(q_h: T.handle, k_h: T.handle, v_h: T.handle, w_h: T.handle, u_h: T.handle, m_h: T.handle,
                 kt_h: T.handle, kj_h: T.handle, what_h: T.handle, gc_h: T.handle, o_h: T.handle, lse_h: T.handle,
                 tok0_h: T.handle, cseq_h: T.handle, sstart_h: T.handle, send_h: T.handle, scbase_h: T.handle,
                 qk_scale: FS, gate_scale: FS):
            T.func_attr({"global_symbol": "scan"})
            N = T.int64()
            NC = T.int64()
            NS = T.int64()
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
            for n, hq in T.grid(NC, HQ):
                with T.sblock("program"):
                    vn, vhq = T.axis.remap("SS", [n, hq])
                    body(q, k, v, w, u, m, kt, kj, what, gc, o, lse, chunk_tok0, chunk_seq, seq_start, seq_end,
                         seq_sc_base, qk_scale, gate_scale, NC, NW, vn, vhq)
        return scan

    @T.prim_func(s_tir=True)
    def scan(q_h: T.handle, k_h: T.handle, v_h: T.handle, w_h: T.handle, u_h: T.handle, m_h: T.handle,
             kt_h: T.handle, kj_h: T.handle, what_h: T.handle, o_h: T.handle, lse_h: T.handle,
             tok0_h: T.handle, cseq_h: T.handle, sstart_h: T.handle, send_h: T.handle, scbase_h: T.handle,
             qk_scale: FS, gate_scale: FS):
        T.func_attr({"global_symbol": "scan"})
        N = T.int64()
        NC = T.int64()
        NS = T.int64()
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
        for n, hq in T.grid(NC, HQ):
            with T.sblock("program"):
                vn, vhq = T.axis.remap("SS", [n, hq])
                body(q, k, v, w, u, m, kt, kj, what, None, o, lse, chunk_tok0, chunk_seq, seq_start, seq_end,
                     seq_sc_base, qk_scale, gate_scale, NC, NW, vn, vhq)
    return scan
