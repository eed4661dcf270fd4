"""perf_db on SQLite files in tmp_path, with synthetic records (GPU "TEST-GPU"; nothing here is a
real measurement)."""
import json
import math
import sqlite3
import warnings

import pytest
from sqlalchemy import inspect, select, text

from pathtune.perf_db import (
    DuplicateMeasurementError,
    KernelKey,
    Measurement,
    PackMismatch,
    PerfDB,
    PerfDBError,
    ResultsFormatError,
    SoftMismatchWarning,
    export_pack,
    load_pack,
    results_record,
    write_results,
)
from pathtune.perf_db._models import best_view
from pathtune.runtime.environment import env_hash
from pathtune.specs import KnobSpace, Workload, load_spec

SPEC = load_spec()
SRC = "src-current"
GPU = "TEST-GPU"


def make_env(gpu=GPU, cc="9.0", triton="3.2.0", tvm=None, cuda="12.4", ptxas="12.4.131", driver="550.54.15",
             torch="2.5.1", host="test-host"):
    return {"gpu_name": gpu, "gpu_count": 1, "compute_capability": cc, "sm_count": 132,
            "gpu_memory_bytes": 150_000_000_000, "driver": driver, "cuda_runtime": cuda, "ptxas": ptxas,
            "torch": torch, "triton": triton, "tvm": tvm, "tvm_ffi": None, "pathtune": "0.1.0", "python": "3.11.0",
            "platform": "test", "host": host}


ENV = make_env()
HEAD = "0002_query_bucket"


def current_keys(op, pass_, backend):
    if backend in ("triton", "tvm"):
        return {"spec_hash": SPEC.hash, "source_hash": SRC}
    return None


def kernel(backend="triton", pass_="fwd", source=SRC):
    if backend in ("triton", "tvm"):
        return KernelKey(pass_=pass_, backend=backend, spec_hash=SPEC.hash, codegen_version="cg1", source_hash=source)
    return KernelKey(pass_=pass_, backend=backend)


def wl(head_dim=64, seq=1024, pass_="fwd", dtype="bfloat16", gate=True, heads=(8, 2), batch=1):
    return Workload(head_dim, head_dim, heads[0], heads[1], dtype, gate, pass_, seq, batch_bucket=batch)


def cfg(**changes):
    return KnobSpace(SPEC, "fwd").default().replace(**changes)


def ok(ms, **kw):
    return Measurement(status="ok", median_ms=ms, p20_ms=ms * 0.98, p80_ms=ms * 1.03, n_reps=50,
                       bench_method="synthetic", errors={"o": 1e-3}, **kw)


pytestmark = pytest.mark.usefixtures("isolated_perf_db")


@pytest.fixture
def url(tmp_path):
    return f"sqlite:///{tmp_path / 'perf.sqlite3'}"


@pytest.fixture
def db(url):
    with PerfDB(url, current_keys=current_keys) as d:
        yield d


# ---------------------------------------------------------------------------------------------------
# record / lookup

def test_record_lookup_and_never_overwrite(db):
    mid = db.record(ENV, kernel(), wl(), cfg(), ok(1.0), run_id="run-a")
    row = db.lookup(env_hash(ENV), kernel(), wl(), cfg().hash)
    assert row["id"] == mid and row["median_ms"] == 1.0 and row["status"] == "ok" and row["run_id"] == "run-a"
    assert row["errors"] == {"o": 1e-3} and row["max_rel_err"] == 1e-3 and row["gpu"] == GPU
    assert db.lookup(ENV, kernel(), wl(), cfg())["id"] == mid          # env info dict, Config object
    assert db.lookup(ENV, kernel(), wl(), cfg(num_warps=8)) is None    # another config was never measured

    with pytest.raises(DuplicateMeasurementError, match="never overwritten"):
        db.record(ENV, kernel(), wl(), cfg(), ok(0.5), run_id="run-a")
    assert db.record(ENV, kernel(), wl(), cfg(), ok(0.5), run_id="run-a", on_conflict="skip") == mid
    assert db.lookup(ENV, kernel(), wl(), cfg())["median_ms"] == 1.0   # the stored fact is unchanged
    with pytest.raises(PerfDBError, match="on_conflict"):
        db.record(ENV, kernel(), wl(), cfg(), ok(0.5), run_id="run-a", on_conflict="overwrite")

    # a new run may measure the same config again; lookup returns the newest
    mid2 = db.record(ENV, kernel(), wl(), cfg(), ok(0.9), run_id="run-b")
    assert db.lookup(ENV, kernel(), wl(), cfg())["id"] == mid2


def test_failed_measurements_are_recorded_and_found(db):
    db.record(ENV, kernel(), wl(), cfg(num_warps=8), Measurement(status="out_of_resources", message="smem 300 KiB"))
    db.record(ENV, kernel(), wl(), cfg(num_warps=2), Measurement(status="wrong", median_ms=0.7,
                                                                 errors={"o": float("nan")}))
    row = db.lookup(ENV, kernel(), wl(), cfg(num_warps=8))
    assert row["status"] == "out_of_resources" and row["median_ms"] is None and row["message"] == "smem 300 KiB"
    wrong = db.lookup(ENV, kernel(), wl(), cfg(num_warps=2))
    assert wrong["errors"] == {"o": "inf"} and wrong["max_rel_err"] == "inf"
    assert db.best(ENV, "fwd", wl()) is None  # failures are never served
    # the default run: one per PerfDB, with the command line
    assert row["run_id"] == db.run_id and row["command"]


@pytest.mark.parametrize("bad, match", [
    (dict(status="fast"), "status"),
    (dict(status="ok"), "needs median_ms"),
    (dict(status="ok", median_ms=-1.0), "positive"),
    (dict(status="ok", median_ms=1.0, p20_ms=2.0), "p20_ms"),
    (dict(status="ok", median_ms=1.0, errors={"o": float("inf")}), "non-finite"),
])
def test_measurement_validation(bad, match):
    with pytest.raises(PerfDBError, match=match):
        Measurement(**bad)


def test_record_rejects_inconsistent_keys(db):
    with pytest.raises(PerfDBError, match="kernel pass"):
        db.record(ENV, kernel(pass_="bwd"), wl(pass_="fwd"), cfg(), ok(1.0))
    with pytest.raises(PerfDBError, match="lacks"):
        db.record({"gpu_name": GPU}, kernel(), wl(), cfg(), ok(1.0))
    with pytest.raises(PerfDBError, match="backend"):
        KernelKey(pass_="fwd", backend="cuda")
    with pytest.raises(PerfDBError, match="workload"):
        db.record(ENV, kernel(), {"head_dim": 64}, cfg(), ok(1.0))


# ---------------------------------------------------------------------------------------------------
# best

def test_best_exact_then_nearest_bucket(db):
    for seq, ms in ((256, 0.2), (1024, 0.8), (4096, 3.0)):
        db.record(ENV, kernel(), wl(seq=seq), cfg(num_warps=4), ok(ms))
        db.record(ENV, kernel(), wl(seq=seq), cfg(num_warps=8), ok(ms * 1.1))
        db.record(ENV, kernel("sdpa"), wl(seq=seq), {}, ok(ms / 10))  # never served when backend is None
    db.record(ENV, kernel(), wl(seq=1024), cfg(num_warps=2), Measurement(status="crash"))

    exact = db.best(env_hash(ENV), "fwd", wl(seq=1024))
    assert exact["match"] == "exact" and exact["seq_bucket"] == 1024 and exact["median_ms"] == 0.8
    assert exact["config"]["num_warps"] == 4 and exact["backend"] == "triton" and exact["warning"] is None

    # 2048: 1024 and 4096 are both one octave away -> the larger bucket wins the tie
    mid = db.best(env_hash(ENV), "fwd", wl(seq=2048))
    assert (mid["match"], mid["seq_bucket"], mid["requested_seq_bucket"]) == ("nearest", 4096, 2048)
    assert db.best(env_hash(ENV), "fwd", wl(seq=512))["seq_bucket"] == 1024
    assert db.best(env_hash(ENV), "fwd", wl(seq=16))["seq_bucket"] == 256
    assert db.best(env_hash(ENV), "fwd", wl(seq=65536))["seq_bucket"] == 4096
    # everything else must match exactly
    assert db.best(env_hash(ENV), "fwd", wl(head_dim=128)) is None
    assert db.best(env_hash(ENV), "fwd", wl(dtype="float16")) is None
    assert db.best(env_hash(ENV), "fwd", wl(gate=False)) is None
    assert db.best(env_hash(ENV), "fwd", wl(batch=2)) is None
    assert db.best(env_hash(make_env(gpu="OTHER-GPU")), "fwd", wl()) is None
    # an explicit backend
    assert db.best(env_hash(ENV), "fwd", wl(), backend="sdpa")["backend"] == "sdpa"
    assert db.best(env_hash(ENV), "fwd", wl(), backend="tvm") is None
    with pytest.raises(PerfDBError, match="pass"):
        db.best(env_hash(ENV), "bwd", wl())


def test_best_view_agrees_with_best(db):
    for warps, ms in ((2, 1.3), (4, 1.1), (8, 1.2)):
        db.record(ENV, kernel(), wl(), cfg(num_warps=warps), ok(ms))
    with db.engine.connect() as conn:
        rows = conn.execute(select(best_view).where(best_view.c.backend == "triton")).mappings().all()
    assert len(rows) == 1 and rows[0]["median_ms"] == 1.1
    assert json.loads(rows[0]["config_json"])["num_warps"] == 4
    assert db.best(ENV, "fwd", wl())["measurement_id"] == rows[0]["measurement_id"]


def test_staleness_hard_and_soft_keys(db):
    db.record(ENV, kernel(), wl(), cfg(), ok(1.0))
    db.record(ENV, kernel(source="src-old"), wl(), cfg(num_warps=8), ok(0.5))  # faster, but old code

    best = db.best(env_hash(ENV), "fwd", wl())
    assert best["median_ms"] == 1.0 and best["kernel"]["source_hash"] == SRC  # stale source never served

    # hard keys: another Triton, CUDA, GPU or cc -> not served
    for change in (dict(triton="3.3.0"), dict(cuda="12.6"), dict(gpu="OTHER"), dict(cc="8.0")):
        assert db.best(make_env(**change), "fwd", wl()) is None, change
    # TVM is not a hard key of Triton results (given env info; an env_hash string is matched exactly)
    with_tvm = make_env(tvm="0.27.0")
    assert db.best(with_tvm, "fwd", wl())["median_ms"] == 1.0
    assert db.best(env_hash(with_tvm), "fwd", wl()) is None

    # soft keys: served, flagged
    soft = db.best(make_env(driver="560.1", torch="2.6.0"), "fwd", wl())
    assert soft["median_ms"] == 1.0 and soft["warning"]
    assert soft["soft_mismatch"] == {"driver": {"stored": "550.54.15", "current": "560.1"},
                                     "torch": {"stored": "2.5.1", "current": "2.6.0"}}
    # ptxas is soft too: torch's inductor switches Triton to the ptxas in torch's wheel mid-process
    other_ptxas = db.best(make_env(ptxas="13.0.88"), "fwd", wl())
    assert other_ptxas["median_ms"] == 1.0
    assert other_ptxas["soft_mismatch"] == {"ptxas": {"stored": "12.4.131", "current": "13.0.88"}}
    assert "ptxas 12.4.131 (now 13.0.88)" in other_ptxas["warning"]

    # a spec change retires everything of the old spec
    newer = PerfDB(str(db.url), current_keys=lambda op, p, b: {"spec_hash": "f" * 64} if b == "triton" else None)
    assert newer.best(ENV, "fwd", wl()) is None

    rows = db.query(backend="triton")
    assert sorted(bool(r["stale"]) for r in rows) == [False, True]
    assert any("source_hash" in reason for r in rows for reason in r["stale"])
    assert len(db.query(backend="triton", include_stale=False)) == 1


# ---------------------------------------------------------------------------------------------------
# query / overhead

def _overhead_fixture(db):
    # D=64: baselines carried on the measurement itself
    db.record(ENV, kernel(), wl(64, 1024), cfg(num_warps=4), ok(1.2, baseline_ms=1.0), run_id="r1")
    db.record(ENV, kernel(), wl(64, 1024), cfg(num_warps=8), ok(1.5, baseline_ms=1.0), run_id="r1")
    # D=128: an sdpa-backend measurement in the same run, without the gate (SDPA has none)
    db.record(ENV, kernel(), wl(128, 1024), cfg(), ok(3.0), run_id="r2")
    db.record(ENV, kernel("sdpa"), wl(128, 1024, gate=False), {}, ok(2.0), run_id="r2")
    # D=256: SDPA only from another run -> not comparable, left out
    db.record(ENV, kernel(), wl(256, 1024), cfg(), ok(5.0), run_id="r3")
    db.record(ENV, kernel("sdpa"), wl(256, 1024), {}, ok(2.0), run_id="r4")
    # another GPU and pass
    db.record(make_env(gpu="TEST-GPU-B"), kernel(pass_="bwd"), wl(64, 1024, pass_="bwd"),
              cfg(), ok(4.0, baseline_ms=2.0, baseline_name="sdpa_flash"), run_id="r5")


def test_overhead_rows(db):
    _overhead_fixture(db)
    rows = db.overhead(by="head_dim")
    assert [(r["gpu"], r["pass"], r["head_dim"]) for r in rows] == [
        (GPU, "fwd", 64), (GPU, "fwd", 128), ("TEST-GPU-B", "bwd", 64)]
    r64, r128, rb = rows
    assert (r64["pathtune_ms"], r64["sdpa_ms"], r64["ratio"]) == (1.2, 1.0, 1.2)  # fastest paired config
    assert r64["config"]["num_warps"] == 4 and r64["seq_len"] == 1024 and r64["backend"] == "triton"
    assert (r128["sdpa_ms"], r128["ratio"], r128["baseline_name"]) == (2.0, 1.5, "sdpa (same run)")
    assert rb["ratio"] == 2.0
    for r in rows:
        assert {"gpu", "head_dim", "pass", "seq_len", "backend", "pathtune_ms", "sdpa_ms", "ratio"} <= set(r)
        assert math.isclose(r["ratio"], r["pathtune_ms"] / r["sdpa_ms"])
    assert [r["head_dim"] for r in db.overhead(gpu="test-gpu-b")] == [64]
    assert [r["pass"] for r in db.overhead(pass_="bwd")] == ["bwd"]
    with pytest.raises(PerfDBError, match="--by"):
        db.overhead(by="colour")


def test_query_filters_and_order(db):
    _overhead_fixture(db)
    assert len(db.query()) == 7
    assert {r["head_dim"] for r in db.query(head_dim=128)} == {128}
    assert {r["backend"] for r in db.query(backend="sdpa")} == {"sdpa"}
    assert {r["gpu"] for r in db.query(gpu="gpu-b")} == {"TEST-GPU-B"}
    assert db.query(dtype="float16") == []
    assert len(db.query(limit=2)) == 2
    fastest = db.query(order="fastest")
    assert [r["median_ms"] for r in fastest] == sorted(r["median_ms"] for r in fastest)
    assert db.query(run_id="r2", backend="triton")[0]["head_dim"] == 128
    json.dumps(db.query())  # JSON-ready
    with pytest.raises(PerfDBError, match="status"):
        db.query(status="fine")


# ---------------------------------------------------------------------------------------------------
# gc

def test_gc_dry_run_then_delete(db):
    db.record(ENV, kernel(), wl(), cfg(), ok(1.0), run_id="keep")
    db.record(ENV, kernel(source="src-old"), wl(), cfg(), ok(1.0), run_id="old-src")
    old_triton = make_env(triton="3.1.0")
    db.record(old_triton, kernel(), wl(), cfg(), ok(1.0), run_id="old-triton")
    db.record(old_triton, kernel("sdpa"), wl(), {}, ok(0.5), run_id="old-triton")      # Triton is not its key
    db.record(make_env(gpu="TEST-GPU-B", triton="3.1.0"), kernel(), wl(), cfg(), ok(1.0), run_id="other-gpu")
    before = db.counts()

    report = db.gc(dry_run=True, env_info=ENV)
    assert report.dry_run and report.total == 2
    assert report.reasons == {"source_hash changed": 1, "triton version changed on this GPU": 1}
    assert report.orphans["perf_run"] == 1 and report.orphans["perf_kernel"] == 1  # old-src run and kernel
    assert report.orphans["perf_env"] == 0  # the old-triton env still holds the sdpa result
    assert db.counts() == before

    real = db.gc(dry_run=False, env_info=ENV)
    assert real.total == 2 and not real.dry_run
    after = db.counts()
    assert after["perf_measurement"] == before["perf_measurement"] - 2
    assert after["perf_run"] == before["perf_run"] - 1 and after["perf_kernel"] == before["perf_kernel"] - 1
    assert {r["run_id"] for r in db.query()} == {"keep", "old-triton", "other-gpu"}
    assert db.gc(dry_run=True, env_info=ENV).total == 0


def test_withdrawn_runs_are_kept_but_never_served(db, monkeypatch):
    """A run whose measurements are known to be of other configs than recorded (``WITHDRAWN_RUNS``): its rows
    stay (``gc`` keeps them, ``query`` lists them as stale with the reason) but ``best`` and the tuner's
    ``lookup`` never answer with them."""
    from pathtune.perf_db import _keys

    monkeypatch.setitem(_keys.WITHDRAWN_RUNS, "run-bad", "withdrawn: timed another config")
    db.record(ENV, kernel(), wl(), cfg(), ok(1.0), run_id="run-good")
    db.record(ENV, kernel(), wl(), cfg(num_warps=8), ok(0.5), run_id="run-bad")
    best = db.best(env_hash(ENV), "fwd", wl())
    assert best["median_ms"] == 1.0 and best["config"]["num_warps"] != 8
    assert db.lookup(ENV, kernel(), wl(), cfg(num_warps=8)) is None
    assert db.lookup(ENV, kernel(), wl(), cfg())["run_id"] == "run-good"
    stale = {r["run_id"]: r["stale"] for r in db.query(include_stale=True)}
    assert stale == {"run-good": [], "run-bad": ["withdrawn: timed another config"]}
    assert {r["run_id"] for r in db.query(include_stale=False)} == {"run-good"}
    assert db.gc(dry_run=True, env_info=ENV).total == 0
    # nor does a new study warm-start from one (retired sources)
    db.record(ENV, kernel(source="src-old"), wl(), cfg(num_warps=2), ok(0.4), run_id="run-bad")
    db.record(ENV, kernel(source="src-old"), wl(), cfg(num_warps=4), ok(0.6), run_id="run-old")
    assert [r["config"]["num_warps"] for r in db.retired(ENV, kernel(), wl())] == [4]


def test_withdrawn_runs_name_the_withdrawn_tune_file():
    """The withdrawal list names exactly the runs of the withdrawn H100 bwd tune (shipped, so that every database
    holds it), so none of its records is served."""
    from pathlib import Path

    from pathtune.perf_db._keys import WITHDRAWN_RUNS

    path = Path(__file__).parents[1] / "perf_db/shipped/H100-20261206T093612Z-bwd-tune.json"
    runs = {r["run_id"] for r in json.loads(path.read_text())["records"]}
    assert runs and runs == set(WITHDRAWN_RUNS)


# ---------------------------------------------------------------------------------------------------
# ingest

def _results_file(path, runs=("gpu-run-1",), n=3, ms=1.0):
    records = [results_record(ENV, kernel(), wl(seq=256 << i), cfg(), ok(ms * (i + 1), baseline_ms=0.5),
                              run_id=runs[0]) for i in range(n)]
    records.append(results_record(ENV, kernel("sdpa"), wl(seq=256), {}, ok(0.5), run_id=runs[0]))
    return write_results(path, records, runs=[{"run_id": runs[0], "command": "pathtune tune --synthetic",
                                               "host": "test-host", "started_at": "2025-01-01T00:00:00Z"}])


def test_ingest_is_idempotent_and_atomic(db, tmp_path):
    path = _results_file(tmp_path / "results.json")
    first = db.ingest(path)
    assert (first.records, first.added, first.identical, first.already_ingested) == (4, 4, 0, False)
    again = db.ingest(path)
    assert (again.added, again.identical, again.already_ingested) == (0, 4, True)
    assert db.counts()["perf_measurement"] == 4
    assert db.query(run_id="gpu-run-1", limit=1)[0]["command"] == "pathtune tune --synthetic"

    # the same keys with other numbers: refused as a whole, or skipped on request
    changed = _results_file(tmp_path / "changed.json", ms=2.0)
    with pytest.raises(DuplicateMeasurementError, match="nothing from this file was stored"):
        db.ingest(changed)
    assert db.counts()["perf_measurement"] == 4
    skipped = db.ingest(changed, on_conflict="skip")
    assert (skipped.added, skipped.skipped, skipped.identical) == (0, 3, 1)  # the sdpa record did not change
    assert db.best(ENV, "fwd", wl(seq=256))["median_ms"] == 1.0


def test_ingest_bare_list_and_errors(db, tmp_path):
    records = [results_record(ENV, kernel(), wl(), cfg(), ok(1.0), run_id="x")]
    del records[0]["run_id"]
    path = tmp_path / "bare.json"
    path.write_text(json.dumps(records))
    assert db.ingest(path).added == 1
    assert db.ingest(path).identical == 1  # run id derived from the file's content: stable
    assert db.query()[0]["run_id"].startswith("file-")

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "pathtune-results", "version": 1,
                               "records": [{"env": ENV, "run_id": "r", "kernel": {"pass": "fwd", "backend": "triton"},
                                            "workload": wl().to_dict(), "config": {},
                                            "measurement": {"status": "ok"}}]}))
    with pytest.raises(ResultsFormatError, match=r"records\[0\].*median_ms"):
        db.ingest(bad)
    bad.write_text("{not json")
    with pytest.raises(ResultsFormatError, match="not JSON"):
        db.ingest(bad)
    with pytest.raises(PerfDBError, match="cannot read"):
        db.ingest(tmp_path / "missing.json")


def test_open_default_ingests_shipped_once(url, tmp_path, monkeypatch):
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    _results_file(shipped / "TEST-GPU-gpu-run-1.json")
    monkeypatch.setenv("PATHTUNE_SHIPPED_DIR", str(shipped))
    monkeypatch.setenv("PATHTUNE_DB_URL", url)
    db = PerfDB.open_default(current_keys=current_keys)
    assert db.counts()["perf_measurement"] == 4 and db.counts()["perf_ingest"] == 1
    newer = lambda op, pass_, backend: {"source_hash": "newer"} if backend == "triton" else None  # noqa: E731
    assert db.gc(dry_run=False, current_keys=newer, env_info=ENV).total == 3
    again = PerfDB.open_default(current_keys=current_keys)  # pruned shipped rows are not re-ingested
    assert again.counts()["perf_measurement"] == 1


def test_retired_matches_other_sources_of_the_same_key_only(db, tmp_path):
    """PerfDB.retired (SQL) and shipped_retired (results files, read directly) apply one rule: same env
    (dispatcher's per-backend hard keys), op, pass, backend, spec hash and workload key; another source
    hash; status ok."""
    from pathtune.perf_db._retired import shipped_retired

    old = kernel(source="src-old")
    facts = [
        (ENV, old, wl(), cfg(num_warps=8), ok(1.0)),                                   # yes
        (ENV, old, wl(), cfg(num_warps=2), ok(0.9)),                                   # yes
        (ENV, kernel(source="src-older"), wl(), cfg(num_stages=3), ok(1.1)),           # yes: any other source
        (make_env(driver="999.1", torch="9.9"), old, wl(), cfg(block_n=128), ok(1.3)),  # yes: soft keys differ
        (make_env(tvm="0.20"), old, wl(), cfg(block_m=64), ok(1.4)),                   # yes: TVM is not Triton's key
        (ENV, kernel(), wl(), cfg(chunk_size=128), ok(0.5)),                           # no: the current source
        (ENV, old, wl(seq=2048), cfg(chunk_size=32), ok(0.5)),                         # no: another length bucket
        (ENV, old, wl(heads=(8, 8)), cfg(chunk_size=32), ok(0.5)),                     # no: other heads
        (ENV, kernel(pass_="bwd", source="src-old"), wl(pass_="bwd"), KnobSpace(SPEC, "bwd").default(),
         ok(0.5)),                                                                     # no: another pass
        (ENV, kernel("tvm", source="src-old"), wl(), cfg(), ok(0.5)),                  # no: another backend
        (ENV, KernelKey(pass_="fwd", backend="triton", spec_hash="other-spec", codegen_version="cg1",
                        source_hash="src-old"), wl(), cfg(), ok(0.5)),                 # no: another spec
        (make_env(triton="3.3.0"), old, wl(), cfg(), ok(0.2)),                         # no: another Triton
        (make_env(gpu="TEST-GPU-B"), old, wl(), cfg(), ok(0.2)),                       # no: another GPU
        (make_env(cuda="12.8"), old, wl(), cfg(), ok(0.2)),                            # no: another CUDA
        (ENV, old, wl(), cfg(chunk_size=32), Measurement(status="wrong", errors={"o": 0.5})),  # no: failed the gate
        (ENV, old, wl(), cfg(num_stages=4), Measurement(status="out_of_resources")),           # no: failed
    ]
    for env, k, w, c, m in facts:
        db.record(env, k, w, c, m)
    want = {cfg(num_warps=8).hash, cfg(num_warps=2).hash, cfg(num_stages=3).hash, cfg(block_n=128).hash,
            cfg(block_m=64).hash}
    rows = db.retired(ENV, kernel(), wl())
    assert {r["config_hash"] for r in rows} == want and len(rows) == 5
    r = next(r for r in rows if r["config_hash"] == cfg(num_stages=3).hash)
    assert (r["source_hash"], r["median_ms"], r["config"]) == ("src-older", 1.1, cfg(num_stages=3).to_dict())
    assert r["origin"].startswith("perf_db #") and r["created_at"] is not None
    # an env_hash string matches exactly (hard keys, TVM's included): soft-key differences still match
    assert {r["config_hash"] for r in db.retired(env_hash(ENV), kernel(), wl())} == want - {cfg(block_m=64).hash}

    # the same facts in a results file, read without a database: the same rows
    path = write_results(tmp_path / "TEST-GPU-20250102T030405Z-x.json",
                         [results_record(env, k, w, c, m, run_id="run-1") for env, k, w, c, m in facts],
                         runs=[{"run_id": "run-1", "command": "pathtune tune --synthetic"}])
    from_file = shipped_retired(ENV, kernel(), wl(), files=[path])
    assert sorted((r["config_hash"], r["median_ms"], r["source_hash"]) for r in from_file) == \
        sorted((r["config_hash"], r["median_ms"], r["source_hash"]) for r in rows)
    assert all(r["origin"] == f"shipped/{path.name}" for r in from_file)
    assert {r["created_at"].isoformat() for r in from_file} == {"2025-01-02T03:04:05+00:00"}  # the name's time
    assert shipped_retired(ENV, kernel(), wl(), files=[tmp_path / "missing.json"]) == []


# ---------------------------------------------------------------------------------------------------
# packs

@pytest.fixture
def packed(db, tmp_path):
    for seq in (256, 1024, 4096):
        db.record(ENV, kernel(), wl(seq=seq), cfg(num_warps=4), ok(seq / 1000))
        db.record(ENV, kernel(), wl(seq=seq), cfg(num_warps=8), ok(seq / 900))
    db.record(ENV, kernel(), wl(head_dim=128, seq=1024), cfg(num_warps=8), ok(2.0))
    db.record(ENV, kernel(source="src-old"), wl(head_dim=32), cfg(), ok(0.1))  # stale: not exported
    db.record(make_env(gpu="TEST-GPU-B"), kernel(), wl(), cfg(), ok(0.1))     # another GPU
    path = tmp_path / "pack.json"
    doc = export_pack(db, GPU, path)
    return path, doc


def test_pack_export_and_round_trip(packed, tmp_path):
    path, doc = packed
    meta = doc["_metadata"]
    assert (meta["gpu_name"], meta["cc"], meta["triton"], meta["spec_hash"]) == (GPU, "9.0", "3.2.0", SPEC.hash)
    for key in ("pathtune", "tvm", "torch", "cuda", "created_at"):
        assert key in meta
    assert len(doc["entries"]) == 4 and {e["workload"]["head_dim"] for e in doc["entries"]} == {64, 128}
    entry = doc["entries"][0]
    assert {"workload", "pass", "backend", "config", "median_ms", "source_hash"} <= set(entry)
    assert doc["default"]["fwd"]["config"]["num_warps"] == 4 and doc["default"]["fwd"]["wins"] == 3

    on_disk = json.loads(path.read_text())
    assert on_disk == doc
    pack = load_pack(path)
    assert pack.to_dict() == on_disk
    copy = pack.save(tmp_path / "copy.json")
    assert json.loads(copy.read_text()) == on_disk and load_pack(copy).entries == pack.entries


def test_pack_lookup_exact_nearest_default(packed):
    pack = load_pack(packed[0])
    hit = pack.lookup(wl(seq=1024), "fwd", ENV)
    assert (hit.match, hit.seq_bucket, hit.config["num_warps"], hit.median_ms) == ("exact", 1024, 4, 1.024)
    near = pack.lookup(wl(seq=2048), "fwd", ENV)
    assert (near.match, near.seq_bucket) == ("nearest", 4096)
    # no entry for D=32 (only a stale one existed): the pass default, valid for D=32 under the spec
    default = pack.lookup(wl(head_dim=32), "fwd", ENV)
    assert default.match == "default" and default.config["num_warps"] == 4 and default.median_ms is None
    assert pack.lookup(wl(pass_="bwd"), "bwd", ENV) is None  # no bwd results, no bwd default
    assert pack.lookup(wl(), "fwd", ENV, backend="tvm") is None
    with pytest.raises(PerfDBError, match="pass"):
        pack.lookup(wl(), "bwd", ENV)
    # current source hashes: entries of other code are skipped
    assert pack.lookup(wl(), "fwd", ENV, current_keys=lambda *a: {"source_hash": "newer"}).match == "default"


def test_pack_decode_entries_per_query_bucket(db, tmp_path):
    """A pack's decode entries serve their own token-count bucket only; the decode default, which comes
    from one-token records, serves no call of several tokens (one-token picks can be slower there)."""
    dcfg = KnobSpace(SPEC, "decode").default()

    def dwl(tokens, seq=4096):
        return Workload(64, 64, 8, 8, "bfloat16", True, "decode", seq, batch_bucket=8, query_bucket=tokens)
    db.record(ENV, kernel(pass_="decode"), dwl(1), dcfg.replace(decode_splits=2), ok(0.30))
    db.record(ENV, kernel(pass_="decode"), dwl(16), dcfg.replace(decode_splits=8), ok(0.50))
    doc = export_pack(db, GPU, tmp_path / "pack.json")
    assert sorted(e["workload"].get("query_bucket", 1) for e in doc["entries"]) == [1, 16]
    assert doc["default"]["decode"]["workloads"] == 1           # from the one-token key only
    pack = load_pack(tmp_path / "pack.json")
    assert pack.lookup(dwl(16), "decode", ENV).config["decode_splits"] == 8
    assert pack.lookup(dwl(16, seq=8192), "decode", ENV).match == "nearest"
    assert pack.lookup(dwl(1, seq=8192), "decode", ENV).config["decode_splits"] == 2
    assert pack.lookup(dwl(4), "decode", ENV) is None          # no 4-token entry, and no default for it


def test_pack_mismatch_hard_and_soft(packed):
    pack = load_pack(packed[0])
    for change, name, ours in ((dict(gpu="NVIDIA H100"), "GPU name", "NVIDIA H100"),
                               (dict(cc="8.0"), "compute capability", "8.0"),
                               (dict(triton="3.3.1"), "Triton major.minor", "3.3")):
        with pytest.raises(PackMismatch) as err:
            pack.lookup(wl(), "fwd", make_env(**change))
        message = str(err.value)
        assert name in message and ours in message, message
    with pytest.raises(PackMismatch, match="spec hash"):
        pack.lookup(wl(), "fwd", ENV, spec_hash="0" * 64)
    with pytest.warns(SoftMismatchWarning, match="torch 2.5.1 \\(now 2.6.0\\)"):
        hit = pack.lookup(wl(), "fwd", make_env(triton="3.2.1", torch="2.6.0"))
    assert hit.match == "exact"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pack.lookup(wl(), "fwd", ENV)  # exact environment: no warning


def test_export_errors(db, tmp_path):
    with pytest.raises(PerfDBError, match="no measurements for a GPU matching"):
        export_pack(db, "H200", tmp_path / "p.json")
    db.record(ENV, kernel(), wl(), cfg(), ok(1.0))
    db.record(make_env(gpu="TEST-GPU-B"), kernel(), wl(), cfg(), ok(1.0))
    with pytest.raises(PerfDBError, match="several GPUs"):
        export_pack(db, "test", tmp_path / "p.json")
    assert export_pack(db, "test-gpu", None)["_metadata"]["gpu_name"] == GPU  # exact name wins


# ---------------------------------------------------------------------------------------------------
# schema, migrations, engines

def test_upgrade_is_idempotent_with_own_version_table(url, tmp_path):
    db = PerfDB(url)
    assert db.revision() == HEAD
    assert db.upgrade() == HEAD and PerfDB(url).revision() == HEAD
    names = set(inspect(db.engine).get_table_names())
    assert {"perf_env", "perf_kernel", "perf_workload", "perf_measurement", "perf_run", "perf_ingest",
            "perf_alembic_version"} <= names
    assert "alembic_version" not in names  # Optuna's name stays free
    assert "perf_best" in inspect(db.engine).get_view_names()
    with db.engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM perf_alembic_version")).scalar() == HEAD


def test_models_match_migrations(db):
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from pathtune.perf_db._models import Base

    def include_name(name, type_, parent_names):
        return type_ != "table" or (name.startswith("perf_") and name != "perf_alembic_version")

    with db.engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True, "include_name": include_name})
        assert compare_metadata(ctx, Base.metadata) == []


def test_downgrade_and_upgrade_again(url):
    from alembic import command

    from pathtune.perf_db._engine import _alembic_config

    db = PerfDB(url)
    with db.engine.begin() as conn:
        command.downgrade(_alembic_config(conn), "base")
    assert db.revision() is None and "perf_measurement" not in inspect(db.engine).get_table_names()
    assert db.upgrade() == HEAD


def test_query_bucket_migration_keeps_the_one_token_rows(url):
    """A database of revision 0001 (no query_bucket) upgraded to the head: its rows read query_bucket 1, keep
    their key (a one-token key's JSON never names the field) and are still served; a 16-token decode record
    lands on its own key, and each bucket is served only its own records."""
    from alembic import command

    from pathtune.perf_db._engine import _alembic_config

    dcfg = KnobSpace(SPEC, "decode").default()
    one = Workload(64, 64, 8, 8, "bfloat16", True, "decode", 4096, batch_bucket=8)
    sixteen = Workload(64, 64, 8, 8, "bfloat16", True, "decode", 4096, batch_bucket=8, query_bucket=16)
    assert one.key() == sixteen.key().replace(',"query_bucket":16', "") and '"query_bucket"' not in one.key()
    db = PerfDB(url, auto_upgrade=False)
    with db.engine.begin() as conn:
        command.upgrade(_alembic_config(conn), "0001_initial")
    with db.engine.begin() as conn:   # a row written by the 0001 code: no query_bucket column
        conn.execute(text("INSERT INTO perf_workload (key_hash, key_json, key_schema, head_dim, head_dim_v, heads_q, "
                          "heads_kv, gqa_group, dtype, use_gate, pass, seq_bucket, batch_bucket, varlen) VALUES "
                          "(:h, :j, 1, 64, 64, 8, 8, 1, 'bfloat16', 1, 'decode', 4096, 8, 0)"),
                     {"h": one.key_hash, "j": one.key()})
    assert db.revision() == "0001_initial"
    db = PerfDB(url, current_keys=current_keys)
    assert db.revision() == HEAD
    with db.engine.connect() as conn:
        assert conn.execute(text("SELECT query_bucket FROM perf_workload")).scalar() == 1
    db.record(ENV, kernel(pass_="decode"), one, dcfg.replace(decode_splits=2), ok(0.30))
    db.record(ENV, kernel(pass_="decode"), sixteen, dcfg.replace(decode_splits=8), ok(0.50))
    with db.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM perf_workload")).scalar() == 2   # the old row was reused
    assert db.best(ENV, "decode", one)["config"]["decode_splits"] == 2
    assert db.best(ENV, "decode", sixteen)["config"]["decode_splits"] == 8
    four = Workload(64, 64, 8, 8, "bfloat16", True, "decode", 4096, batch_bucket=8, query_bucket=4)
    assert db.best(ENV, "decode", four) is None          # no 4-token records: neither bucket's pick is served
    assert {r["query_bucket"] for r in db.query(pass_="decode")} == {1, 16}


def test_query_bucket_migration_with_measurements_both_ways(url):
    """A real database: measurements reference its workloads (foreign keys on).  Down to 0001 and up to the head
    again, every row stays, keeps its id and is still served (a batch rebuild of perf_workload failed here)."""
    from alembic import command

    from pathtune.perf_db._engine import _alembic_config

    dcfg = KnobSpace(SPEC, "decode").default()
    one = Workload(64, 64, 8, 8, "bfloat16", True, "decode", 4096, batch_bucket=8)
    db = PerfDB(url, current_keys=current_keys)
    db.record(ENV, kernel(pass_="decode"), one, dcfg.replace(decode_splits=2), ok(0.30))
    db.record(ENV, kernel(pass_="decode"), one, dcfg.replace(decode_splits=4), ok(0.40))
    before = sorted((r["id"], r["median_ms"]) for r in db.query(pass_="decode"))
    with db.engine.begin() as conn:
        command.downgrade(_alembic_config(conn), "0001_initial")
    assert db.revision() == "0001_initial"
    with db.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM perf_measurement")).scalar() == 2
        assert conn.execute(text("PRAGMA foreign_key_check")).fetchall() == []
    db = PerfDB(url, current_keys=current_keys)
    assert db.revision() == HEAD
    assert sorted((r["id"], r["median_ms"]) for r in db.query(pass_="decode")) == before
    assert db.best(ENV, "decode", one)["config"]["decode_splits"] == 2


def test_unknown_newer_revision_is_refused(url):
    db = PerfDB(url)
    with db.engine.begin() as conn:
        conn.execute(text("UPDATE perf_alembic_version SET version_num = '9999_future'"))
    with pytest.raises(PerfDBError, match="does not know"):
        PerfDB(url)


def test_sqlite_wal_and_busy_timeout(db):
    with db.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1


def test_optuna_storage_coexists_on_one_sqlite_file(url, tmp_path):
    optuna = pytest.importorskip("optuna")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    db = PerfDB(url, current_keys=current_keys)
    study = optuna.create_study(storage=url, study_name="pathtune-test", direction="minimize")

    def objective(trial):
        warps = trial.suggest_categorical("num_warps", [2, 4, 8])
        ms = {2: 1.5, 4: 1.0, 8: 1.2}[warps]
        db.record(ENV, kernel(), wl(), cfg(num_warps=warps),
                  ok(ms, study_name=study.study_name, trial_number=trial.number), on_conflict="skip")
        return ms

    study.optimize(objective, n_trials=4)
    reopened = PerfDB(url, current_keys=current_keys)  # our upgrade leaves Optuna's schema alone
    assert optuna.load_study(study_name="pathtune-test", storage=url).best_value == study.best_value
    assert reopened.best(ENV, "fwd", wl())["median_ms"] == study.best_value
    names = set(inspect(reopened.engine).get_table_names())
    assert {"studies", "trials", "alembic_version", "perf_alembic_version", "perf_measurement"} <= names
    con = sqlite3.connect(tmp_path / "perf.sqlite3")
    assert con.execute("SELECT version_num FROM alembic_version").fetchone()[0] != "0001_initial"
    con.close()

    # the other order: Optuna first, then perf_db
    url2 = f"sqlite:///{tmp_path / 'optuna-first.sqlite3'}"
    optuna.create_study(storage=url2, study_name="first").optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1)
    assert PerfDB(url2).revision() == HEAD
    assert len(optuna.load_study(study_name="first", storage=url2).trials) == 1


def test_url_resolution(monkeypatch, tmp_path):
    from pathtune import _env
    from pathtune.perf_db import resolve_url

    url, is_default = resolve_url(None)
    assert is_default and str(url) == _env.default_db_url() and str(url).endswith("perf.sqlite3")
    monkeypatch.setenv("PATHTUNE_DB_URL", f"sqlite:///{tmp_path}/env.sqlite3")
    assert str(resolve_url(None)[0]).endswith("env.sqlite3") and not resolve_url(None)[1]
    assert str(resolve_url(f"sqlite:///{tmp_path}/arg.sqlite3")[0]).endswith("arg.sqlite3")  # argument wins
    with pytest.raises(PerfDBError, match="not a database URL"):
        resolve_url("::nonsense::")
    with pytest.raises(PerfDBError, match="does not exist"):
        PerfDB(f"sqlite:///{tmp_path}/missing/dir/x.sqlite3")
    with PerfDB("sqlite://") as memory:  # in memory, one shared connection
        memory.record(ENV, kernel(), wl(), cfg(), ok(1.0))
        assert memory.best(ENV, "fwd", wl())["median_ms"] == 1.0


def test_postgres_without_driver_says_how_to_install():
    pytest.importorskip("sqlalchemy")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("psycopg is installed")
    with pytest.raises(PerfDBError, match=r"pip install 'pathtune\[postgres\]'"):
        PerfDB("postgresql+psycopg://user:secret@localhost/pathtune")
    try:
        PerfDB("postgresql+psycopg://user:secret@localhost/pathtune")
    except PerfDBError as e:
        assert "secret" not in str(e)


def test_import_is_light():
    import subprocess
    import sys

    code = ("import sys, pathtune.perf_db, pathtune.cli; "
            "bad = [m for m in ('sqlalchemy', 'alembic', 'optuna', 'torch', 'matplotlib') if m in sys.modules]; "
            "assert not bad, bad")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_ingest_is_all_or_nothing(db, tmp_path):
    db.record(ENV, kernel(), wl(seq=512), cfg(), ok(1.0), run_id="gpu-run-1")
    records = [results_record(ENV, kernel(), wl(seq=256), cfg(), ok(1.0), run_id="gpu-run-1"),   # new
               results_record(ENV, kernel(), wl(seq=512), cfg(), ok(7.0), run_id="gpu-run-1")]   # conflicts
    path = write_results(tmp_path / "r.json", records)
    with pytest.raises(DuplicateMeasurementError):
        db.ingest(path)
    assert db.counts()["perf_measurement"] == 1 and db.lookup(ENV, kernel(), wl(seq=256), cfg()) is None
    report = db.ingest(path, on_conflict="skip")
    assert (report.added, report.skipped) == (1, 1) and db.ingested(report.sha256)


def test_concurrent_writers_on_one_sqlite_file(url):
    import threading

    PerfDB(url).close()
    errors = []

    def worker(i):
        try:
            with PerfDB(url) as d:
                for j in range(8):
                    d.record(ENV, kernel(), wl(), cfg(num_warps=(2, 4, 8)[j % 3]), ok(1.0 + j), run_id=f"w{i}-{j}")
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    counts = PerfDB(url).counts()
    assert (counts["perf_measurement"], counts["perf_env"], counts["perf_kernel"], counts["perf_workload"]) == \
        (32, 1, 1, 1)
