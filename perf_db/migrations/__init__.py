"""Alembic migrations of the perf_db tables (run by ``PerfDB.upgrade()``; see ``pathtune.perf_db._migrate``)."""
