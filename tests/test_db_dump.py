"""`pathtune db dump` / PerfDB.dump_results: a database's rows back into a results file, on SQLite files
in tmp_path with synthetic records (GPU "TEST-GPU"; nothing here is a real measurement), plus a copy of
a real H200 session database when this machine has one."""
import json
import math
import os
import shutil
from datetime import datetime, timezone
from pathlib import Path

import pytest
from sqlalchemy import select, update
from typer.testing import CliRunner

from pathtune.cli import app
from pathtune.perf_db import KernelKey, Measurement, PerfDB, PerfDBError, results_record, write_results
from pathtune.perf_db._models import RunRow
from pathtune.perf_db._results import read_results
from pathtune.perf_db._shipped import SHIPPED_DIR
from pathtune.specs import KnobSpace, Workload, load_spec

SPEC = load_spec()
SRC = "src-current"
runner = CliRunner()
ENV = {"gpu_name": "TEST-GPU", "gpu_count": 1, "compute_capability": "9.0", "sm_count": 132,
       "gpu_memory_bytes": 150_000_000_000, "driver": "550.54.15", "cuda_runtime": "12.4", "ptxas": "12.4.131",
       "torch": "2.5.1", "triton": "3.2.0", "tvm": None, "tvm_ffi": "0.1.0", "pathtune": "0.1.0",
       "python": "3.11.0", "platform": "test", "host": "test-host"}
OTHER_GPU = {**ENV, "gpu_name": "OTHER-GPU", "host": "other-host"}
RUN_A, RUN_B = "20250101T120000Z-test-host-aaaaaaaa", "20250102T080000Z-test-host-bbbbbbbb"
CMD_A = "pathtune tune specs/path_attention.yaml --head-dim 64 --trials 3"
CMD_B = "pathtune bench --pass decode --backends triton,tvm --tvm-modules /x --record"
# a real GPU session's database (the perf.sqlite3 a `pathtune bench --record` or tune call brought back), if given
SESSION_DB = Path(os.environ.get("PATHTUNE_TEST_SESSION_DB", "") or "/nonexistent")
SHIPPED_TVM = SHIPPED_DIR / "H200-20261130T041036Z-tvm-decode.json"


def current_keys(op, pass_, backend):
    return {"spec_hash": SPEC.hash, "source_hash": SRC} if backend in ("triton", "tvm") else None


def kernel(backend="triton", pass_="fwd", source=SRC):
    if backend in ("triton", "tvm"):
        return KernelKey(pass_=pass_, backend=backend, spec_hash=SPEC.hash, codegen_version="1", source_hash=source)
    return KernelKey(pass_=pass_, backend=backend)


def wl(head_dim=64, seq=1024, pass_="fwd", gate=True):
    return Workload(head_dim, head_dim, 8, 2 if pass_ != "decode" else 8, "bfloat16", gate, pass_, seq,
                    batch_bucket=8 if pass_ == "decode" else 1)


def cfg(pass_="fwd", **changes):
    return KnobSpace(SPEC, pass_).default().replace(**changes)


def ok(ms, **kw):
    return Measurement(status="ok", median_ms=ms, p20_ms=ms * 0.98, p80_ms=ms * 1.03, n_reps=50,
                       bench_method="synthetic", errors={"o": 1e-3, "k": 2e-6}, **kw)


pytestmark = pytest.mark.usefixtures("isolated_perf_db")


@pytest.fixture
def src(tmp_path):
    """Two runs, two GPUs' worth of env, three backends, three passes, ok and failed statuses, one stale
    kernel source, one ok kernel whose baseline is a separate same-run SDPA measurement."""
    url = f"sqlite:///{tmp_path / 'src.sqlite3'}"
    with PerfDB(url, current_keys=current_keys) as db:
        db.start_run(CMD_A, "synthetic tune", run_id=RUN_A, host="test-host",
                     started_at=datetime(2025, 1, 1, 12, 0, tzinfo=timezone.utc))
        db.start_run(CMD_B, None, run_id=RUN_B, host="test-host",
                     started_at=datetime(2025, 1, 2, 8, 0, 0, 123456, tzinfo=timezone.utc))
        db.record(ENV, kernel(), wl(64), cfg(), ok(1.25, baseline_ms=1.0, baseline_name="sdpa_flash",
                                                   study_name="s-fwd", trial_number=3), run_id=RUN_A)
        db.record(ENV, kernel(), wl(64), cfg(num_warps=8), Measurement(status="compile_error",
                                                                       message="ptxas: too many registers",
                                                                       study_name="s-fwd", trial_number=4),
                  run_id=RUN_A)
        db.record(ENV, kernel(), wl(128), cfg(), Measurement(status="wrong", median_ms=2.0,
                                                             errors={"o": math.inf, "dq": 0.5}), run_id=RUN_A)
        db.record(ENV, kernel(), wl(64, seq=4096), cfg(), ok(4.5), run_id=RUN_A)        # baseline: the SDPA row
        db.record(ENV, kernel("sdpa"), wl(64, seq=4096, gate=False), {}, ok(3.0), run_id=RUN_A)
        db.record(ENV, kernel("sdpa"), wl(128, seq=4096, gate=False), {}, ok(6.0), run_id=RUN_A)  # no kernel uses it
        db.record(ENV, kernel(source="src-old"), wl(64, seq=2048), cfg(), ok(2.5, baseline_ms=2.0), run_id=RUN_A)
        db.record(OTHER_GPU, kernel(), wl(64), cfg(), ok(0.9, baseline_ms=0.8), run_id=RUN_A)
        dec = wl(128, seq=32768, pass_="decode", gate=False)
        db.record(ENV, kernel("triton", "decode"), dec, cfg("decode"), ok(0.62, baseline_ms=0.28,
                                                                          baseline_name="sdpa_flash"), run_id=RUN_B)
        db.record(ENV, kernel("tvm", "decode"), dec, cfg("decode", decode_splits=8), ok(0.41, baseline_ms=0.28,
                                                                                        baseline_name="sdpa_flash"),
                  run_id=RUN_B)
        db.record(ENV, kernel("tvm", "decode"), dec, cfg("decode", decode_splits=4),
                  Measurement(status="crash", message="CUDA error: misaligned address"), run_id=RUN_B)
    return url


def facts(url, **filters):
    """Every stored measurement as the comparable facts a round trip must keep (not the row ids)."""
    with PerfDB(url, current_keys=None) as db, db.session() as s:
        rows = db.query(order="oldest", **filters)
        runs = {r.run_id: (r.started_at, r.command, r.host, r.notes) for r in s.scalars(select(RunRow))}
    drop = {"id", "stale", "ratio"}
    out = sorted((json.dumps({k: v for k, v in r.items() if k not in drop}, sort_keys=True, default=str)
                  for r in rows))
    return out, {rid: runs[rid] for rid in {r["run_id"] for r in rows}}


def counts(url):
    with PerfDB(url) as db:
        return db.counts()


# ---------------------------------------------------------------------------------------------------
# the API

def test_dump_everything_round_trips_into_a_fresh_database(src, tmp_path):
    out = tmp_path / "all.json"
    with PerfDB(src, read_only=True) as db:
        report = db.dump_results(out)
    assert report.records == 11 and report.runs == [RUN_A, RUN_B] and report.path == str(out)
    assert report.statuses == {"ok": 8, "compile_error": 1, "wrong": 1, "crash": 1}
    assert report.backends == {"triton": 7, "sdpa": 2, "tvm": 2} and report.gpus == ["TEST-GPU", "OTHER-GPU"]
    doc = json.loads(out.read_text())
    read_results(out)
    assert [r["run_id"] for r in doc["runs"]] == [RUN_A, RUN_B]
    assert doc["runs"][0] == {"run_id": RUN_A, "started_at": "2025-01-01T12:00:00+00:00", "command": CMD_A,
                              "host": "test-host", "notes": "synthetic tune"}
    assert doc["runs"][1]["started_at"] == "2025-01-02T08:00:00.123456+00:00" and "notes" not in doc["runs"][1]
    # each record is what results_record builds in the tuner path: the recorded values, unchanged
    first = doc["records"][0]
    recorded = ok(1.25, baseline_ms=1.0, baseline_name="sdpa_flash", study_name="s-fwd", trial_number=3)
    assert first == results_record(ENV, kernel(), wl(64), cfg(), Measurement.from_dict(first["measurement"]), RUN_A)
    assert Measurement.from_dict(first["measurement"]).content() == recorded.content()
    assert first["env"] == ENV and first["run_id"] == RUN_A
    wrong = next(r for r in doc["records"] if r["measurement"]["status"] == "wrong")
    assert wrong["measurement"]["errors"] == {"dq": 0.5, "o": "inf"} and wrong["measurement"]["max_rel_err"] == "inf"

    fresh = f"sqlite:///{tmp_path / 'fresh.sqlite3'}"
    with PerfDB(fresh) as db:
        ingested = db.ingest(out)
    assert (ingested.added, ingested.identical, ingested.skipped) == (11, 0, 0)
    assert facts(fresh) == facts(src)          # same keys, envs, configs, times, statuses, commands, created_at


def test_ingesting_the_dump_into_its_own_database_adds_nothing(src, tmp_path):
    out = tmp_path / "all.json"
    with PerfDB(src) as db:
        db.dump_results(out)
    before, before_facts = counts(src), facts(src)
    with PerfDB(src) as db:
        report = db.ingest(out)                        # default on_conflict="error": identical is not a conflict
        again = db.ingest(out)
    assert (report.added, report.identical, report.skipped) == (0, 11, 0)
    assert again.already_ingested and again.added == 0
    after = counts(src)
    assert after.pop("perf_ingest") == before.pop("perf_ingest") + 1 and after == before
    assert facts(src) == before_facts


def test_filters(src, tmp_path):
    def dump(name, **filters):
        with PerfDB(src, read_only=True, current_keys=current_keys) as db:
            report = db.dump_results(tmp_path / name, **filters)
        doc = json.loads((tmp_path / name).read_text())
        return report, doc

    report, doc = dump("tvm.json", backend="tvm", pass_="decode")
    assert report.records == 2 and report.runs == [RUN_B] and [r["run_id"] for r in doc["runs"]] == [RUN_B]
    assert {r["measurement"]["status"] for r in doc["records"]} == {"ok", "crash"}
    assert dump("tvm-ok.json", backend="tvm", status="ok")[0].records == 1
    assert dump("b.json", run_id=RUN_B)[0].backends == {"triton": 1, "tvm": 2}
    assert dump("ab.json", run_id=f"{RUN_A}, {RUN_B}")[0].records == 11
    assert dump("ab2.json", run_id=[RUN_A, RUN_B], status="ok,crash")[0].records == 9
    assert dump("d128.json", head_dim=128)[0].records == 5
    assert dump("d128-decode.json", head_dim=["128"], pass_=["decode"])[0].records == 3
    assert dump("other.json", gpu="other")[0].gpus == ["OTHER-GPU"]
    failed, doc = dump("failed.json", status=["compile_error", "wrong", "crash"])
    assert failed.statuses == {"compile_error": 1, "wrong": 1, "crash": 1} and len(doc["runs"]) == 2
    current, doc = dump("current.json", backend="triton", current_only=True, baselines=False)
    assert current.stale_left_out == 1 and current.records == 6
    assert {r["kernel"]["source_hash"] for r in doc["records"]} == {SRC}


def test_same_run_sdpa_baselines_come_along(src, tmp_path):
    """An ok kernel without a baseline_ms of its own is compared with the SDPA measurement of its run:
    a dump filtered to its backend keeps that measurement, so `query overhead` still pairs them."""
    with PerfDB(src, read_only=True) as db:
        report = db.dump_results(tmp_path / "fwd.json", backend="triton", pass_="fwd", head_dim=64, gpu="test")
        bare = db.dump_results(tmp_path / "bare.json", backend="triton", pass_="fwd", head_dim=64, gpu="test",
                               baselines=False)
    assert report.baselines_added == 1 and report.backends == {"triton": 4, "sdpa": 1}
    assert bare.baselines_added == 0 and bare.backends == {"triton": 4}
    fresh = f"sqlite:///{tmp_path / 'fresh.sqlite3'}"
    with PerfDB(fresh) as db:
        db.ingest(tmp_path / "fwd.json")
        rows = {r["seq_len"]: r for r in db.overhead(pass_="fwd", include_stale=True)}
    assert rows[4096]["sdpa_ms"] == 3.0 and rows[4096]["baseline_name"] == "sdpa (same run)"
    assert rows[1024]["sdpa_ms"] == 1.0


def test_refusals_write_nothing(src, tmp_path):
    out = tmp_path / "r.json"
    with PerfDB(src, read_only=True, current_keys=current_keys) as db:
        with pytest.raises(PerfDBError, match=r"no measurements match \(filters: backend=tvm, pass=fwd"):
            db.dump_results(out, backend="tvm", pass_="fwd")
        with pytest.raises(PerfDBError, match="3 matched but are stale here.*drop --current-only"):
            db.dump_results(out, backend="triton", pass_="fwd", status="ok", gpu="test-gpu", current_only=True,
                            current_keys=lambda *a: {"source_hash": "other"})
        with pytest.raises(PerfDBError, match="no run nope"):
            db.dump_results(out, run_id="nope")
        with pytest.raises(PerfDBError, match="status 'fine' is not one of"):
            db.dump_results(out, status="fine")
        with pytest.raises(PerfDBError, match="head_dim takes integers"):
            db.dump_results(out, head_dim="D64")
        assert not out.exists()
        db.dump_results(out, backend="tvm")
        first = out.read_bytes()
        with pytest.raises(PerfDBError, match="exists; choose another --out, or pass --force"):
            db.dump_results(out, backend="triton")
        assert out.read_bytes() == first
        report = db.dump_results(out, backend="triton", overwrite=True)
        assert len(json.loads(out.read_text())["records"]) == report.records == 8   # 7 triton + 1 SDPA baseline
        with pytest.raises(PerfDBError, match="is the database file itself"):
            db.dump_results(tmp_path / "src.sqlite3", overwrite=True)
    with PerfDB(src) as db, db.session() as s, s.begin():
        s.execute(update(RunRow).where(RunRow.run_id == RUN_B).values(command=None))
    with PerfDB(src, read_only=True) as db:
        with pytest.raises(PerfDBError, match=f"run {RUN_B} \\(3 of the matching records\\) has no command.*"
                                              f"--run {RUN_A}"):
            db.dump_results(tmp_path / "n.json")
        assert not (tmp_path / "n.json").exists()
        assert db.dump_results(tmp_path / "a.json", run_id=RUN_A).runs == [RUN_A]   # the fix it names


def test_commands_not_starting_with_pathtune_are_noted(tmp_path):
    url = f"sqlite:///{tmp_path / 'p.sqlite3'}"
    with PerfDB(url) as db:
        db.record(ENV, kernel(), wl(), cfg(), ok(1.0, baseline_ms=1.0),
                  run_id=db.start_run("python my_script.py", run_id="r1"))
        report = db.dump_results(tmp_path / "p.json")
    assert report.records == 1 and "does not start with 'pathtune '" in report.notes[0]


# ---------------------------------------------------------------------------------------------------
# the command

def run(*args):
    return runner.invoke(app, ["db", "dump", *map(str, args)], env={"COLUMNS": "250"})


def test_cli_dump_filters_and_round_trip(src, tmp_path, monkeypatch):
    # a shipped file must not end up in the source database (or in the dump): the source opens read-only
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    write_results(shipped / "TEST-GPU-x.json", [results_record(ENV, kernel(), wl(256), cfg(), ok(9.0), "shipped")],
                  [{"run_id": "shipped", "command": "pathtune tune x"}])
    monkeypatch.setenv("PATHTUNE_SHIPPED_DIR", str(shipped))
    before = counts(src)
    out = tmp_path / "tvm.json"
    result = run("--db", src, "--out", out, "--backend", "tvm", "--pass", "decode")
    assert result.exit_code == 0, result.output
    assert f"wrote {out}: 2 records (1 crash, 1 ok; 2 tvm; 2 decode) of TEST-GPU from 1 run(s)" in result.output
    assert RUN_B in result.output
    assert counts(src) == before
    doc = json.loads(out.read_text())
    assert [r["command"] for r in doc["runs"]] == [CMD_B] and len(doc["records"]) == 2
    fresh = f"sqlite:///{tmp_path / 'fresh.sqlite3'}"
    imported = runner.invoke(app, ["import", str(out), "--db", fresh, "-f", "json"])
    assert imported.exit_code == 0, imported.output
    with PerfDB(fresh) as db:
        assert db.ingested(read_results(out)[1])
    assert facts(fresh, backend="tvm") == facts(src, backend="tvm")
    again = runner.invoke(app, ["import", str(out), "--db", src])     # into its own database: nothing new
    assert again.exit_code == 0 and "2 records, 0 added, 2 already present" in again.output

    result = run("--db", src, "--out", tmp_path / "two.json", "--run", RUN_A, "--run", RUN_B, "--status", "ok",
                 "--backend", "triton,tvm", "--head-dim", "64,128", "--gpu", "test", "--format", "json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["records"] == 6 and report["runs"] == [RUN_A, RUN_B] and report["baselines_added"] == 1


def test_cli_refusals(src, tmp_path):
    out = tmp_path / "x.json"
    result = run("--db", src, "--out", out, "--backend", "fla")
    assert result.exit_code == 1 and "no measurements match (filters: backend=fla" in result.output
    assert not out.exists()
    out.write_text("{}")
    result = run("--db", src, "--out", out)
    assert result.exit_code == 1 and "exists; choose another --out, or pass --force" in result.output
    assert out.read_text() == "{}"
    assert run("--db", src, "--out", out, "--force").exit_code == 0
    assert len(json.loads(out.read_text())["records"]) == 11
    result = run("--db", f"sqlite:///{tmp_path / 'none.sqlite3'}", "--out", tmp_path / "y.json")
    assert result.exit_code == 1 and "no database at" in result.output and not (tmp_path / "none.sqlite3").exists()
    result = run("--db", src, "--out", tmp_path / "y.json", "--pass", "prefill")
    assert result.exit_code == 1 and "pass 'prefill' is not one of fwd, bwd, decode" in result.output
    with PerfDB(src) as db, db.session() as s, s.begin():
        s.execute(update(RunRow).where(RunRow.run_id == RUN_A).values(command=""))
    result = run("--db", src, "--out", tmp_path / "z.json", "--pass", "fwd")
    assert result.exit_code == 1 and f"run {RUN_A} (8 of the matching records) has no command" in result.output


def test_cli_current_only_uses_the_dispatchers_keys(tmp_path):
    from pathtune.runtime import dispatch

    url = f"sqlite:///{tmp_path / 'c.sqlite3'}"
    here = dispatch.current_keys("path_attention", "decode", "tvm")["source_hash"]
    dec = wl(128, seq=32768, pass_="decode", gate=False)
    with PerfDB(url) as db:
        run_id = db.start_run(CMD_B, run_id="r")
        db.record(ENV, KernelKey(pass_="decode", backend="tvm", spec_hash=SPEC.hash, source_hash=here), dec,
                  cfg("decode", decode_splits=8), ok(0.4, baseline_ms=0.3), run_id=run_id)
        db.record(ENV, KernelKey(pass_="decode", backend="tvm", spec_hash=SPEC.hash, source_hash="0" * 16), dec,
                  cfg("decode", decode_splits=4), ok(0.3, baseline_ms=0.3), run_id=run_id)
    result = run("--db", url, "--out", tmp_path / "c.json", "--current-only", "-f", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["stale_left_out"] == 1
    records = json.loads((tmp_path / "c.json").read_text())["records"]
    assert [r["kernel"]["source_hash"] for r in records] == [here]


# ---------------------------------------------------------------------------------------------------
# a real session database, and the shipped file made from one

@pytest.mark.skipif(not SESSION_DB.is_file(), reason="set PATHTUNE_TEST_SESSION_DB to a GPU session's perf.sqlite3 "
                                                    "to run this round trip")
def test_real_session_database_round_trips(tmp_path):
    copy = tmp_path / "session.sqlite3"
    shutil.copy(SESSION_DB, copy)
    url = f"sqlite:///{copy}"
    with PerfDB(url, read_only=True) as db:
        report = db.dump_results(tmp_path / "s.json")
    assert report.records == counts(url)["perf_measurement"]
    assert all(r["command"].startswith("pathtune ") for r in json.loads((tmp_path / "s.json").read_text())["runs"])
    fresh = f"sqlite:///{tmp_path / 'fresh.sqlite3'}"
    with PerfDB(fresh) as db:
        assert db.ingest(tmp_path / "s.json").added == report.records
    assert facts(fresh) == facts(url)
    with PerfDB(url) as db:
        assert db.ingest(tmp_path / "s.json").identical == report.records


@pytest.mark.skipif(not SHIPPED_TVM.is_file(), reason="no shipped TVM decode records")
def test_shipped_tvm_decode_records_reach_the_decode_dispatcher(tmp_path):
    """A fresh database given the shipped files serves the measured TVM step for H8 D128 32K decode
    on the host they were measured on (its env: TVM runtime via tvm_ffi, `tvm` null)."""
    import torch

    from pathtune.runtime import dispatch
    from pathtune.runtime.dispatch import Dispatcher

    records = json.loads(SHIPPED_TVM.read_text())["records"]
    here = dispatch.current_keys("path_attention", "decode", "tvm")
    if any(r["kernel"]["source_hash"] != here["source_hash"] for r in records):
        pytest.skip("the TVM kernel sources changed since the shipped TVM decode records were measured")
    url = f"sqlite:///{tmp_path / 'fresh.sqlite3'}"
    with PerfDB(url) as db:
        db.ingest(SHIPPED_TVM)
    env = records[0]["env"]
    wl32k = Workload(128, 128, 8, 8, "bfloat16", False, "decode", 32768, batch_bucket=8)
    fastest = min((r for r in records if Workload.from_dict(r["workload"]) == wl32k),
                  key=lambda r: r["measurement"]["median_ms"])
    with PerfDB(url, read_only=True, current_keys=dispatch.current_keys) as db:
        best = db.best(env, "decode", wl32k)
        choice = Dispatcher(env_info=env, db=db, pack=None).choose("decode", wl32k, torch.device("cuda", 0),
                                                                    ("triton", "tvm"))
    assert (best["backend"], best["match"], best["median_ms"]) == ("tvm", "exact", fastest["measurement"]["median_ms"])
    assert (choice.backend, choice.source) == ("tvm", "perf_db")
    assert {k: choice.config[k] for k in fastest["config"]} == fastest["config"]
