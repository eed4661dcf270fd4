"""Tuning configs and the knob space of one pass.

``Config`` is what the tuner proposes, perf_db stores and the dispatcher hands to a backend: an
immutable, hashable mapping of knob name -> value that round-trips through JSON unchanged.
``KnobSpace`` is the set of valid configs of one pass of a spec; it reads knob domains and
constraints from the spec only, so a new domain value in the YAML needs no code change here.
"""
from __future__ import annotations

import itertools
import json
import math
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping, Union

from .canonical import canonical_json, sha256_hex

if TYPE_CHECKING:  # pragma: no cover
    from .schema import Knob, Rule, Spec

__all__ = ["Config", "KnobSpace", "KnobValue", "in_domain"]

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


class KnobSpace:
    """The valid configs of one pass (``"fwd"``, ``"bwd"``, ``"decode"``) of a spec.

    ``dims`` arguments give the workload dims that constraints mention (``{"D": 64, "DV": 64}``),
    as a mapping or as a ``Workload``.
    """

    def __init__(self, spec: "Spec", pass_: str) -> None:
        if pass_ not in spec.passes:
            raise ValueError(f"unknown pass {pass_!r}; spec {spec.name!r} defines: {', '.join(spec.passes)}")
        self.spec = spec
        self.pass_ = pass_
        self.knobs: dict[str, Knob] = {name: spec.knobs[name] for name in spec.passes[pass_].knobs}
        self.constraints: tuple[Rule, ...] = spec.constraints_for(pass_)
        self.dim_names: frozenset[str] = frozenset(
            n for c in self.constraints for n in c.compiled.names if n not in self.knobs)

    def __repr__(self) -> str:
        return f"KnobSpace({self.spec.name!r}, {self.pass_!r}, knobs={list(self.knobs)})"

    @property
    def size(self) -> int:
        """Number of configs before constraints (product of the domain sizes)."""
        return math.prod(len(k.domain) for k in self.knobs.values())

    def default(self) -> Config:
        return Config({name: knob.default for name, knob in self.knobs.items()})

    def _dims(self, dims: Any) -> dict[str, Any]:
        if hasattr(dims, "constraint_dims"):
            dims = dims.constraint_dims()
        if dims is None:
            dims = {}
        if not isinstance(dims, Mapping):
            raise TypeError(f"dims must be a mapping like {{'D': 64, 'DV': 64}} or a Workload, got {type(dims).__name__}")
        missing = sorted(self.dim_names - set(dims))
        if missing:
            raise ValueError(f"dims must give {', '.join(sorted(self.dim_names))} for the {self.pass_} constraints; "
                             f"missing: {', '.join(missing)}")
        return {n: dims[n] for n in self.dim_names}

    def _violations(self, env: Mapping[str, Any]) -> list[str]:
        out = []
        for c in self.constraints:
            if not c.compiled.evaluate_bool(env):
                values = ", ".join(f"{n}={env[n]!r}" for n in sorted(c.compiled.names))
                out.append(f"{c.message} [{c.expr} is false for {values}]")
        return out

    def validate(self, config: Mapping[str, Any], dims: Any) -> list[str]:
        """Everything wrong with ``config`` for this pass and these dims; an empty list means valid.

        Reports unknown and missing knobs, values outside a knob's domain, then violated constraints.
        """
        env = self._dims(dims)
        problems = self.knob_problems(config)
        if problems:
            return problems
        env.update(config)
        return self._violations(env)

    def knob_problems(self, config: Mapping[str, Any]) -> list[str]:
        """The part of ``validate`` that needs no workload dims: unknown and missing knobs, values outside a
        knob's domain (constraints are not checked)."""
        problems = []
        for name in config:
            if name not in self.knobs:
                where = self.spec.knob_passes(name)
                hint = f"it belongs to pass {', '.join(where)}" if where else "the spec has no such knob"
                problems.append(f"knob {name!r} is not used by pass {self.pass_} ({hint})")
        for name, knob in self.knobs.items():
            if name not in config:
                problems.append(f"knob {name!r} is missing (default {knob.default!r})")
            elif not in_domain(config[name], knob.domain):
                problems.append(f"{name}={config[name]!r} is not in its domain {list(knob.domain)}")
        return problems

    def is_valid(self, config: Mapping[str, Any], dims: Any) -> bool:
        return not self.validate(config, dims)

    def enumerate(self, dims: Any) -> Iterator[Config]:
        """Every valid config, in domain order (first knob slowest)."""
        env = self._dims(dims)
        names = list(self.knobs)
        for values in itertools.product(*(self.knobs[n].domain for n in names)):
            env.update(zip(names, values))
            if all(c.compiled.evaluate_bool(env) for c in self.constraints):
                yield Config(zip(names, values))

    def suggest(self, trial: Any, dims: Any) -> Config:
        """Ask an Optuna trial for one config (a categorical over each knob's domain).

        A proposal that violates a constraint raises ``optuna.TrialPruned`` with the reasons, so a
        study records it as pruned and moves on; no compiler ever sees it.
        """
        import optuna  # heavy; only the tuner needs it

        config = Config({name: trial.suggest_categorical(name, list(knob.domain))
                         for name, knob in self.knobs.items()})
        problems = self.validate(config, dims)
        if problems:
            raise optuna.TrialPruned("invalid config: " + "; ".join(problems))
        return config
