"""Autograd and torch.compile integration of the Triton PaTH kernels.

Two ``torch.library`` custom ops (``pathtune::path_attn_fwd`` / ``pathtune::path_attn_bwd``)
whose bodies and fake implementations are the launchers' entry points, so ``torch.compile(fullgraph=True)``
traces through them.  With ``bwd_forward_state: recompute`` only o and lse are saved for backward and the O(T)
UT / transport state is recomputed there, which keeps activation memory at what FlashAttention keeps.  With the
spec's default ``keep_inter`` the forward op also returns the queries at their super-chunk start, the transported
keys and the super-chunk transitions, and with ``keep`` its whole compact state besides
(``forward.KEPT_STATE_FIELDS``, empty placeholders for what a mode does not keep), for autograd to save; the
backward op reads them instead of computing them again.  A call whose inputs need no gradient runs recompute.
"""
from __future__ import annotations

import json
from typing import Optional

import torch
from torch import Tensor

from .._knobs import config_json
from .backward import backward_op, backward_op_like
from .forward import KernelConfigError, forward_op, forward_op_like

__all__ = ["KernelConfigError", "path_attention_triton"]

# The ops' bodies are the launchers' entry points (forward.forward_op, backward.backward_op): the op text
# (a complete spec Config as JSON) goes to the launcher unread, which resolves it to kernel params.
_path_attn_fwd = torch.library.custom_op("pathtune::path_attn_fwd", forward_op, mutates_args=())
_path_attn_fwd.register_fake(forward_op_like)
_path_attn_bwd = torch.library.custom_op("pathtune::path_attn_bwd", backward_op, mutates_args=())
_path_attn_bwd.register_fake(backward_op_like)


def _setup_context(ctx, inputs, output):
    q, k, v, w, beta, g, cu_seqlens, scale, params_json, gate_placement = inputs
    o, lse, kept = output
    ctx.save_for_backward(q, k, v, w, beta, g, o, lse, cu_seqlens, *kept)
    ctx.mark_non_differentiable(*kept)
    ctx.set_materialize_grads(False)      # no zero gradients of the kept state
    ctx.scale, ctx.params_json, ctx.gate_placement = scale, params_json, gate_placement


def _backward(ctx, do, dlse, _dkept):
    q, k, v, w, beta, g, o, lse, cu_seqlens, *kept = ctx.saved_tensors
    if do is None:
        do = torch.zeros_like(o)
    dq, dk, dv, dw, dbeta, dg = _path_attn_bwd(do, dlse, q, k, v, w, beta, g, o, lse, cu_seqlens, kept, ctx.scale,
                                               ctx.params_json, ctx.gate_placement)
    return dq, dk, dv, dw, dbeta, (dg if g is not None else None), None, None, None, None


_path_attn_fwd.register_autograd(_backward, setup_context=_setup_context)


@torch.compiler.assume_constant_result
def _resolve_params_json(config, head_dim: int, head_dim_v: int, needs_grad: bool = True) -> str:
    """The config the custom op carries: every knob in the spec's spelling, as canonical JSON (run at trace
    time under torch.compile: a constant). Knobs ``config`` leaves out come from the untuned config for
    these head dims (the spec's ``head_dim_defaults``: the plain defaults do not fit shared memory above
    head dim 64); without ``needs_grad`` bwd_forward_state is recompute (no backward reads a kept state).
    Checked here (``resolve``), so a bad config fails before any launch."""
    dims = (head_dim, head_dim_v)
    text = config_json("triton", None, config, dims)
    if needs_grad:
        return text
    return config_json("triton", None, {**json.loads(text), "bwd_forward_state": "recompute"}, dims)


def path_attention_triton(q: Tensor, k: Tensor, v: Tensor, w: Tensor, beta: Tensor, g: Optional[Tensor] = None,
                          *, scale: Optional[float] = None, cu_seqlens: Optional[Tensor] = None, config=None,
                          gate_placement: str = "inside_scale") -> tuple[Tensor, Tensor]:
    """PaTH(-FoX) attention on the Triton kernels, differentiable.

    q [B,T,HQ,D], k/w [B,T,H,D], v [B,T,H,DV], beta [B,T,H], g [B,T,HQ] (w, beta, g float32),
    cu_seqlens [N+1] (packed varlen, B == 1).  ``config`` is a spec Config / mapping of knob
    values / TritonParams (None: the spec's untuned config for the head dims).
    Returns (o [B,T,HQ,DV], lse [B,T,HQ] float32).
    Inputs are assumed validated (``pathtune.path_attention`` does that).
    """
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, w, beta, g))
    params_json = _resolve_params_json(config, q.shape[-1], v.shape[-1], needs_grad)
    if scale is None:
        scale = q.shape[-1] ** -0.5
    if cu_seqlens is not None:
        cu_seqlens = cu_seqlens.to(device=q.device, dtype=torch.int64)
    o, lse, _ = _path_attn_fwd(q, k, v, w, beta, g, cu_seqlens, float(scale), params_json, gate_placement)
    return o, lse
