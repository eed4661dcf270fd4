"""The Optuna objective of one key: propose a config, look it up in perf_db, else measure and record it.

* Proposals come from ``KnobSpace.suggest`` (a categorical per knob over the spec's domain); a
  config that violates a spec constraint is pruned there and never reaches a compiler.
* Optuna re-proposes configs it has tried (by design), and several workers may propose the same
  one: every config is first looked up in perf_db (``PerfDB.lookup``: same env, kernel source,
  workload, config) and its stored outcome is returned without measuring again.
* A measured outcome is recorded with ``PerfDB.record`` under the study's run id, with
  ``on_conflict="skip"``: if another worker stored the same config meanwhile, its row is kept
  and both trials get the stored value, so a config is stored once per machine.
* A failed candidate (``wrong``, ``compile_error``, ``out_of_resources``, ``crash``, ``timeout``)
  is a COMPLETE trial with a constraint value 1 (infeasible: TPE ranks it below every feasible
  config and ``study.best_trial`` never returns it) and a penalty value.
"""
from __future__ import annotations

import signal
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from pathtune.specs import Config, KnobSpace

from .measure import MeasureTask
from .prepare import PREPARED
from .space import TuneKey

__all__ = ["KeyContext", "Objective", "PENALTY_MS", "trial_value", "mark_feasibility", "measurement_from",
           "sigint_deferred"]

PENALTY_MS = 1.0e9          # value of an infeasible trial (never the best: its constraint is violated too)
_MEASUREMENT_KEYS = ("status", "median_ms", "p20_ms", "p80_ms", "n_reps", "bench_method", "errors", "max_rel_err",
                     "baseline_ms", "baseline_name", "message")


@dataclass
class KeyContext:
    """Everything the objective of one key needs (built once per key by the tuner)."""

    key: TuneKey
    space: KnobSpace
    db: Any                              # PerfDB
    env_info: dict
    kernel: Any                          # KernelKey
    study_name: str
    run_id: str
    measure_fn: Callable[[MeasureTask], dict]
    task_defaults: dict = field(default_factory=dict)   # check_len, check_heads, tolerances, warmup/rep
    seed: int = 0
    command: Optional[str] = None
    on_record: Optional[Callable[[dict], None]] = None  # results-file writer
    stop_requested: bool = False
    fatal: Optional[str] = None
    measured: int = 0
    looked_up: int = 0

    def store(self, config: Config, result: dict, *, run_id: str, trial_number: Optional[int]) -> Any:
        """Record ``result`` (a measure() dict) of ``config`` in perf_db under ``run_id`` (a row another worker stored
        first is kept) and in the results file; the Measurement recorded."""
        m = measurement_from(result, study_name=self.study_name, trial_number=trial_number, command=self.command)
        self.db.record(self.env_info, self.kernel, self.key.workload, config, m, run_id=run_id, on_conflict="skip")
        self.measured += 1
        if self.on_record is not None:
            self.on_record({"env": self.env_info, "kernel": self.kernel, "workload": self.key.workload,
                            "config": config, "measurement": m, "run_id": run_id})
        return m

    def task(self, config: Config, trial_number: int) -> MeasureTask:
        return MeasureTask(pass_=self.key.pass_, backend=self.key.backend, workload=self.key.workload.to_dict(),
                           config=config.to_dict(), batch=self.key.batch, seq_len=self.key.seq_len,
                           seed=(self.seed * 1_000_003 + trial_number * 7919) % (2**31 - 1),
                           task_id=f"{self.study_name}#{trial_number}", study_name=self.study_name,
                           trial_number=trial_number, **self.task_defaults)


def measurement_from(result: dict, *, study_name: str, trial_number: Optional[int], command: Optional[str]) -> Any:
    """perf_db Measurement from a measure() dict (unknown keys such as ``fatal`` dropped)."""
    from pathtune.perf_db import Measurement

    data = {k: result[k] for k in _MEASUREMENT_KEYS if result.get(k) is not None}
    if data.get("status") != "ok":
        for k in ("median_ms", "p20_ms", "p80_ms", "n_reps", "bench_method"):
            data.pop(k, None)
    return Measurement(**data, study_name=study_name, trial_number=trial_number, command=command)


def trial_value(stored: dict) -> tuple[float, float]:
    """(value, constraint) of a stored measurement row: ok -> (median_ms, 0), else (PENALTY_MS, 1)."""
    if stored.get("status") == "ok" and stored.get("median_ms") is not None:
        return float(stored["median_ms"]), 0.0
    return PENALTY_MS, 1.0


def mark_feasibility(trial: Any, constraint: float) -> None:
    """Optuna 5: ``trial.set_constraint``; Optuna 4: a user attr the sampler's constraints_func reads."""
    trial.set_user_attr("pathtune_constraint", constraint)
    if hasattr(trial, "set_constraint"):
        trial.set_constraint("pathtune_status", constraint)


class Objective:
    """``Objective(ctx)(trial)`` for ``study.optimize``; the batched tuner calls its three steps itself:
    ``propose`` (config and its stored outcome, if any), ``measure`` (compile child's outcome or a
    measurement, recorded) and ``conclude`` (the trial's value)."""

    def __init__(self, ctx: KeyContext) -> None:
        self.ctx = ctx

    def __call__(self, trial: Any) -> float:
        config, stored = self.propose(trial)
        if stored is None:
            stored = self.measure(trial, config)
        return self.conclude(trial, stored)

    def propose(self, trial: Any) -> tuple[Config, Optional[dict]]:
        """The trial's config (``optuna.TrialPruned`` for an invalid one) and its perf_db row, if stored."""
        ctx = self.ctx
        config = ctx.space.suggest(trial, ctx.key.workload)   # optuna.TrialPruned for an invalid config
        trial.set_user_attr("config", config.to_dict())
        trial.set_user_attr("config_hash", config.hash)
        return config, self.lookup(trial, config)

    def lookup(self, trial: Any, config: Config) -> Optional[dict]:
        """The stored outcome of ``config`` (then the trial's source is perf_db), or None."""
        ctx = self.ctx
        stored = ctx.db.lookup(ctx.env_info, ctx.kernel, ctx.key.workload, config)
        if stored is not None:
            trial.set_user_attr("source", "perf_db")
            ctx.looked_up += 1
        return stored

    def conclude(self, trial: Any, stored: dict) -> float:
        value, constraint = trial_value(stored)
        trial.set_user_attr("status", stored["status"])
        if stored.get("message"):
            trial.set_user_attr("message", str(stored["message"])[:500])
        mark_feasibility(trial, constraint)
        return value

    def measure(self, trial: Any, config: Config, prepared: Optional[dict] = None) -> dict:
        """Measure and record ``config``; a failed compile child (``prepared`` with a status other than
        ``prepared``) is recorded as that failure without running the config in this process."""
        ctx = self.ctx
        if prepared is not None and prepared.get("status") != PREPARED:
            # the child's failure is the config's outcome; its "fatal" concerned the child's CUDA context
            result = {k: v for k, v in prepared.items() if k not in ("fatal", "seconds", "phases", "child_failed")}
            result["message"] = "compile child: " + str(result.get("message", ""))
            source = "compile child"
        else:
            task = ctx.task(config, trial.number)
            try:
                result = ctx.measure_fn(task)
            except KeyboardInterrupt:
                trial.set_user_attr("interrupted", True)   # --resume re-queues it
                raise
            source = "measured"
        # the measurement is stored before the trial is told: a worker killed in between loses
        # nothing (its stale trial is retried and finds the row); Ctrl-C waits for this block
        with sigint_deferred():
            m = ctx.store(config, result, run_id=ctx.run_id, trial_number=trial.number)
        trial.set_user_attr("source", source)
        if prepared is not None and prepared.get("seconds") is not None:
            trial.set_user_attr("compile_seconds", round(float(prepared["seconds"]), 3))
        if prepared is not None and prepared.get("phases"):
            trial.set_user_attr("compile_phases", prepared["phases"])   # startup / setup / gate / timed shape
        if result.get("fatal"):
            ctx.fatal = f"trial {trial.number}: {result.get('message', '')[:300]}"
        stored = ctx.db.lookup(ctx.env_info, ctx.kernel, ctx.key.workload, config)
        return stored if stored is not None else m.to_dict()


class sigint_deferred:
    """Hold SIGINT during a few database writes (re-delivered afterwards); no-op off the main thread."""

    def __enter__(self) -> None:
        import threading

        self._active = threading.current_thread() is threading.main_thread()
        self._got = False
        if self._active:
            def note(signum, frame):
                self._got = True
            self._old = signal.signal(signal.SIGINT, note)

    def __exit__(self, *exc: Any) -> None:
        if self._active:
            signal.signal(signal.SIGINT, self._old)
            if self._got and callable(self._old):
                self._old(signal.SIGINT, None)
