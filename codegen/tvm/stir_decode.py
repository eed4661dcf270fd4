"""Pass ``decode`` as S-TIR: one step of PaTH(-FoX) decoding, fused, plus the split merge.

``decode`` (one program per (batch, kv head, split)): for the cache positions p of its split,
    k_p <- k_p - beta_t (k_p . w_t) w_t     for p < L (math in float32, rounded to the cache dtype,
                                             written back in place; macro ``rank1_update``)
    k_L <- k_t, v_L <- v_t, c_L <- c_{L-1} + g_t      (the append, done by the split owning p = L)
then the G query heads of the group attend over the updated keys (logits scale * q.k plus the FoX
bias, macro ``decode_logits``; online softmax over tiles of decode_block_n keys). Each split writes
its unnormalised (acc, m, l); ``decode_merge`` (one program per (batch, query head)) combines them
into o and the natural-log lse. The same order of operations as runtime.reference.recurrent.
"""
from __future__ import annotations

import math

from tvm.script import tirx as T

from .stir_common import NEG_INF, barrier_macro, const, keep_alive_macro, online_softmax_macro, unroll_factor

__all__ = ["decode_macros", "decode_func", "merge_func", "decode_smem_bytes"]


def decode_macros(BN: int, G: int, D: int, DV: int, fdt: str, cdt: str, unroll: int = 1, sync: bool = False):
    zero = const(0, fdt)
    barrier = barrier_macro(sync)
    uD = unroll_factor(D, unroll)
    ninf = const(NEG_INF, fdt)

    @T.macro
    def rank1_update(wv, dots, Kn, t, tdom, nupd0):
        """Kn[r] <- round_cdt(Kn[r] - beta (Kn[r] . w) w) in place, for rows r < nupd0 - t*BN (math in fdt;
        the cached keys are exactly representable in fdt, so nothing is lost by staging them in cdt).

        wv[:D] = w_t, wv[D] = beta_t."""
        barrier()
        for r in T.serial(BN):
            with T.sblock("r1_dot"):
                vr = T.axis.remap("S", [r])
                a = T.sblock_alloc_buffer((1,), fdt, scope="local")
                a[0] = zero
                for d0 in T.serial(D // uD):
                    for d1 in T.unroll(uD):
                        a[0] = a[0] + T.Cast(fdt, Kn[vr, d0 * uD + d1]) * wv[d0 * uD + d1]
                dots[vr] = a[0]
        barrier()
        for r, d in T.grid(BN, D):
            with T.sblock("r1_apply"):
                vt = T.axis.opaque(tdom, t)
                vr, vd = T.axis.remap("SS", [r, d])
                Kn[vr, vd] = T.if_then_else(T.Cast("int64", vt * BN + vr) < nupd0,
                                            T.Cast(cdt, T.Cast(fdt, Kn[vr, vd]) - wv[D] * dots[vr] * wv[vd]), Kn[vr, vd])

    @T.macro
    def decode_logits(qg, Kn, Lg, st, ck, qk_scale, gate_scale, gated, t, tdom, nvalid0):
        """Lg[g, r] = scale * q_g . k_r (+ (c_L - c_r) * gate_scale, c_L = st[4]); rows r >= nvalid0 - t*BN masked."""
        barrier()
        for g, r in T.grid(G, BN):
            with T.sblock("dl_qk"):
                vg, vr = T.axis.remap("SS", [g, r])
                a = T.sblock_alloc_buffer((1,), fdt, scope="local")
                a[0] = zero
                for d0 in T.serial(D // uD):
                    for d1 in T.unroll(uD):
                        a[0] = a[0] + qg[vg, d0 * uD + d1] * T.Cast(fdt, Kn[vr, d0 * uD + d1])
                Lg[vg, vr] = a[0]
        barrier()
        for g, r in T.grid(G, BN):
            with T.sblock("dl_fox"):
                vt = T.axis.opaque(tdom, t)
                vg, vr = T.axis.remap("SS", [g, r])
                if gated:
                    Lg[vg, vr] = T.if_then_else(T.Cast("int64", vt * BN + vr) < nvalid0,
                                                Lg[vg, vr] * T.Cast(fdt, qk_scale)
                                                + (st[4, vg] - ck[vr, vg]) * T.Cast(fdt, gate_scale), ninf)
                else:
                    Lg[vg, vr] = T.if_then_else(T.Cast("int64", vt * BN + vr) < nvalid0,
                                                Lg[vg, vr] * T.Cast(fdt, qk_scale), ninf)

    return rank1_update, decode_logits


def decode_smem_bytes(BN: int, G: int, D: int, DV: int, cdt: str, fdt: str = "float32") -> int:
    """Scratch bytes of one decode program (every buffer live to the end)."""
    f = 8 if fdt == "float64" else 4
    c = {"float64": 8, "float32": 4}.get(cdt, 2)
    return (D + 2 + G * D + 5 * G + BN * G + BN + G * BN + G * DV) * f + (BN * D + BN * DV) * c


def decode_func(BN: int, NSPLIT: int, H: int, HQ: int, D: int, DV: int, qdt: str, cdt: str, gated: bool,
                fdt: str = "float32", smem: str = "global", unroll: int = 1):
    """prim_func ``decode``: fused cache update + split attention of one decoding step.

    Arguments: q_t [B,HQ,D], k_t [B,H,D], v_t [B,H,DV] (qdt); w_t [B,H,D], beta_t [B,H] (fdt);
    g_t [B,HQ] (fdt, gated only); cache_k [B,ML,H,D], cache_v [B,ML,H,DV] (cdt, updated in place);
    cache_c [B,ML,HQ] (fdt, gated only, updated); o_part [B,HQ,NSPLIT,DV], ml_part [B,HQ,NSPLIT,2]
    (fdt, out); length L (int64: valid positions before this step); qk_scale, gate_scale (with
    log2 e), beta_max.
    """
    G = HQ // H
    sync = smem != "global"
    rank1_update, decode_logits = decode_macros(BN, G, D, DV, fdt, cdt, unroll, sync)
    online_softmax = online_softmax_macro(G, DV, fdt, fdt, unroll, sync)
    barrier = barrier_macro(sync)
    keep_alive = keep_alive_macro(sync)
    zero = const(0, fdt)
    ninf = const(NEG_INF, fdt)
    FS = T.float64 if fdt == "float64" else T.float32

    @T.macro
    def body(q_t, k_t, v_t, w_t, beta_t, g_t, cache_k, cache_v, cache_c, o_part, ml_part, L, qk_scale,
             gate_scale, beta_max, vb, vh, vsp):
        wv = T.sblock_alloc_buffer((D + 2,), fdt, scope=smem)   # w_t, then beta_t at [D] (see online_softmax)
        qg = T.sblock_alloc_buffer((G, D), fdt, scope=smem)
        st = T.sblock_alloc_buffer((5, G), fdt, scope=smem)     # m, l, scratch, scratch, c_L
        Kn = T.sblock_alloc_buffer((BN, D), cdt, scope=smem)
        Vb = T.sblock_alloc_buffer((BN, DV), cdt, scope=smem)
        ck = T.sblock_alloc_buffer((BN, G), fdt, scope=smem)
        dots = T.sblock_alloc_buffer((BN,), fdt, scope=smem)
        Lg = T.sblock_alloc_buffer((G, BN), fdt, scope=smem)
        acc = T.sblock_alloc_buffer((G, DV), fdt, scope=smem)
        total = T.meta_var(L + T.int64(1))
        per = T.meta_var((total + NSPLIT - 1) // NSPLIT)
        p0 = T.meta_var(T.Cast("int64", vsp) * per)
        p1 = T.meta_var(T.min(p0 + per, total))
        barrier()
        for d in T.serial(D):
            with T.sblock("dc_load_w"):
                vd = T.axis.remap("S", [d])
                wv[vd] = w_t[vb, vh, vd]
        barrier()
        for r in T.serial(2):
            with T.sblock("dc_load_beta"):
                vr = T.axis.remap("S", [r])
                wv[D + vr] = T.min(T.Cast(fdt, beta_t[vb, vh]), T.Cast(fdt, beta_max))
        barrier()
        for g, d in T.grid(G, D):
            with T.sblock("dc_load_q"):
                vg, vd = T.axis.remap("SS", [g, d])
                qg[vg, vd] = T.Cast(fdt, q_t[vb, vh * G + vg, vd])
        if gated:
            barrier()
            for g in T.serial(G):
                with T.sblock("dc_c_last"):
                    vg = T.axis.remap("S", [g])
                    st[4, vg] = T.if_then_else(L > 0, cache_c[vb, T.max(L - 1, T.int64(0)), vh * G + vg], zero) \
                        + g_t[vb, vh * G + vg]
        barrier()
        for g in T.serial(G):
            with T.sblock("dc_init_m"):
                vg = T.axis.remap("S", [g])
                st[0, vg] = ninf
        barrier()
        for g in T.serial(G):
            with T.sblock("dc_init_l"):
                vg = T.axis.remap("S", [g])
                st[1, vg] = zero
        barrier()
        for g, e in T.grid(G, DV):
            with T.sblock("dc_init_acc"):
                vg, ve = T.axis.remap("SS", [g, e])
                acc[vg, ve] = zero
        for t in T.serial((per + BN - 1) // BN):
            barrier()
            for r, d in T.grid(BN, D):
                with T.sblock("dc_load_k"):
                    vt = T.axis.opaque(total, t)
                    vr, vd = T.axis.remap("SS", [r, d])
                    Kn[vr, vd] = T.if_then_else(
                        p0 + vt * BN + vr < L, cache_k[vb, p0 + vt * BN + vr, vh, vd],
                        T.if_then_else(p0 + vt * BN + vr == L, T.Cast(cdt, k_t[vb, vh, vd]), T.Cast(cdt, 0)))
            barrier()
            for r, e in T.grid(BN, DV):
                with T.sblock("dc_load_v"):
                    vt = T.axis.opaque(total, t)
                    vr, ve = T.axis.remap("SS", [r, e])
                    Vb[vr, ve] = T.if_then_else(
                        p0 + vt * BN + vr < L, cache_v[vb, p0 + vt * BN + vr, vh, ve],
                        T.if_then_else(p0 + vt * BN + vr == L, T.Cast(cdt, v_t[vb, vh, ve]), T.Cast(cdt, 0)))
            if gated:
                barrier()
                for r, g in T.grid(BN, G):
                    with T.sblock("dc_load_c"):
                        vt = T.axis.opaque(total, t)
                        vr, vg = T.axis.remap("SS", [r, g])
                        ck[vr, vg] = T.if_then_else(p0 + vt * BN + vr < L,
                                                    cache_c[vb, p0 + vt * BN + vr, vh * G + vg], st[4, vg])
            rank1_update(wv, dots, Kn, t, total, L - p0)
            barrier()
            for r, d in T.grid(BN, D):
                with T.sblock("dc_store_k"):
                    vt = T.axis.opaque(total, t)
                    vr, vd = T.axis.remap("SS", [r, d])
                    if p0 + vt * BN + vr < p1:
                        cache_k[vb, p0 + vt * BN + vr, vh, vd] = Kn[vr, vd]
            barrier()
            for r, e in T.grid(BN, DV):
                with T.sblock("dc_store_v"):
                    vt = T.axis.opaque(total, t)
                    vr, ve = T.axis.remap("SS", [r, e])
                    if p0 + vt * BN + vr == L:
                        cache_v[vb, L, vh, ve] = Vb[vr, ve]
            if gated:
                barrier()
                for r, g in T.grid(BN, G):
                    with T.sblock("dc_store_c"):
                        vt = T.axis.opaque(total, t)
                        vr, vg = T.axis.remap("SS", [r, g])
                        if p0 + vt * BN + vr == L:
                            cache_c[vb, L, vh * G + vg] = st[4, vg]
            decode_logits(qg, Kn, Lg, st, ck, qk_scale, gate_scale, gated, t, total, p1 - p0)
            online_softmax(Lg, Vb, BN, st, acc)
        barrier()
        for g, e in T.grid(G, DV):
            with T.sblock("dc_store_o"):
                vg, ve = T.axis.remap("SS", [g, e])
                o_part[vb, vh * G + vg, vsp, ve] = acc[vg, ve]
        barrier()
        for g, c in T.grid(G, 2):
            with T.sblock("dc_store_ml"):
                vg, vc = T.axis.remap("SS", [g, c])
                ml_part[vb, vh * G + vg, vsp, vc] = st[vc, vg]
        keep_alive(ml_part, (0, 0, 0, 0), L < 0, [wv, qg, st, Kn, Vb, ck, dots, Lg, acc])

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
            for b, h, sp in T.grid(B, H, NSPLIT):
                with T.sblock("program"):
                    vb, vh, vsp = T.axis.remap("SSS", [b, h, sp])
                    body(q_t, k_t, v_t, w_t, beta_t, g_t, cache_k, cache_v, cache_c, o_part, ml_part, L,
                         qk_scale, gate_scale, beta_max, vb, vh, vsp)
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
        for b, h, sp in T.grid(B, H, NSPLIT):
            with T.sblock("program"):
                vb, vh, vsp = T.axis.remap("SSS", [b, h, sp])
                body(q_t, k_t, v_t, w_t, beta_t, None, cache_k, cache_v, None, o_part, ml_part, L,
                     qk_scale, gate_scale, beta_max, vb, vh, vsp)
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
