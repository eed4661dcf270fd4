"""SQLAlchemy 2.x models of the perf_db tables (all prefixed ``perf_``).

The schema itself is owned by the Alembic migrations in ``migrations/versions``; these classes
must describe exactly what the migrations create (a test compares them with
``alembic.autogenerate.compare_metadata``). Change both together, through a new revision.
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Optional

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
    UniqueConstraint,
    bindparam,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

__all__ = ["Base", "EnvRow", "KernelRow", "WorkloadRow", "RunRow", "MeasurementRow", "IngestRow", "best_view",
           "best_without", "STATUSES", "BACKENDS", "PASSES", "VERSION_TABLE", "utcnow"]

# Frozen here (and in the initial migration): a new value needs a new revision.
STATUSES = ("ok", "compile_error", "out_of_resources", "wrong", "crash", "timeout")
BACKENDS = ("triton", "tvm", "sdpa", "fla", "reference")
PASSES = ("fwd", "bwd", "decode")
VERSION_TABLE = "perf_alembic_version"

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class UTCDateTime(TypeDecorator):
    """Timezone-aware UTC datetimes on every backend (SQLite stores them naive; we add UTC back)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: Optional[datetime], dialect: Any) -> Optional[datetime]:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: perf_db stores timezone-aware UTC times")
        value = value.astimezone(timezone.utc)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Optional[datetime], dialect: Any) -> Optional[datetime]:
        if value is None:
            return None
        return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class EnvRow(Base):
    """One recorded environment: the hard keys (``env_hash``) plus soft keys, host and sizes.

    ``env_hash`` is ``pathtune.fingerprint.env_hash`` (hard keys only), so hosts that share
    GPU, CUDA, ptxas, Triton and TVM share it while their drivers or torch builds may differ; each
    distinct full record is one row, unique by ``fingerprint`` (sha256 of every column below).
    """

    __tablename__ = "perf_env"

    id: Mapped[int] = mapped_column(primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(64), unique=True)
    env_hash: Mapped[str] = mapped_column(String(64), index=True)
    key_schema: Mapped[int] = mapped_column(Integer)
    gpu_name: Mapped[str] = mapped_column(String(128), index=True)
    cc: Mapped[Optional[str]] = mapped_column(String(16))
    sm_count: Mapped[Optional[int]] = mapped_column(Integer)
    mem_bytes: Mapped[Optional[int]] = mapped_column(BigInteger)
    driver: Mapped[Optional[str]] = mapped_column(String(64))
    cuda: Mapped[Optional[str]] = mapped_column(String(64))
    ptxas: Mapped[Optional[str]] = mapped_column(String(64))
    triton: Mapped[Optional[str]] = mapped_column(String(64))
    tvm: Mapped[Optional[str]] = mapped_column(String(64))
    torch: Mapped[Optional[str]] = mapped_column(String(64))
    pathtune: Mapped[Optional[str]] = mapped_column(String(64))
    host: Mapped[Optional[str]] = mapped_column(String(255))
    info_json: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class KernelRow(Base):
    """What was measured: op, pass, backend and the hashes that pin the generated code."""

    __tablename__ = "perf_kernel"
    __table_args__ = (
        UniqueConstraint("op", "pass", "backend", "spec_hash", "codegen_version", "source_hash",
                         name="uq_perf_kernel_key"),
        CheckConstraint("backend IN ('triton', 'tvm', 'sdpa', 'fla', 'reference')", name="backend"),
        CheckConstraint("pass IN ('fwd', 'bwd', 'decode')", name="pass"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    op: Mapped[str] = mapped_column(String(64))
    pass_: Mapped[str] = mapped_column("pass", String(16))
    backend: Mapped[str] = mapped_column(String(16))
    spec_hash: Mapped[str] = mapped_column(String(64))
    codegen_version: Mapped[str] = mapped_column(String(64))
    source_hash: Mapped[str] = mapped_column(String(64))


class WorkloadRow(Base):
    """A ``pathtune.specs.Workload``: its canonical key and one typed, indexed column per field."""

    __tablename__ = "perf_workload"
    __table_args__ = (
        Index("ix_perf_workload_shape", "pass", "head_dim", "head_dim_v", "heads_q", "heads_kv", "dtype",
              "use_gate", "varlen", "batch_bucket", "seq_bucket"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    key_json: Mapped[str] = mapped_column(Text)
    key_schema: Mapped[int] = mapped_column(Integer)
    head_dim: Mapped[int] = mapped_column(Integer, index=True)
    head_dim_v: Mapped[int] = mapped_column(Integer)
    heads_q: Mapped[int] = mapped_column(Integer)
    heads_kv: Mapped[int] = mapped_column(Integer)
    gqa_group: Mapped[int] = mapped_column(Integer)
    dtype: Mapped[str] = mapped_column(String(16), index=True)
    use_gate: Mapped[bool] = mapped_column(Boolean)
    pass_: Mapped[str] = mapped_column("pass", String(16))
    seq_bucket: Mapped[int] = mapped_column(Integer, index=True)
    batch_bucket: Mapped[int] = mapped_column(Integer)
    varlen: Mapped[bool] = mapped_column(Boolean)
    query_bucket: Mapped[int] = mapped_column(Integer, server_default=text("1"))   # decode: new tokens per call


class RunRow(Base):
    """One tuning or benchmark run: measurements taken together (and so comparable with each other)."""

    __tablename__ = "perf_run"

    run_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    command: Mapped[Optional[str]] = mapped_column(Text)
    host: Mapped[Optional[str]] = mapped_column(String(255))
    notes: Mapped[Optional[str]] = mapped_column(Text)


class MeasurementRow(Base):
    """One timed (or failed) config of one kernel on one workload in one environment and run."""

    __tablename__ = "perf_measurement"
    __table_args__ = (
        UniqueConstraint("env_id", "kernel_id", "workload_id", "config_hash", "run_id", name="uq_perf_measurement_key"),
        Index("ix_perf_measurement_lookup", "env_id", "kernel_id", "workload_id", "median_ms"),
        CheckConstraint("status IN ('ok', 'compile_error', 'out_of_resources', 'wrong', 'crash', 'timeout')",
                        name="status"),
        CheckConstraint("status != 'ok' OR median_ms IS NOT NULL", name="ok_has_time"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    env_id: Mapped[int] = mapped_column(ForeignKey("perf_env.id", ondelete="RESTRICT"))
    kernel_id: Mapped[int] = mapped_column(ForeignKey("perf_kernel.id", ondelete="RESTRICT"))
    workload_id: Mapped[int] = mapped_column(ForeignKey("perf_workload.id", ondelete="RESTRICT"))
    run_id: Mapped[str] = mapped_column(ForeignKey("perf_run.run_id", ondelete="RESTRICT"), index=True)
    config_json: Mapped[str] = mapped_column(Text)
    config_hash: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(32), index=True)
    median_ms: Mapped[Optional[float]] = mapped_column(Float)
    p20_ms: Mapped[Optional[float]] = mapped_column(Float)
    p80_ms: Mapped[Optional[float]] = mapped_column(Float)
    n_reps: Mapped[Optional[int]] = mapped_column(Integer)
    bench_method: Mapped[Optional[str]] = mapped_column(String(64))
    errors_json: Mapped[Optional[str]] = mapped_column(Text)
    max_rel_err: Mapped[Optional[float]] = mapped_column(Float)
    baseline_ms: Mapped[Optional[float]] = mapped_column(Float)
    baseline_name: Mapped[Optional[str]] = mapped_column(String(64))
    study_name: Mapped[Optional[str]] = mapped_column(String(255), index=True)
    trial_number: Mapped[Optional[int]] = mapped_column(Integer)
    command: Mapped[Optional[str]] = mapped_column(Text)
    message: Mapped[Optional[str]] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)


class IngestRow(Base):
    """A results file already ingested (by content hash), so shipped files are read once."""

    __tablename__ = "perf_ingest"

    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(255))
    ingested_at: Mapped[datetime] = mapped_column(UTCDateTime)
    n_records: Mapped[int] = mapped_column(Integer)
    n_added: Mapped[int] = mapped_column(Integer)


# The ``perf_best`` view (created by the migrations): the fastest ok measurement per
# (env_hash, kernel, workload). Declared on its own MetaData so create_all / compare never touch it.
_view_md = MetaData()
best_view = Table(
    "perf_best", _view_md,
    Column("measurement_id", Integer), Column("env_hash", String), Column("env_key_schema", Integer),
    Column("gpu_name", String), Column("cc", String),
    Column("cuda", String), Column("ptxas", String), Column("triton", String), Column("tvm", String),
    Column("driver", String), Column("torch", String), Column("op", String), Column("pass", String),
    Column("backend", String), Column("spec_hash", String), Column("codegen_version", String),
    Column("source_hash", String), Column("workload_key_hash", String), Column("key_json", Text),
    Column("key_schema", Integer), Column("head_dim", Integer), Column("head_dim_v", Integer),
    Column("heads_q", Integer), Column("heads_kv", Integer),
    Column("dtype", String), Column("use_gate", Boolean), Column("seq_bucket", Integer),
    Column("batch_bucket", Integer), Column("varlen", Boolean), Column("query_bucket", Integer),
    Column("config_json", Text),
    Column("config_hash", String), Column("median_ms", Float), Column("p20_ms", Float), Column("p80_ms", Float),
    Column("baseline_ms", Float), Column("baseline_name", String), Column("run_id", String),
    Column("created_at", UTCDateTime),
)


# The perf_best view's query (migrations/versions/0002_query_bucket.py) with the measurements of some runs left out
# before the ranking, so that each group's fastest among the others is what remains.
_BEST_WITHOUT = """
SELECT measurement_id, env_hash, env_key_schema, gpu_name, cc, cuda, ptxas, triton, tvm, driver, torch,
       op, "pass", backend, spec_hash, codegen_version, source_hash,
       workload_key_hash, key_json, key_schema, head_dim, head_dim_v, heads_q, heads_kv, dtype, use_gate,
       seq_bucket, batch_bucket, varlen, query_bucket, config_json, config_hash, median_ms, p20_ms, p80_ms,
       baseline_ms, baseline_name, run_id, created_at
FROM (
    SELECT m.id AS measurement_id, e.env_hash, e.key_schema AS env_key_schema, e.gpu_name, e.cc, e.cuda,
           e.ptxas, e.triton, e.tvm, e.driver, e.torch,
           k.op, k."pass", k.backend, k.spec_hash, k.codegen_version, k.source_hash,
           w.key_hash AS workload_key_hash, w.key_json, w.key_schema, w.head_dim, w.head_dim_v, w.heads_q, w.heads_kv,
           w.dtype, w.use_gate, w.seq_bucket, w.batch_bucket, w.varlen, w.query_bucket,
           m.config_json, m.config_hash, m.median_ms, m.p20_ms, m.p80_ms, m.baseline_ms, m.baseline_name,
           m.run_id, m.created_at,
           ROW_NUMBER() OVER (PARTITION BY e.env_hash, m.kernel_id, m.workload_id
                              ORDER BY m.median_ms ASC, m.created_at DESC, m.id DESC) AS rank_in_group
    FROM perf_measurement m
    JOIN perf_env e ON e.id = m.env_id
    JOIN perf_kernel k ON k.id = m.kernel_id
    JOIN perf_workload w ON w.id = m.workload_id
    WHERE m.status = 'ok' AND m.run_id NOT IN :left_out
) ranked
WHERE rank_in_group = 1
"""


def best_without(run_ids: Any) -> Any:
    """``best_view`` (same columns) ranked without the measurements of ``run_ids``: the fastest ok measurement per
    (env_hash, kernel, workload) among the other runs' (``best_view`` itself when ``run_ids`` is empty)."""
    runs = sorted(run_ids)
    if not runs:
        return best_view
    query = text(_BEST_WITHOUT).bindparams(bindparam("left_out", value=runs, expanding=True))
    return query.columns(*best_view.c).subquery("perf_best")
