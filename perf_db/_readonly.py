"""Reading a database without changing it: what ``pathtune query`` (and ``query overhead``), ``export``,
``plot``, ``db dump`` and ``db path`` open (``PerfDB.open_read``).

- A SQLite file is opened read-only (``_engine.sqlite_read_uri``: ``mode=ro``, and ``immutable=1`` when
  the file or its folder is not writable, so read-only media work even in WAL mode): never created,
  migrated, given the shipped results or switched to WAL. A file the user named (``--db``,
  ``PATHTUNE_DB_URL``) that does not exist is refused (``NoDatabaseError``); only the unset default
  may be absent, and then the shipped results alone answer.
- PostgreSQL is read in read-only transactions.
- A lock is waited for at most ``READ_COMMAND_LOCK_WAIT_MS``, then ``DatabaseLockedError``.
- Shipped results (``_shipped.py``) the database has not ingested are shown without writing it: the
  SQLite file is copied into an in-memory database (sqlite3 backup API), which is migrated if need be
  and given them. The absent default database is replaced by the shipped results alone, kept in
  ``PATHTUNE_CACHE_DIR`` (a file pathtune can rebuild; rebuilt when the shipped files, the schema or
  pathtune's version change) so that each read does not ingest them again. ``read_notes`` says when
  shipped files are shown from a copy, or (PostgreSQL, read as it is) left out.

Commands that write (``tune``, ``import``, ``db gc``) still ingest the shipped files into the database
itself (``PerfDB.open_default``).
"""
from __future__ import annotations

import hashlib
import logging
import os
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, TypeVar

from sqlalchemy.engine import URL
from sqlalchemy.exc import SQLAlchemyError

from ._engine import (
    READ_COMMAND_LOCK_WAIT_MS,
    check_known_revision,
    head_revision,
    is_lock_error,
    locked_message,
    resolve_url,
    safe_url,
    sqlite_file,
    sqlite_unread_wal,
)
from ._errors import DatabaseLockedError, NoDatabaseError, PerfDBError
from ._keys import CurrentKeys, default_current_keys
from ._shipped import ingest_shipped, missing_shipped, shipped_dir, shipped_hashes

if TYPE_CHECKING:  # pragma: no cover
    from ._store import PerfDB

__all__ = ["open_read", "no_database_message", "CACHE_KEEP"]

log = logging.getLogger("pathtune.perf_db")
T = TypeVar("T")

CACHE_KEEP = 4  # shipped-results databases kept in the cache folder (one per set of shipped files)


def no_database_message(path: Path) -> str:
    return f"no database at {path}; `pathtune db path` shows the default, `pathtune import FILE` fills one"


def open_read(cls: type[PerfDB], url: Optional[str] = None, *, shipped: bool = True,
              current_keys: Optional[CurrentKeys] = default_current_keys,
              lock_wait_ms: int = READ_COMMAND_LOCK_WAIT_MS) -> PerfDB:
    """A ``cls`` (``PerfDB``: this is ``PerfDB.open_read``) on the database at ``url`` (default:
    ``PATHTUNE_DB_URL``, else the per-user file), opened so that nothing can change it. ``shipped``: with
    the shipped results it has not ingested (in an in-memory copy); without, the database exactly as
    stored (``db dump``: the shipped files must not land in a dump). Raises ``NoDatabaseError`` for a
    missing SQLite file (except the unset default with ``shipped``), ``DatabaseLockedError`` after
    ``lock_wait_ms`` of waiting for a lock, ``PerfDBError`` for a schema this pathtune does not know."""
    parsed, is_default = resolve_url(url)
    path = sqlite_file(parsed)
    if path is not None and not path.is_file():
        if is_default and shipped:
            return _shipped_only(cls, parsed, current_keys)
        raise NoDatabaseError(no_database_message(path))
    db = cls(parsed, read_only=True, current_keys=current_keys, lock_wait_ms=lock_wait_ms)
    db.read_notes = _unread_wal(path) if path is not None else []
    try:
        revision = _reading(db, lock_wait_ms, db.revision)
        check_known_revision(revision, db.display_url)
        head = head_revision()
        if not shipped:
            return db
        missing = _reading(db, lock_wait_ms, missing_shipped, db) if revision == head else shipped_hashes()
        if revision == head and not missing:
            return db
        if path is None:  # PostgreSQL: read as it is
            if revision != head:
                raise PerfDBError(f"{db.display_url} is at perf_db schema revision {revision!r}, this pathtune "
                                  f"reads {head!r}: run `pathtune db upgrade --db {db.display_url}`")
            db.read_notes.append(
                f"{len(missing)} shipped results file(s) are not in {db.display_url} and are not shown (read-only); "
                "a command that writes (pathtune import FILE, pathtune tune) adds them")
            return db
        copy = _memory_copy(db, lock_wait_ms)
        copy.read_notes = list(db.read_notes)
        if missing:
            copy.read_notes.append(
                f"{len(missing)} shipped results file(s) not stored in {db.display_url} are shown too, read into an "
                f"in-memory copy each time (nothing is written); a command that writes to it, e.g. `pathtune import "
                f"{shipped_dir()}/*.json --db {db.display_url}`, stores them")
    except BaseException:
        db.close()
        raise
    db.close()
    try:
        copy.upgrade()
        ingest_shipped(copy, missing)
    except BaseException:
        copy.close()
        raise
    return copy


def _unread_wal(path: Path) -> list[str]:
    wal = sqlite_unread_wal(path)
    if wal is None:
        return []
    return [f"{wal} holds changes not yet written into {path.name}; they are not shown, since a read-only file or "
            "folder cannot take them in: copy both files to a writable folder to see them"]


def _reading(db: PerfDB, lock_wait_ms: int, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, a lock timeout turned into ``DatabaseLockedError``."""
    try:
        return fn(*args)
    except (SQLAlchemyError, sqlite3.Error) as e:
        if is_lock_error(e):
            raise DatabaseLockedError(locked_message(db.display_url, lock_wait_ms)) from None
        raise


def _memory_copy(src: PerfDB, lock_wait_ms: int) -> PerfDB:
    """An in-memory database holding what ``src`` (a read-only SQLite file) holds, labelled as it."""
    copy = type(src)("sqlite://", auto_upgrade=False, current_keys=src.current_keys)
    source = src.engine.raw_connection()
    try:
        conn = source.driver_connection
        try:
            # Take the read lock first (waiting at most the busy timeout): the backup itself would retry a
            # locked source for ever.
            _reading(src, lock_wait_ms, lambda: (conn.execute("BEGIN"),
                                                 conn.execute("SELECT count(*) FROM sqlite_master").fetchone()))
            target = copy.engine.raw_connection()
            try:
                conn.backup(target.driver_connection)
            finally:
                target.close()
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
    except BaseException:
        copy.close()
        raise
    finally:
        source.close()
    copy._label = src.display_url
    return copy


# -- the shipped results alone (no database yet) ----------------------------------------------------

def _shipped_only(cls: type[PerfDB], url: URL, current_keys: Optional[CurrentKeys]) -> PerfDB:
    label = f"{safe_url(url)} (not created yet; the shipped results)"
    files = shipped_hashes()
    cache = _cache_file(files) if files else None
    if cache is not None and cache.is_file():
        db = cls(URL.create("sqlite", database=str(cache)), read_only=True, current_keys=current_keys)
        try:
            if db.revision() == head_revision():
                db._label = label
                return db
        except (PerfDBError, SQLAlchemyError, sqlite3.Error) as e:  # rebuilt below
            log.info("perf_db: shipped-results cache %s unusable (%s); rebuilding it", cache, e)
        db.close()
    db = cls("sqlite://", current_keys=current_keys)
    ingest_shipped(db, files)
    if cache is not None:
        _save(db, cache)
    db._label = label
    return db


def _cache_file(files: list[tuple[Path, str]]) -> Path:
    """Where the database of exactly these shipped files, at this schema and pathtune version, is kept."""
    from pathtune import __version__, _env

    h = hashlib.sha256(f"{head_revision()}\n{__version__}\n".encode())
    for path, sha in files:
        h.update(f"{path.name}\t{sha}\n".encode())
    return _env.CACHE_DIR.get() / "perf_db" / f"shipped-{h.hexdigest()[:20]}.sqlite3"


def _save(db: PerfDB, cache: Path) -> None:
    """Write the in-memory ``db`` to ``cache`` (atomically; best effort: a read-only cache folder only
    means the next read ingests the shipped files again), keeping the newest ``CACHE_KEEP``."""
    tmp = cache.with_name(f".{cache.name}.{os.getpid()}.tmp")
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        out = sqlite3.connect(tmp)
        try:
            source = db.engine.raw_connection()
            try:
                source.driver_connection.backup(out)
            finally:
                source.close()
        finally:
            out.close()
        os.replace(tmp, cache)
        older = sorted(cache.parent.glob("shipped-*.sqlite3"), key=lambda p: p.stat().st_mtime, reverse=True)
        for stale in older[CACHE_KEEP:]:
            stale.unlink(missing_ok=True)
    except (OSError, sqlite3.Error) as e:
        log.info("perf_db: cannot keep the shipped results in %s: %s", cache, e)
        try:
            tmp.unlink(missing_ok=True)
        except OSError:         # e.g. the cache folder's parent is a file: there is no tmp to remove
            pass
