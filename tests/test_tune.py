"""`pathtune tune` with the deterministic cost model of tests/tune_fake.py (``--measure-with``), on SQLite.

The local loop (lookup before measuring, failures recorded and never best, --resume, the results
file), Ctrl-C (once: the running trial finishes and is recorded; twice: it is abandoned, flagged and
re-queued by --resume) and the split flow (build -> runner without a database or Optuna -> ingest).
The real Triton kernels are tuned in tests/test_tune_triton.py; concurrent workers on PostgreSQL in
tests/test_tune_workers.py.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
FAKE = f"{HERE / 'tune_fake.py'}:measure"
sys.path.insert(0, str(HERE))
import tune_fake  # noqa: E402
from pathtune.perf_db import PerfDB  # noqa: E402
from pathtune.tuning.space import plan_keys, study_name  # noqa: E402
from pathtune.tuning.tuner import Budget, parse_budget  # noqa: E402

SPEC = ""  # set per test (frozen copy of the spec)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    # a frozen copy of the spec: its hash names the studies, and the checkout's copy may be edited meanwhile
    import shutil

    import pathtune.specs

    global SPEC
    SPEC = str(tmp_path / "spec.yaml")
    shutil.copy(Path(pathtune.specs.__file__).parent / "path_attention.yaml", SPEC)
    monkeypatch.setenv("PATHTUNE_SHIPPED_DIR", str(tmp_path / "no-shipped"))
    monkeypatch.setenv("PATHTUNE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PATHTUNE_FAKE_LOG", str(tmp_path / "calls.log"))
    monkeypatch.delenv("PATHTUNE_DB_URL", raising=False)


def _study(url):
    import optuna

    (name,) = optuna.get_all_study_names(url)
    return optuna.load_study(study_name=name, storage=url)


def _calls(tmp_path):
    path = tmp_path / "calls.log"
    return [line.split(" ", 4) for line in path.read_text().splitlines()] if path.exists() else []


def test_budget_and_keys():
    assert parse_budget("10m") == Budget(seconds=600.0)
    assert parse_budget("40") == Budget(trials=40)
    assert parse_budget("90s,12") == Budget(seconds=90.0, trials=12)
    with pytest.raises(ValueError):
        parse_budget("ten minutes")
    keys = plan_keys([64, 128], ["bfloat16"], ["fwd", "bwd", "decode"], ["triton"], [1024, 2048, 4096, 8192])
    assert len(keys) == 24
    k = keys[0]
    assert (k.workload.heads_q, k.batch, k.seq_len, k.workload.use_gate) == (16, 32, 1024, True)
    assert keys[4].workload.head_dim == 128 and keys[4].workload.heads_q == 8
    names = {study_name("e" * 64, "s" * 64, "c" * 16, key) for key in keys}
    assert len(names) == 24 and all(len(n) < 200 for n in names)
    assert study_name("e" * 64, "s" * 64, "d" * 16, k) != study_name("e" * 64, "s" * 64, "c" * 16, k)
    with pytest.raises(ValueError):
        plan_keys([64], ["bfloat16"], ["fwd"], ["triton"], [1000])


def _tune_args(url, *extra):
    return ["tune", "--head-dim", "64", "--pass", "fwd,decode", "--buckets", "1024", "--storage", url,
            "--measure-with", FAKE, "--startup-trials", "4", "--seed-neighbours", "0", "--spec", SPEC, *extra]


def test_local_tune_lookup_resume_results_file(tmp_path):
    from typer.testing import CliRunner

    from pathtune.cli import app

    url = f"sqlite:///{tmp_path / 'tune.sqlite3'}"
    runner = CliRunner()
    res = runner.invoke(app, _tune_args(url, "--budget", "10", "--report-json", str(tmp_path / "rep.json"),
                                        "--results-out", str(tmp_path / "results.json")))
    assert res.exit_code == 0, res.output
    assert "SQLite storage: run ONE worker" in res.output
    report = json.loads((tmp_path / "rep.json").read_text())
    assert [r["pass"] for r in report] == ["fwd", "decode"]
    for r in report:
        assert r["trials"] == 10 and r["default_ms"] and r["best_ms"] <= r["default_ms"]
        assert r["best_ms"] == pytest.approx(tune_fake.cost_ms(r["best_config"], 1024))

    # again without --resume: refused; with --resume and a larger budget: continued, nothing re-measured
    res = runner.invoke(app, _tune_args(url, "--budget", "10"))
    assert res.exit_code == 1 and "--resume" in res.output
    res = runner.invoke(app, _tune_args(url, "--budget", "16", "--resume"))
    assert res.exit_code == 0, res.output

    with PerfDB(url, current_keys=None) as db:
        rows = db.query()
        hashes = [(r["pass"], r["config_hash"]) for r in rows]
        assert len(hashes) == len(set(hashes)), "a config was measured twice"
        for r in rows:
            assert r["status"] == (tune_fake.failure(r["config"]) or "ok")
            assert r["study_name"] and r["trial_number"] is not None and r["run_id"].startswith("tune-")
        n_first = len(json.loads((tmp_path / "results.json").read_text())["records"])
    starts = [c for c in _calls(tmp_path) if c[0] == "start"]
    assert len(starts) == len(rows), "measure() ran for a config perf_db already held"

    import optuna

    for name in optuna.get_all_study_names(url):
        study = optuna.load_study(study_name=name, storage=url)
        complete = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
        assert len(complete) == 16
        assert complete[0].user_attrs.get("seeded_default")
        best = study.best_trial
        assert best.user_attrs["status"] == "ok"
        for t in complete:
            if t.user_attrs["status"] != "ok":
                assert t.value > best.value

    # the results file of the first run ingests into a fresh database
    with PerfDB(f"sqlite:///{tmp_path / 'other.sqlite3'}") as other:
        rep = other.ingest(tmp_path / "results.json")
        assert rep.added == n_first >= 10    # first run: 2 keys x 10 trials, re-proposals looked up


def _popen(url, tmp_path, *extra, sleep="0.6"):
    env = dict(os.environ, PATHTUNE_FAKE_SLEEP=sleep)
    cmd = [sys.executable, "-m", "pathtune", "tune", "--head-dim", "64", "--pass", "fwd", "--buckets", "1024",
           "--storage", url, "--measure-with", FAKE, "--startup-trials", "4", "--seed-neighbours", "0", "--spec", SPEC,
           *extra]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)


def _wait_mid_trial(proc, tmp_path, ends):
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        calls = [c for c in _calls(tmp_path) if int(c[1]) == proc.pid]
        if sum(c[0] == "end" for c in calls) >= ends and calls and calls[-1][0] == "start":
            return
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.05)
    pytest.fail("the worker never got mid-trial")


def test_ctrl_c_finishes_or_flags_the_trial_and_resume_continues(tmp_path):
    from optuna.trial import TrialState

    url = f"sqlite:///{tmp_path / 'tune.sqlite3'}"
    # Ctrl-C once: the running trial completes and is recorded, then the process stops (exit 0)
    p = _popen(url, tmp_path, "--budget", "30")
    _wait_mid_trial(p, tmp_path, ends=2)
    p.send_signal(signal.SIGINT)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 0, out
    assert "Ctrl-C" in out and "--resume" in out
    study = _study(url)
    states = [t.state for t in study.get_trials()]
    assert states == [TrialState.COMPLETE] * 3
    with PerfDB(url, current_keys=None) as db:
        assert len(db.query()) == 3

    # Ctrl-C twice: the running trial is abandoned (FAIL, flagged), exit 130
    p = _popen(url, tmp_path, "--budget", "30", "--resume")
    _wait_mid_trial(p, tmp_path, ends=4)
    p.send_signal(signal.SIGINT)
    time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 130, out
    study = _study(url)
    failed = [t for t in study.get_trials() if t.state == TrialState.FAIL]
    assert len(failed) == 1 and failed[0].user_attrs.get("interrupted")

    # --resume re-queues it and runs to the budget: every trial landed once, nothing measured twice
    n = len([t for t in study.get_trials() if t.state == TrialState.COMPLETE]) + 2
    p = _popen(url, tmp_path, "--budget", str(n), "--resume", sleep="0")
    out, _ = p.communicate(timeout=90)
    assert p.returncode == 0, out
    study = _study(url)
    trials = study.get_trials()
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(complete) == n and not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    retry = [t for t in complete if t.system_attrs.get("failed_trial") == failed[0].number]
    assert retry and retry[0].params == failed[0].params
    with PerfDB(url, current_keys=None) as db:
        rows = db.query()
    assert sorted(r["config_hash"] for r in rows) == sorted({t.user_attrs["config_hash"] for t in complete})
    assert len(rows) == len({r["config_hash"] for r in rows})


def test_split_build_run_ingest(tmp_path):
    import optuna
    from optuna.trial import TrialState
    from typer.testing import CliRunner

    from pathtune.cli import app

    url = f"sqlite:///{tmp_path / 'build.sqlite3'}"
    runner = CliRunner()
    res = runner.invoke(app, ["env", "--json"])                      # on the GPU host, in real life
    (tmp_path / "env.json").write_text(res.output)
    common = ["--head-dim", "64", "--pass", "fwd,decode", "--buckets", "1024", "--storage", url, "--gpu-env",
              str(tmp_path / "env.json"), "--batch", "4", "--no-precompile", "--seed-neighbours", "0", "--spec", SPEC]
    res = runner.invoke(app, ["tune", "build", "--out", str(tmp_path / "b1"), *common])
    assert res.exit_code == 0, res.output
    bundle = json.loads((tmp_path / "b1" / "bundle.json").read_text())
    assert bundle["format"] == "pathtune-bundle" and len(bundle["tasks"]) == 8
    assert (tmp_path / "b1" / "run.sh").exists()
    first = {json.dumps(t["task"]["config"], sort_keys=True) for t in bundle["tasks"]}

    # the GPU host: no database, no Optuna (both imports fail), only the bundle
    script = ("import sys; sys.modules['sqlalchemy'] = None; sys.modules['optuna'] = None; "
              "sys.modules['alembic'] = None; from pathtune.tuning.runner import main; sys.exit(main(sys.argv[1:]))")
    run = subprocess.run([sys.executable, "-c", script, str(tmp_path / "b1"), "--out", str(tmp_path / "r1.json"),
                          "--measure-with", FAKE], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    results = json.loads((tmp_path / "r1.json").read_text())
    assert len(results["records"]) == 8
    # a runner restarted with --resume (after a kill) skips what the results file holds
    run = subprocess.run([sys.executable, "-c", script, str(tmp_path / "b1"), "--out", str(tmp_path / "r1.json"),
                          "--measure-with", FAKE, "--resume"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert json.loads((tmp_path / "r1.json").read_text()) == results

    res = runner.invoke(app, ["tune", "ingest", str(tmp_path / "r1.json"), "--storage", url])
    assert res.exit_code == 0, res.output
    for name in optuna.get_all_study_names(url):
        study = optuna.load_study(study_name=name, storage=url)
        trials = study.get_trials()
        assert not [t for t in trials if t.state == TrialState.RUNNING]
        for t in trials:
            if t.state == TrialState.COMPLETE and t.user_attrs["status"] == "ok":
                assert t.value == pytest.approx(tune_fake.cost_ms(t.user_attrs["config"], 1024))
    with PerfDB(url, current_keys=None) as db:
        assert len(db.query()) == 8
    # ingest is idempotent
    res = runner.invoke(app, ["tune", "ingest", str(tmp_path / "r1.json"), "--storage", url])
    assert res.exit_code == 0 and '"added": 0' in res.output and '"told": 0' in res.output

    # the next batch never ships a config perf_db holds
    res = runner.invoke(app, ["tune", "build", "--out", str(tmp_path / "b2"), *common])
    assert res.exit_code == 0, res.output
    second = {json.dumps(t["task"]["config"], sort_keys=True)
              for t in json.loads((tmp_path / "b2" / "bundle.json").read_text())["tasks"]}
    assert second and not (first & second)


def test_split_flow_refuses_dropped_options_a_missing_file_and_a_missing_database(tmp_path):
    from typer.testing import CliRunner

    from pathtune.cli import app

    runner = CliRunner()
    res = runner.invoke(app, ["tune", "--confirm", "2", "--head-dim", "128", "ingest", "results.json"])
    assert res.exit_code == 1 and "before `ingest` would be ignored" in res.output
    assert "--confirm" in res.output and "--head-dim" in res.output
    res = runner.invoke(app, ["tune", "ingest", str(tmp_path / "missing.json")])
    assert res.exit_code == 2 and "does not exist" in res.output
    (tmp_path / "r.json").write_text("{}")
    res = runner.invoke(app, ["tune", "ingest", str(tmp_path / "r.json"), "--storage",
                              f"sqlite:///{tmp_path / 'none' / 'tune.sqlite3'}"])
    assert res.exit_code == 1 and "no tuning database at" in res.output


def test_new_study_starts_with_the_default_and_its_schedule_neighbours(tmp_path):
    """--seed-neighbours N: after the seeded default, a new study measures up to N configs that each
    change one schedule knob of it (adjacent domain values first), before any random proposal."""
    import optuna
    from optuna.trial import TrialState
    from typer.testing import CliRunner

    from pathtune.cli import app
    from pathtune.specs import KnobSpace, load_spec

    url = f"sqlite:///{tmp_path / 'tune.sqlite3'}"
    args = ["tune", "--head-dim", "64", "--pass", "bwd", "--buckets", "1024", "--storage", url, "--measure-with",
            FAKE, "--startup-trials", "2", "--seed-neighbours", "5", "--budget", "8", "--spec", SPEC]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    study = _study(url)
    trials = sorted(study.get_trials(states=(TrialState.COMPLETE,)), key=lambda t: t.number)
    assert len(trials) == 8
    default = trials[0].params
    assert trials[0].user_attrs.get("seeded_default")
    knobs = KnobSpace(load_spec(SPEC), "bwd").knobs
    for t in trials[1:6]:
        assert t.user_attrs.get("seeded_neighbour"), t.number
        changed = [n for n in default if t.params[n] != default[n]]
        assert len(changed) == 1 and knobs[changed[0]].role == "schedule", (t.number, changed)
        name = changed[0]
        # adjacent values of a knob's domain come before farther ones
        assert abs(knobs[name].domain.index(t.params[name]) - knobs[name].domain.index(default[name])) == 1
    assert not any(t.user_attrs.get("seeded_neighbour") for t in trials[6:])
    assert len({json.dumps(t.params, sort_keys=True) for t in trials[:6]}) == 6
    assert optuna.load_study(study_name=study.study_name, storage=url).best_trial.user_attrs["status"] == "ok"

    # a study tuned without neighbours gets them once when resumed with them (tried configs are skipped)
    url2 = f"sqlite:///{tmp_path / 'tune2.sqlite3'}"
    base = [a if a != url else url2 for a in args]
    first = [a if a != "5" else "0" for a in base]
    assert CliRunner().invoke(app, first).exit_code == 0
    before = {json.dumps(t.params, sort_keys=True) for t in _study(url2).get_trials(states=(TrialState.COMPLETE,))}
    res = CliRunner().invoke(app, [*[a if a != "8" else "14" for a in base], "--resume"])
    assert res.exit_code == 0, res.output
    again = _study(url2)
    seeded = [t for t in again.get_trials(states=(TrialState.COMPLETE,)) if t.user_attrs.get("seeded_neighbour")]
    assert seeded and not {json.dumps(t.params, sort_keys=True) for t in seeded} & before
    assert again.user_attrs["neighbours_seeded"] == 5
    res = CliRunner().invoke(app, [*[a if a != "8" else "16" for a in base], "--resume"])
    assert res.exit_code == 0, res.output
    assert len([t for t in _study(url2).get_trials() if t.user_attrs.get("seeded_neighbour")]) == len(seeded)


def test_seed_config_is_measured_right_after_the_default(tmp_path):
    """--seed-config JSON: the given knob values, applied on each key's default, are the study's next
    trials (a seed naming only another pass's knobs is skipped, an invalid one is dropped with a note);
    a bad knob or value is a one-line error before anything runs."""
    from optuna.trial import TrialState
    from typer.testing import CliRunner

    from pathtune.cli import app

    url = f"sqlite:///{tmp_path / 'tune.sqlite3'}"
    # (the D64 default runs ut_precision and bwd_transition_precision tf32: the seeds move them to tf32x3)
    seeds = ('[{"ut_precision": "tf32x3"}, {"ut_precision": "tf32x3", "bwd_transition_precision": "tf32x3"}, '
             '{"decode_splits": 8}, {"superchunk_size": 1024, "block_n": 128, "chunk_size": 64}]')
    args = ["tune", "--head-dim", "64", "--pass", "bwd", "--buckets", "1024", "--storage", url, "--measure-with",
            FAKE, "--startup-trials", "2", "--seed-neighbours", "0", "--budget", "5", "--spec", SPEC,
            "--seed-config", seeds, "--seed-config", '{"bwd_block_m": 128}']
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    trials = sorted(_study(url).get_trials(states=(TrialState.COMPLETE,)), key=lambda t: t.number)
    default = trials[0].params
    assert trials[0].user_attrs.get("seeded_default")
    changes = [{n: t.params[n] for n in default if t.params[n] != default[n]} for t in trials[1:4]]
    assert all(t.user_attrs.get("seeded_user") for t in trials[1:4])
    assert changes == [{"ut_precision": "tf32x3"}, {"ut_precision": "tf32x3", "bwd_transition_precision": "tf32x3"},
                       {"bwd_block_m": 128}]
    assert not any(t.user_attrs.get("seeded_user") for t in trials[4:])
    # resumed with the same seeds: nothing enqueued twice
    res = CliRunner().invoke(app, [*[a if a != "5" else "7" for a in args], "--resume"])
    assert res.exit_code == 0, res.output
    assert len([t for t in _study(url).get_trials() if t.user_attrs.get("seeded_user")]) == 3

    # a seed that breaks a constraint at a key's head dim is dropped for that key, with the reason
    from pathtune.specs import load_spec
    from pathtune.tuning.space import default_config, seed_configs

    spec = load_spec(SPEC)
    (key,) = plan_keys([256], ["bfloat16"], ["fwd"], ["triton"], [1024])
    kept, notes = seed_configs(spec, key, default_config(spec, key), [{"chunk_size": 128}, {"ut_precision": "tf32"}])
    assert [c["ut_precision"] for c in kept] == ["tf32"]
    assert len(notes) == 1 and "UT chunk tile" in notes[0] and "dropped" in notes[0]

    for bad, words in [('{"ut_precison": "tf32"}', "not in the spec"), ('{"ut_precision": "fp8"}', "not in its domain"),
                       ("[{", "is not JSON"), ('[{}]', "non-empty JSON object")]:
        res = CliRunner().invoke(app, [*args[:-4], "--seed-config", bad])
        assert res.exit_code == 1 and words in " ".join(res.output.split()), (bad, res.output)
    res = CliRunner().invoke(app, [*args[:-4], "--seed-config", '{"ut_precison": "tf32"}'])
    assert "did you mean 'ut_precision'" in " ".join(res.output.split())
