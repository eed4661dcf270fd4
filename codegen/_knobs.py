"""Backend-neutral: turn a spec Config (or any mapping of knob values) into a backend's params."""
from __future__ import annotations

import dataclasses
from dataclasses import fields
from typing import Any, Mapping, Optional, TypeVar

P = TypeVar("P")


def params_from_config(cls: type[P], config: Any, base: Optional[P] = None) -> P:
    """``cls(**knobs)`` for a frozen params dataclass: knobs ``cls`` does not declare are ignored,
    missing ones take their value from ``base`` (default: the class defaults), and beta_clip_eps
    ``'off'`` becomes None."""
    if config is None:
        return cls() if base is None else base
    if isinstance(config, cls):
        return config
    if hasattr(config, "to_dict"):
        config = config.to_dict()
    elif not isinstance(config, Mapping):
        config = dict(config)
    names = {f.name for f in fields(cls)}
    kw = {k: v for k, v in config.items() if k in names}
    eps = kw.get("beta_clip_eps")
    if isinstance(eps, str):
        kw["beta_clip_eps"] = None if eps.lower() == "off" else float(eps)
    return cls(**kw) if base is None else dataclasses.replace(base, **kw)
