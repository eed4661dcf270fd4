"""Reference PaTH(-FoX) decoding: prefill into a current-frame KV cache, then token steps.

Decoding rule [PaTH §3.4]: at step t, FIRST every cached key is updated in place,
    k_j <- H_t k_j = k_j - beta_t (k_j . w_t) w_t            (j < t)
THEN the raw k_t (and v_t, c_t = c_{t-1} + g_t) is appended, THEN q_t attends to the whole cache
with ordinary softmax attention plus the FoX gate c_t - c_j. Hence the cache always holds keys in
the "current frame" k_j^(t) = H_t ... H_{j+1} k_j and q_t . k_j^(t) = S_tj.

Math, and the fused Triton step and static cache that follow this reference: docs/algorithm.md#decoding.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from pathtune.codegen.kv_cache import PaTHKVCache

from ._common import apply_gate, check_gate_placement, check_inputs, compute_dtype, resolve_scale
from .blockwise import (
    blockwise_path_attention,
    boundary_adjust_keys,
    chunk_transition,
    superchunk_transport,
    ut_transform,
)

__all__ = ["PaTHKVCache", "current_frame_keys", "path_attention_prefill",
           "path_attention_decode_step", "path_attention_decode"]


def current_frame_keys(k: Tensor, w: Tensor, beta: Tensor, *, chunk_size: int = 64) -> Tensor:
    """Keys transported to the last position: out[:, j] = H_{T-1} ... H_{j+1} k_j.

    k, w [B, T, H, D], beta [B, T, H] -> [B, T, H, D] in the compute dtype. Linear in T: per UT
    chunk the boundary-adjusted keys K~, then one right-to-left suffix-product walk
    (superchunk_transport over all chunks). Padding uses w = 0, beta = 0 (H = I).
    """
    B, T, H, D = k.shape
    dt = compute_dtype(k, w, beta)
    C = chunk_size
    pad = -(-T // C) * C - T
    kg = F.pad(k.to(dt).permute(0, 2, 1, 3), (0, 0, 0, pad))      # [B,H,Tp,D]
    wg = F.pad(w.to(dt).permute(0, 2, 1, 3), (0, 0, 0, pad))
    bg = F.pad(beta.to(dt).permute(0, 2, 1), (0, pad))
    Kt, P = [], []
    for m in range(kg.shape[-2] // C):
        sl = slice(m * C, (m + 1) * C)
        A, U = ut_transform(wg[..., sl, :], bg[..., sl])
        Kt.append(boundary_adjust_keys(kg[..., sl, :], wg[..., sl, :], A))
        P.append(chunk_transition(wg[..., sl, :], U))
    KJ, _ = superchunk_transport(Kt, P)
    return torch.cat(KJ, dim=-2)[..., :T, :].permute(0, 2, 1, 3)


def path_attention_prefill(q: Tensor, k: Tensor, v: Tensor, w: Tensor, beta: Tensor,
                           g: Optional[Tensor] = None, *, scale: Optional[float] = None,
                           gate_placement: str = "inside_scale", max_len: Optional[int] = None,
                           chunk_size: int = 64, superchunk_size: int = 256,
                           cache_dtype: Optional[torch.dtype] = None,
                           static: bool = False) -> Tuple[Tensor, PaTHKVCache]:
    """Prefill: blockwise attention over the prompt plus a current-frame KV cache.

    Shapes as naive_path_attention (equal-length batch, no cu_seqlens). max_len (default T) is
    the cache capacity (it grows on demand unless ``static``). cache_dtype defaults to k.dtype; the
    gate cumsum is kept in float32 (float64 if g is float64).

    Returns (o [B,T,HQ,DV], cache) with cache.length = T.
    """
    check_gate_placement(gate_placement)
    B, T, HQ, H, G, D, DV = check_inputs(q, k, v, w, beta, g)
    o, _ = blockwise_path_attention(q, k, v, w, beta, g, scale=scale, chunk_size=chunk_size,
                                    superchunk_size=superchunk_size, gate_placement=gate_placement)
    cap = T if max_len is None else max(int(max_len), T)
    cdt = k.dtype if cache_dtype is None else cache_dtype
    cache = PaTHKVCache.empty(B, H, D, DV, HQ, max_len=cap, gated=g is not None, dtype=cdt,
                              gate_dtype=None if g is None else compute_dtype(g), device=k.device,
                              static=static)
    cache.k[:, :T] = current_frame_keys(k, w, beta, chunk_size=chunk_size).to(cdt)
    cache.v[:, :T] = v.to(cdt)
    if g is not None:
        cache.c[:, :T] = torch.cumsum(g.to(cache.c.dtype), dim=1)
    cache.length = T
    return o, cache


def path_attention_decode_step(q_t: Tensor, k_t: Tensor, v_t: Tensor, w_t: Tensor, beta_t: Tensor,
                               g_t: Optional[Tensor], cache: PaTHKVCache, *,
                               scale: Optional[float] = None, gate_placement: str = "inside_scale",
                               return_lse: bool = False):
    """One decoding step (mutates `cache`).

    Token tensors WITHOUT a time dim: q_t [B,HQ,D], k_t/w_t [B,H,D], v_t [B,H,DV], beta_t [B,H],
    g_t [B,HQ] or None (must match cache.gated). ([B,1,...] inputs are also accepted; then o_t
    keeps the time dim.)

    1. k_j <- k_j - beta_t (k_j . w_t) w_t for every cached j (math in float32 or wider, cast back
       to the cache dtype, written in place); 2. append k_t, v_t, c_t = c_{t-1} + g_t;
    3. softmax attention of q_t over the cache with gate c_t - c_j.

    Returns o_t [B,HQ,DV] in q_t.dtype (and lse [B,HQ] with return_lse).
    """
    check_gate_placement(gate_placement)
    has_time = q_t.dim() == 4
    if has_time:
        if q_t.shape[1] != 1:
            raise ValueError("decode_step takes one token; use path_attention_decode for several")
        q_t, k_t, v_t, w_t = (x.squeeze(1) for x in (q_t, k_t, v_t, w_t))
        beta_t = beta_t.squeeze(1)
        g_t = None if g_t is None else g_t.squeeze(1)
    if (g_t is None) != (cache.c is None):
        raise ValueError("g_t must be given iff the cache is gated")
    B, HQ, D = q_t.shape
    H = k_t.shape[1]
    G = HQ // H
    if HQ != cache.num_q_heads or cache.k.shape[2] != H or cache.k.shape[3] != D:
        raise ValueError("token shapes do not match the cache")
    scale = resolve_scale(scale, D)
    L = cache.length
    cache.reserve(1)

    # 1. rotate the cached keys into the new frame (k_j <- H_t k_j), in place
    udt = compute_dtype(cache.k, w_t, beta_t)
    if L > 0:
        kc = cache.k[:, :L].to(udt)                                        # [B,L,H,D]
        wt = w_t.to(udt)[:, None]                                          # [B,1,H,D]
        dots = (kc * wt).sum(-1, keepdim=True)                             # [B,L,H,1]
        kc = kc - beta_t.to(udt)[:, None, :, None] * dots * wt
        cache.k[:, :L] = kc.to(cache.k.dtype)
    # 2. append
    cache.k[:, L] = k_t.to(cache.k.dtype)
    cache.v[:, L] = v_t.to(cache.v.dtype)
    if cache.c is not None:
        prev = cache.c[:, L - 1] if L > 0 else torch.zeros_like(cache.c[:, 0])
        cache.c[:, L] = prev + g_t.to(cache.c.dtype)
    cache.length = L + 1
    # 3. attention over the cache (query head h uses kv head h // G)
    adt = compute_dtype(q_t, cache.k, cache.v, cache.c)
    Kc = cache.k[:, :L + 1].to(adt)                                        # [B,L+1,H,D]
    Vc = cache.v[:, :L + 1].to(adt)
    qg = q_t.to(adt).reshape(B, H, G, D)
    S = torch.einsum("bhgd,blhd->bhgl", qg, Kc)
    if cache.c is None:
        logits = apply_gate(S, None, None, scale, gate_placement)
    else:
        cc = cache.c[:, :L + 1].to(adt).permute(0, 2, 1).reshape(B, H, G, L + 1)
        logits = apply_gate(S[..., None, :], cc[..., L:], cc, scale, gate_placement)[..., 0, :]
    lse = torch.logsumexp(logits, dim=-1)                                  # [B,H,G]
    p = torch.exp(logits - lse[..., None])
    o = torch.einsum("bhgl,blhe->bhge", p, Vc).reshape(B, HQ, -1).to(q_t.dtype)
    lse = lse.reshape(B, HQ)
    if has_time:
        o, lse = o[:, None], lse[:, None]
    return (o, lse) if return_lse else o


def path_attention_decode(q: Tensor, k: Tensor, v: Tensor, w: Tensor, beta: Tensor,
                          g: Optional[Tensor], cache: PaTHKVCache, *, scale: Optional[float] = None,
                          gate_placement: str = "inside_scale") -> Tensor:
    """Several tokens (chunked / speculative decoding) by looping decode steps (mutates `cache`).

    q [B,T,HQ,D], k/w [B,T,H,D], v [B,T,H,DV], beta [B,T,H], g [B,T,HQ] or None -> o [B,T,HQ,DV].
    Token t attends causally to the cache and tokens <= t of this call.
    """
    check_inputs(q, k, v, w, beta, g)
    cache.reserve(q.shape[1])
    outs = [path_attention_decode_step(q[:, t], k[:, t], v[:, t], w[:, t], beta[:, t],
                                       None if g is None else g[:, t], cache, scale=scale,
                                       gate_placement=gate_placement)
            for t in range(q.shape[1])]
    return torch.stack(outs, dim=1)
