"""Public decoding entry points: ``path_attention_prefill`` and ``path_attention_decode``.

Prefill runs attention over a prompt and returns a ``PaTHKVCache`` holding its keys in the current
frame (k_j^(T-1) = H_{T-1} ... H_{j+1} k_j), values and the FoX gate cumsum.  Each decode call then
appends T_new >= 1 tokens and lets each new query attend to the cache (PaTH-FoX: plus the gate bias).
The reference and TVM steps rotate the cached keys in place by every new token's H_t; the Triton step
rotates lazily (codegen/triton/decode.py): it keeps recent tokens pending and rotates the whole cache
once every few steps, decided on the device; ``cache.k`` always reads current-frame keys.  See
``runtime/reference/recurrent.py``.

Backends: ``reference`` (PyTorch, any device, float64 capable), ``triton`` (the fused decode kernel
of ``codegen/triton/decode.py``; CUDA tensors, or CPU tensors under TRITON_INTERPRET=1), ``tvm``
(the TVM fused decode step, CUDA only, one token per launch), ``auto`` (on CUDA: the Triton step, or the
TVM step when its tuning record is faster and it can run here -- runtime/decode_dispatch.py; else reference).

Hot path: a decode call is keyed by the metadata of its arguments (shapes, dtypes, devices, contiguity,
the cache's layout -- ``PaTHKVCache.layout_key()``, kept on the cache until a buffer is replaced --, backend,
config, scale, the dispatch length bucket, PATHTUNE_CHECK_INPUTS). The first call of a key runs
every check (spec validation, cache compatibility, head dims), resolves the backend and its knobs and
prepares the kernel launch; later calls of the key look the prepared step up and run it: no spec
access, no dtype copies (the Triton kernel reads w / beta / g in their dtype), no allocation beyond the
output, one kernel launch (the TVM step: two), no host synchronisation (value checks of beta / w run per
call only where they are enabled: CPU inputs, or ``PATHTUNE_CHECK_INPUTS=1``). The prepared steps live on the
dispatcher (``runtime.dispatch.clear_cache()`` forgets them).

CUDA graphs: with a static cache (``path_attention_prefill(..., max_len=N, static=True)`` or
``PaTHKVCache.empty(..., static=True)``) a Triton decode step captures into a CUDA graph and replays as
the cache grows (the length lives on the device: codegen/kv_cache.py). Run one eager step with the same
shapes before capturing (it compiles the kernels and prepares the step outside the capture), as for any
CUDA-graph capture; ``examples/lm_generate.py`` (``generate(..., cuda_graph=True)``) shows the pattern.
"""
from __future__ import annotations

import os
from typing import Optional, Tuple

import torch

from pathtune import _env
from pathtune.codegen.kv_cache import CacheFullError, PaTHKVCache
from pathtune.specs import load_spec
from pathtune.specs.workload import seq_bucket

from . import dispatch
from .device_guard import on_device
from .validation import check_head_dims, validate_inputs, value_checks_enabled

__all__ = ["PaTHKVCache", "CacheFullError", "path_attention_prefill", "path_attention_decode", "DECODE_BACKENDS"]

DECODE_BACKENDS = ("auto", "reference", "triton", "tvm")
_KERNEL_CACHE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _resolve(backend: str, device: torch.device) -> str:
    if backend not in DECODE_BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, DECODE_BACKENDS))}, got {backend!r}")
    if backend == "auto":
        if device.type != "cuda":
            return "reference"
        try:
            from pathtune.codegen.triton import path_decode_triton  # noqa: F401
        except ImportError:
            return "reference"
        return "triton"
    if backend == "triton" and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"backend 'triton' needs CUDA tensors, but q is on {device}; use backend='reference', "
                         "or set TRITON_INTERPRET=1 to run the Triton kernels in the (slow) CPU interpreter")
    if backend == "tvm" and device.type != "cuda":
        raise ValueError(f"backend 'tvm' needs CUDA tensors, but q is on {device}; use backend='reference'")
    return backend


def _check_cache(cache, q, k, v, g, backend: str) -> None:
    if not isinstance(cache, PaTHKVCache):
        raise TypeError(f"cache must be a pathtune.PaTHKVCache (from path_attention_prefill or "
                        f"PaTHKVCache.empty), got {type(cache).__name__}")
    B, _, HQ, D = q.shape
    H, DV = k.shape[2], v.shape[-1]
    Bc, _, Hc, Dc = cache.k_buffer.shape
    want = dict(B=Bc, HQ=cache.num_q_heads, H=Hc, D=Dc, DV=cache.v.shape[-1])
    got = dict(B=B, HQ=HQ, H=H, D=D, DV=DV)
    bad = [f"{n} = {got[n]} (cache has {want[n]})" for n in want if got[n] != want[n]]
    if bad:
        raise ValueError("the new tokens do not match the cache: " + ", ".join(bad)
                         + "; q must be [B,T,HQ,D], k/w [B,T,H,D], v [B,T,H,DV] with the cache's sizes")
    if (g is None) != (cache.c is None):
        if g is None:
            raise ValueError("the cache is gated (PaTH-FoX, built with a gate): pass g [B,T,HQ] for the new tokens")
        raise ValueError("the cache was built without a gate (plain PaTH): pass g=None, or prefill with a gate")
    ck = cache.k_buffer
    if ck.device != q.device:
        raise ValueError(f"the cache is on {ck.device} but q is on {q.device}; keep them on one device")
    n = cache.length
    if not 0 <= n <= cache.max_len:
        raise ValueError(f"cache.length = {n} is outside [0, max_len = {cache.max_len}]")
    if backend in ("triton", "tvm"):
        if ck.dtype not in _KERNEL_CACHE_DTYPES or cache.v.dtype != ck.dtype:
            raise ValueError(f"backend {backend!r} keeps the cache in bfloat16, float16 or float32 (k and v alike); "
                             f"got k {ck.dtype}, v {cache.v.dtype}; use backend='reference' for other dtypes")
        if cache.c is not None and cache.c.dtype != torch.float32:
            raise ValueError(f"backend {backend!r} needs the cache's gate cumsum in float32, got {cache.c.dtype}; "
                             "prefill with float32 gates or use backend='reference'")
    if backend == "tvm" and ck.dtype != q.dtype:
        raise ValueError(f"backend 'tvm' keeps the cache in q's dtype ({q.dtype}), got {ck.dtype}")


def path_attention_prefill(q, k, v, w, beta, g=None, *, scale: Optional[float] = None,
                           max_len: Optional[int] = None, cache_dtype: Optional[torch.dtype] = None,
                           backend: str = "auto", config=None,
                           static: bool = False) -> Tuple[torch.Tensor, PaTHKVCache]:
    """Attention over a prompt plus a current-frame KV cache for decoding.

    Arguments as ``pathtune.path_attention`` (equal-length batch, no cu_seqlens). ``max_len``: cache
    capacity (default T; it grows on demand unless ``static``). ``static``: a fixed-capacity cache whose
    buffers never move (needed to capture decode steps in a CUDA graph; ``max_len`` required, >= T).
    ``cache_dtype``: default k's dtype (the kernel backends take bfloat16, float16, float32).
    ``config``: Triton knobs (None = heuristic). Returns (o [B,T,HQ,DV] in q's dtype, cache with cache.length = T).
    """
    _env.check_once()
    spec = load_spec()
    info = validate_inputs(spec, q, k, v, w, beta, g, scale=scale)
    chosen = _resolve(backend, q.device)
    if max_len is not None and (isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 0):
        raise ValueError(f"max_len must be a non-negative int (cache capacity), got {max_len!r}")
    if static and (max_len is None or max_len < info.T):
        raise ValueError(f"a static cache needs max_len >= the prompt length T = {info.T} (its fixed capacity: "
                         f"the prompt plus every token to generate), got max_len={max_len!r}")
    if cache_dtype is not None and (not isinstance(cache_dtype, torch.dtype) or not cache_dtype.is_floating_point):
        raise ValueError(f"cache_dtype must be a floating torch.dtype, got {cache_dtype!r}")
    placement = spec.gate_placement
    if chosen == "reference":
        from .reference.recurrent import path_attention_prefill as ref_prefill

        return ref_prefill(q, k, v, w, beta, g, scale=scale, gate_placement=placement, max_len=max_len,
                           cache_dtype=cache_dtype, static=static)
    if chosen == "tvm":
        raise NotImplementedError("backend 'tvm' has no prefill yet; prefill with backend='triton' (the cache "
                                  "is backend-neutral) and decode with backend='tvm'")
    check_head_dims(spec, info, chosen)
    cdt = k.dtype if cache_dtype is None else cache_dtype
    if cdt not in _KERNEL_CACHE_DTYPES:
        raise ValueError(f"backend 'triton' keeps the cache in bfloat16, float16 or float32, got cache_dtype {cdt}")
    from pathtune.codegen.triton import path_prefill_triton

    f32 = [None if x is None else x.float() for x in (w, beta, g)]
    with on_device(q.device):
        return path_prefill_triton(q, k, v, f32[0], f32[1], f32[2], scale=scale, config=config, max_len=max_len,
                                   cache_dtype=cdt, gate_placement=placement, static=static)


def _config_key(config):
    if config is None:
        return None
    try:
        hash(config)
        return config
    except TypeError:
        pass
    try:
        items = tuple(sorted(dict(config).items()))
        hash(items)
        return ("items", items)
    except (TypeError, ValueError):
        return _UNCACHED


_UNCACHED = object()

# PATHTUNE_CHECK_INPUTS is part of every call key (it decides the per-call value checks) and is read on every
# call, as _env reads it.  os.environ.get encodes the name and decodes the value on each read; CPython's
# os.environ keeps the encoded environment in ``_data``, which is read directly while os.environ is the
# mapping seen at import (the raw value, bytes there, keys the call like the string os.environ.get returns).
_CHECK_ENV = _env.CHECK_INPUTS.name
_ENVIRON = os.environ
try:
    _ENV_DATA, _ENV_KEY = _ENVIRON._data, _ENVIRON.encodekey(_CHECK_ENV)
    if not isinstance(_ENV_DATA, dict):
        raise TypeError
except (AttributeError, TypeError):
    _ENVIRON = None


def _call_key(q, k, v, w, beta, g, cache, scale, backend, config):
    """Hashable metadata of a decode call (AttributeError / TypeError / ValueError for arguments of the wrong
    kind): backend, config, scale; shape, dtype, device and contiguity of every tensor argument; the cache's
    ``layout_key()``; the dispatch length bucket of its length + T_new; the PATHTUNE_CHECK_INPUTS setting."""
    layout = cache._layout
    if layout is None:
        layout = cache.layout_key()
    env = os.environ
    return ("call", backend, None if config is None else _config_key(config), scale,
            q.shape, q.dtype, q.device, q.is_contiguous(), k.shape, k.dtype, k.device, k.is_contiguous(),
            v.shape, v.dtype, v.device, v.is_contiguous(), w.shape, w.dtype, w.device, w.is_contiguous(),
            beta.shape, beta.dtype, beta.device, beta.is_contiguous(),
            None if g is None else (g.shape, g.dtype, g.device, g.is_contiguous()),
            layout, seq_bucket(cache._hint + q.shape[1]),
            _ENV_DATA.get(_ENV_KEY) if env is _ENVIRON else env.get(_CHECK_ENV))


def path_attention_decode(q, k, v, w, beta, g, cache: PaTHKVCache, *, scale: Optional[float] = None,
                          backend: str = "auto", config=None) -> torch.Tensor:
    """Decode T_new >= 1 new tokens against ``cache`` (mutated: tokens appended, keys rotated in place now or,
    on the Triton backend, at a later flush).

    q [B,T_new,HQ,D], k/w [B,T_new,H,D], v [B,T_new,H,DV], beta [B,T_new,H], g [B,T_new,HQ] or None
    (given iff the cache is gated). Token t attends to the cache and to tokens <= t of this call.
    ``config``: decode knobs for the Triton backend (spec Config / mapping; None = heuristic, or with
    ``backend="auto"`` on CUDA the dispatcher's choice of backend and knobs: runtime/decode_dispatch.py).
    A static cache that would overflow raises ``CacheFullError``.
    Returns o [B,T_new,HQ,DV] in q's dtype.
    """
    try:
        key = _call_key(q, k, v, w, beta, g, cache, scale, backend, config)
        plans = (dispatch._DISPATCHER or dispatch.get_dispatcher()).decode_plans
        step = plans.get(key)
    except (AttributeError, TypeError, ValueError):   # arguments of the wrong kind: the checks say which
        key, plans, step = _UNCACHED, None, None
    if step is None:
        step = _prepare(q, k, v, w, beta, g, cache, scale=scale, backend=backend, config=config)
        if plans is not None and key is not _UNCACHED and key[2] is not _UNCACHED:
            plans[key] = step
    elif step.check_values:      # a cached step's per-call value checks (_prepare ran a new step's)
        step.check(q, k, v, w, beta, g)
    with on_device(q.device):
        return step.run(q, k, v, w, beta, g, cache)


class _Step:
    """A decode call resolved for one key: ``run(q, k, v, w, beta, g, cache)`` (the backend's step) and, where
    ``check_values``, the per-call value checks ``check`` to run before it."""

    __slots__ = ("run", "spec", "check_values")

    def __init__(self, run, spec, check_values: bool) -> None:
        self.run, self.spec, self.check_values = run, spec, check_values

    def check(self, q, k, v, w, beta, g) -> None:
        from .validation import _check_values

        args = {"q": q, "k": k, "v": v, "w": w, "beta": beta}
        if g is not None:
            args["g"] = g
        _check_values(self.spec, args)


def _prepare(q, k, v, w, beta, g, cache, *, scale, backend, config) -> _Step:
    """Every check of a decode call and the resolved step of its backend (runs once per call key)."""
    _env.check_once()
    spec = load_spec()
    info = validate_inputs(spec, q, k, v, w, beta, g, scale=scale)
    chosen = _resolve(backend, q.device)
    _check_cache(cache, q, k, v, g, chosen)
    check_values = value_checks_enabled(q.device)
    tvm_step = None
    if backend == "auto" and chosen == "triton" and config is None:
        from .decode_dispatch import decode_plan  # a TVM plan also means the cache is in q's dtype

        plan = decode_plan(q, k, v, g, cache)
        chosen, config, tvm_step = plan.backend, plan.triton_params, plan.tvm_step
    placement = spec.gate_placement
    if chosen == "reference":
        from .reference.recurrent import path_attention_decode as ref_decode

        def run(q, k, v, w, beta, g, cache):
            cache.materialize()   # a cache the Triton step left with pending rows: current-frame keys first
            return ref_decode(q, k, v, w, beta, g, cache, scale=scale, gate_placement=placement)
        return _Step(run, spec, check_values)
    check_head_dims(spec, info, chosen)
    if chosen == "triton":
        from pathtune.codegen.triton.decode import prepare

        # the prepared launcher itself is the step: run(q, k, v, w, beta, g, cache)
        triton_step = prepare(q, k, v, w, beta, g, cache, scale=scale, config=config, gate_placement=placement)
        return _Step(triton_step, spec, check_values)
    # tvm: its fused step takes one token per launch; a multi-token call runs them in order
    if tvm_step is None:
        from pathtune.codegen._registry import require

        require("tvm", spec, "decode", gated=g is not None)
        from pathtune.codegen.tvm.runtime import path_attention_decode_step_tvm

        def one(q_t, k_t, v_t, w_t, b_t, g_t, cache, *, scale):
            return path_attention_decode_step_tvm(q_t, k_t, v_t, w_t, b_t, g_t, cache, scale=scale, config=config)
    else:   # dispatched: modules found and loaded by the plan
        one = tvm_step

    def run(q, k, v, w, beta, g, cache):
        if q.is_cuda and torch.cuda.is_current_stream_capturing():
            raise NotImplementedError("the TVM decode step cannot be captured in a CUDA graph (it runs one launch per "
                                      "token from the host); capture with backend='triton'")
        cache.materialize()   # the TVM step rotates current-frame keys
        w32, b32 = w.float(), beta.float()
        g32 = None if g is None else g.float()
        return torch.stack([one(q[:, t], k[:, t], v[:, t], w32[:, t], b32[:, t],
                                None if g32 is None else g32[:, t], cache, scale=scale)[0]
                            for t in range(q.shape[1])], dim=1)
    return _Step(run, spec, check_values)
