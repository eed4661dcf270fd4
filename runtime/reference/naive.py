"""Naive PaTH / PaTH-FoX attention: the oracle.

Materialises the full causal logit matrix

    S_ij = q_i^T H_i H_{i-1} ... H_{j+1} k_j      (j <= i, S_ii = q_i . k_j),
    H_t  = I - beta_t w_t w_t^T,

by a backward sweep of every query through the Householder-like factors, adds the optional
FoX gate c_i - c_j (c = inclusive cumsum of g per sequence), applies a causal softmax and
multiplies by V. O(T^2 D) work, O(T^2) memory; differentiable by autograd (no in-place ops).

Math: docs/algorithm.md#the-path-logit, docs/algorithm.md#path-fox-the-forget-gate; how the kernels
are checked against this oracle: docs/algorithm.md#how-it-is-checked.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from ._common import (apply_gate, check_gate_placement, check_inputs, compute_dtype,
                      from_grouped, resolve_scale, segments, to_grouped)

__all__ = ["naive_path_attention", "naive_path_logits"]


def _shift(x: Tensor, s: int, dim: int) -> Tensor:
    """y[..., i, ...] = x[..., i - s, ...] along `dim` (negative), zeros for i < s."""
    if s == 0:
        return x
    T = x.shape[dim]
    x = x.narrow(dim, 0, T - s)
    pad = [0, 0] * (-dim - 1) + [s, 0]
    return F.pad(x, pad)


def naive_path_logits(q: Tensor, k: Tensor, w: Tensor, beta: Tensor,
                      checkpoint_steps: Optional[int] = None) -> Tensor:
    """Raw PaTH scores in the grouped layout (no scale, no gate, no mask).

    q [B,H,G,T,D], k, w [B,H,1,T,D], beta [B,H,1,T] -> S [B,H,G,T,T] with
    S[..., i, j] = q_i^T H_i ... H_{j+1} k_j for j <= i (entries j > i are 0).

    Backward sweep, vectorised over all queries: after s steps the row X_i holds
    q_i^T H_i H_{i-1} ... H_{i-s+1}; it is dotted with k_{i-s} and then multiplied by H_{i-s}.

    ``checkpoint_steps``: under autograd, run the sweep in segments of that many steps with
    ``torch.utils.checkpoint`` (the same operations, recomputed in the backward), so the memory
    autograd keeps grows with T / checkpoint_steps instead of T (each step saves a few [.., T, D]
    tensors: ~40 GiB per head at T = 4096 without it).
    """
    T = q.shape[-2]
    step = T if not checkpoint_steps or not torch.is_grad_enabled() else max(1, int(checkpoint_steps))
    X = q
    segments = []
    for s0 in range(0, T, step):
        s1 = min(T, s0 + step)
        if step < T:
            from torch.utils.checkpoint import checkpoint

            X, seg = checkpoint(_sweep, X, k, w, beta, s0, s1, T, use_reentrant=False)
        else:
            X, seg = _sweep(X, k, w, beta, s0, s1, T)
        segments.append(seg)
    Dg = torch.cat(segments, dim=-2)                # [B,H,G,T(s),T(i)], Dg[s, i] = S[i, i-s]
    i = torch.arange(T, device=q.device)
    sidx = (i[:, None] - i[None, :]).clamp(min=0)   # [T(i), T(j)] -> s = i - j
    S = Dg[..., sidx, i[:, None].expand(T, T)]
    causal = i[:, None] >= i[None, :]
    return S * causal


def _sweep(X: Tensor, k: Tensor, w: Tensor, beta: Tensor, s0: int, s1: int, T: int) -> tuple[Tensor, Tensor]:
    """Steps s0 .. s1-1 of the sweep from X (= q_i^T H_i ... H_{i-s0+1}): (X after them, their diagonals)."""
    diags = []
    for s in range(s0, s1):
        ks = _shift(k, s, -2)                       # ks[i] = k_{i-s}
        diags.append((X * ks).sum(-1))              # diag s: S[i, i-s]
        if s + 1 < T:
            ws = _shift(w, s, -2)                   # w_{i-s} (0 for i < s: H = I)
            bs = _shift(beta, s, -1)
            X = X - bs[..., None] * (X * ws).sum(-1, keepdim=True) * ws   # X <- X H_{i-s}
    return X, torch.stack(diags, dim=-2)


def _naive_core(q, k, v, w, beta, g, scale, gate_placement, checkpoint_steps=None):
    """One sequence (or an equal-length batch) in grouped layout -> (o [B,H,G,T,DV], lse [B,H,G,T])."""
    T = q.shape[-2]
    S = naive_path_logits(q, k, w, beta, checkpoint_steps)
    c = None if g is None else torch.cumsum(g, dim=-1)
    logits = apply_gate(S, c, c, scale, gate_placement)
    i = torch.arange(T, device=q.device)
    causal = i[:, None] >= i[None, :]
    logits = logits.masked_fill(~causal, float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)
    p = torch.exp(logits - lse[..., None])
    o = p @ v
    return o, lse


def naive_path_attention(q: Tensor, k: Tensor, v: Tensor, w: Tensor, beta: Tensor,
                         g: Optional[Tensor] = None, *, scale: Optional[float] = None,
                         cu_seqlens: Optional[Union[Tensor, Sequence[int]]] = None,
                         gate_placement: str = "inside_scale",
                         return_lse: bool = False, checkpoint_steps: Optional[int] = None):
    """Oracle PaTH(-FoX) attention.

    Args:
        q:    [B, T, HQ, D] queries (HQ = G * H; query head h uses kv head h // G).
        k:    [B, T, H, D] keys.
        v:    [B, T, H, DV] values.
        w:    [B, T, H, D] Householder directions (unit-norm rows expected, not enforced).
        beta: [B, T, H] in (0, 2]; H_t = I - beta_t w_t w_t^T.
        g:    optional [B, T, HQ] log forget gate (<= 0); c = inclusive cumsum of g per sequence.
        scale: softmax scale, default D ** -0.5.
        cu_seqlens: optional 1-D ints [0, ..., T] (B must be 1); each segment is independent.
        gate_placement: "inside_scale" -> scale * (S_ij + c_i - c_j) (default);
                        "outside_scale" -> scale * S_ij + (c_i - c_j).
        return_lse: also return lse.
        checkpoint_steps: under autograd, checkpoint the logit sweep every that many steps (same
            values and gradients, memory ~ T / checkpoint_steps; see ``naive_path_logits``).

    Returns:
        o [B, T, HQ, DV] in q.dtype; with return_lse also lse [B, T, HQ] (natural log of the
        softmax denominator) in the compute dtype (float32, or float64 for float64 inputs).
    """
    check_gate_placement(gate_placement)
    B, T, HQ, H, G, D, DV = check_inputs(q, k, v, w, beta, g)
    scale = resolve_scale(scale, D)
    dt = compute_dtype(q, k, v, w, beta, g)
    qg, kg, vg, wg, bg, gg = to_grouped(q, k, v, w, beta, g, H, G, dt)
    outs, lses = [], []
    for bos, eos in segments(cu_seqlens, B, T):
        o_s, l_s = _naive_core(qg[..., bos:eos, :], kg[..., bos:eos, :], vg[..., bos:eos, :],
                               wg[..., bos:eos, :], bg[..., bos:eos],
                               None if gg is None else gg[..., bos:eos], scale, gate_placement,
                               checkpoint_steps)
        outs.append(o_s)
        lses.append(l_s)
    o = from_grouped(torch.cat(outs, dim=-2)).to(q.dtype)
    if return_lse:
        return o, from_grouped(torch.cat(lses, dim=-1))
    return o
