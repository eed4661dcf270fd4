"""``PaTHCache``: the decoding state of a stack of ``PaTHAttention`` layers.

One entry per ``layer_idx``: the layer's PaTH KV cache (keys kept in the current frame, values,
FoX gate cumsums; ``PaTHKVCache``) and the state of its short convolution over the ``w`` path
(the last ``conv_size - 1`` pre-convolution inputs). A layer called with a cache that has no entry
for its index runs the prompt (prefill) and stores its entry; later calls are decode steps of any
number of tokens that extend it.

    cache = PaTHCache()
    logits = model(prompt, cache=cache)            # prefill: every layer fills its entry
    for _ in range(n):
        logits = model(next_token, cache=cache)    # decode steps
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

from torch import Tensor

__all__ = ["PaTHCache", "LayerState", "prefill_fn", "decode_fn"]


@dataclass
class LayerState:
    """One layer's decoding state. ``kv``: a PaTHKVCache; ``conv``: [B, conv_size - 1, H*D] or None."""

    kv: Any
    conv: Optional[Tensor]

    @property
    def length(self) -> int:
        return int(self.kv.length)


class PaTHCache:
    """Per-layer decoding state, keyed by ``layer_idx`` (see module docstring)."""

    def __init__(self) -> None:
        self._layers: dict[int, LayerState] = {}
        self._owners: dict[int, weakref.ref] = {}

    def claim(self, layer_idx: int, owner: Any) -> None:
        """Bind slot ``layer_idx`` to ``owner`` (a layer) on its first use; another live owner of the same
        slot is an error: two layers sharing a slot would read and extend each other's keys."""
        ref = self._owners.get(layer_idx)
        held = ref() if ref is not None else None
        if held is None:
            self._owners[layer_idx] = weakref.ref(owner)
        elif held is not owner:
            raise ValueError(f"PaTHCache: slot layer_idx={layer_idx} already holds the state of another layer; "
                             f"give every layer that shares this cache its own layer_idx "
                             f"(e.g. PaTHAttention(..., layer_idx=i) for the i-th layer)")

    def __contains__(self, layer_idx: int) -> bool:
        return layer_idx in self._layers

    def __len__(self) -> int:
        return len(self._layers)

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self._layers))

    def __getitem__(self, layer_idx: int) -> LayerState:
        try:
            return self._layers[layer_idx]
        except KeyError:
            raise KeyError(f"PaTHCache has no state for layer_idx {layer_idx} (layers: {sorted(self._layers)}); "
                           "the first call of a layer with this cache is its prefill") from None

    def get(self, layer_idx: int) -> Optional[LayerState]:
        return self._layers.get(layer_idx)

    def set(self, layer_idx: int, state: LayerState) -> None:
        self._layers[layer_idx] = state

    def seq_len(self, layer_idx: Optional[int] = None) -> int:
        """Tokens seen by ``layer_idx`` (default: the lowest index held; 0 when empty)."""
        if not self._layers:
            return 0
        idx = min(self._layers) if layer_idx is None else layer_idx
        state = self._layers.get(idx)
        return 0 if state is None else state.length

    def reset(self) -> None:
        """Forget every layer's state and slot owner (the next call is a prefill again)."""
        self._layers.clear()
        self._owners.clear()

    def __repr__(self) -> str:
        return f"PaTHCache(layers={sorted(self._layers)}, seq_len={self.seq_len()})"


# -- prefill / decode entry points -----------------------------------------------------------------
# pathtune.runtime.decode (prefill + fused decode kernels, backend argument) when present, else the
# PyTorch reference (runtime/reference/recurrent.py). On CUDA the Triton configs come from the
# dispatcher: the forward plan for the prefill, plus the "decode" pass's choice for decode steps.

def _decode_module():
    try:
        from pathtune.runtime import decode as mod
    except ImportError:
        return None
    if hasattr(mod, "path_attention_prefill") and hasattr(mod, "path_attention_decode"):
        return mod
    return None


_PARAMS: dict[tuple, Any] = {}


def _tuned_params(pass_: str, q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor], keys: int, backend: str):
    """TritonParams for a prefill ("fwd") or decode step on CUDA from the dispatcher (pack / perf_db /
    heuristic), or None (heuristic inside the launcher) off CUDA or for other backends."""
    if q.device.type != "cuda" or backend not in ("auto", "triton"):
        return None
    from pathtune.specs.canonical import dtype_name
    from pathtune.specs.workload import batch_bucket, seq_bucket

    B, _, HQ, D = q.shape
    H, DV = k.shape[2], v.shape[-1]
    key = (pass_, q.device.index, D, DV, HQ, H, q.dtype, g is not None, seq_bucket(keys), batch_bucket(B))
    params = _PARAMS.get(key)
    if params is None:
        import json

        from pathtune.codegen._knobs import params_from_config
        from pathtune.codegen.triton.params import TritonParams

        from .dispatch import select_config, select_plan

        plan = select_plan(q.device, D, DV, HQ, H, dtype_name(q.dtype), g is not None, keys, B, False)
        merged = json.loads(plan.params_json)
        if pass_ == "decode":
            from pathtune.specs import Workload

            wl = Workload(head_dim=D, head_dim_v=DV, heads_q=HQ, heads_kv=H, dtype=dtype_name(q.dtype),
                          use_gate=g is not None, pass_="decode", seq_bucket=key[8], batch_bucket=key[9])
            merged.update(select_config("decode", wl, q.device).config.to_dict())
        params = _PARAMS[key] = params_from_config(TritonParams, merged)
    return params


def prefill_fn(backend: str) -> Callable[..., tuple[Tensor, Any]]:
    """``fn(q, k, v, w, beta, g, *, scale) -> (o, kv_cache)`` for ``backend``."""
    mod = _decode_module()
    if mod is not None and backend != "reference":
        # TVM has a decode step but no prefill: the (backend-neutral) cache is filled by Triton
        prefill_backend = "triton" if backend == "tvm" else backend

        def fused(q, k, v, w, beta, g, *, scale):
            config = _tuned_params("fwd", q, k, v, g, q.shape[1], prefill_backend)
            return mod.path_attention_prefill(q, k, v, w, beta, g, scale=scale, backend=prefill_backend,
                                              config=config)
        return fused

    from pathtune.runtime.reference import path_attention_prefill
    from pathtune.specs import load_spec

    placement = load_spec().gate_placement

    def reference(q, k, v, w, beta, g, *, scale):
        return path_attention_prefill(q, k, v, w, beta, g, scale=scale, gate_placement=placement)
    return reference


def decode_fn(backend: str) -> Callable[..., Tensor]:
    """``fn(q, k, v, w, beta, g, kv_cache, *, scale) -> o`` (mutates the cache) for ``backend``."""
    mod = _decode_module()
    if mod is not None and backend != "reference":
        def fused(q, k, v, w, beta, g, cache, *, scale):
            # "auto": path_attention_decode dispatches (the Triton or the TVM step, runtime/decode_dispatch.py)
            config = None if backend == "auto" else _tuned_params("decode", q, k, v, g,
                                                                   int(cache.length) + q.shape[1], backend)
            return mod.path_attention_decode(q, k, v, w, beta, g, cache, scale=scale, backend=backend,
                                             config=config)
        return fused

    from pathtune.runtime.reference import path_attention_decode
    from pathtune.specs import load_spec

    placement = load_spec().gate_placement

    def reference(q, k, v, w, beta, g, cache, *, scale):
        return path_attention_decode(q, k, v, w, beta, g, cache, scale=scale, gate_placement=placement)
    return reference



def _check_decode_inputs(hidden: Tensor, state: LayerState) -> None:
    B = int(hidden.shape[0])
    if int(state.kv.k.shape[0]) != B:
        raise ValueError(f"hidden_states has batch size {B} but the cache was filled with batch size "
                         f"{int(state.kv.k.shape[0])}; use one PaTHCache per batch (cache.reset() to start over)")

