"""What the tuner searches: the keys (one per pass x backend x workload) and each key's study.

A *key* is one (pass, backend, workload) point with the shape it is timed at: B*T = ``tokens``
(32768 by default) at the bucket's length T, heads 16 for D <= 64 else 8 unless the CLI says
otherwise. Each key gets its own Optuna study, named from everything that decides whether a
measurement still applies (GPU env hash, spec hash, kernel source hash, pass, workload key), so a
changed kernel or another GPU starts a new study instead of mixing results.

This module imports neither Optuna nor torch at import time.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from itertools import combinations
from typing import Any, Iterable, Optional, Sequence

from pathtune.specs import KnobSpace, Spec, Workload
from pathtune.specs.config import in_domain

__all__ = ["default_config", "neighbour_configs", "refine_configs", "changed_knobs", "describe_changes",
           "seed_configs", "check_seed_configs", "TOKENS",
           "PASSES", "BACKENDS", "TuneKey", "default_heads",
           "plan_keys", "study_name", "run_id_for", "make_sampler", "source_hash_for", "CODEGEN_VERSION"]

TOKENS = 32768
PASSES = ("fwd", "bwd", "decode")
BACKENDS = ("triton", "tvm")
CODEGEN_VERSION = "1"


def default_heads(head_dim: int) -> int:
    """Query (= key/value) heads a key is timed with: 16 for D <= 64, else 8 (tuning/bench.py's shapes)."""
    return 16 if head_dim <= 64 else 8


@dataclass(frozen=True)
class TuneKey:
    """One tuning target: a pass of a backend on one workload, timed at ``batch`` x ``seq_len`` tokens."""

    pass_: str
    backend: str
    workload: Workload
    batch: int
    seq_len: int

    @property
    def label(self) -> str:
        wl = self.workload
        gate = "fox" if wl.use_gate else "path"
        heads = f"{wl.heads_q}" if wl.heads_q == wl.heads_kv else f"{wl.heads_q}/{wl.heads_kv}"
        return f"{self.backend}/{self.pass_} D{wl.head_dim} {wl.dtype} {gate} H{heads} T{self.seq_len}x{self.batch}"

    def space(self, spec: Spec, *, memory_knobs: bool = False) -> KnobSpace:
        """The knob space this key's study searches (memory-role knobs only with ``memory_knobs``)."""
        return KnobSpace(spec, self.pass_, memory_knobs=memory_knobs)


def default_config(spec: Spec, key: TuneKey) -> Any:
    """The config a key's study is seeded with: what the runtime runs untuned (Triton: the spec's
    ``backends.triton.head_dim_defaults`` for the head dims) restricted to the pass's knobs, or the spec's
    defaults where that is not a valid config of the spec."""
    from pathtune.specs import Config

    space = KnobSpace(spec, key.pass_)
    fallback = space.default()
    if key.backend != "triton":
        return fallback
    untuned = spec.backend_defaults("triton", key.workload.head_dim, key.workload.head_dim_v)
    values = {name: untuned[name] for name in space.knobs}
    try:
        config = Config(values)
    except (TypeError, ValueError):
        return fallback
    return fallback if space.validate(config, key.workload) else config


def plan_keys(head_dims: Sequence[int], dtypes: Sequence[str], passes: Sequence[str], backends: Sequence[str],
              buckets: Sequence[int], *, gate: bool = True, heads: Optional[int] = None, heads_kv: Optional[int] = None,
              tokens: int = TOKENS) -> list[TuneKey]:
    """Every key, ordered so that keys sharing compiled kernels (same backend, pass, D, dtype) are
    adjacent: the bucket varies fastest (Triton specialises kernels on D, not on T)."""
    keys = []
    for backend in backends:
        if backend not in BACKENDS:
            raise ValueError(f"backend {backend!r} is not one of {', '.join(BACKENDS)}")
        for pass_ in passes:
            if pass_ not in PASSES:
                raise ValueError(f"pass {pass_!r} is not one of {', '.join(PASSES)}")
            for D in head_dims:
                hq = heads or default_heads(D)
                hkv = heads_kv or hq
                for dtype in dtypes:
                    for T in buckets:
                        if T < 16 or T & (T - 1):
                            raise ValueError(f"length bucket {T} must be a power of two >= 16")
                        wl = Workload(head_dim=D, head_dim_v=D, heads_q=hq, heads_kv=hkv, dtype=dtype, use_gate=gate,
                                      pass_=pass_, seq_bucket=T, batch_bucket=_pow2_ceil(max(1, tokens // T)))
                        keys.append(TuneKey(pass_, backend, wl, max(1, tokens // T), T))
    return keys


def _pow2_ceil(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def source_hash_for(backend: str, pass_: Optional[str] = None) -> str:
    """The kernel source hash of a backend's pass (a perf_db hard key and part of the study name):
    Triton hashes the code of that pass's files (``pathtune.codegen.triton._source_hash``; ``pass_`` None:
    all of them), TVM its whole codegen."""
    if backend == "triton":
        from pathtune.codegen.triton import source_hash

        return source_hash(pass_)
    if backend == "tvm":
        from pathtune.codegen.tvm.build import source_hash as tvm_source_hash  # light: no TVM import

        return tvm_source_hash()
    raise ValueError(f"backend {backend!r} is not one of {', '.join(BACKENDS)}")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-")


def study_name(env_hash: str, spec_hash: str, source_hash: str, key: TuneKey) -> str:
    """``pathtune-<pass>-<backend>-D64-bfloat16-fox-T4096-w<key>-e<env>-s<spec>-c<source>``: readable in
    ``optuna-dashboard``, unique per (GPU env, spec, kernel source, pass, workload key)."""
    wl = key.workload
    gate = "fox" if wl.use_gate else "path"
    return _slug(f"pathtune-{key.pass_}-{key.backend}-D{wl.head_dim}-{wl.dtype}-{gate}-T{wl.seq_bucket}"
                 f"-w{wl.key_hash[:10]}-e{env_hash[:10]}-s{spec_hash[:10]}-c{(source_hash or 'none')[:10]}")


def run_id_for(study: str) -> str:
    """perf_db run of a study: shared by all its workers, so one config is stored once per machine
    (perf_db's unique key includes the run) however many workers propose it."""
    import hashlib

    return f"tune-{hashlib.sha256(study.encode()).hexdigest()[:24]}"


def make_sampler(seed: int, n_startup_trials: int = 8) -> Any:
    """TPE (multivariate, grouped; constant liar so parallel workers avoid each other's running configs).
    Failed candidates carry a constraint > 0, so TPE ranks them below every feasible one."""
    import optuna

    kwargs: dict[str, Any] = dict(seed=seed, n_startup_trials=n_startup_trials, multivariate=True, group=True,
                                  constant_liar=True)
    if not hasattr(optuna.trial.Trial, "set_constraint"):  # Optuna 4: constraints through the sampler
        kwargs["constraints_func"] = lambda t: [float(t.user_attrs.get("pathtune_constraint", 0.0))]
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # multivariate/group are "experimental" in Optuna
        return optuna.samplers.TPESampler(**kwargs)


def parse_list(text: str, cast: Any = str) -> list[Any]:
    return [cast(x.strip()) for x in text.split(",") if x.strip()]


def unique(items: Iterable[Any]) -> list[Any]:
    return list(dict.fromkeys(items))


def neighbour_configs(spec: Spec, key: TuneKey, centre: Any, limit: int) -> list:
    """Valid configs one schedule knob away from ``centre`` (tiles, warps, stages, chunk sizes), at most
    ``limit``: each knob's adjacent domain values first (in spec order), then the farther ones.

    The tuner seeds them around the key's default, or around the warm start's fastest config (the winner of
    the previous kernels) when it has one: much of the space does not fit (on the H200 the random start-up
    trials of the D = 128 backward were 9 of 10 out of shared memory or failed the gate), while a one-knob
    change of a good config is likely valid and often the win (D = 128 backward: 8 warps instead of 4, 50.1
    -> 43.7 ms; after a later kernel edit, 4 warps instead of the retired winner's 8, 14.59 -> 13.73 ms).
    Precision and semantics knobs are left to the search: they move the numerics, and the accuracy gate
    rejects most of their moves in the backward.
    """
    space = KnobSpace(spec, key.pass_)
    moves = []   # (steps along the knob's domain, spec order, name, value): every knob's next values first
    for order, (name, knob) in enumerate(space.knobs.items()):
        if knob.role != "schedule" or centre[name] not in knob.domain:
            continue
        at = knob.domain.index(centre[name])
        moves += [(abs(i - at), order, name, value) for i, value in enumerate(knob.domain) if i != at]
    out = []
    for _, _, name, value in sorted(moves, key=lambda m: m[:2]):
        if len(out) >= limit:
            break
        candidate = centre.replace(**{name: value})
        if not space.validate(candidate, key.workload):
            out.append(candidate)
    return out


def changed_knobs(config: Any, default: Any) -> dict:
    """{knob: value} of ``config`` where it differs from ``default`` (both Configs)."""
    base = default.to_dict()
    return {name: value for name, value in config.to_dict().items() if base.get(name) != value}


def describe_changes(config: Any, default: Any) -> str:
    """``config``'s changes from ``default`` as ``knob=value`` words in knob order, or "the default"."""
    return " ".join(f"{k}={v}" for k, v in sorted(changed_knobs(config, default).items())) or "the default"


def refine_configs(spec: Spec, key: TuneKey, default: Any, measured: Sequence[tuple[Any, float]], limit: int) -> list:
    """Up to ``limit`` valid configs not in ``measured`` that recombine what the seeded configs changed from
    ``default`` (``measured``: (config, ms) of every config measured ok so far, the default's among them if it
    passed; the tuner calls this once per study, after its seeded configs, ``--refine``):

    * the fastest config's changes, each undone alone, when it changes two knobs or more: a seed of several
      changes may carry one that costs (an H200 backward tune's fastest seed set three knobs; the one of them
      measured alone was 0.7 % slower than the default, the other two 4 % faster);
    * the union of two faster-than-the-default configs' changes (every config measured when the default failed),
      fastest pairs first, where they do not set one knob two ways: two wins on different knobs often add up.
    """
    space = KnobSpace(spec, key.pass_)
    base = default.to_dict()
    ranked = [(config, ms, changed_knobs(config, default))
              for config, ms in sorted(measured, key=lambda cm: (cm[1], cm[0].hash))]
    default_ms = next((ms for _, ms, delta in ranked if not delta), None)
    candidates = []
    if ranked and len(ranked[0][2]) >= 2:
        best, _, delta = ranked[0]
        candidates += [best.replace(**{name: base[name]}) for name in delta]
    winners = [delta for _, ms, delta in ranked if delta and (default_ms is None or ms < default_ms)]
    for i, j in sorted(combinations(range(len(winners)), 2), key=lambda ij: (ij[0] + ij[1], ij)):
        a, b = winners[i], winners[j]
        if all(a.get(name, value) == value for name, value in b.items()):
            candidates.append(default.replace(**{**a, **b}))
    seen = {config.hash for config, _ in measured}
    out = []
    for config in candidates:
        if len(out) >= limit:
            break
        if config.hash not in seen and not space.validate(config, key.workload):
            out.append(config)
        seen.add(config.hash)
    return out


def check_seed_configs(spec: Spec, seeds: Any) -> list[dict]:
    """User seed configs (``--seed-config``): a JSON object or list of objects {knob: value}, each knob one
    of the spec's and each value in its domain (ValueError, one line, otherwise)."""
    items = seeds if isinstance(seeds, list) else [seeds]
    out = []
    for item in items:
        if not isinstance(item, dict) or not item:
            raise ValueError(f"a seed config is a non-empty JSON object {{knob: value}}, got {item!r}")
        for name, value in item.items():
            if name not in spec.knobs:
                close = difflib.get_close_matches(name, list(spec.knobs), n=1)
                hint = f"did you mean {close[0]!r}?" if close else "`pathtune spec show` lists the knobs"
                raise ValueError(f"seed config knob {name!r} is not in the spec ({hint})")
            if not in_domain(value, spec.knobs[name].domain):
                raise ValueError(f"seed config {name}={value!r} is not in its domain {list(spec.knobs[name].domain)}")
        out.append(dict(item))
    return out


def seed_configs(spec: Spec, key: TuneKey, default: Any, seeds: list[dict]) -> tuple[list, list[str]]:
    """The key's default with each seed's knobs of this pass applied (a seed naming none of the pass's knobs
    is not this key's), valid for the key's workload; plus a note per seed that does not validate."""
    space = KnobSpace(spec, key.pass_)
    out, notes = [], []
    for seed in seeds:
        mine = {k: v for k, v in seed.items() if k in space.knobs}
        if not mine:
            continue
        candidate = default.replace(**mine)
        problems = space.validate(candidate, key.workload)
        if problems:
            notes.append(f"{key.label}: seed config {mine} dropped: " + "; ".join(problems))
        elif candidate != default and candidate not in out:
            out.append(candidate)
    return out, notes
