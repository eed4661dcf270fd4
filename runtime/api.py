"""The public entry point: ``path_attention``."""
from __future__ import annotations

import logging
import os
import sys
import warnings
from typing import Callable, Optional, Tuple, Union

import torch

from pathtune import _env
from pathtune.specs import load_spec

from pathtune.specs.canonical import dtype_name

from .device_guard import on_device
from .dispatch import run_triton, select_plan
from .validation import InputInfo, check_head_dims, check_scale, validate_inputs, value_checks_enabled

__all__ = ["path_attention", "BACKENDS", "resolve_backend"]

BACKENDS = ("auto", "reference", "triton", "tvm")

_log = logging.getLogger("pathtune.dispatch")
_printed: set[tuple[str, str]] = set()
_warned: set[str] = set()

# Chunking of the reference backend (it is a readable check, not tuned): one UT chunk of 64 tokens,
# super-chunks of 256, i.e. both levels of the scan are exercised from T > 64 on.
_REFERENCE_CHUNK = 64
_REFERENCE_SUPERCHUNK = 256


_TRITON_ENTRY: Optional[Tuple[Optional[Callable], str]] = None


def _triton_entry() -> Tuple[Optional[Callable], str]:
    """``(path_attention_triton, "")`` or ``(None, why it is unavailable)`` (looked up once)."""
    global _TRITON_ENTRY
    if _TRITON_ENTRY is None:
        _TRITON_ENTRY = _find_triton_entry()
    return _TRITON_ENTRY


def _find_triton_entry() -> Tuple[Optional[Callable], str]:
    try:
        from pathtune.codegen import triton as triton_backend
    except ImportError as e:  # e.g. triton itself missing
        return None, f"importing pathtune.codegen.triton failed ({e})"
    fn = getattr(triton_backend, "path_attention_triton", None)
    if fn is None:
        return None, "pathtune.codegen.triton does not provide path_attention_triton yet"
    return fn, ""


def resolve_backend(backend: str, device: torch.device) -> Tuple[str, str]:
    """Which implementation ``backend`` means for inputs on ``device``: ``(name, reason)``."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
    if backend != "auto":
        return backend, "requested"
    if device.type != "cuda":
        return "reference", f"auto: inputs on {device.type}, the kernels need CUDA"
    fn, why = _triton_entry()
    if fn is None:
        if why not in _warned:
            _warned.add(why)
            warnings.warn(f"pathtune: the Triton backend is unavailable ({why}); path_attention runs the "
                          "PyTorch reference on the GPU, which is correct but slow", RuntimeWarning, stacklevel=3)
        return "reference", f"auto: CUDA inputs but {why}"
    return "triton", "auto: CUDA inputs"


def _report(backend: str, reason: str, info: InputInfo) -> None:
    if _log.isEnabledFor(logging.DEBUG):
        _log.debug("path_attention -> %s (%s); B=%d T=%d HQ=%d H=%d D=%d DV=%d varlen=%s", backend, reason,
                   info.B, info.T, info.HQ, info.H, info.D, info.DV, info.varlen)
    if _env.PRINT_DISPATCH.get() and (backend, reason) not in _printed:
        _printed.add((backend, reason))
        print(f"[pathtune] path_attention -> {backend} ({reason})", file=sys.stderr)


def path_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    w: torch.Tensor,
    beta: torch.Tensor,
    g: Optional[torch.Tensor] = None,
    *,
    scale: Optional[float] = None,
    cu_seqlens: Optional[torch.Tensor] = None,
    backend: str = "auto",
    return_lse: bool = False,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """PaTH attention (and PaTH-FoX when ``g`` is given), causal.

    ``o_i = sum_{j<=i} softmax_j(scale * S_ij) v_j`` with ``S_ij = q_i^T H_i ... H_{j+1} k_j`` and
    ``H_t = I - beta_t w_t w_t^T``; with a gate, ``scale * (S_ij + c_i - c_j)``, ``c = cumsum(g)``
    (the spec's ``fox_gate.placement``). Argument layout as flash-linear-attention's
    ``parallel_path_attn``.

    Args:
        q: [B, T, HQ, D] queries; bfloat16, float16, float32 or float64.
        k: [B, T, H, D] keys, q's dtype. HQ must be a multiple of H (GQA).
        v: [B, T, H, DV] values, q's dtype. DV may differ from D.
        w: [B, T, H, D] Householder directions, unit L2 norm along D; float32 (preferred), float64 or
            q's dtype. Shared by the query heads of a group.
        beta: [B, T, H] Householder strengths in (0, 2]; dtypes as w.
        g: [B, T, HQ] optional log forget gate (FoX) in (-inf, 0] (finite, e.g. ``logsigmoid(x)``), per
            query head; dtypes as w.
        scale: softmax scale; default ``D ** -0.5``.
        cu_seqlens: [N + 1] int32/int64 boundaries of N sequences packed along T (then B must be 1):
            0 = cu_seqlens[0] < ... < cu_seqlens[N] = T.
        backend: ``"auto"`` (CUDA inputs: the fastest measured kernel for this GPU and workload,
            Triton or -- forward-only calls -- TVM, from a loaded pack, perf_db or the built-in
            heuristic, see ``pathtune.runtime.dispatch``; other devices: the reference),
            ``"reference"`` (PyTorch, any head dim, any device), ``"triton"`` / ``"tvm"`` (that
            backend, with its best known config).
        return_lse: also return the log-sum-exp.

    Returns:
        o [B, T, HQ, DV] in q's dtype; with ``return_lse``, ``(o, lse)`` where lse [B, T, HQ] is the
        natural-log sum-exp of the scaled logits, float32 (float64 for float64 inputs).

    Raises:
        ValueError: a bad argument; the message names it and what is expected. Kernel backends accept
            only the spec's head dims (``pathtune spec show``).
        NotImplementedError: the chosen backend is not available (the message says what is missing).

    Validation cost: shape, dtype and device checks are free. ``cu_seqlens`` is read on the host
    (N + 1 integers; a varlen launch needs them there anyway). The value checks -- beta in (0, 2], g in
    (-inf, 0], w unit-norm -- read whole tensors, so on a GPU they would be hidden host synchronisations: they run
    for CPU inputs, and for GPU inputs only when ``PATHTUNE_CHECK_INPUTS=1`` (use it while debugging).
    Kernels run on q's CUDA device (made current for the call, whatever device is current; the caller's is
    restored after it). The backend that ran is logged at DEBUG on the ``pathtune.dispatch`` logger
    (``PATHTUNE_PRINT_DISPATCH=1`` prints it, and each kernel config with where it came from). The
    kernel choice is cached per workload key; under ``torch.compile`` it is made at trace time and
    is a constant of the graph.
    """
    if torch.compiler.is_compiling():
        return _path_attention_traced(q, k, v, w, beta, g, scale, cu_seqlens, backend, return_lse)
    _env.check_once()
    spec = load_spec()
    info = _validate(spec, q, k, v, w, beta, g, scale, cu_seqlens)
    chosen, reason = resolve_backend(backend, q.device)
    _check_backend(spec, info, chosen, q.device)
    scale = float(info.D) ** -0.5 if scale is None else float(scale)
    placement = spec.gate_placement

    _report(chosen, reason, info)
    if chosen == "reference":
        o, lse = _reference(q, k, v, w, beta, g, scale, cu_seqlens, placement)
    else:
        plan = select_plan(q.device, info.D, info.DV, info.HQ, info.H, dtype_name(q.dtype), g is not None,
                           info.max_seqlen, info.num_seqs, info.varlen,
                           backends=_candidates(backend, chosen), grad=_needs_grad(q, k, v, w, beta, g))
        with on_device(q.device):
            o, lse = plan.run(q, k, v, w, beta, g, scale, cu_seqlens, placement)
    if not return_lse:
        return o
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    return o, lse.to(lse_dtype)


_VALIDATED: dict[tuple, InputInfo] = {}
_VALIDATED_MAX = 4096


def _validate(spec, q, k, v, w, beta, g, scale, cu_seqlens) -> InputInfo:
    """``validate_inputs``, remembered per (shapes, dtypes, devices, scale) when it reads no values.

    Without value checks (GPU inputs, PATHTUNE_CHECK_INPUTS unset) and without cu_seqlens the
    outcome depends on that signature only, so a repeated call shape skips the spec walk (tens of
    microseconds) for a dict lookup. Failing calls are never remembered.
    """
    try:
        if cu_seqlens is not None or value_checks_enabled(q.device):
            return validate_inputs(spec, q, k, v, w, beta, g, scale=scale, cu_seqlens=cu_seqlens)
        key = (id(spec), type(scale), scale,
               q.shape, q.dtype, q.device, k.shape, k.dtype, k.device, v.shape, v.dtype, v.device,
               w.shape, w.dtype, w.device, beta.shape, beta.dtype, beta.device,
               None if g is None else (g.shape, g.dtype, g.device))
        info = _VALIDATED.get(key)
    except (AttributeError, TypeError):  # not tensors, unhashable scale: the full check says what is wrong
        return validate_inputs(spec, q, k, v, w, beta, g, scale=scale, cu_seqlens=cu_seqlens)
    if info is None:
        info = validate_inputs(spec, q, k, v, w, beta, g, scale=scale, cu_seqlens=cu_seqlens)
        if len(_VALIDATED) < _VALIDATED_MAX:
            _VALIDATED[key] = info
    return info


def _check_backend(spec, info: InputInfo, chosen: str, device: torch.device) -> None:
    if chosen == "tvm":
        if device.type != "cuda":
            raise ValueError(f"backend 'tvm' needs CUDA tensors, but q is on {device}; its kernels run on a GPU "
                             "(forward only); use backend='reference' on the CPU")
        from pathtune.codegen._registry import require

        require("tvm", spec, "fwd", gated=info.gated)
    if chosen == "triton":
        triton_fn, why = _triton_entry()
        if triton_fn is None:
            raise NotImplementedError(f"backend 'triton' is unavailable: {why}; install Triton (it comes with "
                                      "torch on Linux GPU hosts) or use backend='reference'")
        if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(f"backend 'triton' needs CUDA tensors, but q is on {device}; use backend='reference', "
                             "or set TRITON_INTERPRET=1 to run the Triton kernels in the (slow) CPU interpreter")
        check_head_dims(spec, info, chosen)


def _candidates(requested: str, chosen: str) -> Tuple[str, ...]:
    """Backends the dispatcher may pick: 'auto' on CUDA lets TVM compete with Triton (forward only)."""
    if requested == "auto":
        return ("triton", "tvm")
    return (chosen,)


def _needs_grad(*tensors: Optional[torch.Tensor]) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _reference(q, k, v, w, beta, g, scale, cu_seqlens, placement):
    from pathtune.runtime.reference import blockwise_path_attention

    return blockwise_path_attention(q, k, v, w, beta, g, scale=scale, cu_seqlens=cu_seqlens,
                                    chunk_size=_REFERENCE_CHUNK, superchunk_size=_REFERENCE_SUPERCHUNK,
                                    gate_placement=placement)


# -- torch.compile ---------------------------------------------------------------------------------
# Under tracing, the validation and the dispatch decision run once, at trace time, inside one
# function marked torch.compiler.assume_constant_result: its argument is a string of the inputs'
# sizes, dtypes and devices, its result (backend, Triton params JSON, D) is a constant of the graph.
# Sizes are made static first (_static_int): a size that dynamo made symbolic is pinned by guards,
# so a new shape recompiles with its own plan (as with dynamic=False).

def _static_int(size) -> int:
    """A Python int for a (possibly symbolic) size, by guarded comparisons dynamo can trace."""
    hi = 1
    while size >= hi:
        hi *= 2
    lo = hi // 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if size >= mid:
            lo = mid
        else:
            hi = mid
    return lo


def _sig(t: Optional[torch.Tensor]) -> str:
    if t is None:
        return "-"
    dims = "x".join([str(_static_int(s)) for s in t.shape])
    return dims + ";" + str(t.dtype) + ";" + str(t.device) + ";" + ("1" if t.requires_grad else "0")


@torch.compiler.assume_constant_result
def _traced_plan(signature: str, backend: str, grad_enabled: bool, scale=None) -> Tuple[str, str, int, str]:
    """(backend, params JSON, D, gate placement) of a traced call; validates it (and ``scale``) like an
    eager call."""
    check_scale(scale)
    names = ("q", "k", "v", "w", "beta", "g", "cu_seqlens")
    metas, devices, needs_grad = {}, {}, False
    for name, part in zip(names, signature.split("|")):
        if part == "-":
            metas[name] = None
            continue
        dims, dtype, device, rg = part.split(";")
        shape = tuple(int(x) for x in dims.split("x")) if dims else ()
        metas[name] = torch.empty(shape, dtype=getattr(torch, dtype.replace("torch.", "")), device="meta")
        devices[name] = torch.device(device)
        needs_grad = needs_grad or rg == "1"
    for name, dev in devices.items():
        if dev != devices["q"]:
            raise ValueError(f"{name} is on {dev} but q is on {devices['q']}; put all inputs on one device")
    spec = load_spec()
    info = validate_inputs(spec, *(metas[n] for n in names[:6]), cu_seqlens=metas["cu_seqlens"], host_values=False)
    device = devices["q"]
    chosen, reason = resolve_backend(backend, device)
    if chosen == "tvm":
        raise NotImplementedError("backend 'tvm' cannot be traced by torch.compile (its kernels are not torch "
                                  "ops); use backend='triton' or 'auto' in compiled code")
    _check_backend(spec, info, chosen, device)
    placement = spec.gate_placement
    if chosen == "reference":
        return "reference", "", info.D, placement
    plan = select_plan(device, info.D, info.DV, info.HQ, info.H, str(metas["q"].dtype).replace("torch.", ""),
                       metas["g"] is not None, info.max_seqlen, info.num_seqs, info.varlen,
                       backends=("triton",), grad=grad_enabled and needs_grad)
    return "triton", plan.params_json, info.D, placement


def _path_attention_traced(q, k, v, w, beta, g, scale, cu_seqlens, backend, return_lse):
    signature = "|".join([_sig(t) for t in (q, k, v, w, beta, g, cu_seqlens)])
    # scale: a Python constant of the trace (checked like an eager call's), or a traced value (not checkable)
    checked_scale = scale if scale is None or isinstance(scale, (bool, int, float)) else None
    chosen, params_json, D, placement = _traced_plan(signature, backend, torch.is_grad_enabled(), checked_scale)
    scale = float(D) ** -0.5 if scale is None else float(scale)
    if chosen == "reference":
        o, lse = _reference(q, k, v, w, beta, g, scale, cu_seqlens, placement)
    else:
        o, lse = run_triton(params_json, q, k, v, w, beta, g, scale, cu_seqlens, placement)
    if not return_lse:
        return o
    return o, lse.to(torch.float64 if q.dtype == torch.float64 else torch.float32)
