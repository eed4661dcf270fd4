"""The knob space of one pass: ``KnobSpace`` is the set of valid configs (``config.Config``) of one
pass of a spec; it reads knob domains and constraints from the spec only, so a new domain value in
the YAML needs no code change here. ``Config`` and ``in_domain`` are importable from here too.
"""
from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from .config import Config, KnobValue, in_domain

if TYPE_CHECKING:  # pragma: no cover
    from .schema import Knob, Rule, Spec

__all__ = ["Config", "KnobSpace", "KnobValue", "in_domain"]


class KnobSpace:
    """The valid configs of one pass (``"fwd"``, ``"bwd"``, ``"decode"``) of a spec.

    ``dims`` arguments give the workload dims that constraints mention (``{"D": 64, "DV": 64}``),
    as a mapping or as a ``Workload``.
    """

    def __init__(self, spec: "Spec", pass_: str, *, memory_knobs: bool = False) -> None:
        if pass_ not in spec.passes:
            raise ValueError(f"unknown pass {pass_!r}; spec {spec.name!r} defines: {', '.join(spec.passes)}")
        self.spec = spec
        self.pass_ = pass_
        self.memory_knobs = memory_knobs   # search the memory-role knobs too (else: their defaults)
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
            raise TypeError(f"dims must be a mapping like {{'D': 64, 'DV': 64}} or a Workload, "
                            f"got {type(dims).__name__}")
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

    def _left_at_default(self, name: str) -> bool:
        """A memory-role knob of a space made without ``memory_knobs``: the search does not vary it."""
        return self.knobs[name].role == "memory" and not self.memory_knobs

    def searched_domain(self, name: str) -> tuple:
        """The values a search tries for knob ``name``: its domain, or only its default for a memory-role
        knob unless this space was made with ``memory_knobs=True`` (the user allows the memory)."""
        knob = self.knobs[name]
        return (knob.default,) if self._left_at_default(name) else tuple(knob.domain)

    def enumerate(self, dims: Any) -> Iterator[Config]:
        """Every valid config the search may try (``searched_domain``), in domain order (first knob slowest)."""
        env = self._dims(dims)
        names = list(self.knobs)
        for values in itertools.product(*(self.searched_domain(n) for n in names)):
            env.update(zip(names, values))
            if all(c.compiled.evaluate_bool(env) for c in self.constraints):
                yield Config(zip(names, values))

    def suggest(self, trial: Any, dims: Any) -> Config:
        """Ask an Optuna trial for one config (a categorical over each knob's domain; a memory knob the
        space does not search is not asked, it takes its default).

        A proposal that violates a constraint raises ``optuna.TrialPruned`` with the reasons, so a
        study records it as pruned and moves on; no compiler ever sees it.
        """
        import optuna  # heavy; only the tuner needs it

        config = Config({name: knob.default if self._left_at_default(name)
                         else trial.suggest_categorical(name, list(knob.domain)) for name, knob in self.knobs.items()})
        problems = self.validate(config, dims)
        if problems:
            raise optuna.TrialPruned("invalid config: " + "; ".join(problems))
        return config
