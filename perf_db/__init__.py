"""pathtune.perf_db: the tuning-results database (SQLite by default, PostgreSQL for fleets) and packs.

    from pathtune.perf_db import PerfDB, KernelKey, Measurement
    db = PerfDB()                                   # PATHTUNE_DB_URL or <user data dir>/perf.sqlite3
    db.record(collect_env(), KernelKey(pass_="fwd", backend="triton", spec_hash=spec.pass_hash("fwd"),
                                       source_hash=h),
              workload, config, Measurement(status="ok", median_ms=0.41, baseline_ms=0.30))
    db.best(env_hash(), "fwd", workload)            # fastest current config, exact or nearest length bucket
    db.overhead(by="head_dim")                      # pathtune vs SDPA measured in the same run

    export_pack(db, "H200", "h200.json"); load_pack("h200.json").lookup(workload)

Names load on first use, so importing this package (e.g. from the CLI) does not import SQLAlchemy.
Schema and design: perf_db/README.md; results-file format: perf_db/RESULTS_FORMAT.md.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "PerfDB": "._store", "GcReport": "._store", "IngestReport": "._store", "OVERHEAD_BY": "._store",
    "KernelKey": "._keys", "Measurement": "._keys", "DISPATCH_BACKENDS": "._keys",
    "default_current_keys": "._keys", "spec_keys": "._keys", "new_run_id": "._keys",
    "STATUSES": "._models", "BACKENDS": "._models", "VERSION_TABLE": "._models",
    "PerfDBError": "._errors", "DuplicateMeasurementError": "._errors", "ResultsFormatError": "._errors",
    "PackMismatch": "._errors", "SoftMismatchWarning": "._errors", "NoDatabaseError": "._errors",
    "DatabaseLockedError": "._errors",
    "Pack": "._pack", "PackHit": "._pack", "PackEntry": "._pack", "export_pack": "._pack", "load_pack": "._pack",
    "results_record": "._results", "write_results": "._results", "RunInfo": "._results",
    "resolve_url": "._engine",
    "DumpReport": "._dump", "dump_results": "._dump",
}
__all__ = [
    "PerfDB", "GcReport", "IngestReport", "OVERHEAD_BY",
    "KernelKey", "Measurement", "DISPATCH_BACKENDS", "default_current_keys", "spec_keys", "new_run_id",
    "STATUSES", "BACKENDS", "VERSION_TABLE",
    "PerfDBError", "DuplicateMeasurementError", "ResultsFormatError", "PackMismatch", "SoftMismatchWarning",
    "NoDatabaseError", "DatabaseLockedError",
    "Pack", "PackHit", "PackEntry", "export_pack", "load_pack",
    "results_record", "write_results", "RunInfo",
    "resolve_url", "DumpReport", "dump_results",
]

if TYPE_CHECKING:  # pragma: no cover
    from ._dump import DumpReport, dump_results
    from ._engine import resolve_url
    from ._errors import (
        DatabaseLockedError,
        DuplicateMeasurementError,
        NoDatabaseError,
        PackMismatch,
        PerfDBError,
        ResultsFormatError,
        SoftMismatchWarning,
    )
    from ._keys import DISPATCH_BACKENDS, KernelKey, Measurement, default_current_keys, new_run_id, spec_keys
    from ._models import BACKENDS, STATUSES, VERSION_TABLE
    from ._pack import Pack, PackEntry, PackHit, export_pack, load_pack
    from ._results import RunInfo, results_record, write_results
    from ._store import OVERHEAD_BY, GcReport, IngestReport, PerfDB


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pathtune.perf_db' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
