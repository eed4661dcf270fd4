"""perf_db on PostgreSQL. Runs only when PATHTUNE_TEST_PG_URL is set, e.g.

    pip install -e '.[postgres]'
    PATHTUNE_TEST_PG_URL=postgresql+psycopg://user:pw@localhost:5432/pathtune_test pytest tests/test_perf_db_postgres.py

Each test works in a fresh schema (created and dropped here), so the database may be shared.
Records are synthetic (GPU "TEST-GPU").
"""
import os
import threading

import pytest

PG_URL = os.environ.get("PATHTUNE_TEST_PG_URL")
pytestmark = pytest.mark.skipif(not PG_URL, reason="set PATHTUNE_TEST_PG_URL=postgresql+psycopg://... to run")

if PG_URL:
    from sqlalchemy import inspect

    from pathtune.perf_db import (
        DuplicateMeasurementError,
        KernelKey,
        Measurement,
        PerfDB,
        export_pack,
        load_pack,
        results_record,
        write_results,
    )
    from pathtune.specs import KnobSpace, Workload, load_spec

    SPEC = load_spec()
    ENV = {"gpu_name": "TEST-GPU", "gpu_count": 1, "compute_capability": "9.0", "sm_count": 132,
           "gpu_memory_bytes": 150_000_000_000, "driver": "550.54.15", "cuda_runtime": "12.4", "ptxas": "12.4.131",
           "torch": "2.5.1", "triton": "3.2.0", "tvm": None, "pathtune": "0.1.0", "host": "test-host"}


def kernel(backend="triton"):
    if backend == "sdpa":
        return KernelKey(pass_="fwd", backend="sdpa")
    return KernelKey(pass_="fwd", backend=backend, spec_hash=SPEC.hash, source_hash="src")


def wl(head_dim=64, seq=1024, gate=True):
    return Workload(head_dim, head_dim, 8, 2, "bfloat16", gate, "fwd", seq)


def cfg(**changes):
    return KnobSpace(SPEC, "fwd").default().replace(**changes)


def ok(ms, **kw):
    return Measurement(status="ok", median_ms=ms, p20_ms=ms, p80_ms=ms * 1.1, n_reps=10, **kw)


@pytest.fixture(autouse=True)
def _no_shipped(monkeypatch, tmp_path):
    monkeypatch.setenv("PATHTUNE_SHIPPED_DIR", str(tmp_path))


def test_upgrade_idempotent_own_version_table(pg_url):
    db = PerfDB(pg_url)
    assert db.revision() == "0002_query_bucket" and db.upgrade() == "0002_query_bucket"
    assert PerfDB(pg_url).revision() == "0002_query_bucket"
    names = set(inspect(db.engine).get_table_names())
    assert {"perf_measurement", "perf_alembic_version"} <= names and "alembic_version" not in names
    assert "perf_best" in inspect(db.engine).get_view_names()
    db.close()


def test_models_match_migrations(pg_url):
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from pathtune.perf_db._models import Base

    db = PerfDB(pg_url)

    def include_name(name, type_, parent_names):
        return type_ != "table" or (name.startswith("perf_") and name != "perf_alembic_version")

    with db.engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True, "include_name": include_name})
        assert compare_metadata(ctx, Base.metadata) == []
    db.close()


def test_record_best_overhead_gc_ingest(pg_url, tmp_path):
    db = PerfDB(pg_url)
    for seq, ms in ((1024, 1.0), (4096, 4.0)):
        db.record(ENV, kernel(), wl(seq=seq), cfg(), ok(ms), run_id="r1")
        db.record(ENV, kernel("sdpa"), wl(seq=seq, gate=False), {}, ok(ms / 2), run_id="r1")
    with pytest.raises(DuplicateMeasurementError):
        db.record(ENV, kernel(), wl(seq=1024), cfg(), ok(9.0), run_id="r1")
    assert db.lookup(ENV, kernel(), wl(seq=1024), cfg())["median_ms"] == 1.0
    assert db.best(ENV, "fwd", wl(seq=1024))["match"] == "exact"
    near = db.best(ENV, "fwd", wl(seq=2048))
    assert (near["match"], near["seq_bucket"]) == ("nearest", 4096)
    assert [r["ratio"] for r in db.overhead()] == [2.0, 2.0]
    assert db.gc(dry_run=True, env_info={**ENV, "triton": "3.3.0"}).total == 2
    assert db.gc(dry_run=False, env_info={**ENV, "triton": "3.3.0"}).total == 2
    assert db.counts()["perf_measurement"] == 2

    path = write_results(tmp_path / "r.json", [results_record(ENV, kernel(), wl(128), cfg(), ok(2.0), run_id="r2")],
                         runs=[{"run_id": "r2", "command": "synthetic"}])
    assert db.ingest(path).added == 1 and db.ingest(path).identical == 1
    pack = tmp_path / "pack.json"
    export_pack(db, "TEST-GPU", pack)
    assert load_pack(pack).lookup(wl(128), "fwd", ENV).match == "exact"
    # warm start: the same key's ok records under other kernel sources
    db.record(ENV, KernelKey(pass_="fwd", backend="triton", spec_hash=SPEC.hash, source_hash="src-old"), wl(128),
              cfg(num_warps=8), ok(0.9), run_id="r3")
    assert [r["config_hash"] for r in db.retired(ENV, kernel(), wl(128))] == [cfg(num_warps=8).hash]
    db.close()


def test_concurrent_writers_share_env_kernel_workload_rows(pg_url):
    PerfDB(pg_url).close()
    errors = []

    def worker(i):
        try:
            db = PerfDB(pg_url)
            for j in range(5):
                db.record(ENV, kernel(), wl(), cfg(num_warps=(2, 4, 8)[j % 3]), ok(1.0 + i + j), run_id=f"w{i}-{j}")
            db.close()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    counts = PerfDB(pg_url).counts()
    assert counts["perf_measurement"] == 20 and counts["perf_env"] == 1 and counts["perf_workload"] == 1


def test_optuna_rdb_storage_on_the_same_database(pg_url):
    optuna = pytest.importorskip("optuna")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    db = PerfDB(pg_url)
    study = optuna.create_study(storage=pg_url, study_name="pg-test")
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    assert PerfDB(pg_url).revision() == "0002_query_bucket"
    assert len(optuna.load_study(study_name="pg-test", storage=pg_url).trials) == 2
    names = set(inspect(db.engine).get_table_names())
    assert {"alembic_version", "perf_alembic_version", "studies"} <= names
    db.close()
