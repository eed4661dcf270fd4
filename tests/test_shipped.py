"""The results files shipped in perf_db/shipped/: each parses, states the command that produced it,
holds real measurements (status ok with a time and a same-run baseline, or a failure status), and
ingests into a fresh database so that `pathtune query overhead --by head_dim` answers from them."""
from __future__ import annotations

import json

import pytest

from pathtune.perf_db import PerfDB
from pathtune.perf_db._results import read_results
from pathtune.perf_db._shipped import SHIPPED_DIR

FILES = sorted(SHIPPED_DIR.glob("*.json"))


@pytest.mark.skipif(not FILES, reason="nothing shipped yet")
@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_shipped_file_is_real_and_ingests(path, tmp_path, monkeypatch):
    doc = json.loads(path.read_text())
    assert doc["runs"] and all(run.get("command", "").startswith("pathtune ") for run in doc["runs"])
    records = doc["records"]
    assert records
    for rec in records:
        m = rec["measurement"]
        if m["status"] == "ok":
            assert m["median_ms"] > 0 and m["baseline_ms"] > 0 and m["errors"]
        assert rec["env"]["gpu_name"] and rec["kernel"]["source_hash"] and rec["kernel"]["spec_hash"]
    read_results(path)   # the format checks perf_db applies
    monkeypatch.setenv("PATHTUNE_SHIPPED_DIR", str(SHIPPED_DIR))
    with PerfDB(f"sqlite:///{tmp_path / 'fresh.sqlite3'}") as db:
        report = db.ingest(path)
        assert report.added == len(records)
        rows = db.overhead(by="head_dim")
    # a file may hold only failures (a resumed tune whose new candidates all failed the gate or the
    # resources); one with a measured time answers the overhead query on its own
    assert rows or not any(rec["measurement"]["status"] == "ok" for rec in records)
    assert all(r["ratio"] == pytest.approx(r["pathtune_ms"] / r["sdpa_ms"]) for r in rows)


@pytest.mark.skipif(not FILES, reason="nothing shipped yet")
def test_shipped_files_together_answer_the_overhead_table(tmp_path, monkeypatch):
    """Every pass the shipped tune covered has an overhead row for each head dim it tuned."""
    monkeypatch.setenv("PATHTUNE_SHIPPED_DIR", str(SHIPPED_DIR))
    with PerfDB(f"sqlite:///{tmp_path / 'fresh.sqlite3'}") as db:
        for path in FILES:
            db.ingest(path)
        rows = db.overhead(by="head_dim")
    tuned = {(rec["workload"]["head_dim"], rec["workload"]["pass"]) for path in FILES
             for rec in json.loads(path.read_text())["records"] if rec["measurement"]["status"] == "ok"}
    covered = {(r["head_dim"], r["pass"]) for r in rows}
    for head_dim, pass_ in sorted(tuned):    # (a bwd row times forward+backward)
        assert (head_dim, pass_) in covered, f"no overhead row for D={head_dim} {pass_}: {sorted(covered)}"
