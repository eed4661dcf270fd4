"""The results files shipped in perf_db/shipped/: each parses, states the command that produced it,
holds real measurements (status ok with a time and a same-run baseline, or a failure status), and
ingests into a fresh database.  Files measured with the kernels and spec of this checkout (current:
``runtime.dispatch.current_keys``, what the dispatcher serves) answer `pathtune query overhead
--by head_dim`; files of retired kernels stay (history, and the tuner's warm start) and are seen by
queries over every record."""
from __future__ import annotations

import json

import pytest

from pathtune.perf_db import PerfDB
from pathtune.perf_db._keys import WITHDRAWN_RUNS
from pathtune.perf_db._results import read_results
from pathtune.perf_db._shipped import SHIPPED_DIR

FILES = sorted(SHIPPED_DIR.glob("*.json"))


def _current(rec) -> bool:
    from pathtune.perf_db._keys import stale_reasons
    from pathtune.runtime.dispatch import current_keys

    k = rec["kernel"]
    return not stale_reasons(k, current_keys(k["op"], k["pass"], k["backend"]))


def _all_keys(op, pass_, backend):
    return None


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
    current = [_current(rec) for rec in records]
    # a pass's kernels retire together (its source hash): a file that holds several passes may have
    # some current and some retired, never both within one pass and backend
    by_kernel: dict = {}
    for rec, cur in zip(records, current):
        by_kernel.setdefault((rec["kernel"]["pass"], rec["kernel"]["backend"]), set()).add(cur)
    assert all(len(states) == 1 for states in by_kernel.values()), f"a pass mixes current and retired: {by_kernel}"
    # the records answer an overhead query over every record (current or retired) on their own
    with PerfDB(f"sqlite:///{tmp_path / 'fresh.sqlite3'}", current_keys=_all_keys) as db:
        report = db.ingest(path)
        assert report.added == len(records)
        rows = db.overhead(by="head_dim")
    # a file may hold only failures (a resumed tune whose new candidates all failed the gate or the
    # resources) or withdrawn runs (perf_db._keys.WITHDRAWN_RUNS: never served); one with a measured time of a
    # run not withdrawn answers the overhead query on its own
    assert rows or not any(rec["measurement"]["status"] == "ok" and rec["run_id"] not in WITHDRAWN_RUNS
                           for rec in records)
    if any(current):   # and its current records as the dispatcher sees them
        with PerfDB(f"sqlite:///{tmp_path / 'dispatch.sqlite3'}", current_keys=current_keys_of_dispatch()) as db:
            db.ingest(path)
            live = {(r["pass"], r["head_dim"]) for r in db.overhead(by="head_dim")}
        want = {(rec["workload"]["pass"], rec["workload"]["head_dim"]) for rec, cur in zip(records, current)
                if cur and rec["measurement"]["status"] == "ok"}
        assert want <= live, f"current records without an overhead row: {sorted(want - live)}"
    assert all(r["ratio"] == pytest.approx(r["pathtune_ms"] / r["sdpa_ms"]) for r in rows)


def current_keys_of_dispatch():
    from pathtune.runtime.dispatch import current_keys

    return current_keys


@pytest.mark.skipif(not FILES, reason="nothing shipped yet")
def test_shipped_files_together_answer_the_overhead_table(tmp_path, monkeypatch):
    """Every pass the current shipped records cover has an overhead row for each of their head dims,
    with the retired files ingested beside them (they must not hide or replace current rows)."""
    monkeypatch.setenv("PATHTUNE_SHIPPED_DIR", str(SHIPPED_DIR))
    with PerfDB(f"sqlite:///{tmp_path / 'fresh.sqlite3'}", current_keys=current_keys_of_dispatch()) as db:
        for path in FILES:
            db.ingest(path)
        rows = db.overhead(by="head_dim")
    tuned = {(rec["workload"]["head_dim"], rec["workload"]["pass"]) for path in FILES
             for rec in json.loads(path.read_text())["records"]
             if rec["measurement"]["status"] == "ok" and _current(rec)}
    covered = {(r["head_dim"], r["pass"]) for r in rows}
    for head_dim, pass_ in sorted(tuned):    # (a bwd row times forward+backward)
        assert (head_dim, pass_) in covered, f"no overhead row for D={head_dim} {pass_}: {sorted(covered)}"
