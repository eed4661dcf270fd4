"""Results files: what a GPU host writes and ``PerfDB.ingest`` reads (specified in RESULTS_FORMAT.md)."""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

from pathtune.specs import Config, Workload
from pathtune.specs.canonical import canonical_json, sha256_hex

from ._errors import PerfDBError, ResultsFormatError
from ._keys import (
    ConfigLike,
    EnvLike,
    KernelKey,
    KernelLike,
    Measurement,
    WorkloadLike,
    as_config,
    as_kernel,
    as_measurement,
    as_workload,
    env_columns,
    iso,
    parse_time,
)
from ._validate import config_problems, time_problem

__all__ = ["RESULTS_FORMAT", "RESULTS_VERSION", "ResultRecord", "RunInfo", "results_record", "write_results",
           "read_results", "parse_results"]

RESULTS_FORMAT = "pathtune-results"
RESULTS_VERSION = 1
_RECORD_KEYS = {"env", "run_id", "kernel", "workload", "config", "measurement"}
_RUN_KEYS = {"run_id", "started_at", "command", "host", "notes"}


@dataclass(frozen=True)
class RunInfo:
    run_id: str
    started_at: Optional[Any] = None
    command: Optional[str] = None
    host: Optional[str] = None
    notes: Optional[str] = None


@dataclass(frozen=True)
class ResultRecord:
    env: dict[str, Any]
    run_id: str
    kernel: KernelKey
    workload: Workload
    config: Config
    measurement: Measurement


def results_record(env_info: EnvLike, kernel: KernelLike, workload: WorkloadLike, config: ConfigLike,
                   measurement: Union[Measurement, Mapping[str, Any]], run_id: str) -> dict[str, Any]:
    """One record, validated, as the JSON object a results file holds."""
    return {
        "env": dict(env_info),
        "run_id": run_id,
        "kernel": as_kernel(kernel).to_dict(),
        "workload": as_workload(workload).to_dict(),
        "config": as_config(config).to_dict(),
        "measurement": as_measurement(measurement).to_dict(),
    }


def write_results(path: Union[str, Path], records: Iterable[Mapping[str, Any]],
                  runs: Sequence[Union[RunInfo, Mapping[str, Any]]] = ()) -> Path:
    """Write a results file atomically (temp file + rename). ``records`` from ``results_record``."""
    run_dicts = []
    for run in runs:
        d = dict(run.__dict__) if isinstance(run, RunInfo) else dict(run)
        if d.get("started_at") is not None:
            d["started_at"] = iso(parse_time(d["started_at"]))
        run_dicts.append({k: v for k, v in d.items() if v is not None})
    doc = {"format": RESULTS_FORMAT, "version": RESULTS_VERSION, "runs": run_dicts, "records": list(records)}
    parse_results(doc)  # refuse to write what ingest would refuse to read
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read_results(source: Union[str, Path, bytes, list, dict]) -> tuple[Any, str, str]:
    """(parsed JSON, sha256 of the content, display name) of a results file, its bytes or its data."""
    if isinstance(source, (str, Path)):
        path = Path(source)
        try:
            raw = path.read_bytes()
        except OSError as e:
            raise PerfDBError(f"cannot read results file {path}: {e.strerror or e}") from None
        name = path.name
    elif isinstance(source, bytes):
        raw, name = source, "<bytes>"
    elif isinstance(source, (list, dict)):
        return source, sha256_hex(canonical_json(source)), "<data>"
    else:
        raise PerfDBError(f"results must be a path, bytes, a list or a dict, got {type(source).__name__}")
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ResultsFormatError(f"{name}: not JSON ({e})") from None
    return data, sha256_hex(raw.decode("utf-8", "replace")), name


def _fail(where: str, message: str) -> ResultsFormatError:
    return ResultsFormatError(f"{where}: {message} (see perf_db/RESULTS_FORMAT.md)")


def parse_results(data: Any, *, name: str = "results", sha256: Optional[str] = None
                  ) -> tuple[list[RunInfo], list[ResultRecord]]:
    """Validate a results document; returns its runs and records. Raises ``ResultsFormatError``."""
    default_env: Optional[dict] = None
    runs_raw: list = []
    if isinstance(data, list):
        records_raw = data
    elif isinstance(data, dict):
        if data.get("format") == "pathtune-pack":
            raise _fail(name, "this is a tuned-config pack (pathtune export), not a results file; packs are read "
                              "by the runtime (PATHTUNE_PACK), they are not imported into a database")
        if data.get("format") != RESULTS_FORMAT:
            raise _fail(name, f"'format' must be {RESULTS_FORMAT!r}, got {data.get('format')!r}")
        if data.get("version") != RESULTS_VERSION:
            raise _fail(name, f"'version' {data.get('version')!r} is not supported (this pathtune reads "
                              f"{RESULTS_VERSION})")
        unknown = sorted(set(data) - {"format", "version", "env", "runs", "records"})
        if unknown:
            raise _fail(name, f"unknown top-level keys {unknown}")
        default_env = data.get("env")
        if default_env is not None and not isinstance(default_env, dict):
            raise _fail(name, "'env' must be an object (collect_env() output)")
        runs_raw = data.get("runs") or []
        records_raw = data.get("records")
        if not isinstance(records_raw, list):
            raise _fail(name, "'records' must be a list")
    else:
        raise _fail(name, f"expected a JSON object or list, got {type(data).__name__}")
    if not isinstance(runs_raw, list):
        raise _fail(name, "'runs' must be a list")

    runs: list[RunInfo] = []
    for i, run in enumerate(runs_raw):
        where = f"{name}: runs[{i}]"
        if not isinstance(run, dict) or not isinstance(run.get("run_id"), str) or not run["run_id"]:
            raise _fail(where, "a run is an object with a non-empty string 'run_id'")
        unknown = sorted(set(run) - _RUN_KEYS)
        if unknown:
            raise _fail(where, f"unknown keys {unknown}; allowed: {sorted(_RUN_KEYS)}")
        try:
            started = parse_time(run.get("started_at"))
        except PerfDBError as e:
            raise _fail(where, str(e)) from None
        runs.append(RunInfo(run["run_id"], started, run.get("command"), run.get("host"), run.get("notes")))
    fallback_run = runs[0].run_id if len(runs) == 1 else (f"file-{sha256[:16]}" if sha256 else None)

    records: list[ResultRecord] = []
    for i, rec in enumerate(records_raw):
        where = f"{name}: records[{i}]"
        if not isinstance(rec, dict):
            raise _fail(where, "a record is a JSON object")
        unknown = sorted(set(rec) - _RECORD_KEYS)
        if unknown:
            raise _fail(where, f"unknown keys {unknown}; allowed: {sorted(_RECORD_KEYS)}")
        env = rec.get("env", default_env)
        if not isinstance(env, dict):
            raise _fail(where, "needs an 'env' object (collect_env() output), or a top-level 'env'")
        run_id = rec.get("run_id", fallback_run)
        if not isinstance(run_id, str) or not run_id:
            raise _fail(where, "needs a 'run_id' (several runs in the file, so none is implied)")
        for key in ("kernel", "workload", "config", "measurement"):
            if not isinstance(rec.get(key), dict):
                raise _fail(where, f"needs a '{key}' object")
        try:
            env_columns(env)  # validates the env dict
            records.append(ResultRecord(env=env, run_id=run_id, kernel=as_kernel(rec["kernel"]),
                                        workload=as_workload(rec["workload"]), config=as_config(rec["config"]),
                                        measurement=as_measurement(rec["measurement"])))
        except PerfDBError as e:
            raise _fail(where, str(e)) from None
        r = records[-1]
        if r.kernel.pass_ != r.workload.pass_:
            raise _fail(where, f"kernel pass {r.kernel.pass_!r} != workload pass {r.workload.pass_!r}")
        problems = config_problems(r.kernel.backend, r.kernel.pass_, r.kernel.spec_hash, r.config.to_dict(),
                                   r.workload)
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise _fail(where, f"config is not in the spec's {r.kernel.pass_} knob space: {problems[0]}{more}")
        bad_time = time_problem(r.measurement.median_ms) if r.measurement.status == "ok" else None
        if bad_time:
            raise _fail(where, f"a status 'ok' measurement needs a time: {bad_time}")
    return runs, records
