"""Errors and warnings of perf_db."""
from __future__ import annotations

__all__ = ["PerfDBError", "DuplicateMeasurementError", "ResultsFormatError", "PackMismatch", "SoftMismatchWarning",
           "NoDatabaseError", "DatabaseLockedError"]


class PerfDBError(RuntimeError):
    """A perf_db operation failed; the message says what and how to fix it."""


class DuplicateMeasurementError(PerfDBError):
    """A measurement with the same (env, kernel, workload, config, run) already exists; facts are never
    overwritten. Pass ``on_conflict="skip"`` to keep the stored one and carry on."""


class NoDatabaseError(PerfDBError):
    """A read was asked of a SQLite file that does not exist (a mistyped ``--db`` or ``PATHTUNE_DB_URL``);
    reads never create one."""


class DatabaseLockedError(PerfDBError):
    """A read (or a write) waited its bounded time for another process's lock on the database and gave up."""


class ResultsFormatError(PerfDBError, ValueError):
    """A results file (or a record in it) does not follow RESULTS_FORMAT.md."""


class PackMismatch(PerfDBError):
    """A tuned-config pack was measured under a different hard key (GPU, compute capability, Triton
    major.minor or spec hash) than the one it is asked to serve."""


class SoftMismatchWarning(UserWarning):
    """A stored result or pack differs from this machine in a soft key (driver, torch, CUDA patch...):
    it is still served, but its timings may not carry over exactly."""
