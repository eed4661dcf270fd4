"""Several `pathtune tune` workers on one study in PostgreSQL; one is SIGKILLed mid-trial and resumed.

Runs when PATHTUNE_TEST_PG_URL is set (.ci/run starts a PostgreSQL server and sets it). The workers
measure with the deterministic cost model of tests/tune_fake.py (``--measure-with``): real kernels in
Triton's CPU interpreter are far too slow and noisy for a concurrency test. Each test works in a
fresh schema of that database.

Checks: every COMPLETE trial's config is in perf_db exactly once (no lost, no duplicated
measurement), the killed worker's trial was failed by the heartbeat and re-run by a retry trial,
and the best config (Optuna's best trial, ``PerfDB.best``) is an argmin of the cost model over the
measured set, i.e. what a single worker that measured the same configs reports.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

PG_URL = os.environ.get("PATHTUNE_TEST_PG_URL")
pytestmark = pytest.mark.skipif(not PG_URL, reason="set PATHTUNE_TEST_PG_URL=postgresql+psycopg://... to run")

HERE = Path(__file__).resolve().parent
FAKE = f"{HERE / 'tune_fake.py'}:measure"
sys.path.insert(0, str(HERE))
import tune_fake  # noqa: E402

BUDGET = 24


def _env(tmp_path: Path, url: str) -> dict:
    env = dict(os.environ)
    env.update(PATHTUNE_FAKE_SLEEP="0.3", PATHTUNE_FAKE_LOG=str(tmp_path / "calls.log"),
               PATHTUNE_DB_URL=url, PATHTUNE_CACHE_DIR=str(tmp_path / "cache"))
    return env


def _worker(url: str, worker: int, env: dict, tmp_path: Path) -> subprocess.Popen:
    spec = tmp_path / "spec.yaml"   # a frozen copy: its hash names the study (the checkout's may be edited)
    if not spec.exists():
        import shutil

        import pathtune.specs

        shutil.copy(Path(pathtune.specs.__file__).parent / "path_attention.yaml", spec)
    cmd = [sys.executable, "-m", "pathtune", "tune", "--head-dim", "64", "--pass", "fwd", "--buckets", "1024",
           "--budget", str(BUDGET), "--storage", url, "--resume", "--worker", str(worker), "--heartbeat", "1",
           "--startup-trials", "6", "--seed-neighbours", "0", "--measure-with", FAKE, "--spec", str(spec)]
    log = open(tmp_path / f"worker{worker}-{time.monotonic_ns()}.log", "w")
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)


def _calls(tmp_path: Path) -> list[list[str]]:
    path = tmp_path / "calls.log"
    return [line.split(" ", 4) for line in path.read_text().splitlines()] if path.exists() else []


def _in_flight(tmp_path: Path, pid: int) -> bool:
    """The worker with this pid is inside a measurement now."""
    open_ = 0
    for what, p, *_ in _calls(tmp_path):
        if int(p) == pid:
            open_ += 1 if what == "start" else -1
    return open_ > 0


def test_workers_share_study_kill_and_resume(pg_url, tmp_path):
    import optuna
    from optuna.trial import TrialState

    from pathtune.perf_db import PerfDB
    from pathtune.tuning.tuner import make_storage

    env = _env(tmp_path, pg_url)
    PerfDB(pg_url).close()                 # schema first: workers then only open it
    make_storage(pg_url, 1).engine.dispose()

    a = _worker(pg_url, 0, env, tmp_path)
    b = _worker(pg_url, 1, env, tmp_path)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ends = sum(1 for c in _calls(tmp_path) if c[0] == "end")
        if ends >= 4 and _in_flight(tmp_path, b.pid):
            break
        assert b.poll() is None, "worker 1 ended before it could be killed"
        time.sleep(0.02)
    else:
        pytest.fail("worker 1 never got mid-trial")
    b.send_signal(signal.SIGKILL)       # inside a measurement (or, rarely, just after it: still mid-trial)
    b.wait()

    b2 = _worker(pg_url, 1, env, tmp_path)          # the same worker, resumed
    assert a.wait(timeout=180) == 0
    assert b2.wait(timeout=180) == 0

    storage = make_storage(pg_url, 1)
    names = optuna.get_all_study_names(storage)
    assert len(names) == 1, names
    (name,) = names
    study = optuna.load_study(study_name=name, storage=storage)
    if any(t.state == TrialState.RUNNING for t in study.get_trials(deepcopy=False)):
        # both finished before the killed trial went stale (grace 3 s): one more worker fails it and
        # runs its retry
        time.sleep(4)
        assert _worker(pg_url, 2, env, tmp_path).wait(timeout=120) == 0
        study = optuna.load_study(study_name=name, storage=storage)
    trials = study.get_trials(deepcopy=False)
    assert not [t.number for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(complete) >= BUDGET

    # the killed worker's trial: failed by the heartbeat, re-run by a COMPLETE retry with the same config
    failed = [t for t in trials if t.state == TrialState.FAIL]
    assert failed, "the SIGKILLed worker's running trial must have been failed as stale"
    for t in failed:
        retries = [r for r in trials if r.system_attrs.get("failed_trial") == t.number]
        assert any(r.state == TrialState.COMPLETE and r.params == t.params for r in retries), t.number

    # perf_db: each measured config exactly once, and every COMPLETE trial's config is there
    db = PerfDB(pg_url, current_keys=None)
    rows = db.query()            # this schema holds this study only
    hashes = [r["config_hash"] for r in rows]
    assert len(hashes) == len(set(hashes)), "a config was stored twice"
    assert {t.user_attrs["config_hash"] for t in complete} == set(hashes)
    statuses = {r["status"] for r in rows}
    assert "ok" in statuses
    for r in rows:   # stored facts agree with the cost model (nothing mixed up between workers)
        want = tune_fake.failure(r["config"]) or "ok"
        assert r["status"] == want
        if want == "ok":
            assert r["median_ms"] == pytest.approx(tune_fake.cost_ms(r["config"], 1024))
    for t in complete:
        if t.user_attrs["status"] != "ok":
            assert t.value >= 1e9   # a failed candidate never wins

    # the best config: what one worker reports over the same measured set (the cost model's argmin;
    # configs that differ only in knobs it weighs alike tie, and any of them is a right answer)
    ok = [r for r in rows if r["status"] == "ok"]
    best_cost = min(tune_fake.cost_ms(r["config"], 1024) for r in ok)
    argmin = {r["config_hash"] for r in ok if tune_fake.cost_ms(r["config"], 1024) == best_cost}
    assert study.best_trial.user_attrs["config_hash"] in argmin
    assert study.best_trial.value == pytest.approx(best_cost)
    wl = rows[0]["workload"]
    best = db.best(rows[0]["env_hash"], "fwd", wl, backend="triton")
    assert best["config_hash"] in argmin and best["match"] == "exact"
    db.close()
    storage.engine.dispose()
