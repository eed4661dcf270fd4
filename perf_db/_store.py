"""``PerfDB``: record, look up, rank, report and prune tuning measurements."""
from __future__ import annotations

import json
import logging
import math
import os
import weakref
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Optional, Sequence, Union

from sqlalchemy import and_, delete, func, or_, select
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from pathtune.specs import KEY_SCHEMA, Config, Workload

from ._engine import current_revision as _current_revision
from ._engine import make_engine, resolve_url, safe_url, sqlite_file, sqlite_release_wal, sqlite_wal_present
from ._engine import upgrade as _upgrade
from ._errors import DuplicateMeasurementError, PerfDBError
from ._keys import (
    BACKEND_LIBS,
    DISPATCH_BACKENDS,
    WITHDRAWN_RUNS,
    ConfigLike,
    CurrentKeys,
    EnvLike,
    KernelKey,
    KernelLike,
    Measurement,
    WorkloadLike,
    as_config,
    as_kernel,
    as_measurement,
    as_workload,
    current_command,
    default_current_keys,
    env_columns,
    env_key_schema,
    iso,
    json_float,
    new_run_id,
    parse_time,
    same_spec_hashes,
    soft_mismatch,
    stale_reasons,
)
from ._models import (
    BACKENDS,
    PASSES,
    STATUSES,
    EnvRow,
    IngestRow,
    KernelRow,
    MeasurementRow,
    RunRow,
    WorkloadRow,
    best_without,
)
from ._models import utcnow as utc_now
from ._results import RunInfo, parse_results, read_results
from ._rows import gpu_clause, measurement_of

if TYPE_CHECKING:  # pragma: no cover
    from ._dump import DumpReport

__all__ = ["PerfDB", "GcReport", "IngestReport", "OVERHEAD_BY"]

log = logging.getLogger("pathtune.perf_db")

OVERHEAD_BY = ("head_dim", "head_dim_v", "seq_len", "dtype", "gqa_group", "heads_q", "batch", "use_gate")
_ON_CONFLICT = ("error", "skip")
_CHUNK = 500


@dataclass
class IngestReport:
    """What ``PerfDB.ingest`` did with one results file."""

    name: str
    sha256: str
    records: int = 0
    added: int = 0
    identical: int = 0          # already stored with the same content (re-ingest)
    skipped: int = 0            # stored with different content, kept as is (on_conflict="skip")
    already_ingested: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class GcReport:
    """What ``PerfDB.gc`` deleted (or would delete, with ``dry_run``)."""

    dry_run: bool
    reasons: dict[str, int] = field(default_factory=dict)        # reason -> measurements
    measurement_ids: list[int] = field(default_factory=list)
    orphans: dict[str, int] = field(default_factory=dict)        # table -> rows left without measurements
    examples: list[dict[str, Any]] = field(default_factory=list)  # a few of the rows, for the report

    @property
    def total(self) -> int:
        return len(self.measurement_ids)

    def to_dict(self) -> dict[str, Any]:
        return {"dry_run": self.dry_run, "total": self.total, "reasons": self.reasons, "orphans": self.orphans,
                "measurement_ids": self.measurement_ids, "examples": self.examples}


def _chunks(items: Sequence[Any], n: int = _CHUNK) -> Iterable[Sequence[Any]]:
    for i in range(0, len(items), n):
        yield items[i:i + n]


def _bucket_order(bucket: int, wanted: int) -> tuple[float, int]:
    """Sort key of a length bucket serving ``wanted``: log2 distance, ties to the larger bucket."""
    return abs(math.log2(bucket) - math.log2(wanted)), -bucket


def _one_gpu(rows: list[dict[str, Any]], wanted: int) -> list[dict[str, Any]]:
    """The rows of one GPU (``best(other_gpus=True)``): the GPU whose nearest length bucket is closest to
    ``wanted``, then the one with the most rows, then by name."""
    by_gpu: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_gpu.setdefault(r["gpu_name"], []).append(r)

    def rank(gpu: str) -> tuple:
        return (min(_bucket_order(r["seq_bucket"], wanted) for r in by_gpu[gpu]), -len(by_gpu[gpu]), gpu)

    return by_gpu[min(by_gpu, key=rank)]


def _row_dict(m: MeasurementRow, e: EnvRow, k: KernelRow, w: WorkloadRow) -> dict[str, Any]:
    ratio = m.median_ms / m.baseline_ms if m.median_ms and m.baseline_ms else None
    errors = json.loads(m.errors_json) if m.errors_json else None
    return {
        "id": m.id, "created_at": iso(m.created_at), "run_id": m.run_id,
        "gpu": e.gpu_name, "cc": e.cc, "env_hash": e.env_hash, "cuda": e.cuda, "ptxas": e.ptxas,
        "triton": e.triton, "tvm": e.tvm, "driver": e.driver, "torch": e.torch, "pathtune": e.pathtune,
        "host": e.host,
        "op": k.op, "pass": k.pass_, "backend": k.backend, "spec_hash": k.spec_hash,
        "codegen_version": k.codegen_version, "source_hash": k.source_hash,
        "workload": json.loads(w.key_json), "workload_hash": w.key_hash, "head_dim": w.head_dim,
        "head_dim_v": w.head_dim_v, "heads_q": w.heads_q, "heads_kv": w.heads_kv, "gqa_group": w.gqa_group,
        "dtype": w.dtype, "use_gate": w.use_gate, "seq_bucket": w.seq_bucket, "batch_bucket": w.batch_bucket,
        "varlen": w.varlen, "query_bucket": w.query_bucket,
        "config": json.loads(m.config_json), "config_hash": m.config_hash, "status": m.status,
        "median_ms": m.median_ms, "p20_ms": m.p20_ms, "p80_ms": m.p80_ms, "n_reps": m.n_reps,
        "bench_method": m.bench_method,
        "errors": None if errors is None else {n: json_float(v) for n, v in errors.items()},
        "max_rel_err": json_float(m.max_rel_err), "baseline_ms": m.baseline_ms, "baseline_name": m.baseline_name,
        "ratio": ratio, "study_name": m.study_name, "trial_number": m.trial_number, "command": m.command,
        "message": m.message,
    }


def _not_withdrawn() -> Any:
    """The clause that leaves out the measurements of withdrawn runs (``WITHDRAWN_RUNS``, read per call)."""
    return MeasurementRow.run_id.not_in(tuple(WITHDRAWN_RUNS))


class PerfDB:
    """The tuning-results database at one SQLAlchemy URL.

    ``url``: ``sqlite:///path/perf.sqlite3`` or ``postgresql+psycopg://user@host/db``; default
    ``PATHTUNE_DB_URL``, else ``sqlite:///<user data dir>/perf.sqlite3``. The schema is migrated
    on open (``auto_upgrade``). ``current_keys(op, pass_, backend)`` gives the spec / source hashes of
    the code that would run now; results of other code are stale (not served by ``best``, pruned by
    ``gc``). The default knows the packaged spec's hash only.
    ``read_only``: lookups only (the runtime dispatcher): nothing in the database can change (a SQLite
    file is opened read-only and must exist; PostgreSQL sessions are read-only), the schema is not
    migrated, a lock is waited for at most ``lock_wait_ms`` (default ``SQLITE_READ_BUSY_TIMEOUT_MS``).
    ``PerfDB.open_read`` is what the read commands use: read-only, with the shipped results.

    >>> db = PerfDB("sqlite://")            # in memory
    >>> db.revision()
    '0001_initial'
    """

    def __init__(self, url: Optional[str] = None, *, current_keys: Optional[CurrentKeys] = default_current_keys,
                 auto_upgrade: bool = True, echo: bool = False, read_only: bool = False,
                 lock_wait_ms: Optional[int] = None) -> None:
        self.url, self.is_default_url = resolve_url(url)
        self.read_only = read_only
        self.engine = make_engine(self.url, create_parent=self.is_default_url and not read_only, echo=echo,
                                  read_only=read_only, lock_wait_ms=lock_wait_ms)
        self._session = sessionmaker(self.engine, expire_on_commit=False)
        self.current_keys: CurrentKeys = current_keys or (lambda op, pass_, backend: None)
        self._run_id: Optional[str] = None
        self._label: Optional[str] = None      # what display_url shows instead of the URL (open_read's copies)
        self.read_notes: list[str] = []         # what a read command should tell about what it read (open_read)
        # A read-only reader of a WAL database creates its -wal / -shm files and cannot remove them: close()
        # (or exit) removes them if they were not there before (_engine.sqlite_release_wal).
        path = sqlite_file(self.url) if read_only else None
        self._release_wal = None
        if path is not None and path.is_file() and not sqlite_wal_present(path):
            self._release_wal = weakref.finalize(self, _release_wal, self.engine, path, os.getpid())
        if auto_upgrade and not read_only:
            self.upgrade()

    # -- lifecycle ------------------------------------------------------------------------------------

    @classmethod
    def open_default(cls, url: Optional[str] = None, *, ingest_shipped: bool = True, **kwargs: Any) -> "PerfDB":
        """Open ``url`` (default: ``PATHTUNE_DB_URL`` or the per-user SQLite file) and ingest the result
        files shipped in ``pathtune/perf_db/shipped/`` that it has not ingested yet."""
        db = cls(url, **kwargs)
        if ingest_shipped:
            from ._shipped import ingest_shipped as _ingest

            _ingest(db)
        return db

    @classmethod
    def open_read(cls, url: Optional[str] = None, *, shipped: bool = True, **kwargs: Any) -> "PerfDB":
        """Open ``url`` for reading without changing it, with the shipped results it lacks shown from an
        in-memory copy; a missing SQLite file the user named is refused. See ``perf_db/_readonly.py``."""
        from ._readonly import open_read

        return open_read(cls, url, shipped=shipped, **kwargs)

    def upgrade(self, revision: str = "head") -> str:
        """Run the Alembic migrations (version table ``perf_alembic_version``); idempotent."""
        return _upgrade(self.engine, revision)

    def revision(self) -> Optional[str]:
        return _current_revision(self.engine)

    @property
    def display_url(self) -> str:
        return self._label or safe_url(self.url)

    @property
    def sqlite_path(self) -> Optional[Path]:
        return sqlite_file(self.url)

    def close(self) -> None:
        if self._release_wal is not None and self._release_wal.alive:
            self._release_wal()
        else:
            self.engine.dispose()

    def __enter__(self) -> "PerfDB":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PerfDB({self.display_url!r})"

    def session(self) -> Session:
        return self._session()

    # -- runs -----------------------------------------------------------------------------------------

    def start_run(self, command: Optional[str] = None, notes: Optional[str] = None, *, run_id: Optional[str] = None,
                  host: Optional[str] = None, started_at: Optional[datetime] = None) -> str:
        """Start (or, for an existing ``run_id``, reuse) a run; later ``record(run_id=None)`` calls use it."""
        info = RunInfo(run_id or new_run_id(host), started_at, command or current_command(), host, notes)
        with self.session() as s, s.begin():
            self._ensure_run(s, info)
        self._run_id = info.run_id
        return info.run_id

    @property
    def run_id(self) -> str:
        """The run that ``record(run_id=None)`` uses (started on first use)."""
        if self._run_id is None:
            self.start_run()
        assert self._run_id is not None
        return self._run_id

    def _ensure_run(self, s: Session, info: RunInfo) -> RunRow:
        import platform

        row = s.get(RunRow, info.run_id)
        if row is not None:
            return row
        row = RunRow(run_id=info.run_id, started_at=info.started_at or utc_now(), command=info.command,
                     host=info.host or platform.node(), notes=info.notes)
        try:
            with s.begin_nested():
                s.add(row)
        except IntegrityError:  # created concurrently
            row = s.get(RunRow, info.run_id)
        return row

    # -- record / lookup ------------------------------------------------------------------------------

    @staticmethod
    def _get_or_create(s: Session, model: type, where: dict[str, Any], values: dict[str, Any]) -> Any:
        row = s.scalars(select(model).filter_by(**where)).first()
        if row is not None:
            return row
        try:
            with s.begin_nested():
                row = model(**where, **values)
                s.add(row)
        except IntegrityError:  # another writer created it between our select and insert
            row = s.scalars(select(model).filter_by(**where)).one()
        return row

    def _env_row(self, s: Session, env_info: EnvLike) -> EnvRow:
        cols = env_columns(env_info)
        return self._get_or_create(s, EnvRow, {"fingerprint": cols.pop("fingerprint")},
                                   {**cols, "created_at": utc_now()})

    def _kernel_row(self, s: Session, kernel: KernelKey) -> KernelRow:
        return self._get_or_create(s, KernelRow, {"op": kernel.op, "pass_": kernel.pass_, "backend": kernel.backend,
                                                  "spec_hash": kernel.spec_hash,
                                                  "codegen_version": kernel.codegen_version,
                                                  "source_hash": kernel.source_hash}, {})

    def _workload_row(self, s: Session, wl: Workload) -> WorkloadRow:
        row = self._get_or_create(s, WorkloadRow, {"key_hash": wl.key_hash}, {
            "key_json": wl.key(), "key_schema": KEY_SCHEMA, "head_dim": wl.head_dim, "head_dim_v": wl.head_dim_v,
            "heads_q": wl.heads_q, "heads_kv": wl.heads_kv, "gqa_group": wl.heads_q // wl.heads_kv,
            "dtype": wl.dtype, "use_gate": wl.use_gate, "pass_": wl.pass_, "seq_bucket": wl.seq_bucket,
            "batch_bucket": wl.batch_bucket, "varlen": wl.varlen, "query_bucket": wl.query_bucket})
        if row.key_json != wl.key():
            raise PerfDBError(f"workload key hash collision: {wl.key_hash} is stored for {row.key_json}, "
                              f"not {wl.key()}")
        return row

    def _insert(self, s: Session, env_info: EnvLike, kernel: KernelKey, wl: Workload, config: Config,
                m: Measurement, run: RunInfo, mode: str) -> tuple[int, str]:
        """Insert one measurement. ``mode``: error | skip | identical_ok. Returns (id, added|identical|skipped)."""
        if kernel.pass_ != wl.pass_:
            raise PerfDBError(f"kernel pass {kernel.pass_!r} != workload pass {wl.pass_!r}")
        env_row = self._env_row(s, env_info)
        kernel_row = self._kernel_row(s, kernel)
        wl_row = self._workload_row(s, wl)
        self._ensure_run(s, run)
        key = {"env_id": env_row.id, "kernel_id": kernel_row.id, "workload_id": wl_row.id,
               "config_hash": config.hash, "run_id": run.run_id}

        def existing_outcome(existing: MeasurementRow) -> tuple[int, str]:
            same = measurement_of(existing).content() == m.content()
            if mode == "skip":
                return existing.id, "identical" if same else "skipped"
            if same and mode == "identical_ok":
                return existing.id, "identical"
            what = "the same result" if same else "a different result"
            raise DuplicateMeasurementError(
                f"measurement #{existing.id} already holds {what} for this key (gpu {env_row.gpu_name}, "
                f"{kernel.backend}/{kernel.pass_}, workload {wl.key()}, config {config.to_json()}, run "
                f"{run.run_id}); stored facts are never overwritten. Use on_conflict='skip' to keep it, or record "
                "under a new run_id to measure again")

        existing = s.scalars(select(MeasurementRow).filter_by(**key)).first()
        if existing is not None:
            return existing_outcome(existing)
        row = MeasurementRow(
            **key, config_json=config.to_json(), status=m.status, median_ms=m.median_ms, p20_ms=m.p20_ms,
            p80_ms=m.p80_ms, n_reps=m.n_reps, bench_method=m.bench_method,
            errors_json=None if m.errors is None else json.dumps(m.errors, sort_keys=True),
            max_rel_err=m.max_rel_err, baseline_ms=m.baseline_ms, baseline_name=m.baseline_name,
            study_name=m.study_name, trial_number=m.trial_number, command=m.command or run.command,
            message=m.message, created_at=m.created_at or utc_now())
        try:
            with s.begin_nested():
                s.add(row)
        except IntegrityError:
            existing = s.scalars(select(MeasurementRow).filter_by(**key)).first()
            if existing is None:
                raise
            return existing_outcome(existing)
        return row.id, "added"

    def record(self, env_info: EnvLike, kernel: KernelLike, workload: WorkloadLike, config: ConfigLike,
               measurement: Union[Measurement, Mapping[str, Any]], run_id: Optional[str] = None, *,
               on_conflict: str = "error") -> int:
        """Store one measurement; returns its id.

        ``env_info``: ``collect_env()`` output (plus optional ``host``). ``kernel``: ``KernelKey`` or
        dict. ``workload``: ``Workload`` or its dict. ``config``: ``Config`` or dict. ``run_id``: the
        run it belongs to (default: this PerfDB's run, see ``start_run``). A measurement for the same
        (env, kernel, workload, config, run) is never overwritten: ``on_conflict="error"`` raises
        ``DuplicateMeasurementError``; ``"skip"`` keeps the stored one and returns its id.
        """
        if on_conflict not in _ON_CONFLICT:
            raise PerfDBError(f"on_conflict must be one of {_ON_CONFLICT}, got {on_conflict!r}")
        k, wl, cfg, m = as_kernel(kernel), as_workload(workload), as_config(config), as_measurement(measurement)
        host = env_info.get("host") if isinstance(env_info, Mapping) else None
        run = RunInfo(run_id or self.run_id, None, m.command or current_command(), host)
        with self.session() as s, s.begin():
            mid, outcome = self._insert(s, env_info, k, wl, cfg, m, run, on_conflict)
        if outcome != "added":
            log.debug("record: kept measurement #%d (%s)", mid, outcome)
        return mid

    def _env_clause(self, cols: Any, env: Union[str, EnvLike], backends: Sequence[str], *,
                    other_gpus: bool = False) -> Any:
        """Rows whose environment matches ``env``: an ``env_hash`` exactly, or (for ``collect_env()``
        output) per backend: GPU name, cc, CUDA and the backend's own library version (ptxas is soft).
        ``other_gpus``: the same but for GPUs of another name (``env`` a ``collect_env()`` mapping)."""
        if isinstance(env, str):
            if other_gpus:
                raise PerfDBError("other_gpus needs the environment as collect_env() gives it, not an env_hash")
            return cols.env_hash == env
        want = env_columns(env)
        gpu = (and_(cols.gpu_name.is_not(None), cols.gpu_name != want["gpu_name"]) if other_gpus
               else cols.gpu_name == want["gpu_name"])
        common = [gpu, cols.cc.is_not_distinct_from(want["cc"]),
                  cols.cuda.is_not_distinct_from(want["cuda"]),
                  cols.env_key_schema == env_key_schema()]
        per_backend = [and_(cols.backend == b, *[getattr(cols, lib).is_not_distinct_from(want[lib])
                                                  for lib in BACKEND_LIBS[b]]) for b in backends]
        return and_(*common, or_(*per_backend))

    def _same_spec(self, k: KernelKey) -> tuple[str, ...]:
        """The stored spec hashes that name ``k``'s spec for its pass (``same_spec_hashes`` under this
        PerfDB's ``current_keys``: the pass hash and the full hash of the current spec, else ``k``'s alone)."""
        return same_spec_hashes(k.spec_hash, self.current_keys(k.op, k.pass_, k.backend))

    def lookup(self, env: Union[str, EnvLike], kernel: KernelLike, workload: WorkloadLike,
               config: Union[str, ConfigLike]) -> Optional[dict[str, Any]]:
        """The newest stored measurement (any status) of this config, or None: the tuner asks this before
        benchmarking. ``env``: an env_hash, or ``collect_env()`` output (matched per backend, so
        installing TVM does not hide Triton results). ``config``: a Config, a dict or a config hash.
        A kernel of the current spec matches records of its pass hash and of the full spec hash.  Measurements
        of a withdrawn run (``WITHDRAWN_RUNS``) are not answered: the tuner measures that config again."""
        k, wl = as_kernel(kernel), as_workload(workload)
        config_hash = config if isinstance(config, str) else as_config(config).hash
        env_cols = _EnvCols(EnvRow.__table__.c, KernelRow.__table__.c.backend)
        stmt = (select(MeasurementRow, EnvRow, KernelRow, WorkloadRow)
                .join(EnvRow, EnvRow.id == MeasurementRow.env_id)
                .join(KernelRow, KernelRow.id == MeasurementRow.kernel_id)
                .join(WorkloadRow, WorkloadRow.id == MeasurementRow.workload_id)
                .where(self._env_clause(env_cols, env, (k.backend,)),
                       KernelRow.op == k.op, KernelRow.pass_ == k.pass_, KernelRow.backend == k.backend,
                       KernelRow.spec_hash.in_(self._same_spec(k)), KernelRow.codegen_version == k.codegen_version,
                       KernelRow.source_hash == k.source_hash, WorkloadRow.key_hash == wl.key_hash,
                       MeasurementRow.config_hash == config_hash,
                       _not_withdrawn())
                .order_by(MeasurementRow.created_at.desc(), MeasurementRow.id.desc()).limit(1))
        with self.session() as s:
            hit = s.execute(stmt).first()
            return None if hit is None else _row_dict(*hit)

    def retired(self, env: Union[str, EnvLike], kernel: KernelLike, workload: WorkloadLike, *,
                earlier_specs: bool = False) -> list[dict[str, Any]]:
        """ok measurements of ``workload`` by ``kernel``'s op, pass, backend and spec (``_same_spec``) under
        OTHER kernel source hashes (code edited since), in ``env`` (matched as by ``lookup``): what a new
        study warm-starts from. ``earlier_specs``: those under every other spec instead (any source).
        Newest first; rule and row fields in ``perf_db/_retired.py``."""
        k, wl = as_kernel(kernel), as_workload(workload)
        env_cols = _EnvCols(EnvRow.__table__.c, KernelRow.__table__.c.backend)
        same = self._same_spec(k)
        which = (KernelRow.spec_hash.not_in(same) if earlier_specs
                 else and_(KernelRow.spec_hash.in_(same), KernelRow.source_hash != k.source_hash))
        return self._seed_rows(k, wl, self._env_clause(env_cols, env, (k.backend,)), which)

    def other_gpus(self, env: EnvLike, kernel: KernelLike, workload: WorkloadLike) -> list[dict[str, Any]]:
        """ok measurements of ``workload`` by ``kernel`` (op, pass, backend, spec and the SAME source hash) on GPUs
        other than ``env``'s (its GPU name): what a study on a GPU without records of its own can start from.
        Newest first; rows as ``retired``'s (``perf_db/_retired.py``)."""
        k, wl = as_kernel(kernel), as_workload(workload)
        mine = env_columns(env)["gpu_name"]
        return self._seed_rows(k, wl, EnvRow.gpu_name.is_not(None), EnvRow.gpu_name != mine,
                               KernelRow.spec_hash.in_(self._same_spec(k)), KernelRow.source_hash == k.source_hash)

    def _seed_rows(self, k: KernelKey, wl: Any, *where: Any) -> list[dict[str, Any]]:
        """ok, timed measurements of ``wl`` by ``k``'s op, pass and backend under ``where``, newest first, as
        warm-start rows (``perf_db/_retired.py``'s fields, with the measuring GPU's ``gpu_name``); none of a
        withdrawn run (``WITHDRAWN_RUNS``: its times are not its configs')."""
        stmt = (select(MeasurementRow.id, MeasurementRow.config_json, MeasurementRow.config_hash,
                       MeasurementRow.median_ms, MeasurementRow.created_at, KernelRow.source_hash,
                       KernelRow.spec_hash, KernelRow.codegen_version, EnvRow.gpu_name)
                .join(EnvRow, EnvRow.id == MeasurementRow.env_id)
                .join(KernelRow, KernelRow.id == MeasurementRow.kernel_id)
                .join(WorkloadRow, WorkloadRow.id == MeasurementRow.workload_id)
                .where(KernelRow.op == k.op, KernelRow.pass_ == k.pass_, KernelRow.backend == k.backend,
                       WorkloadRow.key_hash == wl.key_hash, MeasurementRow.status == "ok",
                       MeasurementRow.median_ms.is_not(None), _not_withdrawn(),
                       *where)
                .order_by(MeasurementRow.created_at.desc(), MeasurementRow.id.desc()))
        with self.session() as s:
            return [{"config": json.loads(config_json), "config_hash": config_hash, "median_ms": ms,
                     "source_hash": source, "spec_hash": spec_hash, "codegen_version": codegen,
                     "created_at": created, "origin": f"perf_db #{mid}", "gpu_name": gpu}
                    for mid, config_json, config_hash, ms, created, source, spec_hash, codegen, gpu in s.execute(stmt)]

    # -- best -----------------------------------------------------------------------------------------

    def best(self, env: Union[str, EnvLike], pass_: str, workload: WorkloadLike,
             backend: Optional[str] = None, *, other_gpus: bool = False) -> Optional[dict[str, Any]]:
        """The fastest ok, non-stale measurement for this workload, or None.

        Order: the exact workload key; else the same key with the nearest ``seq_bucket`` (log2
        distance, ties to the larger bucket); else None. ``backend`` None considers the dispatchable
        backends (triton, tvm). ``env``: an env_hash (exact), or ``collect_env()`` output (hard keys
        matched per backend; soft keys compared, a difference is served with ``warning`` set).

        ``other_gpus``: the measurements of GPUs other than ``env``'s (a ``collect_env()`` mapping) with its
        compute capability, CUDA and backend library versions, from ONE of them: the GPU with a record
        at the exact length bucket, else the nearest; among equals, the one with the most records of the
        key, then by name.  Its fastest is returned as above (``gpu`` names it).

        Returns a dict with ``backend``, ``config``, ``median_ms``, ``match`` ("exact"/"nearest"),
        ``seq_bucket`` (served) and ``requested_seq_bucket``, ``soft_mismatch``, ``warning``, ids.
        """
        if pass_ not in PASSES:
            raise PerfDBError(f"pass {pass_!r} is not one of {', '.join(PASSES)}")
        if isinstance(workload, Mapping) and "pass" not in workload and "pass_" not in workload:
            workload = {**workload, "pass": pass_}
        wl = as_workload(workload)
        if wl.pass_ != pass_:
            raise PerfDBError(f"pass_={pass_!r} but the workload is for pass {wl.pass_!r}")
        if backend is not None and backend not in BACKENDS:
            raise PerfDBError(f"backend {backend!r} is not one of {', '.join(BACKENDS)}")
        backends = (backend,) if backend else DISPATCH_BACKENDS
        # ranked without the withdrawn runs: a withdrawn measurement must not hide the fastest of the others
        view = best_without(WITHDRAWN_RUNS)
        v = view.c
        stmt = select(view).where(
            self._env_clause(v, env, backends, other_gpus=other_gpus), v["pass"] == pass_, v.backend.in_(backends),
            v.key_schema == KEY_SCHEMA, v.head_dim == wl.head_dim, v.head_dim_v == wl.head_dim_v,
            v.heads_q == wl.heads_q, v.heads_kv == wl.heads_kv, v.dtype == wl.dtype, v.use_gate == wl.use_gate,
            v.varlen == wl.varlen, v.batch_bucket == wl.batch_bucket, v.query_bucket == wl.query_bucket)
        with self.session() as s:
            rows = [dict(r._mapping) for r in s.execute(stmt)]
        current: dict[tuple[str, str, str], Any] = {}
        fresh = []
        for r in rows:
            ck = (r["op"], r["pass"], r["backend"])
            if ck not in current:
                current[ck] = self.current_keys(*ck)
            if not stale_reasons(r, current[ck]):
                fresh.append(r)
        if not fresh:
            return None
        req = wl.seq_bucket
        if other_gpus:
            fresh = _one_gpu(fresh, req)
        buckets = {r["seq_bucket"] for r in fresh}
        if req in buckets:
            chosen, match = req, "exact"
        else:
            chosen = min(buckets, key=lambda b: _bucket_order(b, req))
            match = "nearest"
        top = min((r for r in fresh if r["seq_bucket"] == chosen),
                  key=lambda r: (r["median_ms"], -r["created_at"].timestamp(), -r["measurement_id"]))
        soft = soft_mismatch(top, None if isinstance(env, str) else env)
        warning = None
        if soft:
            warning = "measured with " + ", ".join(f"{k} {d['stored']} (now {d['current']})" for k, d in soft.items())
        return {
            "backend": top["backend"], "config": json.loads(top["config_json"]), "config_hash": top["config_hash"],
            "median_ms": top["median_ms"], "p20_ms": top["p20_ms"], "p80_ms": top["p80_ms"],
            "baseline_ms": top["baseline_ms"], "baseline_name": top["baseline_name"],
            "match": match, "seq_bucket": chosen, "requested_seq_bucket": req,
            "workload": json.loads(top["key_json"]), "measurement_id": top["measurement_id"],
            "run_id": top["run_id"], "env_hash": top["env_hash"], "gpu": top["gpu_name"],
            "kernel": {k: top[k] for k in ("op", "pass", "backend", "spec_hash", "codegen_version", "source_hash")},
            "created_at": iso(top["created_at"]), "soft_mismatch": soft, "warning": warning,
        }

    # -- query ----------------------------------------------------------------------------------------

    def _select(self, *, gpu: Optional[str] = None, head_dim: Optional[int] = None, pass_: Optional[str] = None,
                backend: Union[None, str, Sequence[str]] = None, dtype: Optional[str] = None,
                status: Optional[str] = None, seq_bucket: Optional[int] = None, env_hash: Optional[str] = None,
                run_id: Optional[str] = None, study_name: Optional[str] = None) -> Any:
        stmt = (select(MeasurementRow, EnvRow, KernelRow, WorkloadRow)
                .join(EnvRow, EnvRow.id == MeasurementRow.env_id)
                .join(KernelRow, KernelRow.id == MeasurementRow.kernel_id)
                .join(WorkloadRow, WorkloadRow.id == MeasurementRow.workload_id))
        if gpu:
            stmt = stmt.where(gpu_clause(EnvRow.gpu_name, gpu))
        if head_dim is not None:
            stmt = stmt.where(WorkloadRow.head_dim == head_dim)
        if pass_ is not None:
            if pass_ not in PASSES:
                raise PerfDBError(f"pass {pass_!r} is not one of {', '.join(PASSES)}")
            stmt = stmt.where(KernelRow.pass_ == pass_)
        if backend is not None:
            wanted = (backend,) if isinstance(backend, str) else tuple(backend)
            bad = [b for b in wanted if b not in BACKENDS]
            if bad:
                raise PerfDBError(f"backend {bad[0]!r} is not one of {', '.join(BACKENDS)}")
            stmt = stmt.where(KernelRow.backend.in_(wanted))
        if dtype is not None:
            stmt = stmt.where(WorkloadRow.dtype == dtype)
        if status is not None:
            if status not in STATUSES:
                raise PerfDBError(f"status {status!r} is not one of {', '.join(STATUSES)}")
            stmt = stmt.where(MeasurementRow.status == status)
        if seq_bucket is not None:
            stmt = stmt.where(WorkloadRow.seq_bucket == seq_bucket)
        if env_hash is not None:
            stmt = stmt.where(EnvRow.env_hash.startswith(env_hash, autoescape=True))
        if run_id is not None:
            stmt = stmt.where(MeasurementRow.run_id == run_id)
        if study_name is not None:
            stmt = stmt.where(MeasurementRow.study_name == study_name)
        return stmt

    def _rows(self, stmt: Any) -> list[dict[str, Any]]:
        current: dict[tuple[str, str, str], Any] = {}
        out = []
        with self.session() as s:
            for m, e, k, w in s.execute(stmt):
                row = _row_dict(m, e, k, w)
                ck = (k.op, k.pass_, k.backend)
                if ck not in current:
                    current[ck] = self.current_keys(*ck)
                row["stale"] = stale_reasons(row, current[ck])
                out.append(row)
        return out

    def query(self, *, gpu: Optional[str] = None, head_dim: Optional[int] = None, pass_: Optional[str] = None,
              backend: Union[None, str, Sequence[str]] = None, dtype: Optional[str] = None,
              status: Optional[str] = None,
              seq_bucket: Optional[int] = None, env_hash: Optional[str] = None, run_id: Optional[str] = None,
              study_name: Optional[str] = None, include_stale: bool = True, limit: Optional[int] = None,
              order: str = "workload") -> list[dict[str, Any]]:
        """Measurements matching every given filter, as JSON-ready dicts (one key per column, plus
        ``config`` / ``errors`` / ``workload`` as dicts, ``ratio`` = median_ms / baseline_ms and ``stale``:
        the reasons the kernel no longer matches the current code, empty when it does).

        ``gpu`` matches a substring of the GPU name, case-insensitively; ``env_hash`` a prefix.
        ``order``: "workload" (gpu, pass, head dim, dtype, length, fastest first), "newest" or "fastest".
        """
        stmt = self._select(gpu=gpu, head_dim=head_dim, pass_=pass_, backend=backend, dtype=dtype, status=status,
                            seq_bucket=seq_bucket, env_hash=env_hash, run_id=run_id, study_name=study_name)
        if order == "workload":
            stmt = stmt.order_by(EnvRow.gpu_name, KernelRow.pass_, WorkloadRow.head_dim, WorkloadRow.head_dim_v,
                                 WorkloadRow.dtype, WorkloadRow.use_gate, WorkloadRow.heads_q, WorkloadRow.heads_kv,
                                 WorkloadRow.seq_bucket, WorkloadRow.batch_bucket, WorkloadRow.query_bucket,
                                 KernelRow.backend,
                                 MeasurementRow.median_ms.is_(None), MeasurementRow.median_ms, MeasurementRow.id)
        elif order == "newest":
            stmt = stmt.order_by(MeasurementRow.created_at.desc(), MeasurementRow.id.desc())
        elif order == "fastest":
            stmt = stmt.order_by(MeasurementRow.median_ms.is_(None), MeasurementRow.median_ms, MeasurementRow.id)
        elif order == "oldest":
            stmt = stmt.order_by(MeasurementRow.created_at, MeasurementRow.id)
        else:
            raise PerfDBError(f"order must be workload, newest, oldest or fastest, got {order!r}")
        if limit is not None:
            if limit < 1:
                raise PerfDBError(f"limit must be >= 1, got {limit}")
            if include_stale:
                stmt = stmt.limit(limit)
        rows = self._rows(stmt)
        if not include_stale:
            rows = [r for r in rows if not r["stale"]]
            if limit is not None:
                rows = rows[:limit]
        return rows

    # -- overhead -------------------------------------------------------------------------------------

    def overhead(self, by: str = "head_dim", gpu: Optional[str] = None, pass_: Optional[str] = None, *,
                 backends: Sequence[str] = DISPATCH_BACKENDS, include_stale: bool = False) -> list[dict[str, Any]]:
        """pathtune vs SDPA, measured in the same run: one row per (gpu, workload, backend).

        For every ok measurement of ``backends`` the SDPA time is its own ``baseline_ms`` (when the
        baseline's name starts with "sdpa"), else the fastest ok ``sdpa``-backend measurement with the
        same run_id, env and shape (the gate, which SDPA lacks, is ignored). Per group the fastest
        paired pathtune time wins. Rows: gpu, cc, head_dim, head_dim_v, heads_q, heads_kv, gqa_group,
        dtype, use_gate, pass, seq_len (the power-of-two length bucket), batch, varlen, backend,
        pathtune_ms, sdpa_ms, ratio (= pathtune_ms / sdpa_ms), baseline_name, config, config_hash,
        run_id, env_hash, measurement_id, created_at. Sorted by gpu, pass, then ``by``.
        Unpaired measurements (no same-run SDPA time) are left out.
        """
        if by not in OVERHEAD_BY:
            raise PerfDBError(f"--by must be one of {', '.join(OVERHEAD_BY)}, got {by!r}")
        bad = [b for b in backends if b not in BACKENDS or b == "sdpa"]
        if bad:
            raise PerfDBError(f"overhead backends must be non-sdpa backends of {', '.join(BACKENDS)}; got {bad}")
        rows = self._rows(self._select(gpu=gpu, pass_=pass_, status="ok", backend=(*backends, "sdpa")))

        def shape(r: dict[str, Any]) -> tuple:
            return (r["run_id"], r["env_hash"], r["pass"], r["head_dim"], r["head_dim_v"], r["heads_q"],
                    r["heads_kv"], r["dtype"], r["seq_bucket"], r["batch_bucket"], r["varlen"], r["query_bucket"])

        sdpa: dict[tuple, float] = {}
        for r in rows:
            if r["backend"] == "sdpa":
                key = shape(r)
                sdpa[key] = min(sdpa.get(key, math.inf), r["median_ms"])
        groups: dict[tuple, dict[str, Any]] = {}
        for r in rows:
            if r["backend"] == "sdpa" or (r["stale"] and not include_stale):
                continue
            if r["baseline_ms"] is not None and (r["baseline_name"] or "sdpa").lower().startswith("sdpa"):
                base, name = r["baseline_ms"], r["baseline_name"] or "sdpa"
            elif shape(r) in sdpa:
                base, name = sdpa[shape(r)], "sdpa (same run)"
            else:
                continue
            out = {
                "gpu": r["gpu"], "cc": r["cc"], "head_dim": r["head_dim"], "head_dim_v": r["head_dim_v"],
                "heads_q": r["heads_q"], "heads_kv": r["heads_kv"], "gqa_group": r["gqa_group"], "dtype": r["dtype"],
                "use_gate": r["use_gate"], "pass": r["pass"], "seq_len": r["seq_bucket"], "batch": r["batch_bucket"],
                "varlen": r["varlen"], "tokens": r["query_bucket"], "backend": r["backend"],
                "pathtune_ms": r["median_ms"], "sdpa_ms": base,
                "ratio": r["median_ms"] / base, "baseline_name": name, "config": r["config"],
                "config_hash": r["config_hash"], "run_id": r["run_id"], "env_hash": r["env_hash"],
                "measurement_id": r["id"], "created_at": r["created_at"],
            }
            if include_stale:
                out["stale"] = r["stale"]
            gkey = (r["gpu"], r["cc"], r["workload_hash"], r["backend"])
            if gkey not in groups or out["pathtune_ms"] < groups[gkey]["pathtune_ms"]:
                groups[gkey] = out

        order = ("gpu", "pass", by, "dtype", "use_gate", "heads_q", "heads_kv", "head_dim", "head_dim_v", "seq_len",
                 "batch", "varlen", "tokens", "backend")
        return sorted(groups.values(), key=lambda r: tuple(str(r[k]) if k in ("gpu", "pass", "dtype", "backend")
                                                           else r[k] for k in order))

    # -- summaries ------------------------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        """Rows per perf_* table."""
        with self.session() as s:
            return {model.__tablename__: s.scalar(select(func.count()).select_from(model)) or 0
                    for model in (EnvRow, KernelRow, WorkloadRow, RunRow, MeasurementRow, IngestRow)}

    def gpus(self) -> list[dict[str, Any]]:
        """Each recorded (gpu, cc, env_hash) with its measurement counts and newest time."""
        stmt = (select(EnvRow.gpu_name, EnvRow.cc, EnvRow.env_hash, EnvRow.triton, EnvRow.tvm, EnvRow.cuda,
                       func.count(MeasurementRow.id), func.max(MeasurementRow.created_at))
                .join(MeasurementRow, MeasurementRow.env_id == EnvRow.id)
                .group_by(EnvRow.gpu_name, EnvRow.cc, EnvRow.env_hash, EnvRow.triton, EnvRow.tvm, EnvRow.cuda)
                .order_by(EnvRow.gpu_name))
        with self.session() as s:
            out = []
            for gpu, cc, h, triton, tvm, cuda, n, newest in s.execute(stmt):
                out.append({"gpu": gpu, "cc": cc, "env_hash": h, "triton": triton, "tvm": tvm, "cuda": cuda,
                            "measurements": n, "newest": iso(parse_time(newest))})
            return out

    # -- gc -------------------------------------------------------------------------------------------

    def gc(self, dry_run: bool = True, *, current_keys: Optional[CurrentKeys] = None,
           env_info: Optional[EnvLike] = None) -> GcReport:
        """Prune measurements whose hard keys no longer match; report what was (or would be) deleted.

        Stale: a kernel whose spec_hash is none ``current_keys`` accepts (default: this PerfDB's; the
        default accepts the pass hash and the full hash of the packaged spec) or whose source_hash
        differs; on this machine's GPU (``env_info``, default ``collect_env()``; same GPU name and cc) an
        environment whose CUDA or backend library (Triton for triton/fla, TVM for tvm) differs from this one;
        any row of an older key schema. Results of other GPUs are judged only by kernel keys: this machine
        cannot tell whether their environment is current. Kernels, workloads, environments and runs left
        without measurements are deleted with them. Ingested file markers are kept, so shipped results are
        not re-ingested after a gc.
        """
        keys_fn = current_keys or self.current_keys
        if env_info is None:
            from pathtune.fingerprint import collect_env

            env_info = collect_env()
        here = env_columns(env_info)
        env_schema = env_key_schema()
        report = GcReport(dry_run=dry_run)
        current: dict[tuple[str, str, str], Any] = {}
        stmt = (select(MeasurementRow.id, MeasurementRow.env_id, MeasurementRow.kernel_id, MeasurementRow.workload_id,
                       MeasurementRow.run_id, EnvRow, KernelRow, WorkloadRow.key_schema, WorkloadRow.key_json)
                .join(EnvRow, EnvRow.id == MeasurementRow.env_id)
                .join(KernelRow, KernelRow.id == MeasurementRow.kernel_id)
                .join(WorkloadRow, WorkloadRow.id == MeasurementRow.workload_id)
                .order_by(MeasurementRow.id))
        doomed: list[int] = []
        touched: dict[str, set] = {"perf_env": set(), "perf_kernel": set(), "perf_workload": set(), "perf_run": set()}
        with self.session() as s, s.begin():
            for mid, env_id, kernel_id, workload_id, run_id, e, k, wl_schema, key_json in s.execute(stmt):
                ck = (k.op, k.pass_, k.backend)
                if ck not in current:
                    current[ck] = keys_fn(*ck)
                kd = {"spec_hash": k.spec_hash, "source_hash": k.source_hash}
                reasons = [r.split(" ")[0] + " changed" for r in stale_reasons(kd, current[ck])]
                if e.key_schema != env_schema:
                    reasons.append("env key schema changed")
                if wl_schema != KEY_SCHEMA:
                    reasons.append("workload key schema changed")
                if e.gpu_name == here["gpu_name"] and e.cc == here["cc"]:
                    for lib in ("cuda", *BACKEND_LIBS[k.backend]):
                        if getattr(e, lib) != here[lib]:
                            reasons.append(f"{lib} version changed on this GPU")
                if not reasons:
                    continue
                doomed.append(mid)
                for reason in reasons:
                    report.reasons[reason] = report.reasons.get(reason, 0) + 1
                if len(report.examples) < 20:
                    report.examples.append({"id": mid, "gpu": e.gpu_name, "backend": k.backend, "pass": k.pass_,
                                            "workload": json.loads(key_json), "reasons": reasons})
                touched["perf_env"].add(env_id)
                touched["perf_kernel"].add(kernel_id)
                touched["perf_workload"].add(workload_id)
                touched["perf_run"].add(run_id)
            report.measurement_ids = doomed
            if not doomed:
                return report
            doomed_set = set(doomed)
            refs = {"perf_env": MeasurementRow.env_id, "perf_kernel": MeasurementRow.kernel_id,
                    "perf_workload": MeasurementRow.workload_id, "perf_run": MeasurementRow.run_id}
            orphan_ids: dict[str, list] = {}
            for table, col in refs.items():
                ids = sorted(touched[table])
                still_used: set = set()
                for chunk in _chunks(ids):
                    for used_id, mid in s.execute(select(col, MeasurementRow.id).where(col.in_(chunk))):
                        if mid not in doomed_set:
                            still_used.add(used_id)
                orphan_ids[table] = [i for i in ids if i not in still_used]
                report.orphans[table] = len(orphan_ids[table])
            if dry_run:
                return report
            for chunk in _chunks(doomed):
                s.execute(delete(MeasurementRow).where(MeasurementRow.id.in_(chunk)))
            models = {"perf_env": (EnvRow, EnvRow.id), "perf_kernel": (KernelRow, KernelRow.id),
                      "perf_workload": (WorkloadRow, WorkloadRow.id), "perf_run": (RunRow, RunRow.run_id)}
            for table, ids in orphan_ids.items():
                model, pk = models[table]
                for chunk in _chunks(ids):
                    s.execute(delete(model).where(pk.in_(chunk)))
        return report

    # -- ingest ---------------------------------------------------------------------------------------

    def ingested(self, sha256: str) -> bool:
        with self.session() as s:
            return s.get(IngestRow, sha256) is not None

    def ingest(self, results: Union[str, Path, bytes, list, dict], *, on_conflict: str = "error",
               name: Optional[str] = None) -> IngestReport:
        """Import a results file written by a GPU host (format: perf_db/RESULTS_FORMAT.md).

        All or nothing, in one transaction. Idempotent: a record already stored with the same content
        counts as ``identical``. One stored with *different* content for the same key raises
        ``DuplicateMeasurementError`` (``on_conflict="error"``) or is left alone (``"skip"``).
        """
        if on_conflict not in _ON_CONFLICT:
            raise PerfDBError(f"on_conflict must be one of {_ON_CONFLICT}, got {on_conflict!r}")
        data, sha, display = read_results(results)
        display = name or display
        runs, records = parse_results(data, name=display, sha256=sha)
        report = IngestReport(name=display, sha256=sha, records=len(records), already_ingested=self.ingested(sha))
        run_info = {r.run_id: r for r in runs}
        mode = "identical_ok" if on_conflict == "error" else "skip"
        try:
            with self.session() as s, s.begin():
                for run in runs:
                    self._ensure_run(s, run)
                for rec in records:
                    run = run_info.get(rec.run_id) or RunInfo(
                        rec.run_id, rec.measurement.created_at, rec.measurement.command or f"ingest {display}",
                        rec.env.get("host"))
                    _, outcome = self._insert(s, rec.env, rec.kernel, rec.workload, rec.config, rec.measurement,
                                              run, mode)
                    if outcome == "added":
                        report.added += 1
                    elif outcome == "identical":
                        report.identical += 1
                    else:
                        report.skipped += 1
                if s.get(IngestRow, sha) is None:
                    s.add(IngestRow(sha256=sha, name=display[:255], ingested_at=utc_now(),
                                    n_records=len(records), n_added=report.added))
        except DuplicateMeasurementError as e:
            raise DuplicateMeasurementError(f"{display}: {e} (nothing from this file was stored)") from None
        except SQLAlchemyError as e:
            raise PerfDBError(f"ingesting {display} into {self.display_url} failed: {e}") from None
        return report

    # -- dump -----------------------------------------------------------------------------------------

    def dump_results(self, out: Union[str, Path], *, backend: Any = None, pass_: Any = None, head_dim: Any = None,
                     gpu: Optional[str] = None, run_id: Any = None, status: Any = None, current_only: bool = False,
                     current_keys: Optional[CurrentKeys] = None, baselines: bool = True,
                     overwrite: bool = False) -> "DumpReport":
        """Write the measurements matching every filter as a results file (the inverse of ``ingest``).

        ``backend``, ``pass_``, ``head_dim``, ``run_id``, ``status``: one value or several (a list or a
        comma-separated string); ``gpu``: a GPU-name substring. ``current_only``: only kernels current
        under ``current_keys`` (default: this PerfDB's). ``baselines``: add the same-run SDPA rows that
        ok kernels without their own baseline are compared with. Refuses (``PerfDBError``) an existing
        ``out`` unless ``overwrite``, an empty match, a run without a command. See ``perf_db/_dump.py``.
        """
        from ._dump import dump_results

        return dump_results(self, out, backend=backend, pass_=pass_, head_dim=head_dim, gpu=gpu, run_id=run_id,
                            status=status, current_only=current_only, current_keys=current_keys,
                            baselines=baselines, overwrite=overwrite)


def _release_wal(engine: Any, path: Path, pid: int) -> None:
    if os.getpid() != pid:   # a forked child exiting: the connections and the files are its parent's
        return
    engine.dispose()
    sqlite_release_wal(path)


class _EnvCols:
    """Env columns plus the kernel backend column, shaped like ``best_view.c`` for ``_env_clause``."""

    def __init__(self, env_cols: Any, backend_col: Any) -> None:
        self._c = env_cols
        self.backend = backend_col
        self.env_key_schema = env_cols.key_schema

    def __getattr__(self, name: str) -> Any:
        return getattr(self._c, name)
