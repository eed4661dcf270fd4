"""Database URL resolution, engine creation (SQLite WAL + busy timeout, PostgreSQL driver check) and
the programmatic Alembic upgrade with perf_db's own version table."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Optional

from sqlalchemy import Engine, create_engine, event, inspect
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError, SQLAlchemyError
from sqlalchemy.pool import StaticPool

from pathtune import _env

from ._errors import PerfDBError
from ._models import VERSION_TABLE

__all__ = ["resolve_url", "make_engine", "upgrade", "current_revision", "head_revision", "MIGRATIONS_DIR",
           "SQLITE_BUSY_TIMEOUT_MS", "SQLITE_READ_BUSY_TIMEOUT_MS", "safe_url"]

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
SQLITE_BUSY_TIMEOUT_MS = 30_000
# Read-only engines (the runtime dispatcher) wait at most this long for a lock, then fail: a kernel
# call falls back to its heuristic config rather than stall behind a tuning worker.
SQLITE_READ_BUSY_TIMEOUT_MS = 200


def safe_url(url: URL | str) -> str:
    """The URL with any password masked (for messages)."""
    try:
        return make_url(url).render_as_string(hide_password=True) if isinstance(url, str) else \
            url.render_as_string(hide_password=True)
    except ArgumentError:
        return str(url)


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
    # Read-only use: autocommit reads (no BEGIN IMMEDIATE, which takes the write lock), a short busy
    # timeout, no journal-mode change, and query_only so that a stray write fails instead of locking.
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    try:
        cur.execute(f"PRAGMA busy_timeout = {SQLITE_READ_BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA query_only = ON")
    finally:
        cur.close()


def _sqlite_begin(conn) -> None:  # noqa: ANN001 - SQLAlchemy event signature
    # IMMEDIATE: take the write lock up front, so a transaction that reads and then writes waits
    # (busy timeout) for other writers instead of failing with "database is locked".
    conn.exec_driver_sql("BEGIN IMMEDIATE")


def make_engine(url: URL, *, create_parent: bool = False, echo: bool = False, read_only: bool = False) -> Engine:
    """An engine for ``url``. ``read_only``: for lookups only (SQLite: short lock wait, query_only;
    PostgreSQL: a short connect timeout); the schema is neither created nor migrated."""
    backend = url.get_backend_name()
    if backend == "sqlite":
        database = url.database or ""
        in_memory = database in ("", ":memory:") or database.startswith("file::memory:")
        if not in_memory:
            parent = Path(database).expanduser().resolve().parent
            if create_parent:
                parent.mkdir(parents=True, exist_ok=True)
            elif not parent.is_dir():
                raise PerfDBError(f"cannot open {safe_url(url)}: directory {parent} does not exist")
        timeout_ms = SQLITE_READ_BUSY_TIMEOUT_MS if read_only else SQLITE_BUSY_TIMEOUT_MS
        kwargs = {"connect_args": {"timeout": timeout_ms / 1000}}
        if in_memory:
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
            return create_engine(url, echo=echo, pool_pre_ping=True, connect_args={"connect_timeout": 3})
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


def upgrade(engine: Engine, revision: str = "head") -> str:
    """Bring the perf_* tables to ``revision``; a no-op when already there. Returns the revision."""
    from alembic import command

    head = head_revision()
    try:
        current = current_revision(engine)
    except (DBAPIError, SQLAlchemyError) as e:
        raise PerfDBError(f"cannot open {safe_url(engine.url)}: {_short(e)}") from None
    if current is not None and current not in _known_revisions():
        raise PerfDBError(f"{safe_url(engine.url)} has perf_db schema revision {current!r}, which this pathtune "
                          f"does not know (its newest is {head!r}); upgrade pathtune")
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
