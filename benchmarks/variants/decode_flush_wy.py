"""Candidate ``decode_kernel``s for the flush step's two fixed costs (built from codegen/triton/decode.py by text
replacement, ``kernel_variants``; same signature and launch arguments).

A flush step first forms the pending transitions' compact WY factors (``_wy``: T from T^-1 = diag(1/beta) + the
strictly upper part of W W^T), then rotates its split's frame rows in rounds of ROT_ROWS rows.  On the H200
(heuristic configs, B = 8) a flush step costs 0.07-0.09 ms more than a plain step at a 4K cache, 0.4-0.6 ms at
32K, while rewriting K is ~0.03 / ~0.2 ms of HBM traffic:

* ``_wy`` back-substitutes T one row per step, NP dependent steps (17 for one token at W = 16, up to 48 for 16
  tokens), each with two reductions across the program's warps.  ``decode_kernel_wy_doubling`` inverts
  I + diag(beta) U (U strictly upper) by recursive doubling instead: the inverse of the 2s-blocks from that of
  the s-blocks, X <- X - X E_s X (E_s: the blocks above the diagonal inside each 2s-block), log2(PB) - 1 levels
  of two PB x PB products at fp32 accuracy (levels at or past NP skipped), then T = X diag(beta).  The same
  function as the substitution (block triangular inversion), in ~10 dependent products instead of NP steps.
* A bf16 cache's rounds multiply float32 keys at tf32 (the load feeds a conversion, so Triton 3.6 does not
  pipeline the loop).  ``decode_kernel_rot_split`` multiplies the bf16 keys as loaded: K W^T as K (W_hi + W_lo)^T
  and (K W^T) M as hi / lo bf16 parts (hi hi + hi lo + lo hi), ~16 bits where tf32 kept 11, and pipelines the
  rounds (``tl.range(num_stages=3)``: the loads feed the products directly).  Other cache dtypes as shipped.
* ``decode_kernel_wy_rot``: both.

``python benchmarks/decode_probe.py --skip checks,profiles,hostprofile,generate --tokens 1,16 --candidate-decode
benchmarks/variants/decode_flush_wy.py:decode_kernel_wy_doubling,benchmarks/variants/decode_flush_wy.py:decode_kernel_rot_split,benchmarks/variants/decode_flush_wy.py:decode_kernel_wy_rot``;
tests/test_triton_decode.py checks them against the float64 reference.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pathtune.codegen.triton.decode as decode_mod

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))      # benchmarks/: kernel_variants
from kernel_variants import load_variant, module_source  # noqa: E402

SHIPPED_WY = """    U = _fdot(Wm, tl.trans(Wm), IEEE)
    U = tl.where(s[None, :] > s[:, None], U, 0.0)
    T = tl.zeros([PB, PB], tl.float32)
    for i2 in range(0, NP):
        i = NP - 1 - i2
        u_i = tl.sum(tl.where((s == i)[:, None], U, 0.0), axis=0)
        b_i = tl.sum(tl.where(s == i, bw, 0.0), axis=0)
        t_i = b_i * (tl.where(s == i, 1.0, 0.0) - tl.sum(u_i[:, None] * T, axis=0))
        T = tl.where((s == i)[:, None], t_i[None, :], T)
    return Wm, _fdot(T, Wm, IEEE)
"""
DOUBLING_WY = """    U = _fdot(Wm, tl.trans(Wm), IEEE)
    # T^-1 = diag(1/beta) (I + N) with N = diag(beta) strictUpper(W W^T): T = (I + N)^-1 diag(beta)
    N = tl.where(s[None, :] > s[:, None], bw[:, None] * U, 0.0)
    X = tl.where(s[:, None] == s[None, :], 1.0, 0.0) - tl.where((s // 2)[:, None] == (s // 2)[None, :], N, 0.0)
    for lv in tl.static_range(1, 7):
        SBLK = 1 << lv
        if SBLK < PB:
            if SBLK < NP:
                E = tl.where(((s // (2 * SBLK))[:, None] == (s // (2 * SBLK))[None, :])
                             & ((s // SBLK) % 2 == 0)[:, None] & ((s // SBLK) % 2 == 1)[None, :], N, 0.0)
                X = X - _fdot(_fdot(X, E, IEEE), X, IEEE)
    return Wm, _fdot(X * bw[None, :], Wm, IEEE)
"""

SHIPPED_ROUNDS = """        rr = tl.arange(0, ROT_ROWS)
        row_hi = tl.minimum(t_hi * BLOCK_N, F)
        tl.debug_barrier()  # every thread of this program is past its last read of these rows
        for r0 in range(t_lo * BLOCK_N, row_hi, ROT_ROWS):
            kr = r0 + rr
            kmask = (kr < row_hi)[:, None] & dmask[None, :]
            kro = kr.to(tl.int64) if OFF64 else kr
            kroff = kro[:, None] * (H * D) + d[None, :]
            Kf = tl.load(k_base + kroff, mask=kmask, other=0.0).to(tl.float32)
            if cdt == tl.bfloat16:
                # one tensor-core pass per product: a bf16 key is exact in tf32, and w and M rounded to tf32
                # (2^-11 relative) stay below the key's own bf16 rounding at the store (2^-9)
                KW = tl.dot(Kf, tl.trans(Wm), input_precision="tf32")
                Kf = Kf - tl.dot(KW, M, input_precision="tf32")
            else:
                Kf = Kf - _fdot(_fdot(Kf, tl.trans(Wm), F32), M, F32)
            tl.store(k_base + kroff, _to_cache(Kf, cdt, INTERP), mask=kmask)
"""
SPLIT_ROUNDS = """        rr = tl.arange(0, ROT_ROWS)
        row_hi = tl.minimum(t_hi * BLOCK_N, F)
        if cdt == tl.bfloat16:
            Wt = tl.trans(Wm)
            Wh = Wt.to(tl.bfloat16)
            Wl = (Wt - Wh.to(tl.float32)).to(tl.bfloat16)
            Mh = M.to(tl.bfloat16)
            Ml = (M - Mh.to(tl.float32)).to(tl.bfloat16)
        tl.debug_barrier()  # every thread of this program is past its last read of these rows
        for r0 in tl.range(t_lo * BLOCK_N, row_hi, ROT_ROWS, num_stages=3):
            kr = r0 + rr
            kmask = (kr < row_hi)[:, None] & dmask[None, :]
            kro = kr.to(tl.int64) if OFF64 else kr
            kroff = kro[:, None] * (H * D) + d[None, :]
            if cdt == tl.bfloat16:
                K16 = tl.load(k_base + kroff, mask=kmask, other=0.0)
                KW = mm(K16, Wh, INTERP) + mm(K16, Wl, INTERP)
                KWh = KW.to(tl.bfloat16)
                KWl = (KW - KWh.to(tl.float32)).to(tl.bfloat16)
                Kf = K16.to(tl.float32) - (mm(KWh, Mh, INTERP) + (mm(KWh, Ml, INTERP) + mm(KWl, Mh, INTERP)))
            else:
                Kf = tl.load(k_base + kroff, mask=kmask, other=0.0).to(tl.float32)
                Kf = Kf - _fdot(_fdot(Kf, tl.trans(Wm), F32), M, F32)
            tl.store(k_base + kroff, _to_cache(Kf, cdt, INTERP), mask=kmask)
"""

_SRC = module_source(decode_mod)
decode_kernel_wy_doubling = load_variant(_SRC, "decode_kernel", "decode_wy_doubling", [(SHIPPED_WY, DOUBLING_WY)])
decode_kernel_rot_split = load_variant(_SRC, "decode_kernel", "decode_rot_split", [(SHIPPED_ROUNDS, SPLIT_ROUNDS)])
decode_kernel_wy_rot = load_variant(_SRC, "decode_kernel", "decode_wy_rot",
                                    [(SHIPPED_WY, DOUBLING_WY), (SHIPPED_ROUNDS, SPLIT_ROUNDS)])
