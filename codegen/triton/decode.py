"""Fused PaTH(-FoX) decoding step with lazy key rotation, plus a GPU prefill that builds a cache.

Decoding rule (docs/algorithm.md#decoding, ``runtime/reference/recurrent.py``): with H_t = I - beta_t w_t w_t^T,
the logit of query i on key j <= i is k_j^T H_{j+1} ... H_i q_i.

Lazy rotation.  The cache (``codegen/kv_cache.py``) keeps a frame base F on the device next to the length
L: rows j < F hold keys in the frame of position F-1, k~_j = H_{F-1} ... H_{j+1} k_j; rows F .. L-1 are
"pending": raw keys k_j, with their w_j and (clipped) beta_j in a window of W slots (``decode_pending_window``) per
(batch, kv head) (slot j - F).  A step of T_new tokens (positions L .. L+T_new-1, rows appended raw)
gives every query i its frame query by walking the pending positions backwards: z = q_i; for
p = i, i-1, .., F: logit_{p,i} = k_p . z, z <- H_p z = z - beta_p (w_p . z) w_p; the final
z = q^_i = H_F ... H_i q_i, and logit_{j,i} = k~_j . q^_i for every j < F, as in ordinary attention.
A step that keeps the pending count L + T_new - F <= W reads K and V once and writes nothing but the
new rows and their window slots, whatever T_new is.

Flush rule (decided on the device, from L and F, by every program alike): when L + T_new - F > W the
step also rotates every row into the frame of the last new token N-1 (N = L + T_new): each frame row
j < F gets H_F, H_{F+1}, .., H_{N-1} in that order (NP = N - F transitions, fp32, rounded to the cache
dtype once) after its logits were taken from k~_j . q^_i; the pending rows F .. N-1 get H_{j+1} ..
H_{N-1} (the trailing parts of the same compact WY form, ``_rotate_pending``); the state update at the
end of the step sets F = N.  The frame rows are rotated after the attention pass, for any T_new (NP up to
W + T_new): each program makes a second pass over its split's frame rows and applies all NP transitions
at once in compact WY form, H_F H_{F+1} .. H_{N-1} = I - W^T T W (W [PB, D]: row s = w_{F+s}; T upper
triangular with T^-1 = diag(1/beta) + the strictly upper part of W W^T, found once per program by back
substitution): a key row k <- k - ((k W^T) T) W = k - (k W^T) M with M = T W formed once (fp32-accurate),
two products per block of ROT_ROWS = 8192 / BD rows (128 at BD = 64, 64 at BD = 128; 16 at BD = 256)
instead of NP dependent row reductions per key: ieee where the kernel computes in fp32, one tf32 pass for
a bf16 cache (its keys are exact in tf32, and tf32's rounding of w and M is below the key's own rounding at
the store: on an H200 a 32K-cache flush step takes 0.68-1.03 ms against 0.96-1.53 at tf32x3), tf32x3 for
fp16 (whose rounding is tf32's).  Large blocks give each program a few large products instead of many small dependent
load -> product -> store rounds.  The second read of the split's keys costs less than it saves: on an H200
(B = 8, 32K cache) a one-token flush step takes 0.98-1.08 ms with it, 1.35-1.65 ms when the attention loop
rotates each key tile it reads by NP serial rank-one updates.

So the cache rounds a key once per flush instead of once per token, the key writes happen once every
~W / T_new steps, and one launch (or one captured CUDA graph) serves flush and non-flush steps.  W = 0
flushes on every step: the eager-rotation scheme (read K, rotate, write K, read V every step) on the same
code path.

Kernels.  ``decode_kernel``: grid (B*H, splits).  A program owns a contiguous share of the key tiles
of rows [0, F) of one (batch, kv head); the last split also owns the pending block, rows [F, N) (at
most W + T_new rows, one padded block of PB rows): it writes the new rows (raw k, v, gate cumsums)
and, on a non-flush step, their window slots, then folds the pending logits into its softmax, and on a
flush rotates the block in place.  Every program walks the pending positions itself (O((W + T_new) D)
per query row, reading only w / beta; the owner also reads the pending keys), so no program waits
for another.  The partial online softmax (m, l, acc) covers every query head of the kv-head group
(GQA: K and V are read once per group); one token with one query head per kv head (MHA) uses row
reductions instead of tensor-core products.  On a flush a program rotates the frame rows its tile loop
has read in its second pass over the same rows, as the flush rule says (a barrier orders the loop's reads
before the pass's writes; rows in blocks of ROT_ROWS).  Each program then stores its partials and
counts its arrival on an int32 counter of its (batch, kv head) (``tl.atomic_add``, acq_rel); the last split
to arrive merges the partials of every split into o (and lse), resets that counter to 0 and counts the
merged (batch, kv head) on one more counter; the last of those (every program of the grid has read the
state by then) resets it and advances L by T_new and, on a flush, sets F = N.  The counters
(``PaTHKVCache.arrival_counters``) are zero between steps with no fill per step.  The grid depends only on
the cache's capacity: a step is one launch and no host sync (capturable in a CUDA graph).  Rows past the
capacity are never written (a replayed graph that overflows drops them; the length then exceeds the
capacity, which the cache reports).

Readers of ``cache.k`` (the reference and TVM steps, tests, benchmarks) see current-frame keys: the
cache materializes its pending rows first (``PaTHKVCache.materialize``, the same fp32 flush in torch).

Knobs (spec pass ``decode``): decode_block_n (key tile), decode_num_warps, decode_splits (split-K
factor, capped by the number of tiles), decode_num_stages (software pipelining of the key-tile loop),
beta_clip_eps (``TritonParams.beta_max``), decode_pending_window (W).
"""
from __future__ import annotations

import functools
import sys
from dataclasses import asdict, dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from pathtune.codegen._knobs import resolve, spec_default
from pathtune.codegen.kv_cache import PaTHKVCache
from pathtune.specs import load_spec

from ._ops import interpreting, mm, next_pow2, padded_dim
from .launch import KernelLauncher, pointers_and_key
from .params import TritonParams

__all__ = ["decode_kernel", "path_decode_triton", "path_prefill_triton",
           "current_frame_keys_triton", "decode_params", "decode_loop_stages", "TritonDecodeStep",
           "TritonDecodeParams"]

# W, the pending window (the spec's decode_pending_window): a step flushes (rotates the whole cache into
# the newest frame) when more than W tokens would be pending after it; 0 = rotate on every step.  16
# amortizes the flush (a second pass over K applying the up to W + T_new transitions in compact WY form)
# over 16 one-token steps.

_LOG2E = 1.4426950408889634
_NEG = tl.constexpr(-1.0e30)  # finite "minus infinity" of the running max (keeps exp2(m_old - m_new) NaN-free)
_CACHE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_OFF64_ELEMS = 2 ** 31  # per-sequence cache elements from which row offsets are computed in 64 bits


@triton.jit
def _dot(a, b, F32: tl.constexpr, INTERP: tl.constexpr):
    """fp32-accumulated product; F32: both operands fp32 with full-precision (ieee) products."""
    if F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return mm(a, b, INTERP)


@triton.jit
def _to_cache(x, cdt: tl.constexpr, INTERP: tl.constexpr):
    """fp32 -> cache dtype with round-to-nearest-even, as the GPU converts.

    Triton 3.6's interpreter truncates fp32 -> bfloat16 (round toward zero); under the interpreter
    (only) the rounding is done on the bits first, so the stored keys are the ones a GPU stores.
    """
    if INTERP:
        if cdt == tl.bfloat16:
            bits = x.to(tl.uint32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
            x = bits.to(tl.float32, bitcast=True)
    return x.to(cdt)


@triton.jit
def _heads_at(ch_base, hq, rows, max_len, OFF64: tl.constexpr):
    """Addresses of the gate cumsums of query heads ``hq`` at cache rows ``rows`` (broadcast) in the cache's
    head-major copy [HQ, max_len] of one sequence: a key tile's offsets are contiguous there."""
    hq_ = hq.to(tl.int64) if OFF64 else hq
    return ch_base + hq_ * max_len + rows


@triton.jit
def _append_rows(knew_ptr, vnew_ptr, g_ptr, k_base, v_base, c_base, ch_base, max_len, b, h, L, N, row_lo, row_hi,
                 H: tl.constexpr, G: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr,
                 BDV: tl.constexpr, TN: tl.constexpr, TNP: tl.constexpr, GP: tl.constexpr,
                 USE_GATE: tl.constexpr, OFF64: tl.constexpr, INTERP: tl.constexpr):
    """Write the new tokens' raw keys/values (and gate cumsums, into the token-major cache and its head-major
    copy) into cache rows L .. L+TN-1 that lie in this program's rows [row_lo, row_hi) and below N (the
    capacity-clamped end); the caller's tile loop reads them after a barrier."""
    HQ: tl.constexpr = H * G
    cdt = k_base.dtype.element_ty
    t = tl.arange(0, TNP)
    d = tl.arange(0, BD)
    dv = tl.arange(0, BDV)
    rows = L + t
    own = (t < TN) & (rows >= row_lo) & (rows < row_hi) & (rows < N)
    nr = rows.to(tl.int64) if OFF64 else rows
    kn = tl.load(knew_ptr + ((b * TN + t) * H + h)[:, None] * D + d[None, :],
                 mask=own[:, None] & (d < D)[None, :], other=0.0)
    tl.store(k_base + nr[:, None] * (H * D) + d[None, :], _to_cache(kn.to(tl.float32), cdt, INTERP),
             mask=own[:, None] & (d < D)[None, :])
    vn = tl.load(vnew_ptr + ((b * TN + t) * H + h)[:, None] * DV + dv[None, :],
                 mask=own[:, None] & (dv < DV)[None, :], other=0.0)
    tl.store(v_base + nr[:, None] * (H * DV) + dv[None, :], _to_cache(vn.to(tl.float32), cdt, INTERP),
             mask=own[:, None] & (dv < DV)[None, :])
    if USE_GATE:
        gq = tl.arange(0, GP)
        hq = h * G + gq
        gmask = gq < G
        prev = (L - 1).to(tl.int64) if OFF64 else L - 1
        run = tl.load(c_base + prev * HQ + hq, mask=gmask & (L > 0), other=0.0)
        cn = tl.zeros([TNP, GP], tl.float32)
        for s in tl.static_range(TN):
            run = run + tl.load(g_ptr + (b * TN + s) * HQ + hq, mask=gmask, other=0.0).to(tl.float32)
            cn = tl.where((t == s)[:, None], run[None, :], cn)
        tl.store(c_base + nr[:, None] * HQ + hq[None, :], cn, mask=own[:, None] & gmask[None, :])
        tl.store(_heads_at(ch_base, hq[None, :], nr[:, None], max_len, OFF64), cn, mask=own[:, None] & gmask[None, :])


@triton.jit
def _flushes(L, F, TN: tl.constexpr, W: tl.constexpr):
    """The flush decision of a step (both kernels): more than W tokens would be pending after it."""
    return L - F + TN > W


@triton.jit
def _transition(pw_base, pb_base, wb, bb, s, P, H: tl.constexpr, D: tl.constexpr, d, dmask,
                BETA_MAX: tl.constexpr):
    """(w_p, beta_p) in fp32 of pending position p = F + s: window slot s for s < P (a token of an earlier
    step, beta stored clipped), else this step's token s - P (read in its dtype, beta clipped here)."""
    old = s < P
    new = s >= P
    t = s - P
    w = tl.load(pw_base + s * (H * D) + d, mask=dmask & old, other=0.0) \
        + tl.load(wb + t * (H * D) + d, mask=dmask & new, other=0.0).to(tl.float32)
    b_old = tl.load(pb_base + s * H, mask=old, other=0.0)
    b_new = tl.minimum(tl.load(bb + t * H, mask=new, other=0.0).to(tl.float32), BETA_MAX)
    return w, tl.where(old, b_old, b_new)


@triton.jit
def _fdot(a, b, IEEE: tl.constexpr):
    """fp32 x fp32 -> fp32 at fp32 accuracy: full-precision products (IEEE) or three tf32 tensor-core passes."""
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a, b, input_precision="tf32x3")


@triton.jit
def _kdot(a, b, TF32: tl.constexpr, IEEE: tl.constexpr):
    """A product that rotates cached keys (fp32 tiles): one tensor-core pass when TF32 (a bf16 cache: its keys are
    exact in tf32, and tf32's rounding of w, M and the frame map, 2^-11 relative, stays below the key's own bf16
    rounding at the store, 2^-9), else fp32 accurate (``_fdot``)."""
    if TF32:
        out = tl.dot(a, b, input_precision="tf32")
    else:
        out = _fdot(a, b, IEEE)
    return out


@triton.jit
def _rotates_all(flush, N, F1, FB: tl.constexpr):
    """The big-flush decision of two frame levels (every program and the state update alike): a flush that would
    leave more than FB rows past the old ones rotates every row."""
    return flush & (N - F1 > FB)


@triton.jit
def _wy(F, NP, pw_base, pb_base, wb, bb, P, H: tl.constexpr, D: tl.constexpr, d, dmask, PB: tl.constexpr,
        BETA_MAX: tl.constexpr, IEEE: tl.constexpr):
    """Compact WY form of the NP pending transitions: H_F H_{F+1} .. H_{F+NP-1} = I - W^T T W with W [PB, BD]
    (row s = w_{F+s}, zero rows for s >= NP) and T [PB, PB] upper triangular, T^-1 = diag(1/beta) + the strictly
    upper part of W W^T.  Back substitution from the last row, T[i] = beta_i (e_i - U[i] T) with U the strictly
    upper part of W W^T, divides by nothing (beta = 0 gives a zero row) and leaves the padding rows / columns
    s >= NP zero.  Returns (W, M = T W) [PB, BD] fp32: a key row k maps to k - (k W^T) M."""
    s = tl.arange(0, PB)
    old = s < P
    new = (s >= P) & (s < NP)
    soff = s[:, None] * (H * D) + d[None, :]
    Wm = tl.load(pw_base + soff, mask=old[:, None] & dmask[None, :], other=0.0) \
        + tl.load(wb + (soff - P * (H * D)), mask=new[:, None] & dmask[None, :], other=0.0).to(tl.float32)
    b_old = tl.load(pb_base + s * H, mask=old, other=0.0)
    b_new = tl.minimum(tl.load(bb + (s - P) * H, mask=new, other=0.0).to(tl.float32), BETA_MAX)
    bw = tl.where(old, b_old, b_new)
    U = _fdot(Wm, tl.trans(Wm), IEEE)
    U = tl.where(s[None, :] > s[:, None], U, 0.0)
    T = tl.zeros([PB, PB], tl.float32)
    for i2 in range(0, NP):
        i = NP - 1 - i2
        u_i = tl.sum(tl.where((s == i)[:, None], U, 0.0), axis=0)
        b_i = tl.sum(tl.where(s == i, bw, 0.0), axis=0)
        t_i = b_i * (tl.where(s == i, 1.0, 0.0) - tl.sum(u_i[:, None] * T, axis=0))
        T = tl.where((s == i)[:, None], t_i[None, :], T)
    return Wm, _fdot(T, Wm, IEEE)


@triton.jit
def _rotate_pending(Kp, Wm, M, PB: tl.constexpr, TF32: tl.constexpr, F32: tl.constexpr):
    """The pending block's keys Kp [PB, BD] fp32 (row s: position F + s) into the new frame: row s gets
    H_{F+s+1} .. H_{N-1}, the trailing part of the compact WY form I - W^T T W whose factors W, M = T W ``_wy`` made
    (its back substitution builds T from the last row up, so T's trailing block is the suffix product's):
    k_s <- k_s - (k_s W^T restricted to columns > s) M -- two products (``_kdot``) instead of NP dependent rank-one
    updates."""
    s = tl.arange(0, PB)
    X = tl.where(s[None, :] > s[:, None], _kdot(Kp, tl.trans(Wm), TF32, F32), 0.0)
    return Kp - _kdot(X, M, TF32, F32)


@triton.jit
def _walk(Z, ipos, rvalid, k_base, F, NP, own, pw_base, pb_base, wb, bb, P, H: tl.constexpr, D: tl.constexpr,
          d, dmask, R: tl.constexpr, PB: tl.constexpr, BETA_MAX: tl.constexpr, OFF64: tl.constexpr):
    """The pending walk: for p = F+NP-1 down to F (NP pending positions), every query row r with p <= ipos_r
    takes S[r, p - F] = k_p . z_r (only where ``own``: the program that attends the pending block), then
    z_r <- H_p z_r.  Returns (Z = the frame queries q^, S [R, PB] raw pending logits, 0 where inactive)."""
    col = tl.arange(0, PB)
    S = tl.zeros([R, PB], tl.float32)
    for s2 in range(0, NP):
        s = NP - 1 - s2
        p = F + s
        w, beta = _transition(pw_base, pb_base, wb, bb, s, P, H, D, d, dmask, BETA_MAX)
        pr = p.to(tl.int64) if OFF64 else p
        kp = tl.load(k_base + pr * (H * D) + d, mask=dmask & own, other=0.0).to(tl.float32)
        act = rvalid & (p <= ipos)
        lg = tl.sum(Z * kp[None, :], axis=1)
        S = tl.where((col == s)[None, :] & act[:, None], lg[:, None], S)
        zw = beta * tl.sum(Z * w[None, :], axis=1)
        Z = tl.where(act[:, None], Z - zw[:, None] * w[None, :], Z)
    return Z, S


@triton.jit
def _load_frame_map(phi_base, e0, EB: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, d, dmask):
    """Rows e0 .. e0+EB-1 of the frame map Phi [D, D] (fp32, row-major at phi_base) as an [EB, BD] tile."""
    e = e0 + tl.arange(0, EB)
    return tl.load(phi_base + e[:, None] * D + d[None, :], mask=(e < D)[:, None] & dmask[None, :], other=0.0)


@triton.jit
def _old_frame_queries(Z, phi_base, R: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, d, dmask,
                       ROWWISE: tl.constexpr, F32: tl.constexpr):
    """The queries of the old rows' frame, Z Phi^T ([R, BD] fp32): row r is Phi z_r, with Phi = H_FP .. H_{F-1}
    carrying the frame-(F-1) queries z to the frame the old rows were last rotated into (fp32 accurate).  One query
    row reads Phi 32 rows at a time (whole it is 128 registers per thread at D = 128, 4 warps), each block's columns
    of the result placed by a product with a 0 / 1 selection tile (exact)."""
    if ROWWISE:   # one query row, padded to the 16 rows of a tensor-core product
        EB: tl.constexpr = 32 if BD >= 32 else BD
        Zp = tl.where((tl.arange(0, 16) == 0)[:, None], Z, 0.0)
        Zo = tl.zeros([16, BD], tl.float32)
        for e0 in tl.static_range(0, BD, EB):
            part = _fdot(Zp, tl.trans(_load_frame_map(phi_base, e0, EB, D, BD, d, dmask)), F32)     # [16, EB]
            sel = tl.where((e0 + tl.arange(0, EB))[:, None] == d[None, :], 1.0, 0.0)               # [EB, BD]
            Zo += _fdot(part, sel, F32)
        out = tl.sum(Zo, axis=0)[None, :]
    else:         # many query rows hold more registers than Phi's transient load: one product
        out = _fdot(Z, tl.trans(_load_frame_map(phi_base, 0, BD, D, BD, d, dmask)), F32)
    return out


@triton.jit
def _rotate_old_rows(k_base, phi_base, row_lo, row_hi, H: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, d, dmask,
                     ROT_ROWS: tl.constexpr, F32: tl.constexpr, OFF64: tl.constexpr, INTERP: tl.constexpr):
    """Key rows [row_lo, row_hi) <- k Phi (row form: from the old rows' frame into frame F-1), in blocks of ROT_ROWS
    rows; the product (``_kdot``) runs over 32-column slices of the keys and 32-row slices of Phi, so Phi is never
    held whole."""
    cdt = k_base.dtype.element_ty
    CB: tl.constexpr = 32 if BD >= 32 else BD
    rr = tl.arange(0, ROT_ROWS)
    c = tl.arange(0, CB)
    for r0 in range(row_lo, row_hi, ROT_ROWS):
        kr = r0 + rr
        rmask = kr < row_hi
        kro = kr.to(tl.int64) if OFF64 else kr
        Ko = tl.zeros([ROT_ROWS, BD], tl.float32)
        for c0 in tl.static_range(0, BD, CB):
            cmask = c0 + c < D
            Kc = tl.load(k_base + kro[:, None] * (H * D) + c0 + c[None, :], mask=rmask[:, None] & cmask[None, :],
                         other=0.0).to(tl.float32)
            Pc = tl.load(phi_base + (c0 + c)[:, None] * D + d[None, :], mask=cmask[:, None] & dmask[None, :],
                         other=0.0)
            Ko += _kdot(Kc, Pc, cdt == tl.bfloat16, F32)
        tl.debug_barrier()   # every slice of these rows is read before they are overwritten
        tl.store(k_base + kro[:, None] * (H * D) + d[None, :], _to_cache(Ko, cdt, INTERP),
                 mask=rmask[:, None] & dmask[None, :])


@triton.jit
def _update_frame_map(phi_base, Wm, M, phi_set, D: tl.constexpr, BD: tl.constexpr, d, dmask, F32: tl.constexpr):
    """Phi <- Phi (I - W^T M) = Phi H_F .. H_{N-1}: the flushed transitions folded into the old rows' frame map, in
    blocks of 32 rows (fp32 accurate).  ``phi_set`` False: the map is the identity (no flush since the old rows'
    last rotation), whatever the buffer holds."""
    EB: tl.constexpr = 32 if BD >= 32 else BD
    for e0 in tl.static_range(0, BD, EB):
        e = e0 + tl.arange(0, EB)
        eye = tl.where(e[:, None] == d[None, :], 1.0, 0.0)
        P = tl.where(phi_set, _load_frame_map(phi_base, e0, EB, D, BD, d, dmask), eye)
        P = P - _fdot(_fdot(P, tl.trans(Wm), F32), M, F32)
        tl.store(phi_base + e[:, None] * D + d[None, :], P, mask=(e < D)[:, None] & dmask[None, :])


@triton.jit
def _query_operand(Z, cdt: tl.constexpr, ROWWISE: tl.constexpr, F32: tl.constexpr, INTERP: tl.constexpr):
    """Frame queries Z (fp32) as the logit product takes them: fp32 for row reductions and fp32 products, else
    rounded to the cache dtype (tensor-core operands)."""
    if ROWWISE:
        out = Z
    elif F32:
        out = Z
    else:
        out = _to_cache(Z, cdt, INTERP)
    return out


@triton.jit
def _qk(Zq, K, ROWWISE: tl.constexpr, F32: tl.constexpr, INTERP: tl.constexpr):
    """Logits [R, rows] of the frame queries Zq [R, BD] against a key tile K [rows, BD] (unscaled)."""
    if ROWWISE:
        s = tl.sum(K.to(tl.float32) * Zq, axis=1)[None, :]
    else:
        s = _dot(Zq, tl.trans(K), F32, INTERP)
    return s


@triton.jit
def _pv(p, V, ROWWISE: tl.constexpr, F32: tl.constexpr, INTERP: tl.constexpr):
    """p [R, rows] fp32 times V [rows, BDV] -> [R, BDV] fp32."""
    if ROWWISE:
        o = tl.sum(tl.sum(p, axis=0)[:, None] * V.to(tl.float32), axis=0)[None, :]
    elif F32:
        o = _dot(p, V, F32, INTERP)
    else:
        o = _dot(_to_cache(p, V.dtype, INTERP), V, F32, INTERP)
    return o


@triton.jit
def _merge_splits(m_part, l_part, acc_part, o_ptr, lse_ptr, pid, b, h, n_splits, H: tl.constexpr,
                  G: tl.constexpr, DV: tl.constexpr, BDV: tl.constexpr, TN: tl.constexpr, R: tl.constexpr,
                  STORE_LSE: tl.constexpr, INTERP: tl.constexpr):
    """Combine the split partials of one (batch, kv head) ``pid``: o [B, TN, H*G, DV] in o's dtype, lse
    [B, TN, H*G] (natural log, with STORE_LSE).  The partials of other programs are loaded from L2 (.cg)."""
    HQ: tl.constexpr = H * G
    r = tl.arange(0, R)
    dv = tl.arange(0, BDV)
    base = pid * n_splits
    m = tl.full([R], _NEG, tl.float32)
    for s in range(0, n_splits):
        m = tl.maximum(m, tl.load(m_part + (base + s) * R + r, cache_modifier=".cg"))
    l_sum = tl.zeros([R], tl.float32)
    acc = tl.zeros([R, BDV], tl.float32)
    for s in range(0, n_splits):
        wgt = tl.exp2(tl.load(m_part + (base + s) * R + r, cache_modifier=".cg") - m)
        l_sum += wgt * tl.load(l_part + (base + s) * R + r, cache_modifier=".cg")
        acc += wgt[:, None] * tl.load(acc_part + ((base + s) * R + r)[:, None] * BDV + dv[None, :],
                                      cache_modifier=".cg")
    rvalid = r < TN * G
    l_sum = tl.where(rvalid, l_sum, 1.0)  # padding rows hold no keys
    o = acc / l_sum[:, None]
    row = (b * TN + r // G) * HQ + h * G + r % G
    tl.store(o_ptr + row[:, None] * DV + dv[None, :], _to_cache(o, o_ptr.dtype.element_ty, INTERP),
             mask=rvalid[:, None] & (dv < DV)[None, :])
    if STORE_LSE:
        tl.store(lse_ptr + row, (m + tl.log2(l_sum)) * 0.6931471805599453, mask=rvalid)


# the capacity changes when a growable cache grows: no per-value specialisation (a recompile per size class)
@triton.jit(do_not_specialize=["max_len", "n_splits"])
def decode_kernel(
    q_ptr, knew_ptr, vnew_ptr, w_ptr, beta_ptr, g_ptr, k_ptr, v_ptr, c_ptr, ch_ptr, st_ptr, pw_ptr, pb_ptr, phi_ptr,
    m_part, l_part, acc_part, o_ptr, lse_ptr, cnt_ptr,
    max_len, n_splits,
    qk_scale, gate_scale,
    H: tl.constexpr, G: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr,
    BDV: tl.constexpr, TN: tl.constexpr, TNP: tl.constexpr, GP: tl.constexpr, R: tl.constexpr,
    BLOCK_N: tl.constexpr, ROWWISE: tl.constexpr, F32: tl.constexpr, USE_GATE: tl.constexpr,
    BETA_MAX: tl.constexpr, OFF64: tl.constexpr, INTERP: tl.constexpr, W: tl.constexpr, WS: tl.constexpr,
    PB: tl.constexpr, STORE_LSE: tl.constexpr, FB: tl.constexpr = 0, FA: tl.constexpr = 512,
    STAGES: tl.constexpr = None,
):
    """One split of one (batch, kv head): partial softmax over its frame tiles (+ the pending block on the last
    split); on a flush step, a second pass over the split's frame rows rotates them (compact WY form) and writes
    them back.

    New tokens: q [B, TN, H*G, D], k [B, TN, H, D], v [B, TN, H, DV], w [B, TN, H, D], beta [B, TN, H],
    g [B, TN, H*G] (contiguous; w / beta / g in any float dtype, converted to fp32 here).  Cache:
    k [B, max_len, H, D], v [B, max_len, H, DV], c [B, max_len, H*G] fp32 (contiguous: constexpr row strides) and
    its head-major copy ch [B, H*G, max_len] (rows < L valid; the tile loops read the keys' offsets there);
    st = (L, F, F1, FP) int32 on the device; window w [B, WS, H, D] fp32, beta [B, WS, H] fp32 (clipped).
    FB > 0 (the frame bound): two frame levels, with rows < F1 (a multiple of FA, itself a multiple of BLOCK_N) in
    the frame of position FP-1 and phi [B*H, D, D] fp32 = H_FP .. H_{F-1}, read when
    F1 > 0 and FP < F; FB = 0: one level (F1, FP and phi unread).
    Query row r = t * G + g (token t, head h*G + g); rows >= TN*G are padding.  PB >= W + TN (power of two):
    the pending block.  Partials: m/l [B*H, n_splits, R], acc [B*H, n_splits, R, BDV] (fp32, base-2 logits).
    Outputs: o [B, TN, H*G, DV], lse [B, TN, H*G] (natural log, with STORE_LSE), written by the last split of the
    (batch, kv head) to arrive (``_merge_splits``).  cnt: int32 [B*H + 1], zero before and after the launch:
    the arrival counters of each (batch, kv head), then the count of merged (batch, kv head)s.
    STAGES: software-pipelining stages of the key-tile loop (None: the loop as written).
    """
    pid = tl.program_id(0)
    split = tl.program_id(1)
    L = tl.minimum(tl.load(st_ptr), max_len)
    F = tl.minimum(tl.load(st_ptr + 1), L)
    N = tl.minimum(L + TN, max_len)
    P = L - F            # pending rows of earlier steps
    NP = N - F           # pending rows including this step's
    flush = _flushes(L, F, TN, W)
    if FB > 0:
        # two frame levels: rows < F1 ("old") in the frame of position FP-1, mapped to frame F-1 by phi;
        # a flush that would leave more than FB rows past F1 rotates every row ("big")
        F1 = tl.minimum(tl.load(st_ptr + 2), F)
        FP = tl.minimum(tl.load(st_ptr + 3), F)
        big = _rotates_all(flush, N, F1, FB)
        phi_on = (FP < F) & (F1 > 0)
        phi_base = phi_ptr + pid.to(tl.int64) * (D * D)
    own = split == n_splits - 1
    b = (pid // H).to(tl.int64)
    h = pid % H
    HQ: tl.constexpr = H * G
    d = tl.arange(0, BD)
    dv = tl.arange(0, BDV)
    dmask = d < D
    dvmask = dv < DV
    cdt = k_ptr.dtype.element_ty
    k_base = k_ptr + b * max_len * (H * D) + h * D
    v_base = v_ptr + b * max_len * (H * DV) + h * DV
    c_base = c_ptr + b * max_len * HQ
    ch_base = ch_ptr + b * max_len * HQ
    wb = w_ptr + (b * TN * H + h) * D
    bb = beta_ptr + b * TN * H + h
    pw_base = pw_ptr + (b * WS * H + h) * D
    pb_base = pb_ptr + b * WS * H + h
    rn = tl.arange(0, BLOCK_N)
    n_tiles = tl.cdiv(F, BLOCK_N)
    tiles_per_split = tl.cdiv(n_tiles, n_splits)
    t_lo = split * tiles_per_split
    t_hi = tl.minimum(t_lo + tiles_per_split, n_tiles)
    part = pid * n_splits + split

    # the pending owner appends the new rows (raw) and, unless this step flushes, their window slots
    _append_rows(knew_ptr, vnew_ptr, g_ptr, k_base, v_base, c_base, ch_base, max_len, b, h, L, N,
                 tl.where(own, L, N), N,
                 H, G, D, DV, BD, BDV, TN, TNP, GP, USE_GATE, OFF64, INTERP)
    tn = tl.arange(0, TNP)
    wm = own & (P + TN <= W) & (tn < TN) & (L + tn < N)
    wnew = tl.load(wb + tn[:, None] * (H * D) + d[None, :], mask=wm[:, None] & dmask[None, :], other=0.0)
    tl.store(pw_base + (P + tn)[:, None] * (H * D) + d[None, :], wnew.to(tl.float32),
             mask=wm[:, None] & dmask[None, :])
    bnew = tl.minimum(tl.load(bb + tn * H, mask=wm, other=0.0).to(tl.float32), BETA_MAX)
    tl.store(pb_base + (P + tn) * H, bnew, mask=wm)
    tl.debug_barrier()  # the new rows are read back by other threads of this program

    r = tl.arange(0, R)
    t_r = r // G
    rvalid = r < TN * G
    hq_r = h * G + r % G
    ipos = L + t_r
    Z = tl.load(q_ptr + ((b * TN + t_r) * HQ + hq_r)[:, None] * D + d[None, :],
                mask=rvalid[:, None] & dmask[None, :], other=0.0).to(tl.float32)
    if USE_GATE:
        prev = (L - 1).to(tl.int64) if OFF64 else L - 1
        c_i = tl.load(c_base + prev * HQ + hq_r, mask=rvalid & (L > 0), other=0.0)
        for si in tl.static_range(TN):
            c_i += tl.load(g_ptr + (b * TN + si) * HQ + hq_r, mask=rvalid & (t_r >= si), other=0.0).to(tl.float32)
    Z, S = _walk(Z, ipos, rvalid, k_base, F, NP, own, pw_base, pb_base, wb, bb, P, H, D, d, dmask, R, PB,
                 BETA_MAX, OFF64)

    # the pending block (the owner only; elsewhere every entry is masked)
    col = tl.arange(0, PB)
    prow = F + col
    pmask = (col < NP) & own
    pr = prow.to(tl.int64) if OFF64 else prow
    S = S * qk_scale
    if USE_GATE:
        cp_j = tl.load(_heads_at(ch_base, hq_r[:, None], pr[None, :], max_len, OFF64),
                       mask=rvalid[:, None] & pmask[None, :], other=0.0)
        S += (c_i[:, None] - cp_j) * gate_scale
    S = tl.where(rvalid[:, None] & pmask[None, :] & (prow[None, :] <= ipos[:, None]), S, float("-inf"))
    m_i = tl.maximum(tl.full([R], _NEG, tl.float32), tl.max(S, axis=1))
    pp = tl.exp2(S - m_i[:, None])
    l_i = tl.sum(pp, axis=1)
    Vp = tl.load(v_base + pr[:, None] * (H * DV) + dv[None, :], mask=pmask[:, None] & dvmask[None, :], other=0.0)
    acc = _pv(pp, Vp, ROWWISE, F32, INTERP)

    # the frame tiles: rows [0, F) of this split
    Zq = _query_operand(Z, cdt, ROWWISE, F32, INTERP)
    if FB > 0:
        Zo = Zq     # the old rows' queries: Zq while the frame map is the identity
        if phi_on & (t_lo * BLOCK_N < F1):
            Zo = _query_operand(_old_frame_queries(Z, phi_base, R, D, BD, d, dmask, ROWWISE, F32), cdt, ROWWISE,
                                F32, INTERP)
    for tile in tl.range(t_lo, t_hi, num_stages=STAGES):
        n = tile * BLOCK_N + rn
        if FB > 0:
            Zt = tl.where(tile * BLOCK_N < F1, Zo, Zq)   # F1 is a multiple of BLOCK_N: a tile is old or recent
        else:
            Zt = Zq
        nmask = n < F
        nr = n.to(tl.int64) if OFF64 else n
        koff = nr[:, None] * (H * D) + d[None, :]
        K = tl.load(k_base + koff, mask=nmask[:, None] & dmask[None, :], other=0.0)
        if ROWWISE and USE_GATE:
            # one query row (head h): the keys' gate offsets as one vector along the tile, added to the row
            # reduction before it becomes the [1, BLOCK_N] logits (a [1, BLOCK_N] gather of them cost the
            # gated step 7-23 % over the ungated one on the H200; this way 0-12 %)
            c_v = tl.load(_heads_at(ch_base, h * G, nr, max_len, OFF64), mask=nmask, other=0.0)
            s = (tl.sum(K.to(tl.float32) * Zt, axis=1) * qk_scale + (tl.sum(c_i, axis=0) - c_v) * gate_scale)[None, :]
        else:
            s = _qk(Zt, K, ROWWISE, F32, INTERP) * qk_scale
        V = tl.load(v_base + nr[:, None] * (H * DV) + dv[None, :], mask=nmask[:, None] & dvmask[None, :],
                    other=0.0)
        if USE_GATE and not ROWWISE:
            if G == 1:   # one query head per kv head: every row of the tile reads the same keys' offsets
                c_v = tl.load(_heads_at(ch_base, h, nr, max_len, OFF64), mask=nmask, other=0.0)
                s += (c_i[:, None] - c_v[None, :]) * gate_scale
            else:
                c_j = tl.load(_heads_at(ch_base, hq_r[:, None], nr[None, :], max_len, OFF64),
                              mask=rvalid[:, None] & nmask[None, :],
                              other=0.0)
                s += (c_i[:, None] - c_j) * gate_scale
        s = tl.where(rvalid[:, None] & nmask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + _pv(p, V, ROWWISE, F32, INTERP)
        m_i = m_new
    tl.store(m_part + part * R + r, m_i)
    tl.store(l_part + part * R + r, l_i)
    tl.store(acc_part + (part * R + r)[:, None] * BDV + dv[None, :], acc)
    if flush:
        # the split's frame rows, rotated by all NP transitions at once (compact WY form) in a second pass,
        # after the loop above has read them; blocks of ROT_ROWS rows (128 at BD = 64, 64 at BD = 128): a few
        # large products per program rather than many small dependent load -> product -> store rounds
        ROT_ROWS: tl.constexpr = 8192 // BD if BD <= 128 else 16
        rr = tl.arange(0, ROT_ROWS)
        row_hi = tl.minimum(t_hi * BLOCK_N, F)
        row_lo = t_lo * BLOCK_N
        tl.debug_barrier()  # every thread of this program is past its last read of these rows
        if FB > 0:
            if big & phi_on:
                # a big flush carries the old rows into frame F-1 first (k <- k Phi), in a pass of their own so that
                # the map and the WY factors are never live together
                _rotate_old_rows(k_base, phi_base, row_lo, tl.minimum(row_hi, F1), H, D, BD, d, dmask, ROT_ROWS,
                                 F32, OFF64, INTERP)
                tl.debug_barrier()
            # a flush that is not big rotates the recent rows only (the old ones keep their frame: phi takes the
            # transitions)
            row_lo = tl.where(big, row_lo, tl.maximum(row_lo, F1))
        Wm, M = _wy(F, NP, pw_base, pb_base, wb, bb, P, H, D, d, dmask, PB, BETA_MAX, F32)
        if own:   # the pending rows (read by the walk and the pending block above, before the barrier)
            kpoff = pr[:, None] * (H * D) + d[None, :]
            Kp = tl.load(k_base + kpoff, mask=pmask[:, None] & dmask[None, :], other=0.0).to(tl.float32)
            Kp = _rotate_pending(Kp, Wm, M, PB, cdt == tl.bfloat16, F32)
            tl.store(k_base + kpoff, _to_cache(Kp, cdt, INTERP), mask=pmask[:, None] & dmask[None, :])
        for r0 in range(row_lo, row_hi, ROT_ROWS):
            kr = r0 + rr
            kmask = (kr < row_hi)[:, None] & dmask[None, :]
            kro = kr.to(tl.int64) if OFF64 else kr
            kroff = kro[:, None] * (H * D) + d[None, :]
            Kf = tl.load(k_base + kroff, mask=kmask, other=0.0).to(tl.float32)
            Kf = Kf - _kdot(_kdot(Kf, tl.trans(Wm), cdt == tl.bfloat16, F32), M, cdt == tl.bfloat16, F32)
            tl.store(k_base + kroff, _to_cache(Kf, cdt, INTERP), mask=kmask)

    # arrival: the last split of this (batch, kv head) to finish merges the partials of all its splits.  The
    # barrier puts every thread's partial stores before the counter's (acq_rel, gpu-scope) increment, whose
    # release publishes them; the merging program's acquire (its result reaches every thread through a
    # barrier) puts its loads after every split's stores.
    tl.debug_barrier()
    arrived = tl.atomic_add(cnt_ptr + pid, 1)
    if arrived == n_splits - 1:
        tl.debug_barrier()
        _merge_splits(m_part, l_part, acc_part, o_ptr, lse_ptr, pid, b, h, n_splits, H, G, DV, BDV, TN, R,
                      STORE_LSE, INTERP)
        if FB > 0:
            # every split of this (batch, kv head) has read phi by now: a flush that keeps old rows folds its
            # transitions into it (a big one leaves FP = F, which makes the map the identity)
            if flush & (F1 > 0) & (big == 0):
                # the factors again rather than kept live from the flush pass: that raised the kernel's spills
                Wu, Mu = _wy(F, NP, pw_base, pb_base, wb, bb, P, H, D, d, dmask, PB, BETA_MAX, F32)
                _update_frame_map(phi_base, Wu, Mu, phi_on, D, BD, d, dmask, F32)
        tl.store(cnt_ptr + pid, 0)  # every split has arrived: the counter is free for the next step
        # the device state, advanced by the last (batch, kv head) to merge: by then every program of the grid
        # has read it (each read it before its arrival, which precedes its merge, which precedes this count)
        n_heads = tl.num_programs(0)
        tl.debug_barrier()
        merged = tl.atomic_add(cnt_ptr + n_heads, 1)
        if merged == n_heads - 1:
            tl.store(cnt_ptr + n_heads, 0)
            L_raw = tl.load(st_ptr)
            F_raw = tl.load(st_ptr + 1)
            L_st = tl.minimum(L_raw, max_len)
            F_st = tl.minimum(F_raw, L_st)
            N_st = tl.minimum(L_st + TN, max_len)
            flush_st = _flushes(L_st, F_st, TN, W)
            tl.store(st_ptr + 1, tl.where(flush_st, N_st, F_raw))
            if FB > 0:
                # a big flush: every row is in frame N-1; the old rows end at the last multiple of FA
                F1_st = tl.minimum(tl.load(st_ptr + 2), F_st)
                big_st = _rotates_all(flush_st, N_st, F1_st, FB)
                tl.store(st_ptr + 2, tl.where(big_st, (N_st // FA) * FA, F1_st))
                tl.store(st_ptr + 3, tl.where(big_st, N_st, tl.load(st_ptr + 3)))
            tl.store(st_ptr, L_raw + TN)


@dataclass(frozen=True)
class TritonDecodeParams(TritonParams):
    """``TritonParams`` plus the knobs only the decode step reads (declared here, so that they key the decode
    pass's source hash alone); ``resolve("triton", "decode", ...)`` builds it (``codegen/_knobs.py``)."""

    decode_frame_bound: int = spec_default("decode_frame_bound")


FRAME_ALIGN = max(v for v in load_spec().knobs["decode_block_n"].domain)   # F1's alignment: every key tile divides it


@functools.lru_cache(maxsize=256)
def _params_cached(key) -> TritonDecodeParams:
    if key[0] == "heuristic":
        return resolve("triton", "decode", None, (key[1], key[2]))
    return TritonDecodeParams.from_config(dict(key[1]))


def decode_params(config, head_dim: int, head_dim_v: int) -> TritonDecodeParams:
    """TritonDecodeParams for a decode launch: ``config`` (spec Config / mapping / TritonParams, whose decode-only
    knobs then take the spec's defaults) or the heuristic.

    Memoised (a decode step is short; building the dataclass costs ~20 us of host time per call)."""
    if config is None:
        return _params_cached(("heuristic", head_dim, head_dim_v))
    if isinstance(config, TritonDecodeParams):
        return config
    if isinstance(config, TritonParams):
        config = asdict(config)
    try:
        items = tuple(sorted(dict(config).items()))
        hash(items)
    except TypeError:  # unhashable knob values: no memo
        return TritonDecodeParams.from_config(config)
    return _params_cached(("config", items))


def decode_loop_stages(params: TritonParams) -> Optional[int]:
    """``STAGES`` of decode_kernel for the decode_num_stages knob: 1 (the default) leaves the tile loop
    as it was before the knob existed (no ``tt.num_stages`` on the loop), k > 1 pipelines it k deep."""
    stages = int(params.decode_num_stages)
    return stages if stages > 1 else None


def decode_layout(T_new: int, G: int) -> tuple[bool, int]:
    """(rowwise, R): rows of query per program (padded to a power of two >= 16 for tensor-core products)."""
    rows = T_new * G
    if rows == 1:
        return True, 1
    return False, padded_dim(rows)


_FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)


def _check_decode_args(q, k, v, w, beta, g, cache):
    """Shape/dtype/device checks of a decode step against the cache (clear ValueErrors)."""
    if not isinstance(cache, PaTHKVCache):
        raise TypeError(f"cache must be a pathtune.PaTHKVCache, got {type(cache).__name__}")
    for name, t in (("q", q), ("k", k), ("v", v), ("w", w), ("beta", beta)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4 or w.dim() != 4 or beta.dim() != 3:
        raise ValueError("decode inputs must be q [B,T,HQ,D], k/w [B,T,H,D], v [B,T,H,DV], beta [B,T,H], "
                         f"g [B,T,HQ]; got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, "
                         f"w {tuple(w.shape)}, beta {tuple(beta.shape)}")
    B, T, HQ, D = q.shape
    Bc, _, H, Dc = cache.k_buffer.shape
    DV = cache.v.shape[-1]
    if T < 1:
        raise ValueError("a decode step needs at least one token (q.shape[1] >= 1)")
    if (B, HQ, D) != (Bc, cache.num_q_heads, Dc):
        raise ValueError(f"q is [B,T,HQ,D] = {tuple(q.shape)} but the cache holds B={Bc}, HQ={cache.num_q_heads}, "
                         f"D={Dc}; pass tokens of the sequence batch the cache was built for")
    for name, t, want in (("k", k, (B, T, H, D)), ("w", w, (B, T, H, D)), ("v", v, (B, T, H, DV)),
                          ("beta", beta, (B, T, H))):
        if tuple(t.shape) != want:
            raise ValueError(f"{name} must be {list(want)} (from q and the cache: H={H}, D={D}, DV={DV}), "
                             f"got {tuple(t.shape)}")
    if (g is None) != (cache.c is None):
        raise ValueError("g must be given iff the cache is gated (PaTH-FoX): the cache "
                         + ("holds a gate cumsum, pass g [B,T,HQ]" if cache.c is not None
                            else "was built without a gate, pass g=None"))
    if g is not None and tuple(g.shape) != (B, T, HQ):
        raise ValueError(f"g must be [B,T,HQ] = {[B, T, HQ]}, got {tuple(g.shape)}")
    if HQ % H:
        raise ValueError(f"HQ={HQ} must be a multiple of the cache's kv heads H={H}")
    if not q.is_floating_point() or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v must share one floating dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    for name, t in (("w", w), ("beta", beta), ("g", g)):
        if t is not None and t.dtype not in _FLOAT_DTYPES:
            raise ValueError(f"{name} must be a float tensor (float32 preferred) for the Triton decode kernel, "
                             f"got {t.dtype}")
    if cache.k_buffer.dtype not in _CACHE_DTYPES or cache.v.dtype != cache.k_buffer.dtype:
        raise ValueError(f"the cache must hold k and v in one of bfloat16/float16/float32, got "
                         f"{cache.k_buffer.dtype}/{cache.v.dtype}")
    if cache.c is not None and cache.c.dtype != torch.float32:
        raise ValueError(f"the cache's gate cumsum must be float32 for the Triton decode kernel, got {cache.c.dtype}")
    if q.dtype not in _CACHE_DTYPES:
        raise ValueError(f"q must be bfloat16, float16 or float32 for the Triton decode kernel, got {q.dtype}")
    devs = {t.device for t in (q, k, v, w, beta, g, cache.k_buffer, cache.v, cache.c) if t is not None}
    if len(devs) != 1:
        raise ValueError(f"decode inputs and the cache must be on one device, got {sorted(map(str, devs))}")
    for name, t in (("cache.k", cache.k_buffer), ("cache.v", cache.v), ("cache.c", cache.c)):
        if t is not None and not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous (the kernel updates it in place with constexpr row "
                             f"strides), got strides {t.stride()}; rebuild the cache with PaTHKVCache.empty "
                             "or .contiguous() its tensors")
    return B, T, HQ, H, D, DV


class TritonDecodeStep:
    """A decode step prepared for fixed shapes, dtypes and knobs: ``step(q, k, v, w, beta, g, cache)``.

    Everything that depends only on those (kernel constexprs, scales, split count, launch options, the pending
    window ``window``) is computed once here; a call reserves room in the cache (host-side capacity check, no
    device read), launches ``decode_kernel`` once on a scratch buffer, the arrival counters and the pending
    window the cache keeps, and allocates only the output (and lse with ``return_lse``); what depends on the
    cache's capacity too (grid, scratch sizes, 64-bit offsets) is computed once per capacity. It does not validate
    its inputs: build it with ``path_decode_triton`` / ``prepare`` after ``_check_decode_args``. Inputs that
    are not contiguous are copied. Capturable in a CUDA graph with a static cache (see codegen/kv_cache.py).
    """

    def __init__(self, *, B: int, TN: int, HQ: int, H: int, D: int, DV: int, q_dtype: torch.dtype,
                 gated: bool, f32: bool, params: TritonParams, scale: Optional[float] = None,
                 gate_placement: str = "inside_scale", window: Optional[int] = None) -> None:
        if gate_placement not in ("inside_scale", "outside_scale"):
            raise ValueError(f"gate_placement must be 'inside_scale' or 'outside_scale', got {gate_placement!r}")
        G = HQ // H
        scale = D ** -0.5 if scale is None else float(scale)
        self.B, self.TN, self.HQ, self.H, self.D, self.DV, self.G = B, TN, HQ, H, D, DV, G
        self.q_dtype = q_dtype
        self.rowwise, self.R = decode_layout(TN, G)
        self.block_n = int(params.decode_block_n)
        self.splits = max(1, int(params.decode_splits))
        self.BDV = padded_dim(DV)
        self.num_warps = int(params.decode_num_warps)
        self.qk_scale = scale * _LOG2E
        self.gate_scale = (scale if gate_placement == "inside_scale" else 1.0) * _LOG2E
        self.gated = gated
        self.window = params.decode_pending_window if window is None else int(window)
        if self.window < 0:
            raise ValueError(f"the pending window must be >= 0, got {self.window}")
        self.frame_bound = int(getattr(params, "decode_frame_bound", 0))
        if self.frame_bound and max(D, DV) > 128:
            raise ValueError(f"decode_frame_bound={self.frame_bound} needs head dims up to 128 (the D x D frame map is "
                             f"read whole), got D={D}, DV={DV}: use decode_frame_bound 0")
        self.const = dict(H=H, G=G, D=D, DV=DV, BD=padded_dim(D), BDV=self.BDV, TN=TN, TNP=next_pow2(TN),
                          GP=next_pow2(G), R=self.R, BLOCK_N=self.block_n, ROWWISE=self.rowwise,
                          F32=f32, USE_GATE=gated, BETA_MAX=params.beta_max, INTERP=interpreting(),
                          STAGES=decode_loop_stages(params), W=self.window,
                          PB=padded_dim(self.window + TN), FB=self.frame_bound, FA=FRAME_ALIGN)
        self._wide = max(D, DV, G)
        self._o_shape = (B, TN, HQ, DV)
        self._geo: dict = {}   # capacity -> _geometry(capacity)
        self._options = dict(num_warps=self.num_warps, num_stages=2)
        self._launch = KernelLauncher(sys.modules[__name__], "decode_kernel")   # repeats skip the JIT's binding

    def launch_splits(self, max_len: int) -> int:
        """Splits per (batch, kv head): the knob, capped by the key tiles of the cache's capacity (the grid
        must not depend on the length, which lives on the device)."""
        return min(self.splits, max(1, -(-max_len // self.block_n)))

    def _geometry(self, max_len: int) -> tuple:
        """What a launch on a cache of capacity ``max_len`` needs besides the tensors, computed once per capacity:
        (grid, splits, scratch key, scratch part sizes (m, l, acc), the launch's constexprs but WS and STORE_LSE)."""
        geo = self._geo.get(max_len)
        if geo is None:
            splits = self.launch_splits(max_len)
            nrow = self.B * self.H * splits * self.R
            const = dict(OFF64=max_len * self.H * self._wide >= _OFF64_ELEMS, **self.const)
            geo = self._geo[max_len] = ((self.B * self.H, splits), splits, ("triton_decode_parts", nrow, self.BDV),
                                        (nrow, nrow, nrow * self.BDV), const)
        return geo

    def __call__(self, q, k, v, w, beta, g, cache: PaTHKVCache, *, return_lse: bool = False):
        TN = self.TN
        cache.reserve(TN)
        max_len = cache.max_len
        grid, splits, parts, sizes, const = self._geometry(max_len)
        m_part, l_part, acc_part = cache.workspace_parts(parts, sizes)   # 16-byte aligned views, kept by the cache
        if not q.is_contiguous():
            q = q.contiguous()
        if not k.is_contiguous():
            k = k.contiguous()
        if not v.is_contiguous():
            v = v.contiguous()
        if not w.is_contiguous():
            w = w.contiguous()
        if not beta.is_contiguous():
            beta = beta.contiguous()
        gg = m_part if g is None else (g if g.is_contiguous() else g.contiguous())
        c = cache.c
        ch = cache.gate_heads() if c is not None else m_part
        pw, pb = cache.pending_window(self.window)
        phi = cache.frame_map() if self.frame_bound else m_part
        o = torch.empty(self._o_shape, device=q.device, dtype=self.q_dtype)
        lse = torch.empty(self._o_shape[:3], device=q.device, dtype=torch.float32) if return_lse else m_part
        tensors = (q, k, v, w, beta, gg, cache.k_buffer, cache.v, m_part if c is None else c, ch, cache.state_tensor,
                   pw, pb, phi, m_part, l_part, acc_part, o, lse, cache.arrival_counters)
        WS = pw.shape[1]
        ptrs, key = pointers_and_key(tensors)
        if key is not None:   # what the compiled kernel depends on besides the geometry's constants
            key = (key, max_len, WS, return_lse, torch.cuda.current_device() if q.is_cuda else -1)
        scalars = (max_len, splits, self.qk_scale, self.gate_scale)
        # a repeat hands the compiled launcher the data pointers as ints; the JIT's call takes the tensors, whose
        # types and alignment it specialises on
        if not self._launch.repeat(key, (*ptrs, *scalars)):
            self._launch(grid, (*tensors, *scalars), dict(const, WS=WS, STORE_LSE=return_lse), self._options, key)
        cache.advanced(TN, window=self.window, frame_bound=self.frame_bound, frame_align=FRAME_ALIGN)
        return (o, lse) if return_lse else o


@functools.lru_cache(maxsize=512)
def _step_cached(B, TN, HQ, H, D, DV, q_dtype, gated, f32, params, scale, gate_placement,
                 window) -> TritonDecodeStep:
    return TritonDecodeStep(B=B, TN=TN, HQ=HQ, H=H, D=D, DV=DV, q_dtype=q_dtype, gated=gated, f32=f32,
                            params=params, scale=scale, gate_placement=gate_placement, window=window)


def prepare(q, k, v, w, beta, g, cache, *, scale: Optional[float] = None, config=None,
            gate_placement: str = "inside_scale", window: Optional[int] = None) -> TritonDecodeStep:
    """Validate one decode call's arguments against the cache and return the (memoised) prepared step
    for its shapes, dtypes and knobs; calls with the same metadata may then run the step directly.
    ``window``: the pending window W (None: the config's ``decode_pending_window``)."""
    B, TN, HQ, H, D, DV = _check_decode_args(q, k, v, w, beta, g, cache)
    params = decode_params(config, D, DV)
    ck = cache.k_buffer
    f32 = ck.dtype == torch.float32 or q.dtype != ck.dtype
    return _step_cached(B, TN, HQ, H, D, DV, q.dtype, g is not None, f32, params,
                        None if scale is None else float(scale), gate_placement,
                        params.decode_pending_window if window is None else int(window))


def path_decode_triton(q, k, v, w, beta, g, cache, *, scale: Optional[float] = None, config=None,
                       gate_placement: str = "inside_scale", return_lse: bool = False,
                       window: Optional[int] = None):
    """One PaTH(-FoX) decoding step of T_new >= 1 tokens on the fused Triton kernel (mutates ``cache``).

    q [B,T_new,HQ,D], k/w [B,T_new,H,D], v [B,T_new,H,DV], beta [B,T_new,H], g [B,T_new,HQ] or None
    (w, beta, g float32 preferred; other float dtypes are read as they are); ``cache`` a ``PaTHKVCache``
    (keys in the current frame, k/v in bf16/fp16/fp32, gate cumsum fp32), grown on demand unless static.
    Token t attends causally to the cache and to tokens <= t of this call, exactly as
    ``runtime.reference.path_attention_decode``.
    ``config``: decode knobs (spec Config / mapping / TritonParams; None = heuristic); ``window``: the
    pending window W (None: the config's ``decode_pending_window``; 0 rotates the cache on every step).
    Returns o [B,T_new,HQ,DV] in q's dtype (and lse [B,T_new,HQ] float32 with ``return_lse``).
    """
    step = prepare(q, k, v, w, beta, g, cache, scale=scale, config=config, gate_placement=gate_placement,
                   window=window)
    return step(q, k, v, w, beta, g, cache, return_lse=return_lse)


def decode_compile_specs(params: TritonParams, D: int, DV: int, *, dtype: str = "bf16", gate: bool = True,
                         heads: int = 8, group: int = 1, tokens: int = 1, window: Optional[int] = None):
    """[(fn, signature, constexprs, num_warps, num_stages)] of the decode step's one launch for
    ``compile_check.compile_kernel`` (sm_90 compilation without a GPU), as ``TritonDecodeStep`` launches it."""
    window = params.decode_pending_window if window is None else int(window)
    rowwise, R = decode_layout(tokens, group)
    io = f"*{dtype}"
    f32p = "*fp32"
    sig = {n: io for n in ("q_ptr", "knew_ptr", "vnew_ptr", "k_ptr", "v_ptr", "o_ptr")}
    for n in ("w_ptr", "beta_ptr", "g_ptr", "c_ptr", "ch_ptr", "pw_ptr", "pb_ptr", "phi_ptr", "m_part", "l_part",
              "acc_part", "lse_ptr"):
        sig[n] = f32p
    sig["st_ptr"] = sig["cnt_ptr"] = "*i32"
    sig["max_len"] = sig["n_splits"] = "i32"
    sig["qk_scale"] = sig["gate_scale"] = "fp32"
    BD, BDV = padded_dim(D), padded_dim(DV)
    const = dict(H=heads, G=group, D=D, DV=DV, BD=BD, BDV=BDV, TN=tokens, TNP=next_pow2(tokens),
                 GP=next_pow2(group), R=R, BLOCK_N=params.decode_block_n,
                 ROWWISE=rowwise, F32=dtype == "fp32", USE_GATE=gate, BETA_MAX=params.beta_max, OFF64=False,
                 INTERP=False, STAGES=decode_loop_stages(params), W=window, WS=max(window, 1),
                 PB=padded_dim(window + tokens), STORE_LSE=False,
                 FB=int(getattr(params, "decode_frame_bound", 0)), FA=FRAME_ALIGN)
    return [(decode_kernel, sig, const, params.decode_num_warps, 2)]


def current_frame_keys_triton(k, w, beta, *, params: TritonParams):
    """Keys transported to the last prompt position, out[:, j] = H_{T-1} ... H_{j+1} k_j, fp32 [B,T,H,D].

    The Triton UT stage gives, per chunk of C tokens, the keys adjusted to the chunk end (K~) and
    U = A W (chunk transition P_m = I - W_m^T U_m); one right-to-left walk over the chunks applies
    the running suffix product (low-rank updates of a D x D matrix, batched over B and H): linear in T.
    """
    from .forward import prepare_state

    B, T, H, D = k.shape
    C = params.chunk_size
    q_dummy = k[:, :, :1]  # prepare_state reads only q's shape (gate off)
    state = prepare_state(q_dummy, k, w, beta, None, cu_seqlens=None, params=params)
    nC = triton.cdiv(T, C)
    pad = nC * C - T

    def chunked(x):  # [B*T, H, D] -> [B, H, nC, C, D] (zero rows past T: w = 0, U = 0 means H = I)
        x = x.view(B, T, H, D).permute(0, 2, 1, 3)
        x = torch.nn.functional.pad(x, (0, 0, 0, pad))
        return x.reshape(B, H, nC, C, D)

    kt, u = chunked(state.kt), chunked(state.u)
    wc = chunked(w.float().reshape(B * T, H, D))
    out = torch.empty_like(kt)
    # N = (P_{nC-1} ... P_{m+1})^T, so a key row kt_j^T (column form) maps to kt_j^T N
    Nm = torch.eye(D, device=k.device, dtype=torch.float32).expand(B, H, D, D).contiguous()
    for m in range(nC - 1, -1, -1):
        out[:, :, m] = kt[:, :, m] @ Nm
        # N <- P_m^T N = N - U_m^T (W_m N)
        Nm = Nm - u[:, :, m].transpose(-1, -2) @ (wc[:, :, m] @ Nm)
    return out.reshape(B, H, nC * C, D)[:, :, :T].permute(0, 2, 1, 3)


def path_prefill_triton(q, k, v, w, beta, g=None, *, scale: Optional[float] = None, config=None,
                        max_len: Optional[int] = None, cache_dtype: Optional[torch.dtype] = None,
                        gate_placement: str = "inside_scale", static: bool = False):
    """Prefill on the GPU: outputs of the Triton forward plus a current-frame ``PaTHKVCache``.

    Shapes as ``path_attention_triton`` (equal-length batch).  ``max_len`` (default T) is the cache
    capacity (grown on demand by decoding unless ``static``); ``cache_dtype`` defaults to k's dtype;
    the gate cumsum is float32.  Returns (o [B,T,HQ,DV], cache) with cache.length = T.
    """
    from .autograd import path_attention_triton

    B, T, HQ, D = q.shape
    H, DV = k.shape[2], v.shape[-1]
    cdt = k.dtype if cache_dtype is None else cache_dtype
    if cdt not in _CACHE_DTYPES:
        raise ValueError(f"cache_dtype must be bfloat16, float16 or float32, got {cdt}")
    params = decode_params(config, D, DV)
    o, _ = path_attention_triton(q, k, v, w, beta, g, scale=scale, config=params,
                                 gate_placement=gate_placement)
    cap = T if max_len is None else max(int(max_len), T)
    cache = PaTHKVCache.empty(B, H, D, DV, HQ, max_len=cap, gated=g is not None, dtype=cdt,
                              gate_dtype=torch.float32, device=q.device, static=static)
    with torch.no_grad():
        cache.k[:, :T] = current_frame_keys_triton(k, w, beta, params=params).to(cdt)
        cache.v[:, :T] = v.to(cdt)
        if g is not None:
            cache.c[:, :T] = torch.cumsum(g.float(), dim=1)
    cache.length = T
    cache.gate_heads()    # the Triton step's head-major gate copy, built before any step (or capture) reads it
    return o, cache
