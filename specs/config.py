"""Tuning configs: ``Config`` is what the tuner proposes, perf_db stores and the dispatcher hands to a
backend: an immutable, hashable mapping of knob name -> value that round-trips through JSON unchanged.
(``knobs.KnobSpace`` says which configs a pass of a spec allows.)
"""
from __future__ import annotations

import json
import math
from typing import Any, Iterable, Iterator, Mapping, Union

from .canonical import canonical_json, sha256_hex

__all__ = ["Config", "KnobValue", "in_domain"]

KnobValue = Union[bool, int, float, str]


def in_domain(value: Any, domain: Iterable[Any]) -> bool:
    """``value`` equals a domain entry of the same type (so 1 != 1.0 != True here, as in JSON)."""
    return any(type(value) is type(d) and value == d for d in domain)


def _check_value(name: Any, value: Any) -> None:
    if not isinstance(name, str) or not name.isidentifier():
        raise TypeError(f"config keys must be knob names (identifiers), got {name!r}")
    if not isinstance(value, (bool, int, float, str)):
        raise TypeError(f"config value {name}={value!r} must be an int, float, bool or str, "
                        f"not {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"config value {name}={value!r} must be finite (it has to survive JSON)")


class Config(Mapping[str, KnobValue]):
    """Frozen knob name -> value mapping: ``Config(chunk_size=64, num_warps=4)``.

    * hashable, and equal exactly when the canonical JSON is equal (``to_json()``);
    * ``config.chunk_size`` or ``config["chunk_size"]`` or ``config.get("chunk_size")``;
    * ``Config.from_json(config.to_json()) == config``;
    * ``config.hash``: the first 16 hex digits of the sha256 of the canonical JSON.
    """

    __slots__ = ("_values", "_json")

    def __init__(self, values: Mapping[str, KnobValue] | Iterable[tuple[str, KnobValue]] = (),
                 /, **knobs: KnobValue) -> None:
        data = dict(values)
        data.update(knobs)
        for name, value in data.items():
            _check_value(name, value)
        ordered = dict(sorted(data.items()))
        object.__setattr__(self, "_values", ordered)
        object.__setattr__(self, "_json", canonical_json(ordered))

    # Mapping protocol
    def __getitem__(self, name: str) -> KnobValue:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __getattr__(self, name: str) -> KnobValue:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"this Config has no knob {name!r}; it has: {', '.join(self._values) or '(none)'}") \
                from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Config is immutable; use config.replace(name=value) for a changed copy")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("Config is immutable")

    def __hash__(self) -> int:
        return hash(self._json)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Config):
            return self._json == other._json
        if isinstance(other, Mapping):
            return dict(self._values) == dict(other)
        return NotImplemented

    def __repr__(self) -> str:
        return "Config(" + ", ".join(f"{k}={v!r}" for k, v in self._values.items()) + ")"

    def __reduce__(self):
        return (Config, (self._values,))

    def to_json(self) -> str:
        """Canonical JSON: sorted keys, compact separators."""
        return self._json

    @classmethod
    def from_json(cls, text: str | bytes) -> "Config":
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"a Config is a JSON object of knob -> value, got {type(data).__name__}")
        return cls(data)

    def to_dict(self) -> dict[str, KnobValue]:
        return dict(self._values)

    def replace(self, **changes: KnobValue) -> "Config":
        return Config(self._values, **changes)

    @property
    def hash(self) -> str:
        return sha256_hex(self._json, 16)
