"""perf_db initial schema: perf_env, perf_kernel, perf_workload, perf_run, perf_measurement,
perf_ingest and the perf_best view.

Revision ID: 0001_initial
Revises:
Create Date: 2025-01-01
"""
from __future__ import annotations

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0001_initial"
down_revision: Union[str, None] = None
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

# Frozen copies: a migration never imports the live models.
TZ = sa.DateTime(timezone=True)

BEST_VIEW = """
CREATE VIEW perf_best AS
SELECT measurement_id, env_hash, env_key_schema, gpu_name, cc, cuda, ptxas, triton, tvm, driver, torch,
       op, "pass", backend, spec_hash, codegen_version, source_hash,
       workload_key_hash, key_json, key_schema, head_dim, head_dim_v, heads_q, heads_kv, dtype, use_gate,
       seq_bucket, batch_bucket, varlen, config_json, config_hash, median_ms, p20_ms, p80_ms,
       baseline_ms, baseline_name, run_id, created_at
FROM (
    SELECT m.id AS measurement_id, e.env_hash, e.key_schema AS env_key_schema, e.gpu_name, e.cc, e.cuda,
           e.ptxas, e.triton, e.tvm, e.driver, e.torch,
           k.op, k."pass", k.backend, k.spec_hash, k.codegen_version, k.source_hash,
           w.key_hash AS workload_key_hash, w.key_json, w.key_schema, w.head_dim, w.head_dim_v, w.heads_q, w.heads_kv,
           w.dtype, w.use_gate, w.seq_bucket, w.batch_bucket, w.varlen,
           m.config_json, m.config_hash, m.median_ms, m.p20_ms, m.p80_ms, m.baseline_ms, m.baseline_name,
           m.run_id, m.created_at,
           ROW_NUMBER() OVER (PARTITION BY e.env_hash, m.kernel_id, m.workload_id
                              ORDER BY m.median_ms ASC, m.created_at DESC, m.id DESC) AS rank_in_group
    FROM perf_measurement m
    JOIN perf_env e ON e.id = m.env_id
    JOIN perf_kernel k ON k.id = m.kernel_id
    JOIN perf_workload w ON w.id = m.workload_id
    WHERE m.status = 'ok'
) ranked
WHERE rank_in_group = 1
"""


def upgrade() -> None:
    op.create_table(
        "perf_env",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("env_hash", sa.String(64), nullable=False),
        sa.Column("key_schema", sa.Integer(), nullable=False),
        sa.Column("gpu_name", sa.String(128), nullable=False),
        sa.Column("cc", sa.String(16), nullable=True),
        sa.Column("sm_count", sa.Integer(), nullable=True),
        sa.Column("mem_bytes", sa.BigInteger(), nullable=True),
        sa.Column("driver", sa.String(64), nullable=True),
        sa.Column("cuda", sa.String(64), nullable=True),
        sa.Column("ptxas", sa.String(64), nullable=True),
        sa.Column("triton", sa.String(64), nullable=True),
        sa.Column("tvm", sa.String(64), nullable=True),
        sa.Column("torch", sa.String(64), nullable=True),
        sa.Column("pathtune", sa.String(64), nullable=True),
        sa.Column("host", sa.String(255), nullable=True),
        sa.Column("info_json", sa.Text(), nullable=False),
        sa.Column("created_at", TZ, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_perf_env"),
        sa.UniqueConstraint("fingerprint", name="uq_perf_env_fingerprint"),
    )
    op.create_index("ix_perf_env_env_hash", "perf_env", ["env_hash"])
    op.create_index("ix_perf_env_gpu_name", "perf_env", ["gpu_name"])

    op.create_table(
        "perf_kernel",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("op", sa.String(64), nullable=False),
        sa.Column("pass", sa.String(16), nullable=False),
        sa.Column("backend", sa.String(16), nullable=False),
        sa.Column("spec_hash", sa.String(64), nullable=False),
        sa.Column("codegen_version", sa.String(64), nullable=False),
        sa.Column("source_hash", sa.String(64), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_perf_kernel"),
        sa.UniqueConstraint("op", "pass", "backend", "spec_hash", "codegen_version", "source_hash",
                            name="uq_perf_kernel_key"),
        sa.CheckConstraint("backend IN ('triton', 'tvm', 'sdpa', 'fla', 'reference')", name="ck_perf_kernel_backend"),
        sa.CheckConstraint("pass IN ('fwd', 'bwd', 'decode')", name="ck_perf_kernel_pass"),
    )

    op.create_table(
        "perf_workload",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key_hash", sa.String(64), nullable=False),
        sa.Column("key_json", sa.Text(), nullable=False),
        sa.Column("key_schema", sa.Integer(), nullable=False),
        sa.Column("head_dim", sa.Integer(), nullable=False),
        sa.Column("head_dim_v", sa.Integer(), nullable=False),
        sa.Column("heads_q", sa.Integer(), nullable=False),
        sa.Column("heads_kv", sa.Integer(), nullable=False),
        sa.Column("gqa_group", sa.Integer(), nullable=False),
        sa.Column("dtype", sa.String(16), nullable=False),
        sa.Column("use_gate", sa.Boolean(), nullable=False),
        sa.Column("pass", sa.String(16), nullable=False),
        sa.Column("seq_bucket", sa.Integer(), nullable=False),
        sa.Column("batch_bucket", sa.Integer(), nullable=False),
        sa.Column("varlen", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_perf_workload"),
        sa.UniqueConstraint("key_hash", name="uq_perf_workload_key_hash"),
    )
    op.create_index("ix_perf_workload_head_dim", "perf_workload", ["head_dim"])
    op.create_index("ix_perf_workload_dtype", "perf_workload", ["dtype"])
    op.create_index("ix_perf_workload_seq_bucket", "perf_workload", ["seq_bucket"])
    op.create_index("ix_perf_workload_shape", "perf_workload",
                    ["pass", "head_dim", "head_dim_v", "heads_q", "heads_kv", "dtype", "use_gate", "varlen",
                     "batch_bucket", "seq_bucket"])

    op.create_table(
        "perf_run",
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("started_at", TZ, nullable=False),
        sa.Column("command", sa.Text(), nullable=True),
        sa.Column("host", sa.String(255), nullable=True),
        sa.Column("notes", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("run_id", name="pk_perf_run"),
    )

    op.create_table(
        "perf_measurement",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("env_id", sa.Integer(), nullable=False),
        sa.Column("kernel_id", sa.Integer(), nullable=False),
        sa.Column("workload_id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("config_json", sa.Text(), nullable=False),
        sa.Column("config_hash", sa.String(64), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("median_ms", sa.Float(), nullable=True),
        sa.Column("p20_ms", sa.Float(), nullable=True),
        sa.Column("p80_ms", sa.Float(), nullable=True),
        sa.Column("n_reps", sa.Integer(), nullable=True),
        sa.Column("bench_method", sa.String(64), nullable=True),
        sa.Column("errors_json", sa.Text(), nullable=True),
        sa.Column("max_rel_err", sa.Float(), nullable=True),
        sa.Column("baseline_ms", sa.Float(), nullable=True),
        sa.Column("baseline_name", sa.String(64), nullable=True),
        sa.Column("study_name", sa.String(255), nullable=True),
        sa.Column("trial_number", sa.Integer(), nullable=True),
        sa.Column("command", sa.Text(), nullable=True),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("created_at", TZ, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_perf_measurement"),
        sa.ForeignKeyConstraint(["env_id"], ["perf_env.id"], name="fk_perf_measurement_env_id_perf_env",
                                ondelete="RESTRICT"),
        sa.ForeignKeyConstraint(["kernel_id"], ["perf_kernel.id"], name="fk_perf_measurement_kernel_id_perf_kernel",
                                ondelete="RESTRICT"),
        sa.ForeignKeyConstraint(["workload_id"], ["perf_workload.id"],
                                name="fk_perf_measurement_workload_id_perf_workload", ondelete="RESTRICT"),
        sa.ForeignKeyConstraint(["run_id"], ["perf_run.run_id"], name="fk_perf_measurement_run_id_perf_run",
                                ondelete="RESTRICT"),
        sa.UniqueConstraint("env_id", "kernel_id", "workload_id", "config_hash", "run_id",
                            name="uq_perf_measurement_key"),
        sa.CheckConstraint("status IN ('ok', 'compile_error', 'out_of_resources', 'wrong', 'crash', 'timeout')",
                           name="ck_perf_measurement_status"),
        sa.CheckConstraint("status != 'ok' OR median_ms IS NOT NULL", name="ck_perf_measurement_ok_has_time"),
    )
    op.create_index("ix_perf_measurement_lookup", "perf_measurement",
                    ["env_id", "kernel_id", "workload_id", "median_ms"])
    op.create_index("ix_perf_measurement_run_id", "perf_measurement", ["run_id"])
    op.create_index("ix_perf_measurement_status", "perf_measurement", ["status"])
    op.create_index("ix_perf_measurement_study_name", "perf_measurement", ["study_name"])
    op.create_index("ix_perf_measurement_created_at", "perf_measurement", ["created_at"])

    op.create_table(
        "perf_ingest",
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("ingested_at", TZ, nullable=False),
        sa.Column("n_records", sa.Integer(), nullable=False),
        sa.Column("n_added", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("sha256", name="pk_perf_ingest"),
    )

    op.execute(BEST_VIEW)


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS perf_best")
    op.drop_table("perf_ingest")
    op.drop_table("perf_measurement")
    op.drop_table("perf_run")
    op.drop_table("perf_workload")
    op.drop_table("perf_kernel")
    op.drop_table("perf_env")
