"""Results of retired kernel sources: what ``pathtune tune`` warm-starts a new study from.

A kernel edit changes its pass's source hash (``codegen.triton.source_hash``), which retires every
record of that pass: ``best`` stops serving them and the tuner opens new studies. The configs that
won under the retired source are usually still near the best, so a new study measures a few of them
right after its default (``tuning/warm.py``). This module finds them.

Match rule (one rule, two sources: ``PerfDB.retired`` in SQL, ``retired_in_records`` over results
files): the record's

* environment matches as in ``PerfDB.lookup`` / ``best`` (the dispatcher's): GPU name, compute
  capability, CUDA runtime, ptxas, env key schema and the backend's own library (Triton for
  triton/fla, TVM for tvm); an ``env_hash`` string is matched exactly;
* kernel has the same op, pass, backend and spec (its spec hash, or for a kernel of the current spec
  either of the hashes a current record may carry: the pass hash and the full spec hash), and a source
  hash OTHER than the current one (the codegen version is not compared, as ``best`` does not);
* workload key is the same (``Workload.key_hash``: head dims, heads, dtype, gate, pass, length and
  batch bucket, varlen, key schema);
* status is ``ok`` (compiled, passed the accuracy gate, timed) with a time.

``earlier_specs=True`` asks instead for the records of the same op, pass, backend, environment and
workload under OTHER specs (any source): a spec change (a new knob, a changed domain) retires every
record of the passes it touches, and the tuner falls back to those when its own spec has none (their
configs lack the knobs added since: ``tuning/warm.py`` gives those the key's defaults).

Rows: ``{"config", "config_hash", "median_ms", "source_hash", "spec_hash", "codegen_version",
"created_at" (datetime or None), "origin", "gpu_name"}``.
"""
from __future__ import annotations

import logging
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence, Union

from ._errors import PerfDBError
from ._keys import (
    BACKEND_LIBS,
    WITHDRAWN_RUNS,
    EnvLike,
    KernelKey,
    KernelLike,
    WorkloadLike,
    as_kernel,
    as_workload,
    default_current_keys,
    env_columns,
    same_spec_hashes,
)

__all__ = ["env_matches", "other_gpus_in_records", "retired_in_records", "shipped_other_gpus", "shipped_retired",
           "shipped_records"]

log = logging.getLogger("pathtune.perf_db")
_STAMP = re.compile(r"(\d{8}T\d{6}Z)")


def env_matches(stored: EnvLike, env: Union[str, EnvLike], backend: str) -> bool:
    """Whether a record's environment (``collect_env()`` output) matches ``env`` for ``backend``'s
    results: ``PerfDB._env_clause`` in Python (used for results files, which are not in a database)."""
    have = env_columns(stored)
    if isinstance(env, str):
        return have["env_hash"] == env
    want = env_columns(env)
    keys = ("gpu_name", "cc", "cuda", "ptxas", "key_schema", *BACKEND_LIBS[backend])
    return all(have[k] == want[k] for k in keys)


def _spec_hashes(k: KernelKey, spec_hashes: Optional[Sequence[str]]) -> tuple[str, ...]:
    if spec_hashes is not None:
        return tuple(spec_hashes) if k.spec_hash in spec_hashes else (k.spec_hash,)
    return same_spec_hashes(k.spec_hash, default_current_keys(k.op, k.pass_, k.backend))


def retired_in_records(records: Iterable[Any], env: Union[str, EnvLike], kernel: KernelLike, workload: WorkloadLike,
                       *, origin: str = "results", when: Optional[datetime] = None,
                       started: Optional[dict[str, Any]] = None,
                       spec_hashes: Optional[Sequence[str]] = None,
                       earlier_specs: bool = False) -> list[dict[str, Any]]:
    """The rows of ``records`` (``ResultRecord``) that match the rule above. ``created_at``: the
    measurement's, else its run's start (``started``: run_id -> datetime), else ``when``. ``spec_hashes``:
    the hashes of one spec (the pass hash and the full hash) that count as ``kernel``'s when it carries
    one of them (default: the packaged spec's, ``default_current_keys``). ``earlier_specs``: the records
    of every other spec instead (any source)."""
    k, wl = as_kernel(kernel), as_workload(workload)
    specs = _spec_hashes(k, spec_hashes)
    out = []
    for rec in _timed_records(records, k, wl):
        rk: KernelKey = rec.kernel
        if earlier_specs:
            if rk.spec_hash in specs:
                continue
        elif rk.spec_hash not in specs or rk.source_hash == k.source_hash:
            continue
        try:
            if not env_matches(rec.env, env, k.backend):
                continue
            gpu = env_columns(rec.env)["gpu_name"]
        except PerfDBError:
            continue
        out.append(_row(rec, origin, started, when, gpu))
    return out


def _timed_records(records: Iterable[Any], k: KernelKey, wl: Any) -> Iterable[Any]:
    """The records of ``k``'s op, pass and backend and ``wl``'s workload key that are ok with a time, none of a
    withdrawn run (``WITHDRAWN_RUNS``)."""
    for rec in records:
        rk, m = rec.kernel, rec.measurement
        if ((rk.op, rk.pass_, rk.backend) == (k.op, k.pass_, k.backend) and rec.workload.key_hash == wl.key_hash
                and m.status == "ok" and m.median_ms is not None and rec.run_id not in WITHDRAWN_RUNS):
            yield rec


def _row(rec: Any, origin: str, started: Optional[dict[str, Any]], when: Optional[datetime],
         gpu_name: Optional[str]) -> dict[str, Any]:
    """A record as a warm-start row (the module docstring's fields); ``created_at``: the measurement's, else its
    run's start (``started``: run_id -> datetime), else ``when``."""
    rk, m = rec.kernel, rec.measurement
    return {"config": rec.config.to_dict(), "config_hash": rec.config.hash, "median_ms": m.median_ms,
            "source_hash": rk.source_hash, "spec_hash": rk.spec_hash, "codegen_version": rk.codegen_version,
            "created_at": m.created_at or (started or {}).get(rec.run_id) or when, "origin": origin,
            "gpu_name": gpu_name}


def other_gpus_in_records(records: Iterable[Any], env: EnvLike, kernel: KernelLike, workload: WorkloadLike, *,
                          origin: str = "results", when: Optional[datetime] = None,
                          started: Optional[dict[str, Any]] = None,
                          spec_hashes: Optional[Sequence[str]] = None) -> list[dict[str, Any]]:
    """The rows of ``records`` measured on OTHER GPUs (a GPU name other than ``env``'s) for ``kernel``'s op, pass,
    backend, spec and source hash (the current kernels) and the same workload key, ok with a time: what a study
    on a GPU without records of its own can start from.  Row fields as ``retired_in_records``'."""
    k, wl = as_kernel(kernel), as_workload(workload)
    specs = _spec_hashes(k, spec_hashes)
    mine = env_columns(env)["gpu_name"]
    out = []
    for rec in _timed_records(records, k, wl):
        if rec.kernel.spec_hash not in specs or rec.kernel.source_hash != k.source_hash:
            continue
        try:
            gpu = env_columns(rec.env)["gpu_name"]
        except PerfDBError:
            continue
        if gpu is None or gpu == mine:
            continue
        out.append(_row(rec, origin, started, when, gpu))
    return out


_CACHE: dict[tuple[str, int, int], tuple[list, dict, Optional[datetime]]] = {}


def _file_time(path: Path) -> Optional[datetime]:
    """The UTC time in a shipped file's name (``H200-20261130T003728Z-...json``), if any: shipped
    records carry no times of their own."""
    m = _STAMP.search(path.name)
    if not m:
        return None
    try:
        return datetime.strptime(m.group(1), "%Y%m%dT%H%M%SZ").replace(tzinfo=timezone.utc)
    except ValueError:
        return None


def shipped_records(files: Optional[Sequence[Path]] = None) -> list[tuple[Path, list, dict, Optional[datetime]]]:
    """(path, records, run_id -> started_at, time in the name) of each shipped results file (default:
    ``shipped_files()``); parsed once per process and file version; a broken file is skipped with a warning."""
    from ._results import parse_results, read_results
    from ._shipped import shipped_files

    out = []
    for path in shipped_files() if files is None else files:
        path = Path(path)
        try:
            st = path.stat()
            key = (str(path.resolve()), st.st_mtime_ns, st.st_size)
            if key not in _CACHE:
                data, sha, name = read_results(path)
                runs, records = parse_results(data, name=name, sha256=sha)
                _CACHE[key] = (records, {r.run_id: r.started_at for r in runs if r.started_at}, _file_time(path))
        except (OSError, PerfDBError) as e:
            log.warning("perf_db: skipped shipped results %s: %s", path.name, e)
            continue
        out.append((path, *_CACHE[key]))
    return out


def shipped_retired(env: Union[str, EnvLike], kernel: KernelLike, workload: WorkloadLike,
                    files: Optional[Sequence[Path]] = None, *,
                    spec_hashes: Optional[Sequence[str]] = None, earlier_specs: bool = False) -> list[dict[str, Any]]:
    """``retired_in_records`` over the shipped results files, read directly: a database that
    ingested them may have pruned their retired records since (``gc`` keeps the ingest markers, so
    they are not ingested again)."""
    rows = []
    for path, records, started, when in shipped_records(files):
        rows += retired_in_records(records, env, kernel, workload, origin=f"shipped/{path.name}", when=when,
                                   started=started, spec_hashes=spec_hashes, earlier_specs=earlier_specs)
    return rows


def shipped_other_gpus(env: EnvLike, kernel: KernelLike, workload: WorkloadLike,
                       files: Optional[Sequence[Path]] = None, *,
                       spec_hashes: Optional[Sequence[str]] = None) -> list[dict[str, Any]]:
    """``other_gpus_in_records`` over the shipped results files."""
    rows = []
    for path, records, started, when in shipped_records(files):
        rows += other_gpus_in_records(records, env, kernel, workload, origin=f"shipped/{path.name}", when=when,
                                      started=started, spec_hashes=spec_hashes)
    return rows
