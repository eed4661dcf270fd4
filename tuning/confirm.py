"""``pathtune tune --confirm N``: after a key's study, its N fastest configs re-timed in interleaved rounds.

A study times each config once.  Where a step is near host-bound, one timing moves with host jitter (identical
configs of one study have taken 8.57 and 10.54 ms), and the jitter only ever adds time: a config whose one draw
was slow loses to a slower config whose draw was clean.  The confirmation gives the study's N fastest distinct
ok configs ``rounds`` more draws each, in rounds that visit every candidate once (each round starts one candidate
later, so that no config is always timed first or right after the same neighbour), each draw on fresh inputs
(its accuracy gate included).  Each round is one perf_db run of its own (measurements taken together): the
dispatcher's fastest-ok rule then sees every draw, so a config is ranked by its cleanest draw, and a candidate
that fails its gate on a new draw is recorded with that status.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Optional, Sequence

from pathtune.specs import Config

from .space import describe_changes

__all__ = ["CONFIRM_TRIAL_BASE", "ConfirmedConfig", "confirm_candidates", "round_order", "confirm_key",
           "confirm_note"]

# trial numbers of the confirmation draws (they seed the inputs: a draw never repeats a study trial's inputs)
CONFIRM_TRIAL_BASE = 1_000_000


@dataclass
class ConfirmedConfig:
    """One candidate: its config, the study's time for it, and the confirmation draws (ms; None: not ok)."""

    config: Config
    first_ms: float
    draws: list = field(default_factory=list)
    failures: list = field(default_factory=list)     # (round, status, message) of draws that were not ok

    @property
    def best_ms(self) -> float:
        return min([self.first_ms] + [d for d in self.draws if d is not None])


def confirm_candidates(measured: Sequence[tuple[Config, float]], n: int) -> list[ConfirmedConfig]:
    """The ``n`` fastest distinct configs of ``measured`` ((config, ms) of ok trials; a config measured twice
    counts with its faster time), fastest first; none when fewer than two distinct configs were measured (nothing
    to rank)."""
    fastest: dict[str, tuple[Config, float]] = {}
    for config, ms in measured:
        if ms is None:
            continue
        seen = fastest.get(config.hash)
        if seen is None or ms < seen[1]:
            fastest[config.hash] = (config, float(ms))
    if n <= 0 or len(fastest) < 2:
        return []
    ranked = sorted(fastest.values(), key=lambda cm: (cm[1], cm[0].hash))[:n]
    return [ConfirmedConfig(config, ms) for config, ms in ranked]


def round_order(n: int, round_index: int) -> list[int]:
    """The candidates' order in round ``round_index`` (0-based): every one once, starting ``round_index`` later."""
    start = round_index % n if n else 0
    return [(start + i) % n for i in range(n)]


def confirm_key(ctx: Any, candidates: list[ConfirmedConfig], rounds: int, *,
                start_run: Callable[[str, str], None], should_stop: Callable[[], bool] = lambda: False,
                stamp: Optional[str] = None) -> int:
    """Time ``candidates`` in ``rounds`` interleaved rounds with ``ctx`` (the key's ``KeyContext``), each round
    recorded under its own run ``<study run>-confirm-<stamp>-r<k>`` (``start_run(run_id, notes)`` opens it); the
    draws go into each candidate's ``draws`` / ``failures``.  Returns the rounds completed (fewer after a stop)."""
    from .objective import sigint_deferred

    stamp = stamp or datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    n = len(candidates)
    done = 0
    for r in range(rounds):
        if should_stop() or ctx.fatal:
            break
        run_id = f"{ctx.run_id}-confirm-{stamp}-r{r + 1}"
        start_run(run_id, f"pathtune tune {ctx.study_name}: confirmation round {r + 1} of {rounds} "
                          f"({n} configs)")
        for i in round_order(n, r):
            if should_stop():
                break
            cand = candidates[i]
            trial_number = CONFIRM_TRIAL_BASE + r * n + i
            result = ctx.measure_fn(ctx.task(cand.config, trial_number))
            with sigint_deferred():
                ctx.store(cand.config, result, run_id=run_id, trial_number=trial_number)
            if result.get("status") == "ok" and result.get("median_ms") is not None:
                cand.draws.append(float(result["median_ms"]))
            else:
                cand.draws.append(None)
                cand.failures.append((r + 1, result.get("status"), str(result.get("message", ""))[:200]))
            if result.get("fatal"):
                ctx.fatal = f"confirmation round {r + 1}: {str(result.get('message', ''))[:300]}"
                break
        else:
            done += 1
    return done


def confirm_note(label: str, candidates: list[ConfirmedConfig], default: Config, rounds_done: int) -> str:
    """One line per key: each candidate's study time and its draws, what changed from the default, and whether the
    confirmation moved the winner."""
    before = candidates[0]
    after = min(candidates, key=lambda c: c.best_ms)
    parts = []
    for c in candidates:
        draws = ", ".join("failed" if d is None else f"{d:.4g}" for d in c.draws)
        parts.append(f"{describe_changes(c.config, default)}: {c.first_ms:.4g} then [{draws}]")
    verdict = ("the winner stands" if after is before else
               f"the winner is now {describe_changes(after.config, default)} ({after.best_ms:.4g} ms against "
               f"{before.best_ms:.4g})")
    failed = [f"{describe_changes(c.config, default)} failed round {r} ({status}: {msg})"
              for c in candidates for r, status, msg in c.failures]
    text = f"{label}: confirm: {len(candidates)} configs x {rounds_done} rounds: " + "; ".join(parts) + f"; {verdict}"
    if failed:
        text += ("; " + "; ".join(failed) + " (its earlier ok record still serves: re-tune the key or withdraw that "
                 "run if the failure is the config's)")
    return text
