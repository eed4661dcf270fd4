"""Input validation for :func:`pathtune.runtime.api.path_attention`.

Shapes, ranks, dtypes and the dim rules come from the spec (``tensors``, ``dim_rules``), so the
messages use the spec's symbols (``k must be [B, T, H, D]``). Every error is a ``ValueError`` (or a
``TypeError`` for a non-tensor argument) that names the argument and says what is expected.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from pathtune import _env
from pathtune.specs import Spec
from pathtune.specs.canonical import dtype_name as _dtype_name

__all__ = ["InputInfo", "validate_inputs", "check_head_dims", "value_checks_enabled", "UNIT_NORM_TOL"]

# |‖w‖ - 1| allowed by the unit-norm check, by w's dtype (half types store ~3 significant digits).
UNIT_NORM_TOL = {torch.float64: 1e-3, torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 1e-2}


@dataclass(frozen=True)
class InputInfo:
    """Sizes bound from the inputs (spec symbols), plus what validation learnt about cu_seqlens."""

    B: int
    T: int
    HQ: int
    H: int
    D: int
    DV: int
    num_seqs: int        # N with cu_seqlens, else B
    max_seqlen: int      # longest sequence
    varlen: bool
    device: torch.device
    values_checked: bool  # beta / g / w value checks ran
    gated: bool = False   # g was given (PaTH-FoX)


def value_checks_enabled(device: torch.device) -> bool:
    """Value checks run on CPU inputs always, on other devices only with PATHTUNE_CHECK_INPUTS=1."""
    return device.type == "cpu" or _env.CHECK_INPUTS.get()


def _shape_str(shape: Sequence[str]) -> str:
    return "[" + ", ".join(shape) + "]"


def _check_dtype(spec: Spec, name: str, t: torch.Tensor, args: dict[str, torch.Tensor]) -> None:
    ts = getattr(spec.tensors, name)
    if ts.same_dtype_as is not None:
        ref = args[ts.same_dtype_as]
        if t.dtype != ref.dtype:
            raise ValueError(f"{name}.dtype is {_dtype_name(t.dtype)} but must equal "
                             f"{ts.same_dtype_as}.dtype ({_dtype_name(ref.dtype)})")
        return
    allowed = list(ts.dtypes)
    if ts.or_dtype_of is not None:
        extra = _dtype_name(args[ts.or_dtype_of].dtype)
        if extra not in allowed:
            allowed.append(extra)
    if _dtype_name(t.dtype) not in allowed:
        hint = f" ({ts.preferred_dtype} preferred)" if ts.preferred_dtype else ""
        raise ValueError(f"{name}.dtype is {_dtype_name(t.dtype)}; allowed: {', '.join(allowed)}{hint}")


def check_scale(scale) -> None:
    """``scale`` is None (the default D ** -0.5) or a positive finite number; raises ValueError otherwise.
    Eager calls and torch.compile traces (where scale is a Python constant) run the same check."""
    if scale is not None:
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
            raise ValueError(f"scale must be a positive finite float (default D ** -0.5), got {scale!r}")


def validate_inputs(spec: Spec, q, k, v, w, beta, g=None, *, scale=None, cu_seqlens=None,
                    host_values: bool = True) -> InputInfo:
    """Check the arguments of ``path_attention`` against the spec; return the bound sizes.

    Always (cheap, no device sync): types, ranks, shapes, dtypes, devices, dim rules, ``scale``.
    ``cu_seqlens`` (N + 1 integers) is always copied to the host and checked (starts at 0, strictly
    increasing, ends at T): the varlen kernels need the sequence count and longest length on the
    host anyway, so this adds no sync a varlen launch would not already do.
    Value checks of ``beta`` and ``g`` (inside the spec's intervals) and ``w`` (unit L2 norm) read whole tensors,
    i.e. a host synchronisation: they run when the inputs are on the CPU, or on any device with
    ``PATHTUNE_CHECK_INPUTS=1``, and never otherwise.

    ``host_values=False`` (tracing under torch.compile, where tensor values are unknown): no value
    checks, and ``cu_seqlens`` is checked by shape and dtype only (its longest sequence is taken as T).
    """
    args = {"q": q, "k": k, "v": v, "w": w, "beta": beta}
    if g is not None:
        args["g"] = g
    named = [*args.items(), ("cu_seqlens", cu_seqlens)]
    for name, t in named:
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")

    if g is not None and spec.stage("fox_gate") is None:
        raise ValueError(f"g was given, but spec {spec.name!r} has no fox_gate stage; pass g=None")

    # Ranks and shapes: bind each symbol at its first occurrence (q, k, v, w, beta, g order).
    bound: dict[str, tuple[int, str]] = {}
    for name, t in args.items():
        shape = getattr(spec.tensors, name).shape
        if t.dim() != len(shape):
            raise ValueError(f"{name} must be {len(shape)}-D {_shape_str(shape)}, got shape {tuple(t.shape)}")
        for axis, (sym, size) in enumerate(zip(shape, t.shape)):
            if sym not in bound:
                bound[sym] = (int(size), f"{name}.shape[{axis}]")
            elif bound[sym][0] != size:
                value, src = bound[sym]
                raise ValueError(f"{name}.shape[{axis}] = {size} does not match {sym} = {value} from {src}; "
                                 f"{name} must be {_shape_str(shape)}, got shape {tuple(t.shape)}")
    sizes = {sym: size for sym, (size, _) in bound.items()}
    empty = [f"{sym} ({src})" for sym, (size, src) in bound.items() if size == 0]
    if empty:
        raise ValueError(f"empty inputs: {', '.join(empty)} is 0; path_attention needs every dim >= 1")
    _enforce(spec.dim_rules, bound)

    # Dtypes and devices.
    for name, t in args.items():
        _check_dtype(spec, name, t, args)
    for name, t in named:
        if t is not None and t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}; put all inputs on one device")

    check_scale(scale)

    num_seqs, max_seqlen = sizes["B"], sizes["T"]
    if cu_seqlens is not None:
        num_seqs, max_seqlen = _check_cu_seqlens(spec, cu_seqlens, bound, read=host_values)

    checked = host_values and value_checks_enabled(q.device)
    if checked:
        _check_values(spec, args)
    return InputInfo(B=sizes["B"], T=sizes["T"], HQ=sizes["HQ"], H=sizes["H"], D=sizes["D"], DV=sizes["DV"],
                     num_seqs=num_seqs, max_seqlen=max_seqlen, varlen=cu_seqlens is not None,
                     device=q.device, values_checked=checked, gated=g is not None)


def _enforce(rules, bound: dict[str, tuple[int, str]]) -> None:
    """Raise the message of the first rule the bound sizes break, with the sizes and where they came from."""
    sizes = {sym: size for sym, (size, _) in bound.items()}
    for rule in rules:
        if not rule.compiled.evaluate_bool(sizes):
            got = ", ".join(f"{n} = {bound[n][0]} ({bound[n][1]})" for n in sorted(rule.compiled.names))
            raise ValueError(f"{rule.message}; got {got}")


def _check_cu_seqlens(spec: Spec, cu: torch.Tensor, bound: dict[str, tuple[int, str]],
                      read: bool = True) -> tuple[int, int]:
    ts = spec.tensors.cu_seqlens
    if ts is None:
        raise ValueError(f"cu_seqlens was given, but spec {spec.name!r} declares no cu_seqlens tensor")
    if cu.dim() != 1:
        raise ValueError(f"cu_seqlens must be 1-D [N + 1] (sequence boundaries), got shape {tuple(cu.shape)}")
    if _dtype_name(cu.dtype) not in ts.dtypes:
        raise ValueError(f"cu_seqlens.dtype is {_dtype_name(cu.dtype)}; allowed: {', '.join(ts.dtypes)}")
    _enforce(ts.requires, bound)
    if cu.numel() < 2:
        raise ValueError(f"cu_seqlens needs at least 2 entries [0, ..., T], got shape {tuple(cu.shape)}")
    T = bound["T"][0]
    if not read:
        return cu.numel() - 1, T
    host = cu.tolist()
    if host[0] != 0:
        raise ValueError(f"cu_seqlens must start at 0, got cu_seqlens[0] = {host[0]}")
    lengths = [b - a for a, b in zip(host, host[1:])]
    bad = next((i for i, n in enumerate(lengths) if n <= 0), None)
    if bad is not None:
        raise ValueError(f"cu_seqlens must be strictly increasing (no empty sequences), but "
                         f"cu_seqlens[{bad}] = {host[bad]} and cu_seqlens[{bad + 1}] = {host[bad + 1]}")
    if host[-1] != T:
        raise ValueError(f"cu_seqlens must end at T = {T} (q.shape[1]), got cu_seqlens[-1] = {host[-1]}")
    return len(lengths), max(lengths)


def _first_index(mask: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(i) for i in mask.nonzero()[0])


def _check_values(spec: Spec, args: dict[str, torch.Tensor]) -> None:
    for name, t in args.items():
        ts = getattr(spec.tensors, name)
        bounds = ts.interval_bounds
        if bounds is not None:
            lo, lo_incl, hi, hi_incl = bounds
            inside = (t >= lo if lo_incl else t > lo) & (t <= hi if hi_incl else t < hi)
            if not bool(inside.all()):
                outside = ~inside
                idx = _first_index(outside)
                raise ValueError(f"{name} must lie in {ts.interval}; {int(outside.sum())} of {t.numel()} values do "
                                 f"not, e.g. {name}[{', '.join(map(str, idx))}] = {t[idx].item()!r}")
        if ts.unit_norm:
            tol = UNIT_NORM_TOL.get(t.dtype, 1e-3)
            acc = torch.float64 if t.dtype == torch.float64 else torch.float32
            dev = (torch.linalg.vector_norm(t.to(acc), dim=-1) - 1).abs()
            worst = dev.nan_to_num(nan=math.inf).max()
            if bool(worst > tol):
                idx = _first_index(dev.nan_to_num(nan=math.inf) == worst)
                raise ValueError(f"{name} must have unit L2 norm along its last dim (normalise it, e.g. "
                                 f"torch.nn.functional.normalize({name}, dim=-1)); |norm - 1| = {float(worst):.3g} "
                                 f"at {name}[{', '.join(map(str, idx))}, :] exceeds {tol:g} "
                                 f"(the tolerance for {_dtype_name(t.dtype)})")


def check_head_dims(spec: Spec, info: InputInfo, backend: str) -> None:
    """Kernels are built for the spec's head dims; the reference backend takes any."""
    for sym, arg, domain in (("D", "q.shape[3]", spec.head_dims), ("DV", "v.shape[3]", spec.head_dims_v)):
        size = getattr(info, sym)
        if size not in domain:
            raise ValueError(f"head dim {sym} = {size} ({arg}) is not supported by backend {backend!r}; "
                             f"supported: {', '.join(map(str, domain))} (backend='reference' accepts any head dim)")
