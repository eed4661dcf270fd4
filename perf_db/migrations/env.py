"""Alembic environment of perf_db.

Runs with the connection that ``pathtune.perf_db._migrate`` hands over in
``config.attributes["connection"]`` (or an engine built from ``sqlalchemy.url`` otherwise).
perf_db keeps its own version table, ``perf_alembic_version``, and only ever looks at ``perf_*``
tables, so Optuna's tables (and its ``alembic_version``) can live in the same database.
"""
from __future__ import annotations

from alembic import context
from sqlalchemy import engine_from_config, pool

from pathtune.perf_db._models import VERSION_TABLE, Base

config = context.config
target_metadata = Base.metadata


def include_name(name, type_, parent_names):  # noqa: ANN001 - alembic hook signature
    """Autogenerate sees perf_* tables only (never Optuna's, never the perf_best view)."""
    if type_ == "table":
        return bool(name) and name.startswith("perf_") and name not in (VERSION_TABLE, "perf_best")
    return True


def _configure(**kwargs) -> None:
    context.configure(target_metadata=target_metadata, version_table=VERSION_TABLE, include_name=include_name,
                      render_as_batch=True, compare_type=True, **kwargs)


def run_migrations_offline() -> None:
    _configure(url=config.get_main_option("sqlalchemy.url"), literal_binds=True,
               dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection=connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = engine_from_config(config.get_section(config.config_ini_section, {}), prefix="sqlalchemy.",
                                poolclass=pool.NullPool)
    with engine.connect() as connection:
        _configure(connection=connection)
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
