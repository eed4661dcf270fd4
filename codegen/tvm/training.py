"""TVM forward, Triton backward: ``path_attention_tvm_trainable``.

The TVM backend compiles the forward only.  A call that needs gradients runs the TVM forward and, from
its saved o and lse, the Triton backward (``torch.ops.pathtune.path_attn_bwd``) at the backward's own
config: the dispatcher's plan when TVM wins the forward of a training call.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

__all__ = ["path_attention_tvm_trainable"]


class _TVMForwardTritonBackward(torch.autograd.Function):
    """TVM forward kernels (no autograd of their own), Triton backward from the saved o and lse."""

    @staticmethod
    def forward(ctx, q, k, v, w, beta, g, cu_seqlens, scale, tvm_config, bwd_config_json, placement):
        from . import runtime

        args = [None if t is None else t.detach() for t in (q, k, v, w, beta, g)]
        o, lse = runtime.path_attention_tvm(*args, scale=scale, cu_seqlens=cu_seqlens, config=tvm_config)
        lse = lse.float()
        ctx.save_for_backward(q, k, v, w, beta, g, o, lse, cu_seqlens)
        ctx.scale, ctx.config_json, ctx.placement = scale, bwd_config_json, placement
        return o, lse

    @staticmethod
    def backward(ctx, do, dlse):
        from pathtune.codegen.triton import autograd  # noqa: F401  (registers torch.ops.pathtune.*)

        q, k, v, w, beta, g, o, lse, cu_seqlens = ctx.saved_tensors
        if do is None:
            do = torch.zeros_like(o)
        dq, dk, dv, dw, dbeta, dg = torch.ops.pathtune.path_attn_bwd(
            do, dlse, q, k, v, w, beta, g, o, lse, cu_seqlens, [], ctx.scale, ctx.config_json, ctx.placement)
        return dq, dk, dv, dw, dbeta, (dg if g is not None else None), None, None, None, None, None


def path_attention_tvm_trainable(q, k, v, w, beta, g, *, scale: float, cu_seqlens: Optional[torch.Tensor],
                                 config: Any, bwd_config_json: str, gate_placement: str):
    """``path_attention_tvm`` (forward knobs ``config``) whose result supports autograd: the backward runs the
    Triton kernels at ``bwd_config_json`` (a Triton bwd config as canonical JSON, ``codegen._knobs.config_json``).
    cu_seqlens: int64 on q's device, or None.  -> (o, lse float32)."""
    return _TVMForwardTritonBackward.apply(q, k, v, w, beta, g, cu_seqlens, float(scale), config, bwd_config_json,
                                           gate_placement)
