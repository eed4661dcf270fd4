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
    assert rows and all(r["ratio"] == pytest.approx(r["pathtune_ms"] / r["sdpa_ms"]) for r in rows)
