"""Backend-neutral: which variant of which spec stage a backend implements, per pass.

The spec's ``stages`` name their variants (``Spec.stages[...].variants``: the ways a stage can run and
the passes each serves).  Each backend lists, in its ``registry.py``, for every (stage, variant, pass)
either the code that implements it (``"module:name"`` entries, checked to exist without importing
them) or why it has none.  The runtime asks ``call_unsupported`` / ``require`` before it runs a
backend, and its error or fallback message carries the backend's reason.
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
from dataclasses import dataclass
from typing import Any, Optional, Union

__all__ = ["Implemented", "Unsupported", "StageRegistry", "VariantUnsupported", "BACKENDS", "registry_for",
           "variant_unsupported", "pass_unsupported", "call_unsupported", "require", "entry_exists"]

BACKENDS = ("triton", "tvm")


@dataclass(frozen=True)
class Implemented:
    """The code that runs a (stage, variant) in one pass: ``"pathtune.module:name"`` entries."""

    entries: tuple[str, ...]


@dataclass(frozen=True)
class Unsupported:
    """Why a backend has no implementation of a (stage, variant) in one pass (shown to users)."""

    reason: str


Entry = Union[Implemented, Unsupported]


class VariantUnsupported(NotImplementedError):
    """A call needs a (stage, variant, pass) that the chosen backend does not implement."""


class StageRegistry:
    """One backend's (stage, variant, pass) -> ``Implemented`` / ``Unsupported`` table."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self._table: dict[tuple[str, str, str], Entry] = {}

    def _put(self, stage: str, variant: str, passes: tuple[str, ...], entry: Entry) -> None:
        if not passes:
            raise ValueError(f"{self.backend} registry: {stage}.{variant} names no pass")
        for p in passes:
            key = (stage, variant, p)
            if key in self._table:
                raise ValueError(f"{self.backend} registry: {stage}.{variant} ({p}) is registered twice")
            self._table[key] = entry

    def implement(self, stage: str, variant: str, passes: tuple[str, ...], *entries: str) -> None:
        if not entries or not all(isinstance(e, str) and e.count(":") == 1 for e in entries):
            raise ValueError(f"{self.backend} registry: {stage}.{variant} needs 'module:name' entries, got {entries}")
        self._put(stage, variant, passes, Implemented(tuple(entries)))

    def unsupported(self, stage: str, variant: str, passes: tuple[str, ...], reason: str) -> None:
        if not reason.strip():
            raise ValueError(f"{self.backend} registry: {stage}.{variant} is unsupported without a reason")
        self._put(stage, variant, passes, Unsupported(reason))

    def lookup(self, stage: str, variant: str, pass_: str) -> Optional[Entry]:
        return self._table.get((stage, variant, pass_))

    def items(self):
        return self._table.items()


def registry_for(backend: str) -> StageRegistry:
    """The registry of ``backend`` (``codegen/<backend>/registry.py``)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; backends with kernels: {', '.join(BACKENDS)}")
    if backend not in _LOADED:
        try:
            module = importlib.import_module(f"pathtune.codegen.{backend}.registry")
        except ImportError:   # the backend's package needs its compiler (triton); the registry file does not
            from pathlib import Path

            path = Path(__file__).resolve().parent / backend / "registry.py"
            spec = importlib.util.spec_from_file_location(f"pathtune_{backend}_registry", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        _LOADED[backend] = module.REGISTRY
    return _LOADED[backend]


_LOADED: dict[str, StageRegistry] = {}


def _stage_name(spec: Any, kind_or_name: str) -> Optional[str]:
    if kind_or_name in spec.stages:
        return kind_or_name
    return next((n for n, s in spec.stages.items() if s.kind == kind_or_name), None)


def variant_unsupported(backend: str, spec: Any, stage: str, variant: str, pass_: str) -> Optional[str]:
    """None when ``backend`` implements ``stage.variant`` for ``pass_``; else the reason it does not."""
    name = _stage_name(spec, stage)
    if name is None or variant not in spec.stages[name].variants:
        raise ValueError(f"the spec has no variant {variant!r} of stage {stage!r}")
    if pass_ not in spec.stages[name].variants[variant].passes:
        raise ValueError(f"the spec's {name}.{variant} does not serve the {pass_} pass")
    entry = registry_for(backend).lookup(name, variant, pass_)
    if entry is None:
        return f"the {backend} registry does not list {name}.{variant} for the {pass_} pass"
    return entry.reason if isinstance(entry, Unsupported) else None


def pass_unsupported(backend: str, spec: Any, pass_: str) -> Optional[str]:
    """None when ``backend`` implements some variant of every stage that serves ``pass_``; else why not
    (the first stage without one, and its first variant's reason)."""
    for name, stage in spec.stages.items():
        serving = [v for v, var in stage.variants.items() if pass_ in var.passes]
        if not serving:
            continue
        reasons = [variant_unsupported(backend, spec, name, v, pass_) for v in serving]
        if all(reasons):
            return reasons[0]
    return None


def call_unsupported(backend: str, spec: Any, pass_: str, gated: bool) -> Optional[str]:
    """Why ``backend`` cannot run ``pass_`` of a call (gated: with the FoX gate, in the spec's placement),
    or None."""
    why = pass_unsupported(backend, spec, pass_)
    if why is None and gated:
        gate = _stage_name(spec, "fox_gate")
        if gate is not None:
            why = variant_unsupported(backend, spec, gate, spec.gate_placement, pass_)
            if why is not None:
                why = f"fox_gate placement {spec.gate_placement!r}: {why}"
    return why


def require(backend: str, spec: Any, pass_: str, gated: bool) -> None:
    """Raise ``VariantUnsupported`` (a NotImplementedError) with the backend's reason when it cannot run
    ``pass_`` of this call."""
    why = call_unsupported(backend, spec, pass_, gated)
    if why is not None:
        raise VariantUnsupported(f"backend {backend!r} cannot run the {pass_} pass of this call: {why}")


def entry_exists(entry: str) -> bool:
    """``"package.module:name"`` names a module-level function, class or assignment, found in the
    module's source without importing it (so a registry is checked without a GPU toolchain)."""
    module, _, name = entry.partition(":")
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return False
    if found is None or not found.origin or not found.origin.endswith(".py"):
        return False
    with open(found.origin, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return True
    return False
