"""Autograd and torch.compile integration of the Triton PaTH kernels.

Two ``torch.library`` custom ops (``pathtune::path_attn_fwd`` / ``pathtune::path_attn_bwd``)
with fake implementations, so ``torch.compile(fullgraph=True)`` traces through them.  With the
spec's default ``bwd_forward_state: recompute`` only o and lse are saved for backward and the O(T)
UT / transport state is recomputed there, which keeps activation memory at what FlashAttention
keeps.  With ``keep`` the forward op also returns its compact state (``forward.KEPT_STATE_FIELDS``,
empty placeholders otherwise) for autograd to save, and the backward op reads it instead.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .._knobs import config_of, resolve, resolve_json
from ._layout import build_tables
from .backward import backward_state, path_attention_bwd
from .forward import kept_state_like, kept_state_tensors, path_attention_fwd, state_from_kept
from .params import TritonParams


def _params(config_json: str, pass_: str, q: Tensor, v: Tensor) -> TritonParams:
    """The op's config (a complete spec Config as JSON) -> kernel params: the one representation change,
    cached per config text and head dims."""
    return resolve_json("triton", pass_, config_json, int(q.shape[-1]), int(v.shape[-1]))


class KernelConfigError(RuntimeError):
    """A Triton config that does not compile or does not fit this GPU (shared memory, registers)."""


def _explain(exc: Exception, q: Tensor, v: Tensor, params_json: str, what: str) -> KernelConfigError:
    D, DV = q.shape[-1], v.shape[-1]
    wide = (" (above head dim 128, TritonParams.heuristic(D, DV)'s tiles are the ones checked to fit an "
            "sm_90 GPU: chunk_size 32, block_m and bwd_block_m 64, block_n and bwd_block_n 32, one stage)"
            if max(D, DV) > 128 else "")
    return KernelConfigError(
        f"the Triton PaTH {what} kernels with config {params_json} do not fit this GPU for head dims "
        f"D={D}, DV={DV} ({type(exc).__name__}: {exc}). Pass a smaller config (chunk_size, num_stages, "
        f"block_m, block_n, bwd_block_m, bwd_block_n){wide}, tune one for this GPU, or use "
        f"backend='reference'. `python -m pathtune.codegen.triton.compile_check --head-dim {D} --pass fwd "
        f"--config JSON` reports a config's shared memory per kernel without a GPU.")


def _keeps_state(params: TritonParams) -> bool:
    return params.bwd_forward_state == "keep"


def _absent_state(q: Tensor) -> list[Tensor]:
    return [q.new_empty(0, dtype=torch.float32) for _ in range(7)]


@torch.library.custom_op("pathtune::path_attn_fwd", mutates_args=())
def _path_attn_fwd(q: Tensor, k: Tensor, v: Tensor, w: Tensor, beta: Tensor, g: Optional[Tensor],
                   cu_seqlens: Optional[Tensor], scale: float, params_json: str,
                   gate_placement: str) -> tuple[Tensor, Tensor, list[Tensor]]:
    from triton.runtime.errors import OutOfResources

    params = _params(params_json, "fwd", q, v)
    try:
        o, lse, state = path_attention_fwd(q, k, v, w, beta, g, scale=scale, cu_seqlens=cu_seqlens,
                                           params=params, gate_placement=gate_placement)
    except OutOfResources as exc:
        raise _explain(exc, q, v, params_json, "forward") from exc
    return o, lse, (kept_state_tensors(state) if _keeps_state(params) else _absent_state(q))


@_path_attn_fwd.register_fake
def _(q, k, v, w, beta, g, cu_seqlens, scale, params_json, gate_placement):
    B, T, HQ, _ = q.shape
    params = _params(params_json, "fwd", q, v)
    n_seqs = None if cu_seqlens is None else cu_seqlens.shape[0] - 1
    kept = kept_state_like(q, k, g, n_seqs, params) if _keeps_state(params) else _absent_state(q)
    return q.new_empty(B, T, HQ, v.shape[-1]), q.new_empty(B, T, HQ, dtype=torch.float32), kept


@torch.library.custom_op("pathtune::path_attn_bwd", mutates_args=())
def _path_attn_bwd(do: Tensor, dlse: Optional[Tensor], q: Tensor, k: Tensor, v: Tensor, w: Tensor,
                   beta: Tensor, g: Optional[Tensor], o: Tensor, lse: Tensor, cu_seqlens: Optional[Tensor],
                   kept: list[Tensor], scale: float, params_json: str, gate_placement: str) -> list[Tensor]:
    from triton.runtime.errors import OutOfResources

    params = _params(params_json, "bwd", q, v)
    try:
        if kept and kept[0].numel():      # the forward's state (bwd_forward_state keep)
            B, T = q.shape[:2]
            tables = build_tables(B, T, cu_seqlens, params.chunk_size, params.superchunk_size, q.device,
                                  block_m=params.block_m)
            state = state_from_kept(list(kept), tables)
        else:
            state = backward_state(q, k, w, beta, g, cu_seqlens=cu_seqlens, params=params)
        grads = path_attention_bwd(do.contiguous(), q, k, v, w, beta, g, o, lse, state, scale=scale,
                                   params=params, gate_placement=gate_placement, dlse=dlse)
    except OutOfResources as exc:
        raise _explain(exc, q, v, params_json, "backward") from exc
    dg = grads[5] if grads[5] is not None else beta.new_empty(0)
    return [*grads[:5], dg]


@_path_attn_bwd.register_fake
def _(do, dlse, q, k, v, w, beta, g, o, lse, cu_seqlens, kept, scale, params_json, gate_placement):
    # contiguous like the real op's results (empty_like would copy the strides of a permuted
    # input, and inductor asserts the real strides against these)
    def like(x):
        return x.new_empty(x.shape)
    dg = like(g) if g is not None else beta.new_empty(0)
    return [like(q), like(k), like(v), like(w), like(beta), dg]


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
def _resolve_params_json(config, head_dim: int, head_dim_v: int) -> str:
    """The config the custom op carries: every knob in the spec's spelling, as canonical JSON (run at trace
    time under torch.compile: a constant). Knobs ``config`` leaves out come from the untuned config for
    these head dims (the spec's ``head_dim_defaults``: the plain defaults do not fit shared memory above
    head dim 64). Checked here (``resolve``), so a bad config fails before any launch."""
    import json

    dims = (head_dim, head_dim_v)
    values = config_of("triton", resolve("triton", None, config, dims), dims)
    return json.dumps(values, sort_keys=True, separators=(",", ":"))


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
    params_json = _resolve_params_json(config, q.shape[-1], v.shape[-1])
    if scale is None:
        scale = q.shape[-1] ** -0.5
    if cu_seqlens is not None:
        cu_seqlens = cu_seqlens.to(device=q.device, dtype=torch.int64)
    o, lse, _ = _path_attn_fwd(q, k, v, w, beta, g, cu_seqlens, float(scale), params_json, gate_placement)
    return o, lse
