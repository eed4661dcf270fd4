"""Database URL resolution, engine creation (SQLite WAL + busy timeout, PostgreSQL driver check; read-only
engines that cannot change the database) and the programmatic Alembic upgrade with perf_db's own
version table."""
from __future__ import annotations

import importlib.util
import os
import sqlite3
from pathlib import Path
from typing import Optional

from sqlalchemy import Engine, create_engine, event, inspect
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError, SQLAlchemyError
from sqlalchemy.pool import StaticPool

from pathtune import _env

from ._errors import DatabaseLockedError, PerfDBError
from ._models import VERSION_TABLE

__all__ = ["resolve_url", "make_engine", "upgrade", "current_revision", "head_revision", "check_known_revision",
           "MIGRATIONS_DIR", "SQLITE_BUSY_TIMEOUT_MS", "SQLITE_READ_BUSY_TIMEOUT_MS", "READ_COMMAND_LOCK_WAIT_MS",
           "safe_url", "sqlite_file", "sqlite_read_uri", "sqlite_read_connection", "sqlite_wal_present",
           "sqlite_unread_wal", "sqlite_release_wal", "is_lock_error", "locked_message", "damage_hint", "write_problem"]

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
SQLITE_BUSY_TIMEOUT_MS = 30_000
# Read-only engines (the runtime dispatcher) wait at most this long for a lock, then fail: a kernel
# call falls back to its heuristic config rather than stall behind a tuning worker.
SQLITE_READ_BUSY_TIMEOUT_MS = 200
# The read commands (pathtune query, export, plot, db dump, db path) wait at most this long for another
# process's lock (SQLite busy timeout; PostgreSQL lock_timeout), then fail saying the database is locked.
READ_COMMAND_LOCK_WAIT_MS = 3_000


def safe_url(url: URL | str) -> str:
    """The URL with any password masked (for messages)."""
    try:
        return make_url(url).render_as_string(hide_password=True) if isinstance(url, str) else \
            url.render_as_string(hide_password=True)
    except ArgumentError:
        return str(url)


def sqlite_file(url: URL) -> Optional[Path]:
    """The file of a SQLite URL (absolute, ``~`` expanded), ``None`` for other databases and in-memory ones."""
    if url.get_backend_name() != "sqlite":
        return None
    database = url.database or ""
    if database in ("", ":memory:") or database.startswith("file::memory:"):
        return None
    return Path(database).expanduser().resolve()


def _writable(path: Path) -> bool:
    # Write bits as well as access(): root may write a chmod 0444 file, but its owner marked it read-only.
    try:
        return bool(path.stat().st_mode & 0o222) and os.access(path, os.W_OK)
    except OSError:
        return False


def sqlite_read_uri(path: Path) -> str:
    """A ``file:`` URI opening ``path`` read-only (``mode=ro``), plus ``immutable=1`` when the file or
    its folder is not writable: read-only media, a chmod 0444 file. There SQLite could not create the
    ``-shm`` file a WAL database needs (and nothing can change the file while it is read); an
    immutable read does not see a ``-wal`` file's uncheckpointed pages."""
    path = Path(path).expanduser().resolve()
    uri = path.as_uri() + "?mode=ro"
    if not (_writable(path) and _writable(path.parent)):
        uri += "&immutable=1"
    return uri


def sqlite_read_connection(path: Path, lock_wait_ms: int) -> sqlite3.Connection:
    """A DB-API connection that can only read ``path``: opened read-only (``sqlite_read_uri``), with
    ``query_only`` on, autocommit reads (no ``BEGIN IMMEDIATE``, which takes the write lock) and a
    busy timeout of ``lock_wait_ms``."""
    conn = sqlite3.connect(sqlite_read_uri(path), uri=True, timeout=lock_wait_ms / 1000, isolation_level=None,
                           check_same_thread=False)
    try:
        conn.execute("PRAGMA query_only = ON")
    except sqlite3.Error:
        conn.close()
        raise
    return conn


def _wal_path(path: Path) -> Path:
    return path.with_name(path.name + "-wal")


def sqlite_wal_present(path: Path) -> bool:
    """Whether ``path`` has a ``-wal`` file now (another connection has it open, or it was not closed cleanly)."""
    return _wal_path(path).exists()


def sqlite_unread_wal(path: Path) -> Optional[Path]:
    """The ``-wal`` file of ``path`` when it holds pages that an immutable read (``sqlite_read_uri`` of a
    read-only file or folder) does not see; else ``None``."""
    wal = _wal_path(path)
    try:
        if "immutable=1" in sqlite_read_uri(path) and wal.is_file() and wal.stat().st_size > 0:
            return wal
    except OSError:
        pass
    return None


def sqlite_release_wal(path: Path) -> None:
    """After read-only connections to a WAL database closed: remove the ``-wal`` and ``-shm`` files they
    created (a read-only connection must create them to read, and cannot delete them), the way SQLite
    does when its last connection closes: open and close one query_only connection, which checkpoints
    nothing and deletes them only if no other connection has the database open. Call it only when the
    ``-wal`` file did not exist before the reads; a non-empty one (another process wrote) is left alone."""
    wal = _wal_path(path)
    try:
        if not wal.is_file() or wal.stat().st_size != 0 or not _writable(path) or not _writable(path.parent):
            return
        conn = sqlite3.connect(path.as_uri() + "?mode=rw", uri=True, timeout=0, isolation_level=None)
        try:
            conn.execute("PRAGMA query_only = ON")
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        finally:
            conn.close()
    except (OSError, sqlite3.Error):  # locked, gone: the files stay, as after any reader
        pass


def is_lock_error(e: BaseException) -> bool:
    """Whether ``e`` (a DB-API or SQLAlchemy error) is a lock wait that timed out."""
    text = str(getattr(e, "orig", None) or e).lower()
    return "database is locked" in text or "database table is locked" in text or "lock timeout" in text


def locked_message(display_url: str, lock_wait_ms: int) -> str:
    return (f"{display_url} is locked by another process (waited {lock_wait_ms / 1000:g} s); retry when it "
            "is done")


def damage_hint(text: str) -> str:
    """``text`` (a database error), with what it means when SQLite says the file is damaged or foreign."""
    lowered = text.lower()
    if "file is not a database" in lowered or "malformed" in lowered:
        return (f"{text} (the file is damaged or not a pathtune database; nothing in it was changed: restore it "
                "from a copy, or use another file with --db / PATHTUNE_DB_URL)")
    return text


def resolve_url(url: Optional[str] = None) -> tuple[URL, bool]:
    """(URL, is_default): the argument, else ``PATHTUNE_DB_URL``, else the per-user SQLite file."""
    explicit = url or (_env.DB_URL.raw() or "").strip() or None
    text = explicit or _env.default_db_url()
    try:
        parsed = make_url(text)
    except ArgumentError as e:
        source = "--db / url argument" if url else "PATHTUNE_DB_URL"
        raise PerfDBError(f"not a database URL: {text!r} (from {source}); expected e.g. "
                          f"sqlite:////path/to/perf.sqlite3 or postgresql+psycopg://user@host/db ({e})") from None
    return parsed, explicit is None


def _sqlite_pragmas(dbapi_conn, _record) -> None:  # noqa: ANN001 - SQLAlchemy event signature
    # pysqlite's own transaction handling breaks SAVEPOINTs (a released outer savepoint commits), so
    # it is switched off and every transaction is begun explicitly by _sqlite_begin below.
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    try:
        cur.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA journal_mode = WAL")  # in-memory databases answer 'memory'; fine
        cur.execute("PRAGMA synchronous = NORMAL")
        cur.execute("PRAGMA foreign_keys = ON")
    finally:
        cur.close()


def _sqlite_read_pragmas(dbapi_conn, _record) -> None:  # noqa: ANN001 - SQLAlchemy event signature
    # A read-only in-memory database (a file is opened by sqlite_read_connection): autocommit reads, no
    # journal-mode change, and query_only so that a stray write fails.
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    try:
        cur.execute("PRAGMA query_only = ON")
    finally:
        cur.close()


def _sqlite_begin(conn) -> None:  # noqa: ANN001 - SQLAlchemy event signature
    # IMMEDIATE: take the write lock up front, so a transaction that reads and then writes waits
    # (busy timeout) for other writers instead of failing with "database is locked".
    conn.exec_driver_sql("BEGIN IMMEDIATE")


def _pg_read_only(lock_wait_ms: int) -> "object":
    def on_connect(dbapi_conn, _record) -> None:  # noqa: ANN001 - SQLAlchemy event signature
        # as SQLAlchemy's documentation sets a session's search_path: outside a transaction
        autocommit = dbapi_conn.autocommit
        dbapi_conn.autocommit = True
        cur = dbapi_conn.cursor()
        try:
            cur.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
            cur.execute(f"SET lock_timeout = {int(lock_wait_ms)}")
        finally:
            cur.close()
        dbapi_conn.autocommit = autocommit

    return on_connect


_ELSEWHERE = "put the database elsewhere with PATHTUNE_DB_URL=sqlite:///PATH or --db sqlite:///PATH"


def write_problem(url: Optional[str] = None) -> Optional[str]:
    """Why a command that writes could not store results into ``url`` (default: ``PATHTUNE_DB_URL``, else
    the per-user file), as a one-line message, or None; checked without creating anything. A SQLite file
    that exists must be writable; else the nearest existing folder above it must be a writable folder.
    Other databases: None (their server decides)."""
    parsed, _ = resolve_url(url)
    path = sqlite_file(parsed)
    if path is None:
        return None
    if path.exists():
        if path.is_dir():
            return f"{path} is a folder, not a database file; {_ELSEWHERE}"
        return None if os.access(path, os.W_OK) else f"{path} is read-only; {_ELSEWHERE}"
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        return f"cannot create {path}: {folder} is a file, not a folder; {_ELSEWHERE}"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"cannot create {path}: folder {folder} is not writable; {_ELSEWHERE}"
    return None


def make_engine(url: URL, *, create_parent: bool = False, echo: bool = False, read_only: bool = False,
                lock_wait_ms: Optional[int] = None) -> Engine:
    """An engine for ``url``. ``read_only``: an engine that cannot change the database, for lookups
    and the read commands: a SQLite file is opened read-only (``sqlite_read_connection``; it must
    exist), PostgreSQL sessions are read-only with a short connect timeout; either waits at most
    ``lock_wait_ms`` (default ``SQLITE_READ_BUSY_TIMEOUT_MS``) for a lock. The schema is neither
    created nor migrated."""
    backend = url.get_backend_name()
    wait = SQLITE_READ_BUSY_TIMEOUT_MS if lock_wait_ms is None else int(lock_wait_ms)
    if backend == "sqlite":
        path = sqlite_file(url)
        if path is not None:
            if create_parent:
                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                except OSError as e:
                    raise PerfDBError(f"cannot create the folder {path.parent} of {safe_url(url)}: "
                                      f"{e.strerror or e}; {_ELSEWHERE}") from None
            elif not path.parent.is_dir():
                raise PerfDBError(f"cannot open {safe_url(url)}: directory {path.parent} does not exist")
            if not read_only and not path.exists() and not os.access(path.parent, os.W_OK | os.X_OK):
                raise PerfDBError(f"cannot create {path}: its folder {path.parent} is not writable; {_ELSEWHERE}")
        if read_only and path is not None:
            return create_engine(url, echo=echo, creator=lambda: sqlite_read_connection(path, wait))
        kwargs = {"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}}
        if path is None:
            kwargs.update(poolclass=StaticPool, connect_args={"check_same_thread": False})
        engine = create_engine(url, echo=echo, **kwargs)
        if read_only:
            event.listen(engine, "connect", _sqlite_read_pragmas)
            return engine
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "begin", _sqlite_begin)
        return engine
    if backend == "postgresql":
        driver = url.get_driver_name()
        module = {"psycopg": "psycopg", "psycopg2": "psycopg2", "asyncpg": "asyncpg"}.get(driver, driver)
        if importlib.util.find_spec(module) is None:
            raise PerfDBError(f"{safe_url(url)} needs the PostgreSQL driver {module!r}, which is not installed: "
                              "pip install 'pathtune[postgres]' (installs psycopg 3; use a postgresql+psycopg:// URL)")
        if driver in ("psycopg2", "asyncpg"):
            raise PerfDBError(f"use a postgresql+psycopg:// URL (psycopg 3, the [postgres] extra), not {driver}")
    try:
        if read_only and backend == "postgresql":
            engine = create_engine(url, echo=echo, pool_pre_ping=True, connect_args={"connect_timeout": 3})
            event.listen(engine, "connect", _pg_read_only(wait))
            return engine
        return create_engine(url, echo=echo, pool_pre_ping=True)
    except (NoSuchModuleError, ImportError, ArgumentError) as e:
        raise PerfDBError(f"cannot open {safe_url(url)}: {e}") from None


def _alembic_config(connection) -> "object":  # noqa: ANN001
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("path_separator", "os")
    cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    cfg = _alembic_config(None)
    heads = ScriptDirectory.from_config(cfg).get_heads()
    if len(heads) != 1:
        raise PerfDBError(f"perf_db migrations have {len(heads)} heads ({heads}); expected one")
    return heads[0]


def current_revision(engine: Engine) -> Optional[str]:
    from alembic.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}).get_current_revision()


def _known_revisions() -> set[str]:
    from alembic.script import ScriptDirectory

    return {s.revision for s in ScriptDirectory.from_config(_alembic_config(None)).walk_revisions()}


def check_known_revision(revision: Optional[str], display_url: str) -> None:
    """Refuse a database migrated by a newer pathtune (a revision this one does not know)."""
    if revision is not None and revision not in _known_revisions():
        raise PerfDBError(f"{display_url} has perf_db schema revision {revision!r}, which this pathtune "
                          f"does not know (its newest is {head_revision()!r}); upgrade pathtune")


def upgrade(engine: Engine, revision: str = "head") -> str:
    """Bring the perf_* tables to ``revision``; a no-op when already there. Returns the revision."""
    from alembic import command

    head = head_revision()
    try:
        current = current_revision(engine)
    except (DBAPIError, SQLAlchemyError) as e:
        if is_lock_error(e):
            raise DatabaseLockedError(locked_message(safe_url(engine.url), SQLITE_BUSY_TIMEOUT_MS)) from None
        raise PerfDBError(f"cannot open {safe_url(engine.url)}: {damage_hint(_short(e))}") from None
    check_known_revision(current, safe_url(engine.url))
    if current == head and revision == "head":
        return head
    try:
        with engine.begin() as conn:
            command.upgrade(_alembic_config(conn), revision)
    except (DBAPIError, SQLAlchemyError) as e:
        # Another process may have migrated concurrently: fine if the schema is now where we want it.
        if revision == "head" and current_revision(engine) == head:
            return head
        raise PerfDBError(f"migrating {safe_url(engine.url)} failed: {_short(e)}") from None
    return current_revision(engine) or ""


def table_names(engine: Engine) -> list[str]:
    return sorted(inspect(engine).get_table_names())


def _short(e: BaseException) -> str:
    text = str(getattr(e, "orig", None) or e)
    return text.splitlines()[0] if text else type(e).__name__
