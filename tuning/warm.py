"""Warm start: a new study measures, right after its default, the configs that won under retired
kernel sources.

perf_db records and studies are keyed by the kernel source hash of a pass, so an edit of a kernel
file retires every record of that pass and the next ``pathtune tune`` starts each key's study from
scratch. The retired records (same GPU environment, spec, pass, backend and workload key; older
source hash; ``perf_db/_retired.py`` has the exact rule) still say which configs won, and after a
kernel edit those are usually still near the best. ``select_retired`` picks up to K of them:

* order: newest source first (a source's newest measurement time), then fastest first;
* one per config (its best time under its newest source), never the default's knob values (the
  default is already the study's first trial and the reference of "speedup over default");
* re-validated against the current spec (``KnobSpace.validate``: knobs of the pass, domains,
  constraints for the workload): a config that no longer validates is dropped and reported.

A spec change (a knob added, a domain changed) retires the records of every pass it touches, spec and
source alike.  When the current spec has no retired records for a key, the tuner takes those of earlier
specs (``earlier_specs``), with the knobs added since at the key's defaults (``fill_defaults``).

A GPU with no records of a key at all (a new GPU, or a key never tuned there) can also start from what other
GPUs measured for the same key under the current kernels and spec (``--seed-other-gpus``,
``select_other_gpus``): a tuned config of a GPU of the same architecture is usually a better first guess than the
untuned default, and it passes the same validation and accuracy gate as any other trial.

This module imports neither Optuna nor torch.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Iterable, Optional

from pathtune.specs import Config, KnobSpace, Spec

from .space import TuneKey

__all__ = ["WarmStart", "rank_retired", "select_other_gpus", "select_retired"]


@dataclass
class WarmStart:
    """What ``select_retired`` chose (best first) and what it left out."""

    configs: list[tuple[Config, dict]] = field(default_factory=list)           # (config, its retired row)
    dropped: list[tuple[Any, list[str], dict]] = field(default_factory=list)   # (config, problems, row)
    same_as_default: int = 0
    candidates: int = 0                                                         # distinct configs looked at


def _grouped(rows: Iterable[dict], by: str) -> tuple[dict[str, Optional[datetime]], dict[tuple[str, str], dict]]:
    """(group -> its newest ``created_at``, (group, config hash) -> its fastest row) of ``rows`` grouped by the
    field ``by`` (a source hash, a GPU name)."""
    newest: dict[str, Optional[datetime]] = {}
    best: dict[tuple[str, str], dict] = {}
    for r in rows:
        group, when = r[by], r.get("created_at")
        if group not in newest:
            newest[group] = when
        elif when is not None and (newest[group] is None or when > newest[group]):
            newest[group] = when
        key = (group, r["config_hash"])
        if key not in best or r["median_ms"] < best[key]["median_ms"]:
            best[key] = r
    return newest, best


def _newest_first(when: Optional[datetime]) -> tuple:
    """Sort key: newer times first, no time last."""
    return (when is None, -when.timestamp() if when is not None else 0.0)


def rank_retired(rows: Iterable[dict]) -> list[dict]:
    """One row per (source, config): its fastest; sources newest first (by their newest
    ``created_at``; sources without times last), then fastest first, then config hash."""
    newest, best = _grouped(rows, "source_hash")
    return sorted(best.values(), key=lambda r: (*_newest_first(newest[r["source_hash"]]), r["source_hash"],
                                                r["median_ms"], r["config_hash"]))


def select_retired(spec: Spec, key: TuneKey, default: Config, rows: Iterable[dict], limit: int, *,
                   fill_defaults: bool = False) -> WarmStart:
    """Up to ``limit`` distinct configs of ``rows`` (``PerfDB.retired`` / ``shipped_retired``), ranked
    by ``rank_retired``, that differ from ``default`` and validate for ``key`` now.

    ``fill_defaults``: rows measured under an earlier spec (``earlier_specs=True``) lack the knobs added
    since; those take ``default``'s values (a knob the spec no longer has still fails validation)."""
    return _pick(spec, key, default, rank_retired(rows), limit, set(),
                 lambda row: Config({**default.to_dict(), **row["config"]} if fill_defaults else row["config"]))


def _pick(spec: Spec, key: TuneKey, default: Config, ordered: Iterable[dict], limit: int, seen: set,
          make_config) -> WarmStart:
    """The first ``limit`` configs of ``ordered`` rows (``make_config(row)``) not in ``seen`` (config hashes), not
    the default's knobs, and valid for ``key`` now; the others counted or reported in the WarmStart."""
    space = KnobSpace(spec, key.pass_)
    out = WarmStart()
    if limit <= 0:
        return out
    for row in ordered:
        if len(out.configs) >= limit:
            break
        try:
            config = make_config(row)
        except (TypeError, ValueError) as e:
            if row["config_hash"] not in seen:
                seen.add(row["config_hash"])
                out.candidates += 1
                out.dropped.append((row["config"], [str(e)], row))
            continue
        if config.hash in seen:
            continue
        seen.add(config.hash)
        out.candidates += 1
        if config == default:
            out.same_as_default += 1
            continue
        problems = space.validate(config, key.workload)
        if problems:
            out.dropped.append((config, problems, row))
            continue
        out.configs.append((config, row))
    return out


def select_other_gpus(spec: Spec, key: TuneKey, default: Config, rows: Iterable[dict], limit: int, *,
                      exclude: Iterable[str] = ()) -> WarmStart:
    """Up to ``limit`` distinct configs of ``rows`` (``PerfDB.other_gpus`` / ``shipped_other_gpus``: the current
    kernels' ok measurements of ``key`` on other GPUs) that differ from ``default`` and from the config hashes in
    ``exclude`` (already seeded) and validate for ``key`` now.  Order: each GPU's fastest config first, GPUs with
    the newest measurement first, then each GPU's second fastest, and so on (one GPU's many near-equal configs do
    not crowd out another GPU's winner)."""
    newest, best = _grouped(rows, "gpu_name")
    gpus = sorted(newest, key=lambda g: (*_newest_first(newest[g]), g))
    ranked = [sorted((r for (g, _), r in best.items() if g == gpu), key=lambda r: (r["median_ms"], r["config_hash"]))
              for gpu in gpus]
    rounds = [per_gpu[i] for i in range(max(map(len, ranked), default=0)) for per_gpu in ranked if i < len(per_gpu)]
    return _pick(spec, key, default, rounds, limit, set(exclude), lambda row: Config(row["config"]))
