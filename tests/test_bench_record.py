"""`pathtune bench --record` stores pathtune's times with the same-run SDPA baseline in perf_db."""
import pytest

from pathtune.perf_db import PerfDB
from pathtune.tuning.bench import BenchRow, format_table, record_rows


def test_record_rows_feed_overhead_query(tmp_path):
    url = f"sqlite:///{tmp_path / 'perf.sqlite3'}"
    ok = BenchRow(64, 4096, 8, 16, False, times={"pathtune_f": 2.0, "pathtune_fb": 9.0, "sdpa_flash_f": 1.0,
                                                  "sdpa_flash_fb": 3.0}, errors={"o": 2e-3})
    broken = BenchRow(128, 4096, 8, 8, False, failures={"pathtune": "OutOfResources: shared memory"})
    n = record_rows([ok, broken], url, None, "pathtune bench --record (test)")
    assert n == 4
    with PerfDB(url) as db:
        rows = db.overhead(by="head_dim")
        assert {(r["head_dim"], r["pass"]) for r in rows} == {(64, "fwd"), (64, "bwd")}
        by_pass = {r["pass"]: r for r in rows}
        assert abs(by_pass["fwd"]["ratio"] - 2.0) < 1e-9 and abs(by_pass["bwd"]["ratio"] - 3.0) < 1e-9
        statuses = sorted(r["status"] for r in db.query(head_dim=128))
        assert statuses == ["crash", "crash"]
    assert format_table([ok, broken]).row_count == 2


def test_an_interrupted_bench_keeps_the_rows_it_finished(tmp_path):
    """`pathtune bench --record --json F` stores and writes each row when it is measured, all in one perf_db run:
    a bench stopped after its first row (Ctrl-C, a time limit) keeps that row in perf_db and in F."""
    import json

    import pytest
    from rich.console import Console

    from pathtune.cli.bench import _run_and_report

    url = f"sqlite:///{tmp_path / 'perf.sqlite3'}"
    out = tmp_path / "bench.json"
    first = BenchRow(64, 4096, 8, 16, False, times={"pathtune_f": 2.0, "pathtune_fb": 9.0, "sdpa_flash_f": 1.0,
                                                     "sdpa_flash_fb": 3.0}, errors={"o": 2e-3})

    def run(on_row):
        on_row(first)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _run_and_report(Console(), run, format_table, out,
                        lambda rows, run_id: record_rows(rows, url, None, "pathtune bench (test)", run_id=run_id))
    assert [r["head_dim"] for r in json.loads(out.read_text())] == [64]
    with PerfDB(url) as db:
        assert sorted(r["pass"] for r in db.query(head_dim=64)) == ["bwd", "fwd"]

    # a finished bench: rows handed over one by one and the rest at the end, each stored once, one run
    second = BenchRow(128, 4096, 8, 8, False, times={"pathtune_f": 1.5, "sdpa_flash_f": 1.0}, errors={"o": 2e-3})
    url2 = f"sqlite:///{tmp_path / 'perf2.sqlite3'}"
    runs = set()

    def rec(rows, run_id):
        runs.add(run_id)
        return record_rows(rows, url2, None, "pathtune bench (test)", run_id=run_id)

    _run_and_report(Console(), lambda on_row: (on_row(first), [first, second])[1], format_table, out, rec)
    assert len(runs) == 1
    with PerfDB(url2) as db:
        assert len(db.query(head_dim=64)) == 2 and len(db.query(head_dim=128)) == 1
    assert [r["head_dim"] for r in json.loads(out.read_text())] == [64, 128]


def test_a_row_over_the_spec_tolerance_is_recorded_wrong(tmp_path):
    """The bench records through the tuner's gate: a row whose o (or, for fwd+bwd, a gradient) error is over
    the spec's tolerance is stored as "wrong" with the reason, so the dispatcher never serves it."""
    url = f"sqlite:///{tmp_path / 'perf.sqlite3'}"
    times = {"pathtune_f": 2.0, "pathtune_fb": 9.0, "sdpa_flash_f": 1.0, "sdpa_flash_fb": 3.0}
    bad_grad = BenchRow(64, 4096, 8, 16, False, times=dict(times), errors={"o": 2e-3, "dk": 0.5})
    bad_o = BenchRow(64, 4096, 8, 16, True, times=dict(times), errors={"o": 0.1, "dk": 2e-3})
    assert record_rows([bad_grad, bad_o], url, None, "pathtune bench --record (test)") == 4
    with PerfDB(url) as db:
        got = {(r["use_gate"], r["pass"]): r for r in db.query(head_dim=64)}
    assert got[(False, "fwd")]["status"] == "ok"             # the forward's own error (o) passes
    assert got[(False, "bwd")]["status"] == "wrong" and "dk 0.5 > 0.007" in got[(False, "bwd")]["message"]
    assert got[(True, "fwd")]["status"] == "wrong" and got[(True, "bwd")]["status"] == "wrong"


def test_a_baseline_does_not_change_the_triton_toolchain(monkeypatch):
    """A baseline that points TRITON_PTXAS_PATH elsewhere (torch's inductor does, once per process) leaves the
    process's toolchain as it found it: pathtune's kernels timed after it compile with the same ptxas."""
    import os

    from pathtune.tuning.baselines import keep_triton_toolchain

    monkeypatch.delenv("TRITON_PTXAS_PATH", raising=False)
    monkeypatch.setenv("TRITON_LIBDEVICE_PATH", "/opt/libdevice.bc")
    with keep_triton_toolchain():
        os.environ["TRITON_PTXAS_PATH"] = "/torch/bin/ptxas"
        os.environ["TRITON_LIBDEVICE_PATH"] = "/torch/lib/libdevice.bc"
    assert "TRITON_PTXAS_PATH" not in os.environ
    assert os.environ["TRITON_LIBDEVICE_PATH"] == "/opt/libdevice.bc"
    with pytest.raises(RuntimeError), keep_triton_toolchain():
        os.environ["TRITON_PTXAS_PATH"] = "/torch/bin/ptxas"
        raise RuntimeError("baseline failed")
    assert "TRITON_PTXAS_PATH" not in os.environ
