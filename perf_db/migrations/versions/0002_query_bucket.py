"""perf_workload.query_bucket: a decode workload's new tokens per call (power-of-two bucket; 1 for every
row before it, and for fwd / bwd), and the perf_best view with it.

Revision ID: 0002_query_bucket
Revises: 0001_initial
Create Date: 2026-12-03
"""
from __future__ import annotations

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0002_query_bucket"
down_revision: Union[str, None] = "0001_initial"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

# Frozen copies: a migration never imports the live models.
_VIEW = """
CREATE VIEW perf_best AS
SELECT measurement_id, env_hash, env_key_schema, gpu_name, cc, cuda, ptxas, triton, tvm, driver, torch,
       op, "pass", backend, spec_hash, codegen_version, source_hash,
       workload_key_hash, key_json, key_schema, head_dim, head_dim_v, heads_q, heads_kv, dtype, use_gate,
       seq_bucket, batch_bucket, varlen,{query} config_json, config_hash, median_ms, p20_ms, p80_ms,
       baseline_ms, baseline_name, run_id, created_at
FROM (
    SELECT m.id AS measurement_id, e.env_hash, e.key_schema AS env_key_schema, e.gpu_name, e.cc, e.cuda,
           e.ptxas, e.triton, e.tvm, e.driver, e.torch,
           k.op, k."pass", k.backend, k.spec_hash, k.codegen_version, k.source_hash,
           w.key_hash AS workload_key_hash, w.key_json, w.key_schema, w.head_dim, w.head_dim_v, w.heads_q, w.heads_kv,
           w.dtype, w.use_gate, w.seq_bucket, w.batch_bucket, w.varlen,{w_query}
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


# A plain ALTER TABLE ADD / DROP COLUMN on every dialect (SQLite >= 3.35 drops columns in place), not a batch
# operation: SQLite's batch mode rebuilds perf_workload, and dropping the old table with foreign keys on fails
# once measurements reference its rows (every real database).
def upgrade() -> None:
    op.execute("DROP VIEW IF EXISTS perf_best")
    op.add_column("perf_workload", sa.Column("query_bucket", sa.Integer(), nullable=False, server_default=sa.text("1")))
    op.execute(_VIEW.format(query=" query_bucket,", w_query=" w.query_bucket,"))


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS perf_best")
    op.drop_column("perf_workload", "query_bucket")
    op.execute(_VIEW.format(query="", w_query=""))
