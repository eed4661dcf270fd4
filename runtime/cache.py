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

``PaTHCache(max_len=N)`` makes every layer's KV cache static (capacity N tokens, never reallocated,
length kept on the device): a decode step of the whole model can then be captured in a CUDA graph and
replayed while the cache fills (the conv states are updated in place too).
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
    """Per-layer decoding state, keyed by ``layer_idx`` (see module docstring).

    ``max_len``: None (default) -- each layer's KV cache holds the prompt and grows on demand; an int --
    every layer's KV cache is static with that capacity in tokens (prompt + generated), allocated at the
    prefill and never moved, so decode steps can be captured in a CUDA graph (``torch.cuda.graph``) and
    replayed as the cache fills; a step past the capacity raises ``CacheFullError``.
    """

    def __init__(self, max_len: Optional[int] = None) -> None:
        if max_len is not None and (isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1):
            raise ValueError(f"PaTHCache: max_len must be a positive int (the static capacity in tokens) or None "
                             f"(growable), got {max_len!r}")
        self.max_len = max_len
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
        cap = "" if self.max_len is None else f", max_len={self.max_len}"
        return f"PaTHCache(layers={sorted(self._layers)}, seq_len={self.seq_len()}{cap})"


# -- prefill / decode entry points -----------------------------------------------------------------
# The backends' prefill / decode (runtime/decode.py), or the PyTorch reference (runtime/reference/recurrent.py)
# for backend "reference". With backend "triton" on CUDA the Triton knobs come from the dispatcher (the
# forward plan for the prefill, plus the "decode" pass's choice for decode steps); "auto" dispatches
# inside path_attention_decode (runtime/decode_dispatch.py).

def prefill_fn(backend: str) -> Callable[..., tuple[Tensor, Any]]:
    """``fn(q, k, v, w, beta, g, *, scale, max_len=None, static=False) -> (o, kv_cache)`` for ``backend``."""
    if backend != "reference":
        from pathtune.runtime.decode import path_attention_prefill

        # TVM has a decode step but no prefill: the (backend-neutral) cache is filled by Triton
        prefill_backend = "triton" if backend == "tvm" else backend

        def fused(q, k, v, w, beta, g, *, scale, max_len=None, static=False):
            from .decode_dispatch import tuned_triton_params

            config = tuned_triton_params("fwd", q, k, v, g, q.shape[1], prefill_backend)
            return path_attention_prefill(q, k, v, w, beta, g, scale=scale, backend=prefill_backend,
                                          config=config, max_len=max_len, static=static)
        return fused

    from pathtune.runtime.reference import path_attention_prefill as ref_prefill
    from pathtune.specs import load_spec

    placement = load_spec().gate_placement

    def reference(q, k, v, w, beta, g, *, scale, max_len=None, static=False):
        return ref_prefill(q, k, v, w, beta, g, scale=scale, gate_placement=placement, max_len=max_len,
                           static=static)
    return reference


def decode_fn(backend: str) -> Callable[..., Tensor]:
    """``fn(q, k, v, w, beta, g, kv_cache, *, scale) -> o`` (mutates the cache) for ``backend``."""
    if backend != "reference":
        from pathtune.runtime.decode import path_attention_decode

        if backend != "triton":
            def fused(q, k, v, w, beta, g, cache, *, scale):
                return path_attention_decode(q, k, v, w, beta, g, cache, scale=scale, backend=backend)
            return fused

        def triton(q, k, v, w, beta, g, cache, *, scale):
            from .decode_dispatch import tuned_triton_params

            config = tuned_triton_params("decode", q, k, v, g, cache._hint + q.shape[1], "triton")
            return path_attention_decode(q, k, v, w, beta, g, cache, scale=scale, backend="triton", config=config)
        return triton

    from pathtune.runtime.reference import path_attention_decode as ref_decode
    from pathtune.specs import load_spec

    placement = load_spec().gate_placement

    def reference(q, k, v, w, beta, g, cache, *, scale):
        return ref_decode(q, k, v, w, beta, g, cache, scale=scale, gate_placement=placement)
    return reference


def _check_decode_inputs(hidden: Tensor, state: LayerState) -> None:
    B = int(hidden.shape[0])
    if state.kv.batch_size != B:   # not .k: reading it rotates pending rows into the current frame
        raise ValueError(f"hidden_states has batch size {B} but the cache was filled with batch size "
                         f"{state.kv.batch_size}; use one PaTHCache per batch (cache.reset() to start over)")

