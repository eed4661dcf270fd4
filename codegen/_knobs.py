"""Backend-neutral: the one knob contract between the spec and a backend's kernel params.

A backend's params class (``TritonParams``, ``TVMParams``) is a frozen dataclass whose fields are knobs
of the spec (``knobs``) or of that backend (``backends.<name>.knobs``).  Its defaults come from the spec
(``spec_default``) and its checks from the spec's domains and constraints (``check_params``); nothing
is repeated in code.  ``resolve(backend, pass_, config, dims)`` is the one Config -> kernel params
function: the dispatcher, the tuner, the benches and the layer's custom op build params with it.
``config_json`` is the text a launch carries (the complete Config, checked by ``resolve``) and
``resolve_json`` reads it back; ``params_from_config`` (``TritonParams.from_config``) overlays a partial
config on given params.  All three construct params in ``_construct`` only (tests/test_knob_path.py).

Spelling: the spec writes "no clip" as ``'off'`` (a categorical knob whose domain holds ``'off'``); the
params hold None.  ``config_of`` turns params (or a partial config) back into a complete config in the
spec's spelling, which is what plans and records carry.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import json
from dataclasses import fields
from typing import Any, Mapping, Optional, TypeVar

P = TypeVar("P")

__all__ = ["spec_default", "check_params", "params_from_config", "params_class", "config_of", "resolve",
           "resolve_json", "config_json", "head_dims_of"]

_OFF = "off"


def _spec():
    from pathtune.specs import load_spec

    return load_spec()


def _knob(name: str, backend: Optional[str]):
    spec = _spec()
    knob = spec.knobs.get(name)
    if knob is None and backend is not None:
        knob = spec.backend_knobs(backend).get(name)
    if knob is None:
        raise KeyError(f"{name!r} is neither a spec knob nor a knob of backend {backend!r} (specs/path_attention.yaml)")
    return knob


def _to_params(name: str, value: Any, backend: Optional[str] = None) -> Any:
    """A knob value in the spec's spelling -> the params' ('off' -> None, a numeric string -> float)."""
    if isinstance(value, str):
        knob = _knob(name, backend)
        if value.lower() == _OFF and _OFF in knob.domain:
            return None
        if knob.type == "categorical" and not any(isinstance(v, str) and v == value for v in knob.domain):
            try:
                return float(value)
            except ValueError:
                return value
    return value


def _to_spec(name: str, value: Any, backend: Optional[str] = None) -> Any:
    """A params value -> the spec's spelling (None -> 'off')."""
    if value is None and _OFF in _knob(name, backend).domain:
        return _OFF
    return value


def spec_default(name: str, backend: Optional[str] = None) -> Any:
    """A dataclass field defaulting to knob ``name``'s default in the spec (``backend``: also its own knobs),
    in the params' spelling."""
    knob = _knob(name, backend)
    return dataclasses.field(default=_to_params(name, knob.default, backend))


def check_params(obj: Any, backend: str) -> None:
    """Raise ValueError when a params object breaks the spec: a string value outside its knob's domain
    (a misspelt precision), a number that is not positive (>= 0 where the domain holds 0), or a
    constraint over its knobs alone (the ones naming workload dims are checked with the workload).
    Numbers outside a domain are accepted: tests and probes run smaller tiles than tuning searches."""
    spec = _spec()
    knobs = {**spec.knobs, **spec.backend_knobs(backend)}
    env = {}
    for f in fields(obj):
        knob = knobs.get(f.name)
        if knob is None:
            continue
        value = getattr(obj, f.name)
        env[f.name] = value
        if value is None and _OFF in knob.domain:
            continue
        if isinstance(value, str) and value.lower() == _OFF and _OFF in knob.domain:
            raise ValueError(f"{f.name}={value!r} is the spec's spelling; kernel params hold None for it "
                             "(build params with resolve() or from_config())")
        if isinstance(value, str) or knob.type == "categorical" and not isinstance(value, (int, float)):
            if not any(isinstance(v, str) and v == value for v in knob.domain):
                raise ValueError(f"{f.name} must be one of {[v for v in knob.domain if isinstance(v, str)]} "
                                 f"(specs/path_attention.yaml knobs.{f.name}), got {value!r}")
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{f.name} must be a number like the spec's domain {list(knob.domain)}, got {value!r}")
        if knob.type == "int" and int(value) != value:
            raise ValueError(f"{f.name} must be an integer, got {value!r}")
        floor = 0 if any(v == 0 for v in knob.domain if not isinstance(v, str)) else 1
        if knob.type == "int" and value < floor:
            raise ValueError(f"{f.name} must be >= {floor} (the spec's domain is {list(knob.domain)}), got {value!r}")
        if knob.type != "int" and not value > 0:
            raise ValueError(f"{f.name} must be > 0 (the spec's domain is {list(knob.domain)}), got {value!r}")
    for rule in spec.constraints:
        names = rule.compiled.names
        if names <= env.keys() and all(env[n] is not None for n in names):
            if not rule.compiled.evaluate_bool(env):
                values = ", ".join(f"{n}={env[n]!r}" for n in sorted(names))
                raise ValueError(f"{rule.message} [{rule.expr} is false for {values}]")


# A pass whose kernels read knobs no other pass reads may declare them in a subclass of its backend's params
# class, in its own (source-hashed) module, so that such a knob touches only that pass's sources and records.
_PASS_PARAMS = {("triton", "decode"): ("pathtune.codegen.triton.decode", "TritonDecodeParams"),
                ("triton", "fwd"): ("pathtune.codegen.triton.forward", "TritonFwdParams"),
                ("triton", "bwd"): ("pathtune.codegen.triton.backward", "TritonBwdParams")}


def params_class(backend: str, pass_: Optional[str] = None) -> type:
    """The params class of ``backend`` (``codegen/<backend>/params.py``), or of one of its passes where that pass
    declares its own knobs (``_PASS_PARAMS``: a subclass with the pass's extra fields)."""
    names = {"triton": "TritonParams", "tvm": "TVMParams"}
    if backend not in names:
        raise ValueError(f"unknown backend {backend!r}; backends with kernel params: {', '.join(names)}")
    sub = _PASS_PARAMS.get((backend, pass_))
    if sub is not None:
        return getattr(importlib.import_module(sub[0]), sub[1])
    return getattr(importlib.import_module(f"pathtune.codegen.{backend}.params"), names[backend])


def head_dims_of(dims: Any) -> tuple[Optional[int], Optional[int]]:
    """(D, DV) of ``dims``: a mapping with D (and DV), a Workload, a (D, DV) pair, or None."""
    if dims is None:
        return None, None
    if hasattr(dims, "head_dim"):
        return int(dims.head_dim), int(getattr(dims, "head_dim_v", None) or dims.head_dim)
    if isinstance(dims, Mapping):
        D = dims.get("D")
        return (None if D is None else int(D)), (None if dims.get("DV") is None else int(dims["DV"]))
    D, DV = dims
    return int(D), (None if DV is None else int(DV))


def _as_mapping(config: Any) -> Mapping[str, Any]:
    if config is None:
        return {}
    if hasattr(config, "to_dict"):
        return config.to_dict()
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return {f.name: getattr(config, f.name) for f in fields(config)}
    if isinstance(config, Mapping):
        return config
    return dict(config)


def config_of(backend: str, config: Any, dims: Any = None) -> dict[str, Any]:
    """Every knob ``backend`` reads, in the spec's spelling: the spec's defaults (with the backend's
    head-dim defaults for ``dims``), overlaid with ``config`` (a Config, mapping or params object).
    A name that is no knob of the spec or of the backend raises ValueError."""
    spec = _spec()
    D, DV = head_dims_of(dims)
    out = spec.backend_defaults(backend, D, DV)
    given = _as_mapping(config)
    unknown = sorted(k for k in given if k not in out)
    if unknown:
        raise ValueError(f"unknown knob {', '.join(map(repr, unknown))} for backend {backend!r}; knobs: the spec's "
                         f"knobs and backends.{backend}.knobs (`pathtune spec show`)")
    out.update({k: _to_spec(k, v, backend) for k, v in given.items()})
    return out


def resolve(backend: str, pass_: Optional[str], config: Any, dims: Any = None) -> Any:
    """Kernel params of ``backend`` for ``pass_`` (``fwd``, ``bwd``, ``decode``; None: any; the class of
    ``params_class(backend, pass_)``) from a spec
    Config / mapping of knob values / params object; knobs it leaves out take the backend's untuned
    config for ``dims`` (the spec's ``head_dim_defaults`` over its defaults; no dims: the defaults).
    Knobs the backend does not read are ignored; a value the spec does not allow raises ValueError."""
    spec = _spec()
    if pass_ is not None and pass_ not in spec.passes:
        raise ValueError(f"unknown pass {pass_!r}; passes: {', '.join(spec.passes)}")
    cls = params_class(backend, pass_)
    if isinstance(config, cls):
        return config
    if dataclasses.is_dataclass(config) and isinstance(config, params_class(backend)):
        # params of the backend (or of another pass) for this pass's class: its knob values, the rest defaults
        return _construct(cls, config_of(backend, _as_mapping(config)), backend)
    return _construct(cls, config_of(backend, config, dims), backend)


def _construct(cls: type[P], values: Mapping[str, Any], backend: Optional[str], base: Optional[P] = None) -> P:
    """The one place knob values (the spec's spelling) become kernel params: the knobs ``cls`` declares,
    'off' -> None, over ``base`` when given (its fields for the knobs ``values`` leave out)."""
    names = {f.name for f in fields(cls)}
    kw = {k: _to_params(k, v, backend) for k, v in values.items() if k in names}
    return cls(**kw) if base is None else dataclasses.replace(base, **kw)


def config_json(backend: str, pass_: Optional[str], config: Any, dims: Any = None) -> str:
    """The config a launch carries (``Plan.params_json``, the custom op's argument): every knob ``backend``
    reads, in the spec's spelling (``config_of``), as canonical JSON; checked by ``resolve`` first, so a
    config the kernels cannot take fails here, not at the launch.  ``resolve_json`` reads it back."""
    from pathtune.specs.canonical import canonical_json

    resolve(backend, pass_, config, dims)
    return canonical_json(config_of(backend, config, dims))


@functools.lru_cache(maxsize=256)
def resolve_json(backend: str, pass_: Optional[str], config_json: str, head_dim: Optional[int] = None,
                 head_dim_v: Optional[int] = None) -> Any:
    """``resolve`` of a config given as JSON (what a plan and the custom op carry), cached per text."""
    dims = None if head_dim is None else (head_dim, head_dim_v)
    return resolve(backend, pass_, json.loads(config_json), dims)


def params_from_config(cls: type[P], config: Any, base: Optional[P] = None) -> P:
    """``cls(**knobs)`` for a frozen params dataclass: knobs ``cls`` does not declare are ignored,
    missing ones take their value from ``base`` (default: the class defaults, i.e. the spec's), and
    beta_clip_eps ``'off'`` becomes None."""
    if config is None and base is not None:
        return base
    if isinstance(config, cls):
        return config
    return _construct(cls, _as_mapping(config), getattr(cls, "BACKEND", None), base)   # None: cls()
