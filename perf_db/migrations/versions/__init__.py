"""Alembic revisions of the perf_db schema, oldest first (``0001_initial``)."""
