"""The local tuning loop: one Optuna study per key, run with ``study.optimize`` on this machine.

* Storage: ``optuna.storages.RDBStorage`` at the database URL perf_db uses (Optuna's tables beside
  perf_db's ``perf_*`` tables), with heartbeats: a killed worker's running trial goes stale, is
  failed by any live worker and re-queued with the same config (``RetryFailedTrialCallback``); the
  retry finds the measurement in perf_db if the killed worker had stored it.
* Budget: wall time (shared by the keys still to do: each key gets remaining / keys left) and/or a
  number of COMPLETE trials per study (``MaxTrialsCallback``, counted over every worker).
* Each new study is seeded with the default config (``enqueue_trial``), then with the user's seed
  configs (``seed_configs``: knob values applied on the key's default, ``space.seed_configs``), then
  (warm start, a new study only) with up to ``seed_retired`` configs that won under retired kernel
  sources of the same key (``tuning/warm.py``; from perf_db and the shipped results files), then (a new
  study only) with up to ``seed_other_gpus`` configs that won the same key on other GPUs under the current
  kernels (``warm.select_other_gpus``), then with
  up to ``seed_neighbours`` configs one schedule knob away from the first of those warm-start configs
  (the newest retired source's fastest: a re-tune after a kernel edit searches around the previous
  winner; else another GPU's winner), or from the default when there is none (``space.neighbour_configs``).
  The default, the user's seeds and the warm-start configs (retired and other GPUs') are measured first,
  whatever the budget: the
  batched loop puts them all in the key's first batch, the unbatched one runs them before its timed trials.
  With ``refine`` > 0 a new study then also measures, whatever the budget, up to that many configs that
  recombine what those changed from the default (``space.refine_configs``: the fastest one's changes undone
  one at a time, unions of two winners' changes), once.
* Ctrl-C once: the running trial finishes, is recorded and told, then the run stops. Ctrl-C twice:
  the running trial is abandoned (state FAIL, flagged ``interrupted``); ``--resume`` re-queues it.
* Batched (``compile_workers`` > 0, the default on a CUDA host): per key, a batch of proposals is
  compiled at once in child processes (``tuning.prepare``), then measured one by one with ask/tell.
  Every compiled config of a batch is measured (the budget only decides whether another batch
  starts); trials left unmeasured by Ctrl-C are abandoned flagged ``interrupted``, so ``--resume``
  re-queues them and finds their kernels in Triton's cache. Without ``study.optimize``
  there are no heartbeats: a worker killed with SIGKILL leaves its batch's trials RUNNING (its
  measured configs are in perf_db and are looked up, never re-measured).
"""
from __future__ import annotations

import inspect
import logging
import math
import re
import signal
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from .objective import PENALTY_MS, KeyContext, Objective
from .space import (
    TuneKey,
    default_config,
    describe_changes,
    make_sampler,
    neighbour_configs,
    refine_configs,
    run_id_for,
    seed_configs,
    source_hash_for,
    study_name,
)

__all__ = ["Budget", "TuneOptions", "KeyResult", "Tuner", "make_storage", "StudyExistsError", "parse_budget",
           "requeue_interrupted", "requeue_stale_running", "is_sqlite"]

log = logging.getLogger("pathtune.tune")


class StudyExistsError(RuntimeError):
    pass


@dataclass(frozen=True)
class Budget:
    seconds: Optional[float] = None
    trials: Optional[int] = None

    def __str__(self) -> str:
        parts = []
        if self.seconds is not None:
            parts.append(f"{self.seconds / 60:.3g} min wall time")
        if self.trials is not None:
            parts.append(f"{self.trials} trials per key")
        return " and ".join(parts) or "no limit"


_UNITS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600}


def parse_budget(text: str) -> Budget:
    """``10m`` / ``90s`` / ``1.5h`` (wall time, all keys together), ``40`` (COMPLETE trials per key's
    study), or both comma-separated (``10m,40``: whichever comes first).  Neither limit cuts the seeded
    configs (the default, ``--seed-config``'s, the warm start's): those are measured whatever the budget."""
    seconds = trials = None
    for part in (p.strip().lower() for p in text.split(",") if p.strip()):
        m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(s|sec|m|min|h)", part)
        if m:
            seconds = float(m.group(1)) * _UNITS[m.group(2)]
        elif part.isdigit() and int(part) > 0:
            trials = int(part)
        else:
            raise ValueError(f"--budget {text!r}: use a wall time (10m, 90s, 1h), a number of trials (40), or both "
                             "(10m,40)")
    if seconds is None and trials is None:
        raise ValueError("--budget is empty")
    return Budget(seconds, trials)


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def make_storage(url: str, heartbeat: Optional[int] = 30) -> Any:
    """RDBStorage with heartbeats (``heartbeat`` seconds; None: none, for the split flow's ask/tell);
    stale trials are re-queued with the same params."""
    import optuna
    from optuna.storages import RDBStorage

    engine_kwargs: dict[str, Any] = {}
    if is_sqlite(url):
        engine_kwargs["connect_args"] = {"timeout": 60}
    else:
        engine_kwargs["pool_pre_ping"] = True
    params = inspect.signature(RDBStorage.__init__).parameters
    cb_arg = "heartbeat_stale_trial_callback" if "heartbeat_stale_trial_callback" in params else "failed_trial_callback"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # heartbeat_interval and the retry callback are "experimental"
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        if not heartbeat:
            return RDBStorage(url, engine_kwargs=engine_kwargs)
        callback = _retry_callback()
        return RDBStorage(url, engine_kwargs=engine_kwargs, heartbeat_interval=heartbeat,
                          grace_period=max(2 * heartbeat, heartbeat + 2), **{cb_arg: callback})


def _retry_callback() -> Any:
    """Optuna's callback that re-queues a failed trial with its params (renamed in Optuna 4.9)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            from optuna.storages import RetryHeartbeatStaleTrialCallback as Retry
        except ImportError:  # Optuna < 4.9
            from optuna.storages import RetryFailedTrialCallback as Retry
        return Retry(max_retry=3)


def requeue_interrupted(study: Any) -> int:
    """Re-queue FAIL trials that Ctrl-C abandoned (user attr ``interrupted``) and that no trial retries yet."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    retried = {t.system_attrs.get("failed_trial") for t in trials} | {
        n for t in trials for n in t.system_attrs.get("retry_history", [])}
    n = 0
    cb = _retry_callback()
    for t in trials:
        if t.state == TrialState.FAIL and t.user_attrs.get("interrupted") and t.number not in retried and t.params:
            cb(study, t)
            n += 1
    return n


def requeue_stale_running(study: Any) -> int:
    """Put RUNNING trials back in the queue (state WAITING, same trial and params, same queue place).

    Only for a study on SQLite, where one worker runs at a time, so on ``--resume`` a RUNNING trial
    belongs to a dead process: the batched mode has no heartbeats, and a worker killed by a signal
    it cannot catch (a step timeout's SIGTERM, SIGKILL) leaves its batch RUNNING.  Left RUNNING, a key's
    seeded default would be lost that way: the resumed key's next trial would be a neighbour.
    """
    from optuna.trial import TrialState

    n = 0
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if study._storage.set_trial_state_values(t._trial_id, TrialState.WAITING):
            n += 1
    return n


@dataclass
class TuneOptions:
    storage: str
    db_url: Optional[str] = None
    budget: Budget = field(default_factory=lambda: Budget(trials=40))
    seed: int = 0
    worker: int = 0
    resume: bool = False
    measure_fn: Optional[Callable[..., dict]] = None
    task_defaults: dict = field(default_factory=dict)
    heartbeat: Optional[int] = 30
    startup_trials: int = 8
    seed_neighbours: int = 0           # a new study also gets up to this many one-knob neighbours (of the default,
    #                                    or of the warm start's first config)
    seed_retired: int = 3              # ... and first (after the default) up to this many winners of retired sources
    seed_other_gpus: int = 0           # ... and up to this many winners of this key on other GPUs (current kernels)
    seed_configs: list = field(default_factory=list)   # user seeds {knob: value} applied on each key's default
    refine: int = 0                    # then, once, up to this many recombinations of the seeded configs' changes
    confirm: int = 0                   # after each study, its this many fastest configs re-timed (tuning.confirm) ...
    confirm_rounds: int = 3            # ... in this many interleaved rounds
    command: Optional[str] = None
    results_out: Optional[Any] = None  # path: a results file rewritten after each record
    env_info: Optional[dict] = None    # the GPU host's collect_env() (split flow: the build host has no GPU)
    spec_path: Optional[Any] = None    # default: the packaged spec
    compile_workers: int = 0           # > 0: batches compiled in that many child processes, then measured
    compile_timeout: float = 300.0     # seconds one compile child may take
    preparer: Optional[Any] = None     # injected Preparer-like object (tests); default tuning.prepare.Preparer
    memory_knobs: bool = False         # also search the spec's memory-role knobs (the user allows the memory)


@dataclass
class KeyResult:
    key: TuneKey
    study_name: str
    trials: int = 0
    measured: int = 0
    looked_up: int = 0
    default_ms: Optional[float] = None
    default_status: Optional[str] = None
    best_ms: Optional[float] = None
    best_config: Optional[dict] = None
    baseline_ms: Optional[float] = None
    skipped: Optional[str] = None
    seeded_retired: Optional[int] = None   # warm-start configs the study was seeded with (None: not tried)
    previous_ms: Optional[float] = None    # the fastest ok time of this key under retired kernel sources, this GPU
    previous_source: Optional[str] = None  # ... and the source hash it ran
    confirmed: Optional[int] = None        # configs re-timed by --confirm (None: no confirmation ran)

    @property
    def speedup(self) -> Optional[float]:
        if self.default_ms and self.best_ms:
            return self.default_ms / self.best_ms
        return None

    @property
    def vs_previous(self) -> Optional[float]:
        """Tuned time over the previous kernels' best (above 1: slower than before the kernel edit)."""
        if self.previous_ms and self.best_ms:
            return self.best_ms / self.previous_ms
        return None

    def to_dict(self) -> dict:
        return {"label": self.key.label, "pass": self.key.pass_, "backend": self.key.backend,
                "workload": self.key.workload.to_dict(), "batch": self.key.batch, "seq_len": self.key.seq_len,
                "study_name": self.study_name, "trials": self.trials, "measured": self.measured,
                "looked_up": self.looked_up, "default_ms": self.default_ms, "default_status": self.default_status,
                "best_ms": self.best_ms, "best_config": self.best_config, "speedup": self.speedup,
                "baseline_ms": self.baseline_ms, "skipped": self.skipped, "seeded_retired": self.seeded_retired,
                "previous_ms": self.previous_ms, "previous_source": self.previous_source,
                "vs_previous": self.vs_previous, "confirmed": self.confirmed}


class Tuner:
    """Run the studies of ``keys`` one after the other (see module doc)."""

    def __init__(self, keys: Sequence[TuneKey], opts: TuneOptions, *, progress: Any = None) -> None:
        from pathtune.fingerprint import collect_env, env_hash
        from pathtune.perf_db import KernelKey, PerfDB, spec_keys
        from pathtune.specs import load_spec

        from .measure import measure

        self.keys = list(keys)
        self.opts = opts
        self.spec = load_spec(opts.spec_path)
        self.env_info = dict(opts.env_info) if opts.env_info else collect_env()
        self.env_hash = env_hash(self.env_info)
        # an injected measurement backend (tests' cost model) names its own "kernel source"
        fake_source = getattr(inspect.getmodule(opts.measure_fn), "SOURCE_HASH", None) if opts.measure_fn else None
        # per (backend, pass): a Triton pass's hash covers only that pass's kernel files
        self.sources = {(b, p): fake_source or source_hash_for(b, p)
                        for b, p in {(k.backend, k.pass_) for k in self.keys}}
        sources = self.sources
        spec = self.spec

        def current_keys(op: str, pass_: str, backend: str) -> Optional[dict]:
            if (backend, pass_) in sources:
                return {**spec_keys(spec, pass_), "source_hash": sources[(backend, pass_)]}
            return None

        # several workers may open a fresh database at once: the loser of a schema race retries
        self.db = _retry(lambda: PerfDB.open_default(opts.db_url or opts.storage, current_keys=current_keys))
        # heartbeats are Study.optimize's (its thread); the batched loop asks and tells without them
        batched = opts.preparer is not None or opts.compile_workers > 0
        self.storage = _retry(lambda: make_storage(opts.storage, None if batched else opts.heartbeat))
        self._study_names: Optional[set[str]] = None   # the studies in the storage when first asked (study_name)
        self.measure_fn = opts.measure_fn or measure
        self.KernelKey = KernelKey
        self.progress = progress
        self.stop_requested = False
        self.fatal: Optional[str] = None
        self.on_note: Optional[Callable[[str], None]] = None   # where notes go without a progress display
        self._records: list[dict] = []
        self._runs: dict[str, dict] = {}
        self.preparer = opts.preparer
        if self.preparer is None and opts.compile_workers > 0:
            from .prepare import Preparer

            self.preparer = Preparer(opts.compile_workers, opts.compile_timeout)
        self._opened: dict[str, Any] = {}        # study name -> study opened by compile_seeded, for tune_key
        self._compiled: dict[tuple[str, str], dict] = {}   # (study name, config hash) -> compile_seeded's result

    # -- names ----------------------------------------------------------------------------------------

    def study_name(self, key: TuneKey) -> str:
        """The key's study, named by its pass's spec hash; a study of the same key named by the full spec
        hash (opened before per-pass hashes, under this very spec) is the one continued when it exists."""
        source = self.sources[(key.backend, key.pass_)]
        name = study_name(self.env_hash, self.spec.pass_hash(key.pass_), source, key)
        older = study_name(self.env_hash, self.spec.hash, source, key)
        if self._study_names is None:   # listed once: this pathtune never opens a study of the older name
            import optuna

            self._study_names = {s.study_name for s in optuna.get_all_study_summaries(
                self.storage, include_best_trial=False)}
        return older if older in self._study_names and name not in self._study_names else name

    def kernel(self, key: TuneKey) -> Any:
        from .space import CODEGEN_VERSION

        return self.KernelKey(pass_=key.pass_, backend=key.backend, spec_hash=self.spec.pass_hash(key.pass_),
                              codegen_version=CODEGEN_VERSION, source_hash=self.sources[(key.backend, key.pass_)])

    # -- results file ---------------------------------------------------------------------------------

    def _results_run(self, run_id: str, notes: str) -> None:
        """The results file's entry of ``run_id`` (its first notes stay)."""
        self._runs.setdefault(run_id, {"run_id": run_id, "command": self.opts.command,
                                       "host": self.env_info.get("host"), "notes": notes})

    def _on_record(self, rec: dict) -> None:
        if self.opts.results_out is None:
            return
        from pathtune.perf_db import results_record, write_results

        self._results_run(rec["run_id"], "pathtune tune")
        self._records.append(results_record(rec["env"], rec["kernel"], rec["workload"], rec["config"],
                                            rec["measurement"], rec["run_id"]))
        write_results(self.opts.results_out, self._records, list(self._runs.values()))

    # -- one key --------------------------------------------------------------------------------------

    def check_new(self) -> None:
        """Without --resume, refuse (before any work) to run keys whose studies already have trials."""
        import optuna

        if self.opts.resume:
            return
        summaries = {s.study_name: s.n_trials
                     for s in optuna.get_all_study_summaries(self.storage, include_best_trial=False)}
        for key in self.keys:
            n = summaries.get(self.study_name(key), 0)
            if n:
                raise StudyExistsError(
                    f"study {self.study_name(key)} already has {n} trials in {self.db.display_url}; pass --resume "
                    "to continue it (every worker of a shared study passes --resume)")

    def open_study(self, key: TuneKey) -> Any:
        import optuna

        name = self.study_name(key)
        exists = name in {s.study_name for s in optuna.get_all_study_summaries(self.storage, include_best_trial=False)}
        if exists and not self.opts.resume:
            study = optuna.load_study(study_name=name, storage=self.storage)
            if study.get_trials(deepcopy=False):
                raise StudyExistsError(
                    f"study {name} already has {len(study.get_trials(deepcopy=False))} trials in "
                    f"{self.db.display_url}; "
                    "pass --resume to continue it (every worker of a shared study passes --resume)")
        # the seed moves on with the study's length: a resumed study does not replay the proposals it made
        n_before = len(optuna.load_study(study_name=name, storage=self.storage).get_trials(deepcopy=False)) \
            if exists else 0
        sampler = make_sampler(self.opts.seed + 1000 * self.opts.worker + n_before, self.opts.startup_trials)
        study = optuna.create_study(study_name=name, storage=self.storage, sampler=sampler, direction="minimize",
                                    load_if_exists=True)
        if not study.user_attrs.get("key"):
            study.set_user_attr("key", {"label": key.label, "pass": key.pass_, "backend": key.backend,
                                        "workload": key.workload.to_dict(), "batch": key.batch,
                                        "seq_len": key.seq_len, "env_hash": self.env_hash,
                                        "spec_hash": self.spec.pass_hash(key.pass_),
                                        "source_hash": self.sources[(key.backend, key.pass_)]})
        default = default_config(self.spec, key)
        new = not study.get_trials(deepcopy=False)
        if new:
            study.enqueue_trial(default.to_dict(), user_attrs={"seeded_default": True}, skip_if_exists=True)
        # the user's seeds, right after the default, into a new or a resumed study (a config the study
        # already holds is skipped, so a resume with the same seeds adds nothing and new seeds still count)
        if self.opts.seed_configs:
            configs, notes = seed_configs(self.spec, key, default, self.opts.seed_configs)
            for note in notes:
                self._note(note)
            for config in configs:
                study.enqueue_trial(config.to_dict(), user_attrs={"seeded_user": True}, skip_if_exists=True)
        # warm start: a new study only (a resumed one has its seeds, or predates them), once (the flag)
        centre = default    # the neighbours' centre: the warm start's first config (the previous winner) if any
        if new and self.opts.seed_retired > 0 and "retired_seeded" not in study.user_attrs:
            warm = self.warm_start(key, default)
            for config, row in warm.configs:
                study.enqueue_trial(config.to_dict(), skip_if_exists=True, user_attrs={
                    "seeded_retired": True, "retired_source": row["source_hash"], "retired_ms": row["median_ms"]})
            study.set_user_attr("retired_seeded", len(warm.configs))
            if warm.configs:
                centre = warm.configs[0][0]
        if new and self.opts.seed_other_gpus > 0 and "other_gpus_seeded" not in study.user_attrs:
            from pathtune.specs import Config

            queued = {Config(t.system_attrs["fixed_params"]).hash for t in study.get_trials(deepcopy=False)
                      if t.system_attrs.get("fixed_params")}
            other = self.other_gpus_start(key, default, queued)
            for config, row in other.configs:
                study.enqueue_trial(config.to_dict(), skip_if_exists=True, user_attrs={
                    "seeded_other_gpu": True, "other_gpu": row["gpu_name"], "other_gpu_ms": row["median_ms"]})
            study.set_user_attr("other_gpus_seeded", len(other.configs))
            if other.configs and centre is default:
                centre = other.configs[0][0]
        # once per study, also into one resumed from before neighbour seeding existed (a config the
        # study already tried is skipped, and perf_db lookups keep a re-proposal from being re-measured)
        if self.opts.seed_neighbours > 0 and not study.user_attrs.get("neighbours_seeded"):
            for config in neighbour_configs(self.spec, key, centre, self.opts.seed_neighbours):
                study.enqueue_trial(config.to_dict(), user_attrs={"seeded_neighbour": True}, skip_if_exists=True)
            study.set_user_attr("neighbours_seeded", self.opts.seed_neighbours)
        return study

    def warm_start(self, key: TuneKey, default: Any) -> Any:
        """The configs a new study of ``key`` is warm-started with (``tuning/warm.py``), from perf_db and
        the shipped results files; says what it chose and what no longer validates."""
        from .warm import WarmStart, select_retired

        got = self._seed_rows(key, "warm start", "retired", lambda: self.retired_rows(key))
        if got is None:
            return WarmStart()
        rows, earlier = got
        warm = select_retired(self.spec, key, default, rows, self.opts.seed_retired, fill_defaults=earlier)
        for _config, problems, row in warm.dropped:
            self._note(f"{key.label}: warm start: dropped a config of retired source {row['source_hash'][:10]} "
                       f"({row['median_ms']:.4g} ms there; {row['origin']}): it no longer validates: "
                       + "; ".join(problems))
        if warm.configs:
            by_source: dict[str, list[str]] = {}
            for _, row in warm.configs:
                by_source.setdefault(row["source_hash"][:10], []).append(f"{row['median_ms']:.4g}")
            n = len(warm.configs)
            where = ("retired kernel sources of an earlier spec (knobs new since at this key's defaults)" if earlier
                     else "retired kernel sources")
            self._note(f"{key.label}: warm start: {n} config{'s' if n > 1 else ''} that won under {where}, "
                       "measured right after the default: " + "; ".join(
                           f"{', '.join(times)} ms under {src}" for src, times in by_source.items())
                       + (" (the default's own knobs were among them: measured once)" if warm.same_as_default else ""))
        elif rows:
            log.info("%s: warm start: none of %d retired configs is usable (%d dropped, %d the default)",
                     key.label, warm.candidates, len(warm.dropped), warm.same_as_default)
        return warm

    def other_gpus_start(self, key: TuneKey, default: Any, queued: set) -> Any:
        """The configs a new study of ``key`` also measures first: the winners of the same key on other GPUs under
        the current kernels (perf_db and the shipped results files; ``tuning/warm.py``), minus those ``queued``
        already; says what it chose."""
        from pathtune.perf_db._retired import shipped_other_gpus

        from .warm import WarmStart, select_other_gpus

        def read() -> list:
            kernel = self.kernel(key)
            return (self.db.other_gpus(self.env_info, kernel, key.workload)
                    + shipped_other_gpus(self.env_info, kernel, key.workload,
                                         spec_hashes=self.spec.hashes_of(key.pass_)))

        rows = self._seed_rows(key, "other GPUs' winners", "other GPUs'", read)
        if rows is None:
            return WarmStart()
        other = select_other_gpus(self.spec, key, default, rows, self.opts.seed_other_gpus, exclude=queued)
        for _config, problems, row in other.dropped:
            self._note(f"{key.label}: a config of {row['gpu_name']} ({row['median_ms']:.4g} ms there) does not "
                       "validate here: " + "; ".join(problems))
        if other.configs:
            self._note(f"{key.label}: also measured first: the fastest configs of other GPUs under these kernels: "
                       + "; ".join(f"{row['median_ms']:.4g} ms on {row['gpu_name']}" for _, row in other.configs))
        return other

    def _seed_rows(self, key: TuneKey, what: str, whose: str, read: Callable[[], Any]) -> Any:
        """``read()``, or None with a note when it fails: seeding is an optimisation, never the reason a tune
        fails."""
        try:
            return read()
        except Exception as e:  # noqa: BLE001
            self._note(f"{key.label}: {what} skipped: reading {whose} results failed: {e}")
            return None

    def retired_rows(self, key: TuneKey) -> tuple[list[dict], bool]:
        """(rows, earlier) of ``key``'s ok measurements under retired kernel sources on this GPU, from perf_db and
        the shipped results files (``perf_db/_retired.py``); when there are none under this spec, those of earlier
        specs (``earlier`` True)."""
        from pathtune.perf_db._retired import shipped_retired

        kernel = self.kernel(key)
        specs = self.spec.hashes_of(key.pass_)
        rows = self.db.retired(self.env_info, kernel, key.workload)
        rows += shipped_retired(self.env_info, kernel, key.workload, spec_hashes=specs)
        if rows:
            return rows, False
        # the spec itself changed since the last tune: its winners, new knobs at defaults
        rows = self.db.retired(self.env_info, kernel, key.workload, earlier_specs=True)
        rows += shipped_retired(self.env_info, kernel, key.workload, spec_hashes=specs, earlier_specs=True)
        return rows, True

    def _note(self, message: str) -> None:
        log.info(message)
        sink = self.progress.note if self.progress is not None else self.on_note
        if sink is not None:
            sink(message)

    @staticmethod
    def _seeded_waiting(study: Any) -> int:
        """Queued trials of the seeded default, the user's seeds and the warm start (measured first, whatever
        the budget)."""
        from optuna.trial import TrialState

        return sum(1 for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
                   if t.user_attrs.get("seeded_default") or t.user_attrs.get("seeded_user")
                   or t.user_attrs.get("seeded_retired") or t.user_attrs.get("seeded_other_gpu")
                   or t.user_attrs.get("seeded_refine"))

    @staticmethod
    def _measured_ok(study: Any) -> list:
        """(Config, ms) of the study's ok trials."""
        from optuna.trial import TrialState

        from pathtune.specs import Config

        return [(Config(t.user_attrs["config"]), t.value) for t in study.get_trials(
            deepcopy=False, states=(TrialState.COMPLETE,))
            if t.user_attrs.get("status") == "ok" and t.user_attrs.get("config") is not None]

    def confirm(self, study: Any, ctx: KeyContext, result: KeyResult) -> None:
        """``opts.confirm`` > 0: the study's fastest configs re-timed in interleaved rounds (``tuning.confirm``),
        each draw recorded; a note says what the draws were and whether the winner moved."""
        from .confirm import confirm_candidates, confirm_key, confirm_note

        candidates = confirm_candidates(self._measured_ok(study), self.opts.confirm)
        if not candidates:
            self._note(f"{ctx.key.label}: confirm: fewer than two ok configs, nothing to re-time")
            return

        def start_run(run_id: str, notes: str) -> None:
            self.db.start_run(command=self.opts.command, notes=notes, run_id=run_id)
            self._results_run(run_id, notes)     # the results file names the run as perf_db does

        done = confirm_key(ctx, candidates, self.opts.confirm_rounds, start_run=start_run,
                           should_stop=lambda: self.stop_requested)
        result.confirmed = len(candidates)
        self._note(confirm_note(ctx.key.label, candidates, default_config(self.spec, ctx.key), done))

    def refine(self, study: Any, key: TuneKey) -> int:
        """Once per study whose seeded configs are all measured (``opts.refine`` > 0): enqueue up to
        ``opts.refine`` recombinations of what they changed from the default (``space.refine_configs``),
        measured like seeds; how many."""
        if self.opts.refine <= 0 or study.user_attrs.get("refined") is not None or self._seeded_waiting(study):
            return 0
        measured = self._measured_ok(study)
        default = default_config(self.spec, key)
        configs = refine_configs(self.spec, key, default, measured, self.opts.refine)
        for config in configs:
            study.enqueue_trial(config.to_dict(), user_attrs={"seeded_refine": True}, skip_if_exists=True)
        study.set_user_attr("refined", len(configs))
        if configs:
            self._note(f"{key.label}: refine: {len(configs)} recombination{'s' if len(configs) > 1 else ''} of the "
                       f"seeded configs' changes, measured next: "
                       + "; ".join(describe_changes(c, default) for c in configs))
        return len(configs)

    def context(self, key: TuneKey, name: str, *, start_run: bool = True) -> KeyContext:
        """The objective's context of ``key``'s study ``name``; ``start_run``: also open its perf_db run (the
        measuring loop records into it; ``compile_seeded`` only builds tasks)."""
        if start_run:
            self.db.start_run(command=self.opts.command, notes=f"pathtune tune {name}", run_id=run_id_for(name))
        space = key.space(self.spec, memory_knobs=self.opts.memory_knobs)
        return KeyContext(key=key, space=space, db=self.db, env_info=self.env_info,
                          kernel=self.kernel(key), study_name=name, run_id=run_id_for(name),
                          measure_fn=self.measure_fn, task_defaults=dict(self.opts.task_defaults),
                          seed=self.opts.seed + 1000 * self.opts.worker, command=self.opts.command,
                          on_record=self._on_record)

    def tune_key(self, key: TuneKey, seconds: Optional[float]) -> KeyResult:
        from optuna.study import MaxTrialsCallback
        from optuna.trial import TrialState

        study = self._opened.pop(self.study_name(key), None) or self.open_study(key)
        name = study.study_name
        if self.opts.resume:
            requeue_interrupted(study)
            if is_sqlite(self.opts.storage):
                requeue_stale_running(study)
        ctx = self.context(key, name)
        result = KeyResult(key, name)
        budget = self.opts.budget
        done = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
        task = None
        if self.progress is not None:
            task = self.progress.add_key(key, budget.trials, done)
            self.progress.start_key(task, study)
        # the trial cap stops the sampler's trials only: the seeded ones run to the end (_seeded_waiting)
        capped: list[Any] = []
        if budget.trials is not None:
            capped.append(MaxTrialsCallback(budget.trials, states=(TrialState.COMPLETE,)))

        def after_trial(study: Any, trial: Any) -> None:
            if self.progress is not None:
                self.progress.update_key(task, study, trial)
            if (self.stop_requested or ctx.fatal) and self.preparer is None:
                study.stop()     # study.optimize's loop; the batched loop checks the flags itself

        capped.append(after_trial)
        if budget.trials is not None and done >= budget.trials and not self._seeded_waiting(study):
            pass
        elif self.preparer is not None:
            self._optimize_batched(study, Objective(ctx), ctx, seconds, after_trial)
        else:
            # first the seeded default and the warm-start configs, even out of time: every key gets a
            # default time, and the winners of its retired sources re-measured
            first = max(self._seeded_waiting(study), 1 if done == 0 else 0)
            start = time.monotonic()
            if first:
                study.optimize(Objective(ctx), n_trials=first, callbacks=[after_trial], catch=(),
                               gc_after_trial=False)
            refined = 0 if self.stop_requested or ctx.fatal else self.refine(study, key)
            if refined:
                study.optimize(Objective(ctx), n_trials=refined, callbacks=[after_trial], catch=(),
                               gc_after_trial=False)
            left = None if seconds is None else seconds - (time.monotonic() - start)
            complete = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
            if (left is None or left > 0) and not (self.stop_requested or ctx.fatal) and \
                    (budget.trials is None or complete < budget.trials):
                # n_trials caps this process (pruned proposals do not count toward MaxTrialsCallback)
                cap = None if budget.trials is None else 4 * budget.trials + 20
                study.optimize(Objective(ctx), n_trials=cap, timeout=left, callbacks=capped, catch=(),
                               gc_after_trial=False)
        if self.opts.confirm > 0 and not (self.stop_requested or ctx.fatal):
            self.confirm(study, ctx, result)
        self.fatal = self.fatal or ctx.fatal
        result.measured, result.looked_up = ctx.measured, ctx.looked_up
        result.seeded_retired = study.user_attrs.get("retired_seeded")
        self.summarize(key, study, result)
        if self.progress is not None:
            self.progress.finish_key(task, result)
        return result

    def _optimize_batched(self, study: Any, objective: Objective, ctx: KeyContext, seconds: Optional[float],
                          after_trial: Callable[[Any, Any], None]) -> None:
        """Ask a batch of trials, compile the new configs in parallel child processes, then measure them
        one at a time (ask/tell). Every key gets at least one batch (its first holds the seeded default
        and the warm-start configs, however many compile workers there are; a key reached after the
        budget ran out gets a batch of just those); another batch starts while the key's share of the
        wall time lasts. Trials left unmeasured by Ctrl-C are flagged
        ``interrupted`` (``--resume`` re-queues them)."""
        import optuna
        from optuna.trial import TrialState

        budget = self.opts.budget
        start = time.monotonic()
        # out of time: a batch of just the seeded default (so every key has a default time) and the
        # warm-start configs (the winners of its retired sources: the best bet for one batch)
        size = self.preparer.workers if seconds is None or seconds > 0 else 1
        empty_batches = 0
        while not (self.stop_requested or ctx.fatal):
            complete = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
            seeded = self._seeded_waiting(study)
            want = max(size, seeded)     # the seeded configs share one batch
            if budget.trials is not None:   # a trial cap never cuts a seeded config (the previous winner)
                want = max(min(want, budget.trials - complete), seeded)
            if want <= 0:
                break
            batch: list[tuple[Any, Any]] = []      # (trial, config) to compile and measure
            repeats: list[tuple[Any, Any]] = []    # same config as an earlier trial of this batch
            hashes: set[str] = set()
            answered = 0    # proposals answered from an earlier measurement: COMPLETE, so they count too
            for _ in range(4 * want):
                if len(batch) + len(repeats) + answered >= want:
                    break
                trial = study.ask()
                try:
                    config, stored = objective.propose(trial)
                except optuna.TrialPruned:
                    study.tell(trial, state=TrialState.PRUNED)
                    continue
                if stored is not None:
                    answered += 1
                    after_trial(study, study.tell(trial, objective.conclude(trial, stored)))
                elif config.hash in hashes:
                    repeats.append((trial, config))
                else:
                    hashes.add(config.hash)
                    batch.append((trial, config))
            empty_batches = 0 if batch else empty_batches + 1
            untold = [t for t, _ in batch + repeats]
            try:
                # configs that compile_seeded already compiled (or found failing) are not compiled again
                known = {i: self._compiled.pop((ctx.study_name, config.hash)) for i, (_, config) in enumerate(batch)
                         if (ctx.study_name, config.hash) in self._compiled}
                todo = [i for i in range(len(batch)) if i not in known]
                fresh = self.preparer.run([ctx.task(batch[i][1], batch[i][0].number) for i in todo],
                                          should_stop=lambda: self.stop_requested) if todo else []
                prepared = [known[i] if i in known else fresh[todo.index(i)] for i in range(len(batch))]
                if len(batch) > 1 and all(p.get("child_failed") for p in prepared):
                    # not the configs: the children cannot run at all (environment); record nothing
                    ctx.fatal = ("every compile child of a batch died without a result (a setup problem, not "
                                 f"the configs): {str(prepared[0].get('message', ''))[-600:]}")
                # every compiled config of the batch is measured even past the budget: compiling was the
                # expensive part (abandoning a batch at the deadline threw away minutes of compiling); the
                # budget decides whether another batch starts
                for (trial, config), prep in zip(batch, prepared):
                    if self.stop_requested or ctx.fatal or prep.get("status") == "interrupted":
                        untold.remove(trial)
                        self._abandon(study, trial, "not measured: the run stopped before its turn")
                        continue
                    stored = objective.measure(trial, config, prepared=prep)
                    untold.remove(trial)
                    after_trial(study, study.tell(trial, objective.conclude(trial, stored)))
            except KeyboardInterrupt:     # second Ctrl-C: nothing left running (--resume re-queues these)
                for trial in untold:
                    self._abandon(study, trial, "interrupted")
                raise
            for trial, config in repeats:
                stored = objective.lookup(trial, config)
                if stored is None:
                    self._abandon(study, trial, "not measured: its config's first trial was not measured")
                    continue
                after_trial(study, study.tell(trial, objective.conclude(trial, stored)))
            if self.refine(study, ctx.key):   # once, after the seeded configs: measured like them, whatever the budget
                continue
            if empty_batches >= 3:       # every proposal pruned or already measured: the space is spent
                break
            if seconds is not None and time.monotonic() - start >= seconds:
                break

    @staticmethod
    def _abandon(study: Any, trial: Any, why: str) -> None:
        from optuna.trial import TrialState

        trial.set_user_attr("interrupted", True)
        trial.set_user_attr("message", why)
        study.tell(trial, state=TrialState.FAIL)

    def summarize(self, key: TuneKey, study: Any, result: KeyResult) -> None:
        """Default vs tuned time of a key, from perf_db (the facts) and the study (the trial count)."""
        from optuna.trial import TrialState

        result.trials = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
        kernel = self.kernel(key)
        default = default_config(self.spec, key)
        row = self.db.lookup(self.env_info, kernel, key.workload, default)
        if row is not None:
            result.default_status = row["status"]
            result.default_ms = row["median_ms"] if row["status"] == "ok" else None
            result.baseline_ms = row.get("baseline_ms")
        best = self.db.best(self.env_info, key.pass_, key.workload, backend=key.backend)
        if best is not None and best["match"] == "exact":
            result.best_ms, result.best_config = best["median_ms"], best["config"]
            result.baseline_ms = result.baseline_ms or best.get("baseline_ms")
        # the previous kernels' best on this GPU: a tuned time well above it says a kernel edit or a tune that
        # missed the previous winner (its config is the warm start's first seed)
        try:
            rows, _ = self.retired_rows(key)
        except Exception as e:  # noqa: BLE001  (a comparison for the report: never the reason a tune fails)
            log.info("%s: previous kernels' best not read: %s", key.label, e)
            rows = []
        if rows:
            prev = min(rows, key=lambda r: r["median_ms"])
            result.previous_ms, result.previous_source = prev["median_ms"], prev["source_hash"]

    # -- all keys -------------------------------------------------------------------------------------

    def compile_seeded(self) -> None:
        """Compile the seeded trials of every key (its default, the user's seeds, the warm start) in one wave of
        the compile workers, before any key is measured; each key's first batch then measures them without
        compiling again.  Key by key, a batch of a few seeded configs leaves most workers idle while it
        compiles (a re-tune after a kernel edit: the default and the retired winners of 16 keys, minutes of
        cold compiles each); one wave keeps every worker busy.  Configs whose kernels another key already
        compiles (the same pass, head dims, heads, dtype, gate and config at another length bucket) are
        compiled once; their Triton cache entries serve both.  No straggler rule in the wave: a backward
        config compiles for minutes next to forward ones that take seconds."""
        from optuna.trial import TrialState

        from pathtune.specs import Config

        tasks, owners, first = [], [], {}
        for key in self.keys:
            study = self.open_study(key)
            self._opened[study.study_name] = study
            ctx = self.context(key, study.study_name, start_run=False)
            for trial in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
                params = trial.system_attrs.get("fixed_params")
                if not params:
                    continue
                try:
                    config = Config(params)
                except (TypeError, ValueError):
                    continue
                if self.db.lookup(self.env_info, ctx.kernel, key.workload, config) is not None:
                    continue     # measured before: its trial reads perf_db
                wl = key.workload
                kernels = (key.pass_, key.backend, wl.head_dim, wl.head_dim_v, wl.heads_q, wl.heads_kv, wl.dtype,
                           wl.use_gate, wl.varlen, config.hash)
                owners.append(((study.study_name, config.hash), first.setdefault(kernels, len(tasks))))
                if first[kernels] == len(tasks):
                    tasks.append(ctx.task(config, trial.number))
        if len(tasks) <= 1:
            return
        preparer = self.preparer
        if hasattr(preparer, "straggler_factor"):
            import copy

            preparer = copy.copy(preparer)
            preparer.straggler_factor = None
        start = time.monotonic()
        results = preparer.run(tasks, should_stop=lambda: self.stop_requested)
        if all(r.get("child_failed") for r in results):
            # not the configs: the children cannot run at all (environment); stop before any key
            self.fatal = ("every compile child of the seeded configs died without a result (a setup problem, not "
                          f"the configs): {str(results[0].get('message', ''))[-600:]}")
            return
        for (study_config, i) in owners:
            if results[i].get("status") not in ("interrupted", "timeout") and not results[i].get("child_failed"):
                self._compiled[study_config] = results[i]
        self._note(f"compiled the seeded configs of {len(self.keys)} keys in one wave: {len(tasks)} configs, "
                   f"{len(owners)} trials, {time.monotonic() - start:.0f} s")

    def run(self, on_key_done: Optional[Callable[[KeyResult], None]] = None) -> list[KeyResult]:
        results = []
        deadline = None if self.opts.budget.seconds is None else time.monotonic() + self.opts.budget.seconds
        self.check_new()
        old = _install_sigint(self)
        try:
            if self.preparer is not None and len(self.keys) > 1:
                self.compile_seeded()
            for i, key in enumerate(self.keys):
                if self.stop_requested or self.fatal:
                    break
                seconds = None
                if deadline is not None:
                    seconds = (deadline - time.monotonic()) / (len(self.keys) - i)
                res = self.tune_key(key, seconds)
                results.append(res)
                if on_key_done is not None:
                    on_key_done(res)
        finally:
            signal.signal(signal.SIGINT, old) if old is not None else None
        return results

    def close(self) -> None:
        self.db.close()
        try:
            self.storage.engine.dispose()
        except Exception:  # noqa: BLE001
            pass


def _retry(fn: Callable[[], Any], attempts: int = 4) -> Any:
    for i in range(attempts):
        try:
            return fn()
        except Exception:  # noqa: BLE001
            if i == attempts - 1:
                raise
            time.sleep(0.5 + i)


def _install_sigint(tuner: Tuner) -> Any:
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum: int, frame: Any) -> None:
        if tuner.stop_requested:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt
        tuner.stop_requested = True
        if tuner.progress is not None:
            tuner.progress.note("Ctrl-C: finishing the running trial, then stopping (Ctrl-C again abandons it; "
                                "--resume continues either way)")
        signal.signal(signal.SIGINT, handler_second)

    def handler_second(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        raise KeyboardInterrupt

    return signal.signal(signal.SIGINT, handler)


def fmt_ms(v: Optional[float]) -> str:
    if v is None or not math.isfinite(v) or v >= PENALTY_MS:
        return "-"
    return f"{v:.4g}"
