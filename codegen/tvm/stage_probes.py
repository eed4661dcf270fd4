"""Single-stage prim_funcs for checking each TVMScript piece on its own (CPU tests).

Each probe runs exactly one macro of the stage generators over ``n`` independent tiles stored
contiguously ([n, rows, cols] tensors), with the same macro the kernels use, so a test can compare
one stage against its runtime.reference counterpart:

    probe_ut_inverse        (W, beta) -> A                    vs ut_transform
    probe_boundary_queries  (Q, W, U) -> (QW, X)              vs boundary_adjust_queries
    probe_diag_logits       (Q, K, W, U, M) -> S              vs diagonal_logits
    probe_lowrank_update    (X, W, U) -> X P                  vs apply_transition
    probe_online_softmax    (logits, V, m, l, acc) -> (m, l, acc)   vs online_softmax_update
    probe_fox_logits        (S, cq, ck) -> scale*(S + cq - ck)      vs apply_gate
    probe_transport         (K~, W, U of s chunks) -> (KJ, What)    vs superchunk_transport
"""
from __future__ import annotations

from tvm.script import tirx as T

from .stir_scan import scan_macros
from .stir_transport import transport_macros, transport_slice
from .stir_ut import ut_macros

__all__ = ["probe_ut_inverse", "probe_boundary_queries", "probe_diag_logits", "probe_lowrank_update",
           "probe_online_softmax", "probe_fox_logits", "probe_transport"]

F = "float64"


@T.macro
def _copy_in(dst, src, p, R, Cc):
    for r, c in T.grid(R, Cc):
        with T.sblock("copy_in"):
            vr, vc = T.axis.remap("SS", [r, c])
            dst[vr, vc] = src[p, vr, vc]


@T.macro
def _copy_out(dst, src, p, R, Cc):
    for r, c in T.grid(R, Cc):
        with T.sblock("copy_out"):
            vr, vc = T.axis.remap("SS", [r, c])
            dst[p, vr, vc] = src[vr, vc]


def probe_ut_inverse(C: int, D: int):
    ut_inverse = ut_macros(C, D, F)[0]

    @T.prim_func(s_tir=True)
    def probe(w_h: T.handle, b_h: T.handle, a_h: T.handle):
        n = T.int64()
        Wg = T.match_buffer(w_h, (n, C, D), F)
        Bg = T.match_buffer(b_h, (n, C), F)
        Ag = T.match_buffer(a_h, (n, C, C), F)
        for p in T.serial(n):
            with T.sblock("program"):
                vp = T.axis.remap("S", [p])
                Ws = T.sblock_alloc_buffer((C, D), F)
                bs = T.sblock_alloc_buffer((C,), F)
                G = T.sblock_alloc_buffer((C, C), F)
                Tinv = T.sblock_alloc_buffer((C, C), F)
                _copy_in(Ws, Wg, vp, C, D)
                for r in T.serial(C):
                    with T.sblock("copy_b"):
                        vr = T.axis.remap("S", [r])
                        bs[vr] = Bg[vp, vr]
                ut_inverse(Ws, bs, G, Tinv)
                _copy_out(Ag, Tinv, vp, C, C)

    return probe


def probe_boundary_queries(C: int, D: int):
    mac = scan_macros(C, C, D, D, F, F, F)
    boundary_queries = mac["boundary_queries"]

    @T.prim_func(s_tir=True)
    def probe(q_h: T.handle, w_h: T.handle, u_h: T.handle, qw_h: T.handle, x_h: T.handle):
        n = T.int64()
        Qg = T.match_buffer(q_h, (n, C, D), F)
        Wg = T.match_buffer(w_h, (n, C, D), F)
        Ug = T.match_buffer(u_h, (n, C, D), F)
        QWg = T.match_buffer(qw_h, (n, C, C), F)
        Xg = T.match_buffer(x_h, (n, C, D), F)
        for p in T.serial(n):
            with T.sblock("program"):
                vp = T.axis.remap("S", [p])
                Qs = T.sblock_alloc_buffer((C, D), F)
                Ws = T.sblock_alloc_buffer((C, D), F)
                Us = T.sblock_alloc_buffer((C, D), F)
                QW = T.sblock_alloc_buffer((C, C), F)
                X = T.sblock_alloc_buffer((C, D), F)
                _copy_in(Qs, Qg, vp, C, D)
                _copy_in(Ws, Wg, vp, C, D)
                _copy_in(Us, Ug, vp, C, D)
                boundary_queries(Qs, Ws, Us, QW, X)
                _copy_out(QWg, QW, vp, C, C)
                _copy_out(Xg, X, vp, C, D)

    return probe


def probe_diag_logits(C: int, D: int):
    mac = scan_macros(C, C, D, D, F, F, F)
    boundary_queries, diag_logits = mac["boundary_queries"], mac["diag_logits"]

    @T.prim_func(s_tir=True)
    def probe(q_h: T.handle, k_h: T.handle, w_h: T.handle, u_h: T.handle, m_h: T.handle, s_h: T.handle):
        n = T.int64()
        Qg = T.match_buffer(q_h, (n, C, D), F)
        Kg = T.match_buffer(k_h, (n, C, D), F)
        Wg = T.match_buffer(w_h, (n, C, D), F)
        Ug = T.match_buffer(u_h, (n, C, D), F)
        Mg = T.match_buffer(m_h, (n, C, C), F)
        Sg = T.match_buffer(s_h, (n, C, C), F)
        for p in T.serial(n):
            with T.sblock("program"):
                vp = T.axis.remap("S", [p])
                Qs = T.sblock_alloc_buffer((C, D), F)
                Ks = T.sblock_alloc_buffer((C, D), F)
                Ws = T.sblock_alloc_buffer((C, D), F)
                Us = T.sblock_alloc_buffer((C, D), F)
                Ms = T.sblock_alloc_buffer((C, C), F)
                QW = T.sblock_alloc_buffer((C, C), F)
                X = T.sblock_alloc_buffer((C, D), F)
                Lg = T.sblock_alloc_buffer((C, C), F)
                _copy_in(Qs, Qg, vp, C, D)
                _copy_in(Ks, Kg, vp, C, D)
                _copy_in(Ws, Wg, vp, C, D)
                _copy_in(Us, Ug, vp, C, D)
                _copy_in(Ms, Mg, vp, C, C)
                boundary_queries(Qs, Ws, Us, QW, X)
                diag_logits(Qs, Ks, QW, Ms, Lg)
                _copy_out(Sg, Lg, vp, C, C)

    return probe


def probe_lowrank_update(C: int, D: int):
    mac = scan_macros(C, C, D, D, F, F, F)
    lowrank_update = mac["lowrank_update"]

    @T.prim_func(s_tir=True)
    def probe(x_h: T.handle, w_h: T.handle, u_h: T.handle, y_h: T.handle):
        n = T.int64()
        Xg = T.match_buffer(x_h, (n, C, D), F)
        Wg = T.match_buffer(w_h, (n, C, D), F)
        Ug = T.match_buffer(u_h, (n, C, D), F)
        Yg = T.match_buffer(y_h, (n, C, D), F)
        for p in T.serial(n):
            with T.sblock("program"):
                vp = T.axis.remap("S", [p])
                X = T.sblock_alloc_buffer((C, D), F)
                Ws = T.sblock_alloc_buffer((C, D), F)
                Us = T.sblock_alloc_buffer((C, D), F)
                XW = T.sblock_alloc_buffer((C, C), F)
                _copy_in(X, Xg, vp, C, D)
                _copy_in(Ws, Wg, vp, C, D)
                _copy_in(Us, Ug, vp, C, D)
                lowrank_update(X, Ws, Us, XW)
                _copy_out(Yg, X, vp, C, D)

    return probe


def probe_online_softmax(C: int, N: int, DV: int):
    """One online-softmax update of C rows with a tile of N (base-2) logits; st rows 0/1 = m, l."""
    mac = scan_macros(C, N, DV, DV, F, F, F)
    online_softmax = mac["online_softmax"]

    @T.prim_func(s_tir=True)
    def probe(l_h: T.handle, v_h: T.handle, st_h: T.handle, acc_h: T.handle):
        n = T.int64()
        Lgg = T.match_buffer(l_h, (n, C, N), F)
        Vg = T.match_buffer(v_h, (n, N, DV), F)
        STg = T.match_buffer(st_h, (n, 4, C), F)
        ACCg = T.match_buffer(acc_h, (n, C, DV), F)
        for p in T.serial(n):
            with T.sblock("program"):
                vp = T.axis.remap("S", [p])
                Lg = T.sblock_alloc_buffer((C, N), F)
                Vb = T.sblock_alloc_buffer((N, DV), F)
                st = T.sblock_alloc_buffer((4, C), F)
                acc = T.sblock_alloc_buffer((C, DV), F)
                _copy_in(Lg, Lgg, vp, C, N)
                _copy_in(Vb, Vg, vp, N, DV)
                _copy_in(st, STg, vp, 4, C)
                _copy_in(acc, ACCg, vp, C, DV)
                online_softmax(Lg, Vb, N, st, acc)
                _copy_out(STg, st, vp, 4, C)
                _copy_out(ACCg, acc, vp, C, DV)

    return probe


def probe_fox_logits(C: int, N: int, diag: bool):
    mac = scan_macros(C, N, 8, 8, F, F, F)
    logits = mac["logits"]

    @T.prim_func(s_tir=True)
    def probe(s_h: T.handle, cq_h: T.handle, ck_h: T.handle, o_h: T.handle, qk_scale: T.float64,
              gate_scale: T.float64, nvalid: T.int64):
        n = T.int64()
        Sg = T.match_buffer(s_h, (n, C, N), F)
        CQ = T.match_buffer(cq_h, (n, C), F)
        CK = T.match_buffer(ck_h, (n, N), F)
        Og = T.match_buffer(o_h, (n, C, N), F)
        for p in T.serial(n):
            with T.sblock("program"):
                vp = T.axis.remap("S", [p])
                Lg = T.sblock_alloc_buffer((C, N), F)
                cq = T.sblock_alloc_buffer((C,), F)
                ck = T.sblock_alloc_buffer((N,), F)
                _copy_in(Lg, Sg, vp, C, N)
                for r in T.serial(C):
                    with T.sblock("copy_cq"):
                        vr = T.axis.remap("S", [r])
                        cq[vr] = CQ[vp, vr]
                for r in T.serial(N):
                    with T.sblock("copy_ck"):
                        vr = T.axis.remap("S", [r])
                        ck[vr] = CK[vp, vr]
                logits(Lg, N, cq, ck, qk_scale, gate_scale, True, diag, nvalid)
                _copy_out(Og, Lg, vp, C, N)

    return probe


def probe_transport(C: int, s: int, D: int):
    """Tensors are token-major like the kernels': K~, W, U, KJ [s*C, n, D] (n independent super-chunks)."""
    suffix_init, transport_keys, transition_lowrank = transport_macros(C, D, F)
    Q = transport_slice(C, D, F)

    @T.prim_func(s_tir=True)
    def probe(kt_h: T.handle, w_h: T.handle, u_h: T.handle, kj_h: T.handle, what_h: T.handle):
        n = T.int64()
        KT = T.match_buffer(kt_h, (s * C, n, D), F)
        Wg = T.match_buffer(w_h, (s * C, n, D), F)
        Ug = T.match_buffer(u_h, (s * C, n, D), F)
        KJg = T.match_buffer(kj_h, (s * C, n, D), F)
        WH = T.match_buffer(what_h, (n, D, D), F)
        for p in T.serial(n):
            with T.sblock("program"):
                vp = T.axis.remap("S", [p])
                Suf = T.sblock_alloc_buffer((D, D), F)
                SW = T.sblock_alloc_buffer((D, C), F)
                Us = T.sblock_alloc_buffer((Q, D), F)
                suffix_init(Suf)
                for step in T.serial(s):
                    transport_keys(KT, Suf, KJg, T.int64((s - 1) * C), step, s, vp)
                    transition_lowrank(Suf, Wg, Ug, SW, Us, T.int64((s - 1) * C), step, s, vp)
                _copy_out(WH, Suf, vp, D, D)

    return probe
