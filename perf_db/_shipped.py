"""Result files measured on reference GPUs and shipped with pathtune (``perf_db/shipped/*.json``)."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence

from ._errors import PerfDBError
from ._results import read_results

if TYPE_CHECKING:  # pragma: no cover
    from ._store import IngestReport, PerfDB

__all__ = ["SHIPPED_DIR", "shipped_dir", "shipped_files", "shipped_hashes", "missing_shipped", "ingest_shipped"]

log = logging.getLogger("pathtune.perf_db")
SHIPPED_DIR = Path(__file__).resolve().parent / "shipped"


def shipped_dir() -> Path:
    """``PATHTUNE_SHIPPED_DIR`` when set, else the package's ``perf_db/shipped``."""
    from pathtune import _env

    return _env.SHIPPED_DIR.get() or SHIPPED_DIR


def shipped_files() -> list[Path]:
    folder = shipped_dir()
    return sorted(folder.glob("*.json")) if folder.is_dir() else []


def shipped_hashes() -> list[tuple[Path, str]]:
    """(file, sha256 of its content, as ``PerfDB.ingested`` knows it) of each readable shipped file; an
    unreadable one is skipped with a warning (it must not break the user's command)."""
    out = []
    for path in shipped_files():
        try:
            _, sha, _ = read_results(path)
        except PerfDBError as e:
            log.warning("perf_db: skipped shipped results %s: %s", path.name, e)
            continue
        out.append((path, sha))
    return out


def missing_shipped(db: "PerfDB", files: Optional[Sequence[tuple[Path, str]]] = None) -> list[tuple[Path, str]]:
    """The shipped files (``shipped_hashes()`` unless given) that ``db`` has not ingested."""
    return [(path, sha) for path, sha in (shipped_hashes() if files is None else files) if not db.ingested(sha)]


def ingest_shipped(db: "PerfDB", files: Optional[Sequence[tuple[Path, str]]] = None) -> list["IngestReport"]:
    """Ingest every shipped file (``files`` from ``shipped_hashes()``, default all) the database has not
    ingested yet (by content hash); idempotent."""
    reports = []
    for path, _ in missing_shipped(db, files):
        try:
            report = db.ingest(path, on_conflict="skip", name=f"shipped/{path.name}")
        except PerfDBError as e:  # a broken shipped file must not break the user's command
            log.warning("perf_db: skipped shipped results %s: %s", path.name, e)
            continue
        log.info("perf_db: ingested shipped %s (%d records, %d new)", path.name, report.records, report.added)
        reports.append(report)
    return reports
