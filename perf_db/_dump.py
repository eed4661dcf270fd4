"""``dump_results``: rows of a database (a GPU session's SQLite file, say) back into a results file.

The inverse of ``PerfDB.ingest``: each measurement becomes the record ``results_record`` builds in the
tuner (the stored env dict, kernel key, workload key, config and measurement, unchanged), each of their
runs a ``runs[]`` entry with its stored id, start, command, host and notes; ``write_results`` checks
the format and writes atomically. Ingesting the file into a fresh database reproduces the same keys
and measurements; ingesting it into the database it came from adds nothing (every record is
``identical``). Format: RESULTS_FORMAT.md; command: ``pathtune db dump``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Optional, Sequence, Union

from sqlalchemy import select

from pathtune.specs import KEY_SCHEMA, Config, Workload

from ._errors import PerfDBError
from ._keys import CurrentKeys, KernelKey, env_columns, env_key_schema, stale_reasons
from ._models import BACKENDS, PASSES, STATUSES, EnvRow, KernelRow, MeasurementRow, RunRow, WorkloadRow
from ._results import RunInfo, results_record, write_results
from ._rows import gpu_clause, measurement_of

if TYPE_CHECKING:  # pragma: no cover
    from ._store import PerfDB

__all__ = ["DumpReport", "dump_results", "dump_document"]

Many = Union[None, str, int, Iterable[Union[str, int]]]


@dataclass
class DumpReport:
    """What ``dump_results`` wrote (``dump_document``: would write)."""

    path: Optional[str]
    records: int = 0
    runs: list[str] = field(default_factory=list)
    statuses: dict[str, int] = field(default_factory=dict)
    backends: dict[str, int] = field(default_factory=dict)
    passes: dict[str, int] = field(default_factory=dict)
    gpus: list[str] = field(default_factory=list)
    baselines_added: int = 0      # same-run SDPA records included for ok records without their own baseline
    stale_left_out: int = 0       # matched the filters, left out by current_only
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _many(value: Many, name: str, allowed: Optional[Sequence[str]] = None, as_int: bool = False) -> Optional[list]:
    """A filter value: None, one value, or several (a sequence, or strings with commas)."""
    if value is None:
        return None
    items = [value] if isinstance(value, (str, int)) else list(value)
    out: list = []
    for item in items:
        parts = [p.strip() for p in item.split(",")] if isinstance(item, str) else [item]
        for part in parts:
            if part == "":
                continue
            if as_int:
                try:
                    part = int(part)
                except (TypeError, ValueError):
                    raise PerfDBError(f"{name} takes integers, got {part!r}") from None
                if part <= 0:
                    raise PerfDBError(f"{name} must be positive, got {part}")
            elif allowed is not None and part not in allowed:
                raise PerfDBError(f"{name} {part!r} is not one of {', '.join(allowed)}")
            if part not in out:
                out.append(part)
    if not out:
        raise PerfDBError(f"{name} is empty")
    return out


def _filters_text(filters: dict[str, Any]) -> str:
    given = {k: ",".join(map(str, v)) if isinstance(v, list) else v for k, v in filters.items()
             if v not in (None, False)}
    return ", ".join(f"{k}={v}" for k, v in given.items()) or "none"


def _shape(w: WorkloadRow) -> tuple:
    """What a same-run SDPA baseline shares with the kernel it is compared with (the gate is ignored,
    SDPA has none), as ``PerfDB.overhead`` pairs them."""
    return (w.pass_, w.head_dim, w.head_dim_v, w.heads_q, w.heads_kv, w.dtype, w.seq_bucket, w.batch_bucket,
            w.varlen, w.query_bucket)


def dump_document(db: "PerfDB", *, backend: Many = None, pass_: Many = None, head_dim: Many = None,
                  gpu: Optional[str] = None, run_id: Many = None, status: Many = None, current_only: bool = False,
                  current_keys: Optional[CurrentKeys] = None, baselines: bool = True
                  ) -> tuple[list[RunInfo], list[dict[str, Any]], DumpReport]:
    """The runs and records ``dump_results`` would write, and its report (``path`` None). Raises
    ``PerfDBError`` when nothing matches or a run lacks its command. Arguments: see ``dump_results``."""
    filters = {"backend": _many(backend, "backend", BACKENDS), "pass": _many(pass_, "pass", PASSES),
               "head_dim": _many(head_dim, "head_dim", as_int=True), "gpu": gpu.strip() if gpu else None,
               "run": _many(run_id, "run", None), "status": _many(status, "status", STATUSES),
               "current_only": current_only}
    keys_fn = current_keys or db.current_keys
    where_db = f"db: {db.display_url}"

    stmt = (select(MeasurementRow, EnvRow, KernelRow, WorkloadRow)
            .join(EnvRow, EnvRow.id == MeasurementRow.env_id)
            .join(KernelRow, KernelRow.id == MeasurementRow.kernel_id)
            .join(WorkloadRow, WorkloadRow.id == MeasurementRow.workload_id))
    if filters["backend"]:
        stmt = stmt.where(KernelRow.backend.in_(filters["backend"]))
    if filters["pass"]:
        stmt = stmt.where(KernelRow.pass_.in_(filters["pass"]))
    if filters["head_dim"]:
        stmt = stmt.where(WorkloadRow.head_dim.in_(filters["head_dim"]))
    if filters["gpu"]:
        stmt = stmt.where(gpu_clause(EnvRow.gpu_name, filters["gpu"]))
    if filters["run"]:
        stmt = stmt.where(MeasurementRow.run_id.in_(filters["run"]))
    if filters["status"]:
        stmt = stmt.where(MeasurementRow.status.in_(filters["status"]))
    stmt = stmt.order_by(MeasurementRow.created_at, MeasurementRow.id)

    env_schema = env_key_schema()
    current: dict[tuple[str, str, str], Any] = {}
    report = DumpReport(path=None)
    with db.session() as s:
        if filters["run"]:
            known = set(s.scalars(select(RunRow.run_id).where(RunRow.run_id.in_(filters["run"]))))
            unknown = [r for r in filters["run"] if r not in known]
            if unknown:
                stored = sorted(s.scalars(select(RunRow.run_id)))
                raise PerfDBError(f"no run {', '.join(unknown)} in {db.display_url}; its runs: "
                                  f"{', '.join(stored) or '(none)'}")
        rows = []
        for m, e, k, w in s.execute(stmt):
            if current_only:
                ck = (k.op, k.pass_, k.backend)
                if ck not in current:
                    current[ck] = keys_fn(*ck)
                kd = {"spec_hash": k.spec_hash, "source_hash": k.source_hash}
                if stale_reasons(kd, current[ck]) or e.key_schema != env_schema or w.key_schema != KEY_SCHEMA:
                    report.stale_left_out += 1
                    continue
            rows.append((m, e, k, w))
        if not rows:
            hint = ""
            if report.stale_left_out:
                hint = (f"; {report.stale_left_out} matched but are stale here (kernel spec / source hash or key "
                        "schema differs from this pathtune's): drop --current-only to dump them anyway")
            raise PerfDBError(f"no measurements match (filters: {_filters_text(filters)}; {where_db}){hint}; "
                              "nothing written. Loosen the filters (`pathtune query --db URL` lists what is stored)")

        if baselines:
            extra = _same_run_baselines(s, rows)
            report.baselines_added = len(extra)
            rows += extra
        rows.sort(key=lambda r: (r[0].created_at, r[0].id))

        run_ids = list(dict.fromkeys(m.run_id for m, _, _, _ in rows))
        run_rows = {r.run_id: r for r in s.scalars(select(RunRow).where(RunRow.run_id.in_(run_ids)))}

    # every run must say how its measurements were taken
    per_run: dict[str, int] = {}
    for m, _, _, _ in rows:
        per_run[m.run_id] = per_run.get(m.run_id, 0) + 1
    for rid in run_ids:
        run = run_rows.get(rid)
        if run is None or not (run.command or "").strip():
            others = [r for r in run_ids if r != rid]
            fix = (f"leave it out with --run {','.join(others)}" if others else
                   "leave it out with narrower filters")
            raise PerfDBError(f"run {rid} ({per_run[rid]} of the matching records) has no command, so the results "
                              f"file could not say how they were measured (runs[].command, RESULTS_FORMAT.md); "
                              f"{fix}; nothing written")
        if not run.command.startswith("pathtune "):
            report.notes.append(f"run {rid}'s command does not start with 'pathtune ' ({run.command[:60]!r}): "
                                "tests/test_shipped.py refuses such a file in perf_db/shipped/")

    records = []
    env_checked: dict[int, dict[str, Any]] = {}
    for m, e, k, w in rows:
        records.append(_record(m, e, k, w, env_checked, env_schema))
        report.statuses[m.status] = report.statuses.get(m.status, 0) + 1
        report.backends[k.backend] = report.backends.get(k.backend, 0) + 1
        report.passes[k.pass_] = report.passes.get(k.pass_, 0) + 1
        if e.gpu_name not in report.gpus:
            report.gpus.append(e.gpu_name)
    runs = sorted((RunInfo(r.run_id, r.started_at, r.command, r.host, r.notes) for r in
                   (run_rows[rid] for rid in run_ids)), key=lambda r: (r.started_at, r.run_id))
    report.records = len(records)
    report.runs = [r.run_id for r in runs]
    return runs, records, report


def _same_run_baselines(s: Any, rows: list[tuple]) -> list[tuple]:
    """The ok SDPA-backend measurements that ``rows``' ok kernels without a baseline of their own are
    compared with (same run, env hash and shape), not already among ``rows``."""
    wanted: dict[str, set[tuple]] = {}
    for m, e, k, w in rows:
        if m.status == "ok" and m.baseline_ms is None and k.backend != "sdpa":
            wanted.setdefault(m.run_id, set()).add((e.env_hash, _shape(w)))
    if not wanted:
        return []
    have = {m.id for m, _, _, _ in rows}
    stmt = (select(MeasurementRow, EnvRow, KernelRow, WorkloadRow)
            .join(EnvRow, EnvRow.id == MeasurementRow.env_id)
            .join(KernelRow, KernelRow.id == MeasurementRow.kernel_id)
            .join(WorkloadRow, WorkloadRow.id == MeasurementRow.workload_id)
            .where(KernelRow.backend == "sdpa", MeasurementRow.status == "ok",
                   MeasurementRow.run_id.in_(sorted(wanted))))
    return [(m, e, k, w) for m, e, k, w in s.execute(stmt)
            if m.id not in have and (e.env_hash, _shape(w)) in wanted[m.run_id]]


def _record(m: MeasurementRow, e: EnvRow, k: KernelRow, w: WorkloadRow, env_checked: dict[int, dict[str, Any]],
            env_schema: int) -> dict[str, Any]:
    """One stored measurement as the record ``results_record`` builds, checked to ingest under the same key."""
    where = f"measurement #{m.id} (run {m.run_id})"
    env = env_checked.get(e.id)
    if env is None:
        env = json.loads(e.info_json)
        if e.key_schema != env_schema or env_columns(env)["fingerprint"] != e.fingerprint:
            raise PerfDBError(f"{where}: its environment no longer hashes as stored (env key schema {e.key_schema}, "
                              f"this pathtune's {env_schema}); a file would not re-ingest under the same key. "
                              "--current-only leaves such rows out")
        env_checked[e.id] = env
    if w.key_schema != KEY_SCHEMA:
        raise PerfDBError(f"{where}: workload key schema {w.key_schema} is not this pathtune's {KEY_SCHEMA}; "
                          "--current-only leaves such rows out")
    workload = Workload.from_dict(json.loads(w.key_json))
    config = Config(json.loads(m.config_json))
    if workload.key_hash != w.key_hash or config.hash != m.config_hash:
        raise PerfDBError(f"{where}: its stored workload / config hash does not match its JSON; the database is "
                          "inconsistent, nothing written")
    kernel = KernelKey(op=k.op, pass_=k.pass_, backend=k.backend, spec_hash=k.spec_hash,
                       codegen_version=k.codegen_version, source_hash=k.source_hash)
    return results_record(env, kernel, workload, config, measurement_of(m), m.run_id)


def dump_results(db: "PerfDB", out: Union[str, Path], *, backend: Many = None, pass_: Many = None,
                 head_dim: Many = None, gpu: Optional[str] = None, run_id: Many = None, status: Many = None,
                 current_only: bool = False, current_keys: Optional[CurrentKeys] = None, baselines: bool = True,
                 overwrite: bool = False) -> DumpReport:
    """Write the measurements of ``db`` that match every filter to the results file ``out``.

    Filters take one value or several (a list, or a comma-separated string): ``backend``, ``pass_``,
    ``head_dim``, ``run_id``, ``status`` (default: every status); ``gpu`` is a case-insensitive
    substring of the GPU name. ``current_only``: only kernels whose spec / source hash match
    ``current_keys`` (default: the database's, as ``gc`` uses; ``pathtune db dump`` passes the runtime
    dispatcher's) and rows of the current key schemas; environments are not judged (a machine without
    that GPU cannot). ``baselines``: also write the ok SDPA-backend measurements of the same run and
    shape that ok kernels without a ``baseline_ms`` of their own are compared with (``overhead``), so
    that filtering by backend keeps them comparable.

    Refuses (``PerfDBError``, nothing written) when ``out`` exists (unless ``overwrite``) or is the
    database file, when nothing matches, or when a run of the matching records has no command.
    """
    out = Path(out)
    if db.sqlite_path is not None and out.expanduser().resolve() == db.sqlite_path:
        raise PerfDBError(f"--out {out} is the database file itself; write the results file elsewhere")
    if out.exists() and not overwrite:
        raise PerfDBError(f"{out} exists; choose another --out, or pass --force to replace it")
    if out.is_dir():
        raise PerfDBError(f"{out} is a folder; --out takes a file name (e.g. {out / 'results.json'})")
    runs, records, report = dump_document(db, backend=backend, pass_=pass_, head_dim=head_dim, gpu=gpu,
                                          run_id=run_id, status=status, current_only=current_only,
                                          current_keys=current_keys, baselines=baselines)
    write_results(out, records, runs)
    report.path = str(out)
    return report
