"""Shared helpers for the PaTH reference implementations (layout, dtype, gate, varlen).

Internal "grouped" layout used by the references (heads first, GQA groups explicit):

    q    [B, H, G, T, D]    query head hq = h * G + g_idx  (HQ = G * H)
    k, w [B, H, 1, T, D]    kv-side tensors broadcast over the G query heads of a group
    v    [B, H, 1, T, DV]
    beta [B, H, 1, T]
    g    [B, H, G, T]       per query head

Public tensors use the token-major layout of the conventions: q [B,T,HQ,D], k/w [B,T,H,D],
v [B,T,H,DV], beta [B,T,H], g [B,T,HQ].

Math: docs/algorithm.md#notation-and-layout (layout, GQA), docs/algorithm.md#path-fox-the-forget-gate
(``apply_gate``, the two gate placements).
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

GATE_PLACEMENTS = ("inside_scale", "outside_scale")


def compute_dtype(*tensors: Optional[Tensor]) -> torch.dtype:
    """Promotion of all floating inputs with float32 (float64 inputs -> float64 math)."""
    dt = torch.float32
    for t in tensors:
        if t is not None and t.is_floating_point():
            dt = torch.promote_types(dt, t.dtype)
    return dt


def resolve_scale(scale: Optional[float], D: int) -> float:
    return float(D) ** -0.5 if scale is None else float(scale)


def check_gate_placement(gate_placement: str) -> None:
    if gate_placement not in GATE_PLACEMENTS:
        raise ValueError(f"gate_placement must be one of {GATE_PLACEMENTS}, got {gate_placement!r}")


def check_inputs(q: Tensor, k: Tensor, v: Tensor, w: Tensor, beta: Tensor,
                 g: Optional[Tensor]) -> Tuple[int, int, int, int, int, int, int]:
    """Validate shapes; return (B, T, HQ, H, G, D, DV)."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4 or w.dim() != 4:
        raise ValueError("q, k, v, w must be 4-D: [B, T, heads, dim]")
    B, T, HQ, D = q.shape
    H = k.shape[2]
    DV = v.shape[-1]
    if k.shape != (B, T, H, D):
        raise ValueError(f"k must be [B,T,H,D]={(B, T, H, D)}, got {tuple(k.shape)}")
    if w.shape != k.shape:
        raise ValueError(f"w must have k's shape {tuple(k.shape)}, got {tuple(w.shape)}")
    if v.shape[:3] != (B, T, H):
        raise ValueError(f"v must be [B,T,H,DV] with (B,T,H)={(B, T, H)}, got {tuple(v.shape)}")
    if beta.shape != (B, T, H):
        raise ValueError(f"beta must be [B,T,H]={(B, T, H)}, got {tuple(beta.shape)}")
    if g is not None and g.shape != (B, T, HQ):
        raise ValueError(f"g must be [B,T,HQ]={(B, T, HQ)}, got {tuple(g.shape)}")
    if HQ % H != 0:
        raise ValueError(f"HQ={HQ} must be a multiple of H={H}")
    return B, T, HQ, H, HQ // H, D, DV


def segments(cu_seqlens: Optional[Union[Tensor, Sequence[int]]], B: int, T: int) -> List[Tuple[int, int]]:
    """[(bos, eos), ...] of the packed sequences (one full-length segment without cu_seqlens)."""
    if cu_seqlens is None:
        return [(0, T)]
    cu = cu_seqlens.tolist() if isinstance(cu_seqlens, Tensor) else list(cu_seqlens)
    if B != 1:
        raise ValueError("with cu_seqlens the batch size must be 1 (packed varlen)")
    if len(cu) < 2 or cu[0] != 0 or cu[-1] != T or any(b > e for b, e in zip(cu[:-1], cu[1:])):
        raise ValueError(f"cu_seqlens must be non-decreasing from 0 to T={T}, got {cu}")
    return [(int(b), int(e)) for b, e in zip(cu[:-1], cu[1:]) if e > b]


def to_grouped(q, k, v, w, beta, g, H: int, G: int, dt: torch.dtype):
    """Token-major public layout -> grouped heads-first layout (see module docstring), cast to dt."""
    B, T, HQ, D = q.shape
    qg = q.to(dt).permute(0, 2, 1, 3).reshape(B, H, G, T, D)
    kg = k.to(dt).permute(0, 2, 1, 3).unsqueeze(2)
    vg = v.to(dt).permute(0, 2, 1, 3).unsqueeze(2)
    wg = w.to(dt).permute(0, 2, 1, 3).unsqueeze(2)
    bg = beta.to(dt).permute(0, 2, 1).unsqueeze(2)
    gg = None if g is None else g.to(dt).permute(0, 2, 1).reshape(B, H, G, T)
    return qg, kg, vg, wg, bg, gg


def from_grouped(x: Tensor) -> Tensor:
    """[B, H, G, T, *rest] -> [B, T, H*G, *rest] (rest may be empty, e.g. for lse)."""
    B, H, G, T = x.shape[:4]
    rest = x.shape[4:]
    x = x.reshape(B, H * G, T, *rest)
    return x.transpose(1, 2)


def apply_gate(S: Tensor, ci: Optional[Tensor], cj: Optional[Tensor], scale: float,
               gate_placement: str) -> Tensor:
    """Logits from raw PaTH scores S [..., Tq, Tk] and gate cumsums ci [..., Tq], cj [..., Tk].

    inside_scale:  scale * (S + c_i - c_j)      (fla convention, default)
    outside_scale: scale * S + (c_i - c_j)      (FoX-kernel convention)
    """
    if ci is None:
        return scale * S
    Dg = ci[..., :, None] - cj[..., None, :]
    if gate_placement == "inside_scale":
        return scale * (S + Dg)
    return scale * S + Dg
