"""Result files measured on reference GPUs and shipped with pathtune (``perf_db/shipped/*.json``)."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from ._errors import PerfDBError
from ._results import read_results

if TYPE_CHECKING:  # pragma: no cover
    from ._store import IngestReport, PerfDB

__all__ = ["SHIPPED_DIR", "shipped_dir", "shipped_files", "ingest_shipped"]

log = logging.getLogger("pathtune.perf_db")
SHIPPED_DIR = Path(__file__).resolve().parent / "shipped"


def shipped_dir() -> Path:
    """``PATHTUNE_SHIPPED_DIR`` when set, else the package's ``perf_db/shipped``."""
    from pathtune import _env

    return _env.SHIPPED_DIR.get() or SHIPPED_DIR


def shipped_files() -> list[Path]:
    folder = shipped_dir()
    return sorted(folder.glob("*.json")) if folder.is_dir() else []


def ingest_shipped(db: "PerfDB") -> list["IngestReport"]:
    """Ingest every shipped file the database has not ingested yet (by content hash); idempotent."""
    reports = []
    for path in shipped_files():
        try:
            _, sha, _ = read_results(path)
            if db.ingested(sha):
                continue
            report = db.ingest(path, on_conflict="skip", name=f"shipped/{path.name}")
        except PerfDBError as e:  # a broken shipped file must not break the user's command
            log.warning("perf_db: skipped shipped results %s: %s", path.name, e)
            continue
        log.info("perf_db: ingested shipped %s (%d records, %d new)", path.name, report.records, report.added)
        reports.append(report)
    return reports
