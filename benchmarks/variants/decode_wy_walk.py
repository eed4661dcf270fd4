"""Candidate for the decode step: the pending walk in compact WY form, with T kept beside the window.

The shipped ``decode_kernel`` moves every query through the NP pending transitions one at a time (two
dependent D-wide reductions per position, in every split program).  With Q = H_F H_{F+1} .. H_{N-1} =
I - W^T T W (W [PB, BD]: row s = w_{F+s}; T upper triangular, T^-1 = diag(1/beta) + striu(W W^T)):

* the frame query of token i is q^ = q - W^T (T (W q)) with W q masked to s <= i - F (the leading block
  of T is the T of the leading product);
* its pending logits are S_p = k_p.q - sum_{s > p} (k_p.w_s) (T W q)_s (a contiguous principal block of
  an upper-triangular T is the T of that sub-product);
* T grows by one column per new token, t_j = -beta_j T (W w_j) on rows < j and T_jj = beta_j, so a step
  reads the T of the P pending positions of earlier steps from a buffer beside the window ([B, H, WS,
  WS] fp32, ``cache.workspace``) and the owner program stores the new columns when the step does not
  flush.  One token then costs three small products on the query's dependency chain instead of 2 NP
  reductions; a flush rotates keys as K - (K W^T)(T W) in a pass after the attention loop for any token
  count (T from the walk instead of a back substitution; W and T W live through the loop spilled 2-8 KB
  of registers per thread at sm_90).  The pending block's own rotation stays serial (each row needs a
  partial product).

The module is ``codegen/triton/decode.py`` with these text replacements
(``kernel_variants.load_variant_module``); ``install()`` makes ``prepare`` / ``path_decode_triton`` (and so
``path_attention_decode``) build the candidate's steps.  Pending rows written by another kernel have no T in
the buffer: swap kernels only on a cache with nothing pending (a fresh prefill or ``materialize()``).
"""
from __future__ import annotations

import contextlib

from kernel_variants import load_variant_module, module_source

import pathtune.codegen.triton.decode as _shipped

_WALK = '''

@triton.jit
def _pending_w(P, NP, pw_base, wb, H: tl.constexpr, D: tl.constexpr, d, dmask, PB: tl.constexpr):
    """W [PB, BD] fp32: row s = w_{F+s} (window slot s < P, else this step's token s - P), zero rows s >= NP."""
    s = tl.arange(0, PB)
    old = s < P
    new = (s >= P) & (s < NP)
    soff = s[:, None] * (H * D) + d[None, :]
    return tl.load(pw_base + soff, mask=old[:, None] & dmask[None, :], other=0.0) \\
        + tl.load(wb + (soff - P * (H * D)), mask=new[:, None] & dmask[None, :], other=0.0).to(tl.float32)


@triton.jit
def _walk_wy(Z, ipos, rvalid, k_base, F, P, NP, own, pw_base, pb_base, pt_base, wb, bb,
             H: tl.constexpr, D: tl.constexpr, d, dmask, R: tl.constexpr, PB: tl.constexpr, WS: tl.constexpr,
             BETA_MAX: tl.constexpr, OFF64: tl.constexpr, ROWWISE: tl.constexpr, IEEE: tl.constexpr):
    """The pending walk in compact WY form.  Returns (Z = the frame queries, S [R, PB] raw pending logits,
    T [PB, PB]); T's columns >= P are this step's."""
    s = tl.arange(0, PB)
    old = s < P
    new = (s >= P) & (s < NP)
    Wm = _pending_w(P, NP, pw_base, wb, H, D, d, dmask, PB)
    b_old = tl.load(pb_base + s * H, mask=old, other=0.0)
    b_new = tl.minimum(tl.load(bb + (s - P) * H, mask=new, other=0.0).to(tl.float32), BETA_MAX)
    bw = tl.where(old, b_old, b_new)
    # only the upper triangle of the first P columns was ever stored
    T = tl.load(pt_base + s[:, None] * WS + s[None, :], mask=old[:, None] & old[None, :] & (s[:, None] <= s[None, :]),
                other=0.0)
    Gm = _fdot(Wm, tl.trans(Wm), IEEE)
    for j in range(P, NP):
        g_j = tl.sum(tl.where((s == j)[None, :] & (s < j)[:, None], Gm, 0.0), axis=1)
        b_j = tl.sum(tl.where(s == j, bw, 0.0), axis=0)
        t_j = tl.where(s == j, b_j, -b_j * tl.sum(T * g_j[None, :], axis=1))
        T = tl.where((s == j)[None, :], tl.where(s <= j, t_j, 0.0)[:, None], T)
    m_r = ipos - F
    act = rvalid[:, None] & (s[None, :] <= m_r[:, None])
    pr = (F + s).to(tl.int64) if OFF64 else F + s
    Kp = tl.load(k_base + pr[:, None] * (H * D) + d[None, :], mask=(s < NP)[:, None] & dmask[None, :] & own,
                 other=0.0).to(tl.float32)
    KW = tl.where(s[None, :] > s[:, None], _fdot(Kp, tl.trans(Wm), IEEE), 0.0)
    if ROWWISE:
        A = tl.where(act, tl.sum(Z * Wm, axis=1)[None, :], 0.0)
        Bm = tl.sum(T * A, axis=1)[None, :]
        Zn = Z - tl.sum(tl.trans(Bm) * Wm, axis=0)[None, :]
        S = tl.sum(Kp * Z, axis=1)[None, :] - tl.sum(KW * Bm, axis=1)[None, :]
    else:
        A = tl.where(act, _fdot(Z, tl.trans(Wm), IEEE), 0.0)
        Bm = _fdot(A, tl.trans(T), IEEE)
        Zn = Z - _fdot(Bm, Wm, IEEE)
        S = _fdot(Z, tl.trans(Kp), IEEE) - _fdot(Bm, tl.trans(KW), IEEE)
    return Zn, S, T
'''

_REPLACEMENTS = (
    # the kernel takes the T buffer after the window
    ("st_ptr, pw_ptr, pb_ptr,\n    m_part, l_part, acc_part,",
     "st_ptr, pw_ptr, pb_ptr, pt_ptr,\n    m_part, l_part, acc_part,"),
    ("    Z, S = _walk(Z, ipos, rvalid, k_base, F, NP, own, pw_base, pb_base, wb, bb, P, H, D, d, dmask, R, PB,\n"
     "                 BETA_MAX, OFF64)\n",
     "    pt_base = pt_ptr + (b * H + h) * (WS * WS)\n"
     "    Z, S, Tm = _walk_wy(Z, ipos, rvalid, k_base, F, P, NP, own, pw_base, pb_base, pt_base, wb, bb,\n"
     "                               H, D, d, dmask, R, PB, WS, BETA_MAX, OFF64, ROWWISE, F32)\n"
     "    sc = tl.arange(0, PB)\n"
     "    tmask = own & (P + TN <= W) & (sc < NP)[:, None] & (sc >= P)[None, :] & (sc < NP)[None, :]\n"
     "    tl.store(pt_base + sc[:, None] * WS + sc[None, :], Tm, mask=tmask)\n"),
    # every flush rotates the frame rows after the attention loop (keeping W and T W live through the loop
    # spilled registers), with T from the walk instead of a back substitution
    ("        if TN == 1:\n            if flush:\n", "        if TN == 0:   # (never: the flush is the pass below)\n"
     "            if flush:\n"),
    ("    if TN > 1:\n        if flush:\n", "    if TN >= 1:\n        if flush:\n"),
    ("            Wm, M = _wy(F, NP, pw_base, pb_base, wb, bb, P, H, D, d, dmask, PB, BETA_MAX, F32)\n",
     "            Wm = _pending_w(P, NP, pw_base, wb, H, D, d, dmask, PB)\n"
     "            M = _fdot(Tm, Wm, F32)\n"),
    # the launcher hands the kernel its T buffer
    ("        pw, pb = cache.pending_window(self.window)\n",
     "        pw, pb = cache.pending_window(self.window)\n"
     "        fresh = (\"pending_T\", pw.shape[1]) not in cache._work\n"
     "        pt = cache.workspace((\"pending_T\", pw.shape[1]), self.B * self.H * pw.shape[1] ** 2)\n"
     "        if fresh:   # zero columns: the T of zero window slots (w = 0, beta = 0), as a replayed state has\n"
     "            pt.zero_()\n"),
    ("cache.state_tensor, pw, pb, m_part,", "cache.state_tensor, pw, pb, pt, m_part,"),
)

decode_wy_walk = load_variant_module(module_source(_shipped), "decode_wy_walk", _REPLACEMENTS, append=_WALK)


@contextlib.contextmanager
def install():
    """Inside the block, ``pathtune.codegen.triton.decode.prepare`` (which ``path_attention_decode`` and
    ``path_decode_triton`` call) builds the candidate's steps; the memoised steps are dropped on entry and exit."""
    import pathtune.runtime.dispatch as dispatch

    real = _shipped.TritonDecodeStep

    def _clear():
        _shipped._step_cached.cache_clear()
        d = dispatch._DISPATCHER
        if d is not None:
            d.decode_plans.clear()

    _shipped.TritonDecodeStep = decode_wy_walk.TritonDecodeStep
    _clear()
    try:
        yield
    finally:
        _shipped.TritonDecodeStep = real
        _clear()
