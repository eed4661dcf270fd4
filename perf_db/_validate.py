"""Checks of a stored configuration and time against the spec, for records and pack entries that enter
from files (``pathtune import``, shipped results, ``load_pack``).

A Triton record of the current spec must be a point of its pass's knob space (every knob of the pass,
each in its domain, every constraint met for its head dims): the dispatcher would otherwise drop it
without a word, or a pack would make it a default.  Records of another spec version are retired
anyway and keep whatever knobs that spec had; the TVM backend has knobs of its own. A record is of the
current spec when it carries the spec's full hash or its pass's hash (``Spec.pass_hash``).
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Optional

from ._keys import current_spec_hashes, spec_keys

__all__ = ["config_problems", "time_problem"]

CHECKED_BACKENDS = ("triton",)


def config_problems(backend: str, pass_: str, spec_hash: Optional[str], config: Mapping[str, Any],
                    dims: Any = None) -> list[str]:
    """What is wrong with ``config`` for ``pass_`` and ``dims`` (head_dim / head_dim_v or D / DV; None: the
    knobs and their domains only, for a config that serves every head dim); empty when valid or not
    checkable here (another backend, another spec)."""
    from pathtune.specs import KnobSpace, load_spec

    if backend not in CHECKED_BACKENDS:
        return []
    spec = load_spec()
    if spec_hash is not None and spec_hash not in current_spec_hashes(spec_keys(spec, pass_)):
        return []
    if pass_ not in spec.passes:
        return [f"pass {pass_!r} is not one of the spec's passes ({', '.join(spec.passes)})"]
    space = KnobSpace(spec, pass_)
    return space.knob_problems(dict(config)) if dims is None else space.validate(dict(config), dims)


def time_problem(median_ms: Any) -> Optional[str]:
    """None when ``median_ms`` is a positive finite time, else what is wrong with it."""
    if isinstance(median_ms, bool) or not isinstance(median_ms, (int, float)):
        return f"median_ms must be a number of milliseconds, got {median_ms!r}"
    if not math.isfinite(median_ms) or median_ms <= 0:
        return f"median_ms must be a positive finite time, got {median_ms!r}"
    return None
