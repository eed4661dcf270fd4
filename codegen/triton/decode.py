"""Fused PaTH(-FoX) decoding step on a current-frame KV cache, plus a GPU prefill that builds one.

Decoding rule (path-math.md §1.7, ``runtime/reference/recurrent.py``): the cache holds keys in the
current frame.  A step with T_new tokens at positions L .. L+T_new-1 first writes their raw keys,
values and gate cumsums into cache rows L.., then, for token t (in order), updates every row
j < L+t in place, ``k_j <- k_j - beta_t (k_j . w_t) w_t``, and lets q_t attend (softmax, scale,
FoX gate c_{L+t} - c_j) over rows j <= L+t.

``decode_kernel`` does all of that in one pass over the cache: grid (B*H, splits); a program owns
a contiguous range of key tiles of one (batch, kv head).  The cache length L is read on the device
(``cache.length_tensor``), and each split derives its tile range from it, so the grid depends only
on the cache's capacity and one launch (or a captured CUDA graph of it) serves any length.  A program
first writes the new tokens' rows that fall in its range (raw k, v; gate cumsums c_{L-1} + g_L + ...),
so the host issues no copies; then per tile it loads K once, applies the
T_new rank-one updates in order (math in fp32, each result rounded to the cache dtype as the
reference stores it), computes the logits of token t right after the update by H_t, writes the
updated K back, loads V, and advances a partial online softmax (m, l, acc) for every query head of
the kv-head group (GQA: K and V are read once per group).  ``decode_merge_kernel`` combines the
splits.  A step with one token and one query head per kv head (MHA) uses row reductions instead of
tensor-core products (no padding of the single query row to 16).  w, beta and g are read in their
own dtype and converted to fp32 in registers.  ``decode_merge_kernel`` also advances the device
length by T_new (after every split has read it), so a step is two launches and no host sync.  Rows
past the capacity are never written (a replayed graph that overflows drops them; the length then
exceeds the capacity, which the cache reports).

Knobs (spec pass ``decode``): decode_block_n (key tile), decode_num_warps, decode_splits (split-K
factor, capped by the number of tiles), decode_num_stages (software pipelining of the key-tile loop),
beta_clip_eps (``TritonParams.beta_max``).
"""
from __future__ import annotations

import functools
from typing import Optional

import torch
import triton
import triton.language as tl

from pathtune.codegen.kv_cache import PaTHKVCache

from ._ops import interpreting, mm
from .params import TritonParams

__all__ = ["decode_kernel", "decode_merge_kernel", "path_decode_triton", "path_prefill_triton",
           "current_frame_keys_triton", "decode_params", "decode_loop_stages", "TritonDecodeStep"]

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
def _append_rows(knew_ptr, vnew_ptr, g_ptr, k_base, v_base, c_base, b, h, L, N, row_lo, row_hi,
                 H: tl.constexpr, G: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr,
                 BDV: tl.constexpr, TN: tl.constexpr, TNP: tl.constexpr, GP: tl.constexpr,
                 USE_GATE: tl.constexpr, OFF64: tl.constexpr, INTERP: tl.constexpr):
    """Write the new tokens' raw keys/values (and gate cumsums) into cache rows L .. L+TN-1 that lie
    in this program's rows [row_lo, row_hi) and below N (the capacity-clamped end); the caller's tile loop
    reads them after a barrier."""
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


# the capacity changes when a growable cache grows: no per-value specialisation (a recompile per size class)
@triton.jit(do_not_specialize=["max_len", "n_splits"])
def decode_kernel(
    q_ptr, knew_ptr, vnew_ptr, w_ptr, beta_ptr, g_ptr, k_ptr, v_ptr, c_ptr, len_ptr,
    m_part, l_part, acc_part,
    max_len, n_splits,
    qk_scale, gate_scale,
    H: tl.constexpr, G: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr,
    BDV: tl.constexpr, TN: tl.constexpr, TNP: tl.constexpr, GP: tl.constexpr, R: tl.constexpr,
    BLOCK_N: tl.constexpr, ROWWISE: tl.constexpr, F32: tl.constexpr, USE_GATE: tl.constexpr,
    BETA_MAX: tl.constexpr, OFF64: tl.constexpr, INTERP: tl.constexpr, STAGES: tl.constexpr = None,
):
    """One split of one (batch, kv head): in-place rank-one updates of its key tiles + partial softmax.

    New tokens: q [B, TN, H*G, D], k [B, TN, H, D], v [B, TN, H, DV], w [B, TN, H, D], beta [B, TN, H],
    g [B, TN, H*G] (contiguous; w / beta / g in any float dtype, converted to fp32 here).  Cache:
    k [B, max_len, H, D], v [B, max_len, H, DV], c [B, max_len, H*G] fp32 (contiguous: the row strides are
    constexpr, so the compiler sees aligned, vectorisable rows); L = len_ptr[0] (int32, on the device):
    rows 0 .. L-1 hold the cache, the new tokens go to rows L .. N-1 (N = L + TN, both clamped to max_len),
    written here by the program that owns them.  Split ``split`` of ``n_splits`` takes the split's share of
    the cdiv(N, BLOCK_N) key tiles (possibly none).  OFF64: row offsets need 64 bits.
    Partials: m/l [B*H, n_splits, R], acc [B*H, n_splits, R, BDV] (fp32, base-2 logits).
    Query row r = t * G + g (token t, head h*G + g); rows >= TN*G are padding.
    STAGES: software-pipelining stages of the key-tile loop (``tl.range(num_stages=)``: the loads of
    later tiles are issued while one tile is processed); None leaves the loop as written (Triton then
    pipelines only the loads that feed a tensor-core product, by the launch's num_stages).
    """
    pid = tl.program_id(0)
    split = tl.program_id(1)
    L = tl.minimum(tl.load(len_ptr), max_len)
    N = tl.minimum(L + TN, max_len)
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
    wb = w_ptr + (b * TN * H + h) * D
    bb = beta_ptr + b * TN * H + h
    rn = tl.arange(0, BLOCK_N)
    n_tiles = tl.cdiv(N, BLOCK_N)
    tiles_per_split = tl.cdiv(n_tiles, n_splits)
    t_lo = split * tiles_per_split
    t_hi = tl.minimum(t_lo + tiles_per_split, n_tiles)
    part = pid * n_splits + split

    _append_rows(knew_ptr, vnew_ptr, g_ptr, k_base, v_base, c_base, b, h, L, N, t_lo * BLOCK_N, t_hi * BLOCK_N,
                 H, G, D, DV, BD, BDV, TN, TNP, GP, USE_GATE, OFF64, INTERP)
    tl.debug_barrier()  # the new rows are read back by other threads of this program

    if ROWWISE:
        # TN == 1, G == 1: one query row; logits and P.V by row reductions
        qv = tl.load(q_ptr + (b * HQ + h) * D + d, mask=dmask, other=0.0).to(tl.float32)
        w0 = tl.load(wb + d, mask=dmask, other=0.0).to(tl.float32)
        beta0 = tl.minimum(tl.load(bb).to(tl.float32), BETA_MAX)
        if USE_GATE:
            prev = (L - 1).to(tl.int64) if OFF64 else L - 1
            c_prev = tl.load(c_base + prev * HQ + h, mask=L > 0, other=0.0)
            c_i = c_prev + tl.load(g_ptr + b * HQ + h).to(tl.float32)
        m_i = tl.full([1], _NEG, tl.float32)
        l_i = tl.zeros([1], tl.float32)
        acc = tl.zeros([BDV], tl.float32)
        for tile in tl.range(t_lo, t_hi, num_stages=STAGES):
            n = tile * BLOCK_N + rn
            nmask = n < N
            nr = n.to(tl.int64) if OFF64 else n
            koff = nr[:, None] * (H * D) + d[None, :]
            K = tl.load(k_base + koff, mask=nmask[:, None] & dmask[None, :], other=0.0).to(tl.float32)
            V = tl.load(v_base + nr[:, None] * (H * DV) + dv[None, :], mask=nmask[:, None] & dvmask[None, :],
                        other=0.0)
            upd = n < L
            a = tl.where(upd, beta0 * tl.sum(K * w0[None, :], axis=1), 0.0)
            Kc = _to_cache(K - a[:, None] * w0[None, :], cdt, INTERP)
            tl.store(k_base + koff, Kc, mask=upd[:, None] & dmask[None, :])
            s = tl.sum(Kc.to(tl.float32) * qv[None, :], axis=1) * qk_scale
            if USE_GATE:
                c_j = tl.load(c_base + nr * HQ + h, mask=nmask, other=0.0)
                s += (c_i - c_j) * gate_scale
            s = tl.where(nmask, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=0))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new)
            l_i = l_i * alpha + tl.sum(p, axis=0)
            acc = acc * alpha + tl.sum(p[:, None] * V.to(tl.float32), axis=0)
            m_i = m_new
        r1 = tl.arange(0, 1)
        tl.store(m_part + part + r1, m_i)
        tl.store(l_part + part + r1, l_i)
        tl.store(acc_part + part * BDV + dv, acc)
    else:
        r = tl.arange(0, R)
        t_r = r // G
        rvalid = r < TN * G
        hq_r = h * G + r % G
        pos_r = L + t_r
        Q = tl.load(q_ptr + ((b * TN + t_r) * HQ + hq_r)[:, None] * D + d[None, :],
                    mask=rvalid[:, None] & dmask[None, :], other=0.0)
        if F32:
            Q = Q.to(tl.float32)
        if USE_GATE:
            prev = (L - 1).to(tl.int64) if OFF64 else L - 1
            c_i = tl.load(c_base + prev * HQ + hq_r, mask=rvalid & (L > 0), other=0.0)
            for si in tl.static_range(TN):
                c_i += tl.load(g_ptr + (b * TN + si) * HQ + hq_r, mask=rvalid & (t_r >= si), other=0.0).to(tl.float32)
        m_i = tl.full([R], _NEG, tl.float32)
        l_i = tl.zeros([R], tl.float32)
        acc = tl.zeros([R, BDV], tl.float32)
        for tile in tl.range(t_lo, t_hi, num_stages=STAGES):
            n = tile * BLOCK_N + rn
            nmask = n < N
            nr = n.to(tl.int64) if OFF64 else n
            koff = nr[:, None] * (H * D) + d[None, :]
            Kc = tl.load(k_base + koff, mask=nmask[:, None] & dmask[None, :], other=0.0)
            V = tl.load(v_base + nr[:, None] * (H * DV) + dv[None, :], mask=nmask[:, None] & dvmask[None, :],
                        other=0.0)
            s = tl.zeros([R, BLOCK_N], tl.float32)
            for t in tl.static_range(TN):  # keys carried in the cache dtype between the updates
                K = Kc.to(tl.float32)
                wt = tl.load(wb + t * H * D + d, mask=dmask, other=0.0).to(tl.float32)
                bt = tl.minimum(tl.load(bb + t * H).to(tl.float32), BETA_MAX)
                a = tl.where(n < L + t, bt * tl.sum(K * wt[None, :], axis=1), 0.0)
                Kc = _to_cache(K - a[:, None] * wt[None, :], cdt, INTERP)
                st = _dot(Q, tl.trans(Kc), F32, INTERP)
                if TN == 1:
                    s = st
                else:
                    s = tl.where((t_r == t)[:, None], st, s)
            tl.store(k_base + koff, Kc, mask=((n < L + TN - 1) & nmask)[:, None] & dmask[None, :])
            s = s * qk_scale
            if USE_GATE:
                c_j = tl.load(c_base + nr[None, :] * HQ + hq_r[:, None],
                              mask=rvalid[:, None] & nmask[None, :], other=0.0)
                s += (c_i[:, None] - c_j) * gate_scale
            valid = rvalid[:, None] & nmask[None, :] & (n[None, :] <= pos_r[:, None])
            s = tl.where(valid, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            if F32:
                pv = _dot(p, V, F32, INTERP)
            else:
                pv = _dot(_to_cache(p, V.dtype, INTERP), V, F32, INTERP)
            acc = acc * alpha[:, None] + pv
            m_i = m_new
        tl.store(m_part + part * R + r, m_i)
        tl.store(l_part + part * R + r, l_i)
        tl.store(acc_part + (part * R + r)[:, None] * BDV + dv[None, :], acc)


@triton.jit(do_not_specialize=["n_splits"])
def decode_merge_kernel(
    m_part, l_part, acc_part, o_ptr, lse_ptr, len_ptr, n_splits,
    H: tl.constexpr, G: tl.constexpr, DV: tl.constexpr, BDV: tl.constexpr, TN: tl.constexpr,
    R: tl.constexpr, STORE_LSE: tl.constexpr, INTERP: tl.constexpr,
):
    """Combine the split partials of one (batch, kv head): o [B, TN, H*G, DV], lse [B, TN, H*G] (natural log,
    with STORE_LSE); program 0 advances the device cache length by TN (decode_kernel has finished reading it)."""
    pid = tl.program_id(0)
    b = (pid // H).to(tl.int64)
    h = pid % H
    HQ: tl.constexpr = H * G
    r = tl.arange(0, R)
    dv = tl.arange(0, BDV)
    base = pid * n_splits
    m = tl.full([R], _NEG, tl.float32)
    for s in range(0, n_splits):
        m = tl.maximum(m, tl.load(m_part + (base + s) * R + r))
    l_sum = tl.zeros([R], tl.float32)
    acc = tl.zeros([R, BDV], tl.float32)
    for s in range(0, n_splits):
        wgt = tl.exp2(tl.load(m_part + (base + s) * R + r) - m)
        l_sum += wgt * tl.load(l_part + (base + s) * R + r)
        acc += wgt[:, None] * tl.load(acc_part + ((base + s) * R + r)[:, None] * BDV + dv[None, :])
    rvalid = r < TN * G
    l_sum = tl.where(rvalid, l_sum, 1.0)  # padding rows hold no keys
    o = acc / l_sum[:, None]
    row = (b * TN + r // G) * HQ + h * G + r % G
    tl.store(o_ptr + row[:, None] * DV + dv[None, :], _to_cache(o, o_ptr.dtype.element_ty, INTERP),
             mask=rvalid[:, None] & (dv < DV)[None, :])
    if STORE_LSE:
        tl.store(lse_ptr + row, (m + tl.log2(l_sum)) * 0.6931471805599453, mask=rvalid)
    if pid == 0:
        tl.store(len_ptr, tl.load(len_ptr) + TN)


def _pow2(x: int) -> int:
    return max(16, triton.next_power_of_2(x))


@functools.lru_cache(maxsize=256)
def _params_cached(key) -> TritonParams:
    if key[0] == "heuristic":
        return TritonParams.heuristic(key[1], key[2])
    return TritonParams.from_config(dict(key[1]))


def decode_params(config, head_dim: int, head_dim_v: int) -> TritonParams:
    """TritonParams for a decode launch: ``config`` (spec Config / mapping / TritonParams) or the heuristic.

    Memoised (a decode step is short; building the dataclass costs ~20 us of host time per call)."""
    if config is None:
        return _params_cached(("heuristic", head_dim, head_dim_v))
    if isinstance(config, TritonParams):
        return config
    try:
        items = tuple(sorted(dict(config).items()))
        hash(items)
    except TypeError:  # unhashable knob values: no memo
        return TritonParams.from_config(config)
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
    return False, _pow2(rows)


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
    Bc, _, H, Dc = cache.k.shape
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
    if cache.k.dtype not in _CACHE_DTYPES or cache.v.dtype != cache.k.dtype:
        raise ValueError(f"the cache must hold k and v in one of bfloat16/float16/float32, got "
                         f"{cache.k.dtype}/{cache.v.dtype}")
    if cache.c is not None and cache.c.dtype != torch.float32:
        raise ValueError(f"the cache's gate cumsum must be float32 for the Triton decode kernel, got {cache.c.dtype}")
    if q.dtype not in _CACHE_DTYPES:
        raise ValueError(f"q must be bfloat16, float16 or float32 for the Triton decode kernel, got {q.dtype}")
    devs = {t.device for t in (q, k, v, w, beta, g, cache.k, cache.v, cache.c) if t is not None}
    if len(devs) != 1:
        raise ValueError(f"decode inputs and the cache must be on one device, got {sorted(map(str, devs))}")
    for name, t in (("cache.k", cache.k), ("cache.v", cache.v), ("cache.c", cache.c)):
        if t is not None and not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous (the kernel updates it in place with constexpr row "
                             f"strides), got strides {t.stride()}; rebuild the cache with PaTHKVCache.empty "
                             "or .contiguous() its tensors")
    return B, T, HQ, H, D, DV


class TritonDecodeStep:
    """A decode step prepared for fixed shapes, dtypes and knobs: ``step(q, k, v, w, beta, g, cache)``.

    Everything that depends only on those (kernel constexprs, scales, split count, launch options) is
    computed once here; a call reserves room in the cache (host-side capacity check, no device read),
    launches ``decode_kernel`` and ``decode_merge_kernel`` on a scratch buffer the cache keeps, and
    allocates only the output (and lse with ``return_lse``). It does not validate its inputs: build it
    with ``path_decode_triton`` / ``prepare`` after ``_check_decode_args``. Inputs that are not contiguous
    are copied. Capturable in a CUDA graph with a static cache (see codegen/kv_cache.py).
    """

    def __init__(self, *, B: int, TN: int, HQ: int, H: int, D: int, DV: int, q_dtype: torch.dtype,
                 gated: bool, f32: bool, params: TritonParams, scale: Optional[float] = None,
                 gate_placement: str = "inside_scale") -> None:
        if gate_placement not in ("inside_scale", "outside_scale"):
            raise ValueError(f"gate_placement must be 'inside_scale' or 'outside_scale', got {gate_placement!r}")
        G = HQ // H
        scale = D ** -0.5 if scale is None else float(scale)
        self.B, self.TN, self.HQ, self.H, self.D, self.DV, self.G = B, TN, HQ, H, D, DV, G
        self.q_dtype = q_dtype
        self.rowwise, self.R = decode_layout(TN, G)
        self.block_n = int(params.decode_block_n)
        self.splits = max(1, int(params.decode_splits))
        self.BDV = _pow2(DV)
        self.num_warps = int(params.decode_num_warps)
        self.qk_scale = scale * _LOG2E
        self.gate_scale = (scale if gate_placement == "inside_scale" else 1.0) * _LOG2E
        self.gated = gated
        self.const = dict(H=H, G=G, D=D, DV=DV, BD=_pow2(D), BDV=self.BDV, TN=TN, TNP=triton.next_power_of_2(TN),
                          GP=triton.next_power_of_2(G), R=self.R, BLOCK_N=self.block_n, ROWWISE=self.rowwise,
                          F32=f32, USE_GATE=gated, BETA_MAX=params.beta_max, INTERP=interpreting(),
                          STAGES=decode_loop_stages(params))
        self.merge_const = dict(H=H, G=G, DV=DV, BDV=self.BDV, TN=TN, R=self.R, INTERP=self.const["INTERP"])
        self._wide = max(D, DV, G)

    def launch_splits(self, max_len: int) -> int:
        """Splits per (batch, kv head): the knob, capped by the key tiles of the cache's capacity (the grid
        must not depend on the length, which lives on the device)."""
        return min(self.splits, max(1, triton.cdiv(max_len, self.block_n)))

    def __call__(self, q, k, v, w, beta, g, cache: PaTHKVCache, *, return_lse: bool = False):
        TN = self.TN
        cache.reserve(TN)
        max_len = cache.k.shape[1]
        splits = self.launch_splits(max_len)
        BH = self.B * self.H
        nrow = BH * splits * self.R
        pad = -(-nrow // 4) * 4  # 16-byte aligned sub-buffers
        part = cache.workspace(("triton_decode", nrow, self.BDV), pad * (self.BDV + 2))
        m_part, l_part, acc_part = part[:nrow], part[pad:pad + nrow], part[2 * pad:2 * pad + nrow * self.BDV]
        xs = [x if x.is_contiguous() else x.contiguous() for x in (q, k, v, w, beta)]
        gg = m_part if g is None else (g if g.is_contiguous() else g.contiguous())
        decode_kernel[(BH, splits)](
            *xs[:3], xs[3], xs[4], gg, cache.k, cache.v, cache.c if cache.c is not None else m_part,
            cache.length_tensor, m_part, l_part, acc_part, max_len, splits, self.qk_scale, self.gate_scale,
            OFF64=max_len * self.H * self._wide >= _OFF64_ELEMS, **self.const,
            num_warps=self.num_warps, num_stages=2,
        )
        o = torch.empty(self.B, TN, self.HQ, self.DV, device=q.device, dtype=self.q_dtype)
        lse = torch.empty(self.B, TN, self.HQ, device=q.device, dtype=torch.float32) if return_lse else m_part
        decode_merge_kernel[(BH,)](m_part, l_part, acc_part, o, lse, cache.length_tensor, splits,
                                   STORE_LSE=return_lse, **self.merge_const, num_warps=4, num_stages=1)
        cache.advanced(TN)
        return (o, lse) if return_lse else o


@functools.lru_cache(maxsize=512)
def _step_cached(B, TN, HQ, H, D, DV, q_dtype, gated, f32, params, scale, gate_placement) -> TritonDecodeStep:
    return TritonDecodeStep(B=B, TN=TN, HQ=HQ, H=H, D=D, DV=DV, q_dtype=q_dtype, gated=gated, f32=f32,
                            params=params, scale=scale, gate_placement=gate_placement)


def prepare(q, k, v, w, beta, g, cache, *, scale: Optional[float] = None, config=None,
            gate_placement: str = "inside_scale") -> TritonDecodeStep:
    """Validate one decode call's arguments against the cache and return the (memoised) prepared step
    for its shapes, dtypes and knobs; calls with the same metadata may then run the step directly."""
    B, TN, HQ, H, D, DV = _check_decode_args(q, k, v, w, beta, g, cache)
    params = decode_params(config, D, DV)
    f32 = cache.k.dtype == torch.float32 or q.dtype != cache.k.dtype
    return _step_cached(B, TN, HQ, H, D, DV, q.dtype, g is not None, f32, params,
                        None if scale is None else float(scale), gate_placement)


def path_decode_triton(q, k, v, w, beta, g, cache, *, scale: Optional[float] = None, config=None,
                       gate_placement: str = "inside_scale", return_lse: bool = False):
    """One PaTH(-FoX) decoding step of T_new >= 1 tokens on the fused Triton kernel (mutates ``cache``).

    q [B,T_new,HQ,D], k/w [B,T_new,H,D], v [B,T_new,H,DV], beta [B,T_new,H], g [B,T_new,HQ] or None
    (w, beta, g float32 preferred; other float dtypes are read as they are); ``cache`` a ``PaTHKVCache``
    (keys in the current frame, k/v in bf16/fp16/fp32, gate cumsum fp32), grown on demand unless static.
    Token t attends causally to the cache and to tokens <= t of this call, exactly as
    ``runtime.reference.path_attention_decode``.
    ``config``: decode knobs (spec Config / mapping / TritonParams; None = heuristic).
    Returns o [B,T_new,HQ,DV] in q's dtype (and lse [B,T_new,HQ] float32 with ``return_lse``).
    """
    step = prepare(q, k, v, w, beta, g, cache, scale=scale, config=config, gate_placement=gate_placement)
    return step(q, k, v, w, beta, g, cache, return_lse=return_lse)


def decode_compile_specs(params: TritonParams, D: int, DV: int, *, dtype: str = "bf16", gate: bool = True,
                         heads: int = 8, group: int = 1, tokens: int = 1):
    """(fn, signature, constexprs, num_warps, num_stages) of the decode step's two launches for
    ``compile_check.compile_kernel`` (sm_90 compilation without a GPU), as ``TritonDecodeStep`` launches them."""
    rowwise, R = decode_layout(tokens, group)
    io = f"*{dtype}"
    f32p = "*fp32"
    sig = {n: io for n in ("q_ptr", "knew_ptr", "vnew_ptr", "k_ptr", "v_ptr", "o_ptr")}
    for n in ("w_ptr", "beta_ptr", "g_ptr", "c_ptr", "m_part", "l_part", "acc_part", "lse_ptr"):
        sig[n] = f32p
    sig["len_ptr"] = "*i32"
    sig["max_len"] = sig["n_splits"] = "i32"
    sig["qk_scale"] = sig["gate_scale"] = "fp32"
    BD, BDV = _pow2(D), _pow2(DV)
    const = dict(H=heads, G=group, D=D, DV=DV, BD=BD, BDV=BDV, TN=tokens, TNP=triton.next_power_of_2(tokens),
                 GP=triton.next_power_of_2(group), R=R, BLOCK_N=params.decode_block_n,
                 ROWWISE=rowwise, F32=dtype == "fp32", USE_GATE=gate, BETA_MAX=params.beta_max, OFF64=False,
                 INTERP=False, STAGES=decode_loop_stages(params))
    merge = dict(H=heads, G=group, DV=DV, BDV=BDV, TN=tokens, R=R, STORE_LSE=False, INTERP=False)
    return [(decode_kernel, sig, const, params.decode_num_warps, 2), (decode_merge_kernel, sig, merge, 4, 1)]


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
    return o, cache
