"""Warm start (``--seed-retired K``): a new study measures, right after its default, the K best configs
that won under retired kernel sources of the same key, with the cost model of tests/tune_fake.py.

Synthetic records under an older "kernel source" of the fake cost model (``fake-cost-model-v0``; the
tuner keys its studies by ``tune_fake.SOURCE_HASH``, v1) in a temporary SQLite perf_db or in a shipped
results file; nothing here is a real measurement.
"""
from __future__ import annotations

import ast
import json
import logging
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import tune_fake  # noqa: E402
from pathtune.perf_db import KernelKey, Measurement, PerfDB, results_record, write_results  # noqa: E402
from pathtune.specs import Config, KnobSpace  # noqa: E402
from pathtune.tuning.space import default_config, plan_keys  # noqa: E402
from pathtune.tuning.tuner import Budget, TuneOptions, Tuner  # noqa: E402
from pathtune.tuning.warm import rank_retired, select_retired  # noqa: E402

OLD, OLDER = "fake-cost-model-v0", "fake-cost-model-v-1"
T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)


def make_env(gpu="TEST-GPU", triton="3.6.0", **kw):
    env = {"gpu_name": gpu, "gpu_count": 1, "compute_capability": "9.0", "sm_count": 132,
           "gpu_memory_bytes": 150_000_000_000, "driver": "580.1", "cuda_runtime": "13.0", "ptxas": "12.8.93",
           "torch": "2.11.0", "triton": triton, "tvm": None, "tvm_ffi": None, "pathtune": "0.1.0",
           "python": "3.11.0", "platform": "test", "host": "test-host"}
    env.update(kw)
    return env


ENV = make_env()


FakePreparer = tune_fake.FakePreparer     # every config compiles


def _key(pass_="fwd", bucket=1024):
    return plan_keys([64], ["bfloat16"], [pass_], ["triton"], [bucket])[0]


def _kernel(spec, source=OLD, pass_="fwd"):
    return KernelKey(pass_=pass_, backend="triton", spec_hash=spec.hash, codegen_version="1", source_hash=source)


def _ok(ms, when):
    return Measurement(status="ok", median_ms=ms, p20_ms=ms, p80_ms=ms, n_reps=10, bench_method="synthetic",
                       errors={"o": 1e-3}, baseline_ms=0.5, created_at=when)


def _facts(spec):
    """(env, kernel, workload, config, measurement) of a retired tune of the fwd D64 T1024 key, plus noise,
    and the configs a warm start must pick from them, best first."""
    key = _key()
    d = default_config(spec, key)
    b, a, e = d.replace(block_n=64), d.replace(num_stages=3), d.replace(num_warps=8)
    f = d.replace(superchunk_size=2048)
    bad_domain = dict(d.to_dict(), chunk_size=96)                        # no longer in chunk_size's domain
    bad_knob = dict(d.to_dict(), old_knob=1)                             # a knob the spec dropped
    old, older = _kernel(spec), _kernel(spec, OLDER)
    wl = key.workload
    facts = [
        (ENV, old, wl, bad_domain, _ok(0.60, T0 + timedelta(hours=1))),
        (ENV, old, wl, bad_knob, _ok(0.65, T0 + timedelta(hours=1))),
        (ENV, old, wl, d, _ok(0.70, T0 + timedelta(hours=1))),           # the default's knobs: not again
        (ENV, old, wl, b, _ok(0.90, T0 + timedelta(hours=1))),
        (ENV, old, wl, b, _ok(0.95, T0 + timedelta(hours=2))),           # b again, slower (another run)
        (ENV, old, wl, a, _ok(1.00, T0 + timedelta(hours=2))),
        (ENV, old, wl, e, _ok(1.20, T0 + timedelta(hours=3))),
        (ENV, older, wl, f, _ok(0.50, T0)),                              # an older source: after all of v0's
        (ENV, older, wl, b, _ok(0.40, T0)),                              # ... and b only once
        # never used: another workload, pass, GPU, Triton; a failure; the current source
        (ENV, old, _key(bucket=2048).workload, d.replace(chunk_size=32), _ok(0.1, T0)),
        (ENV, _kernel(spec, pass_="bwd"), _key("bwd").workload,
         default_config(spec, _key("bwd")).replace(bwd_num_warps=8), _ok(0.1, T0)),
        (make_env(gpu="TEST-GPU-B"), old, wl, d.replace(chunk_size=32), _ok(0.1, T0)),
        (make_env(triton="3.5.0"), old, wl, d.replace(block_m=64), _ok(0.1, T0)),
        (ENV, old, wl, d.replace(inter_num_warps=4), Measurement(status="wrong", errors={"o": 0.5})),
    ]
    return facts, [b, a, e, f]


def _record(url, facts, run="retired-run"):
    with PerfDB(url, current_keys=None) as db:
        for i, (env, k, wl, c, m) in enumerate(facts):
            db.record(env, k, wl, c, m, run_id=f"{run}-{i}")


def _study(url):
    import optuna

    (name,) = optuna.get_all_study_names(url)
    return optuna.load_study(study_name=name, storage=url)


def _measured(tmp_path):
    path = tmp_path / "calls.log"
    lines = path.read_text().splitlines() if path.exists() else []
    return [dict(ast.literal_eval(line.split(" ", 4)[4])) for line in lines if line.startswith("start")]


def _tuner(url, spec_copy, **kw):
    opts = dict(storage=url, budget=Budget(trials=6), measure_fn=tune_fake.measure, spec_path=spec_copy,
                startup_trials=2, heartbeat=None, env_info=ENV, seed_retired=3)
    opts.update(kw)
    return Tuner([_key()], TuneOptions(**opts))


@pytest.mark.parametrize("seconds", [1e-3, -1.0], ids=["one-batch", "out-of-time"])
def test_new_study_measures_retired_winners_first_in_the_first_batch(tmp_path, spec_copy, caplog, seconds):
    """A wall budget of one batch (or none left: the key's batch of just the seeded configs), and fewer
    compile workers than seeded configs: the default, then the retired winners best first, all in the
    first batch; the default is deduplicated, invalid configs are dropped with a note, other
    workloads / passes / environments are not used."""
    from optuna.trial import TrialState

    from pathtune.specs import load_spec

    spec = load_spec(spec_copy)
    facts, want = _facts(spec)
    url = f"sqlite:///{tmp_path / 'tune.sqlite3'}"
    _record(url, facts)
    prep = FakePreparer(workers=2)
    tuner = _tuner(url, spec_copy, budget=Budget(seconds=seconds), preparer=prep, seed_neighbours=2)
    with caplog.at_level(logging.INFO, logger="pathtune.tune"):
        (result,) = tuner.run()
    tuner.close()

    default = default_config(spec, _key()).to_dict()
    first = [default] + [c.to_dict() for c in want[:3]]
    assert prep.batches[0] == first, "the default, then the retired winners best first, in one batch"
    assert len(prep.batches) == 1
    assert _measured(tmp_path) == first
    study = _study(url)
    trials = sorted(study.get_trials(states=(TrialState.COMPLETE,)), key=lambda t: t.number)
    assert len(trials) == 4
    assert trials[0].user_attrs.get("seeded_default") and not trials[0].user_attrs.get("seeded_retired")
    for t, c in zip(trials[1:], want):
        assert t.user_attrs["seeded_retired"] and t.user_attrs["config"] == c.to_dict()
        assert t.user_attrs["retired_source"] == OLD
    assert trials[1].user_attrs["retired_ms"] == 0.90          # b's best under its newest source
    assert study.user_attrs["retired_seeded"] == 3 and result.seeded_retired == 3
    # the neighbours wait behind them; "speedup over default" still compares with the seeded default
    waiting = study.get_trials(states=(TrialState.WAITING,))
    assert waiting and all(t.user_attrs.get("seeded_neighbour") for t in waiting)
    # ... one schedule knob away from the fastest retired config (the previous kernels' winner), not the default
    best = want[0].to_dict()
    for t in waiting:
        fixed = t.system_attrs["fixed_params"]
        assert sum(fixed[k] != v for k, v in best.items() if k in fixed) == 1, fixed
    assert result.default_ms == pytest.approx(tune_fake.cost_ms(default, 1024))
    assert result.best_ms == pytest.approx(min(tune_fake.cost_ms(c, 1024) for c in first))

    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "3 configs that won under retired kernel sources" in text
    dropped = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert len(dropped) == 2 and all("no longer validates" in m for m in dropped)
    assert any("chunk_size=96 is not in its domain" in m for m in dropped)
    assert any("knob 'old_knob' is not used by pass fwd" in m for m in dropped)


def test_more_retired_configs_than_k_older_source_next_and_k_zero_disables(tmp_path, spec_copy):
    from optuna.trial import TrialState

    from pathtune.specs import load_spec

    spec = load_spec(spec_copy)
    facts, want = _facts(spec)
    url = f"sqlite:///{tmp_path / 'tune.sqlite3'}"
    _record(url, facts)
    prep = FakePreparer(workers=8)
    tuner = _tuner(url, spec_copy, preparer=prep, seed_retired=5, seed_neighbours=1)
    tuner.run()
    tuner.close()
    default = default_config(spec, _key()).to_dict()
    # only four usable configs: v0's three, then the older source's one it did not already give
    assert prep.batches[0][:5] == [default] + [c.to_dict() for c in want]
    assert _study(url).user_attrs["retired_seeded"] == 4

    url0 = f"sqlite:///{tmp_path / 'off.sqlite3'}"
    _record(url0, facts)
    prep0 = FakePreparer(workers=4)
    tuner = _tuner(url0, spec_copy, preparer=prep0, seed_retired=0, budget=Budget(trials=4))
    tuner.run()
    tuner.close()
    study = _study(url0)
    assert "retired_seeded" not in study.user_attrs
    assert not [t for t in study.get_trials() if t.user_attrs.get("seeded_retired")]
    assert prep0.batches[0][0] == default and not {json.dumps(c, sort_keys=True) for c in prep0.batches[0][1:]} & \
        {json.dumps(c.to_dict(), sort_keys=True) for c in want}
    assert study.get_trials(states=(TrialState.COMPLETE,))


def test_resume_does_not_enqueue_again(tmp_path, spec_copy):
    """--resume: a warm-started study is not warm-started again, nor is one that had trials before."""
    from pathtune.specs import load_spec

    spec = load_spec(spec_copy)
    facts, want = _facts(spec)
    url = f"sqlite:///{tmp_path / 'tune.sqlite3'}"
    _record(url, facts)
    tuner = _tuner(url, spec_copy, preparer=FakePreparer(workers=4), budget=Budget(trials=4))
    tuner.run()
    tuner.close()
    assert len([t for t in _study(url).get_trials() if t.user_attrs.get("seeded_retired")]) == 3

    # records of a newer retired source arrive meanwhile; a resumed study still does not take them
    d = default_config(spec, _key())
    _record(url, [(ENV, _kernel(spec, "fake-cost-model-v0.5"), _key().workload, d.replace(block_m=64),
                   _ok(0.3, T0 + timedelta(days=1)))], run="newer")
    tuner = _tuner(url, spec_copy, preparer=FakePreparer(workers=4), budget=Budget(trials=10), resume=True)
    tuner.run()
    tuner.close()
    study = _study(url)
    assert len([t for t in study.get_trials() if t.user_attrs.get("seeded_retired")]) == 3
    assert study.user_attrs["retired_seeded"] == 3

    # a study tuned without warm start, resumed with it: not a new study, nothing enqueued
    url2 = f"sqlite:///{tmp_path / 'tune2.sqlite3'}"
    _record(url2, facts)
    _tuner(url2, spec_copy, preparer=FakePreparer(workers=4), budget=Budget(trials=2), seed_retired=0).run()
    tuner = _tuner(url2, spec_copy, preparer=FakePreparer(workers=4), budget=Budget(trials=6), resume=True)
    tuner.run()
    tuner.close()
    study = _study(url2)
    assert "retired_seeded" not in study.user_attrs
    assert not [t for t in study.get_trials() if t.user_attrs.get("seeded_retired")]


def test_shipped_results_warm_start_a_fresh_or_pruned_database(tmp_path, spec_copy, monkeypatch, caplog):
    """On a fresh GPU host the shipped results hold the previous tune: open_default ingests them, and
    they are read directly too, so a database whose retired records gc pruned still warm-starts.  (A
    shipped file holds only configs of its spec's knob space: parse_results refuses others, and
    test_shipped checks every shipped file, so the invalid facts stay out of it here.)"""
    from pathtune.specs import load_spec

    spec = load_spec(spec_copy)
    facts, want = _facts(spec)
    valid = [f for f in facts if not KnobSpace(spec, "fwd").validate(dict(f[3]), f[2]) or f[1].pass_ != "fwd"]
    assert len(valid) == len(facts) - 2
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    write_results(shipped / "TEST-GPU-20261101T000000Z-d64-fwd.json",
                  [results_record(env, k, wl, c, m, run_id=f"tune-shipped-{i}")
                   for i, (env, k, wl, c, m) in enumerate(valid)])
    monkeypatch.setenv("PATHTUNE_SHIPPED_DIR", str(shipped))
    url = f"sqlite:///{tmp_path / 'tune.sqlite3'}"
    current = lambda op, pass_, backend: {"spec_hash": spec.hash, "source_hash": tune_fake.SOURCE_HASH}  # noqa: E731
    with PerfDB.open_default(url, current_keys=current) as db:       # ingests the shipped file
        assert db.retired(ENV, _kernel(spec, tune_fake.SOURCE_HASH), _key().workload)
        assert db.gc(dry_run=False, current_keys=current, env_info=ENV).total     # ... and prunes it again
        assert not db.retired(ENV, _kernel(spec, tune_fake.SOURCE_HASH), _key().workload)
    prep = FakePreparer(workers=4)
    tuner = _tuner(url, spec_copy, preparer=prep, budget=Budget(trials=4))
    with caplog.at_level(logging.INFO, logger="pathtune.tune"):
        tuner.run()
    tuner.close()
    assert prep.batches[0] == [default_config(spec, _key()).to_dict()] + [c.to_dict() for c in want[:3]]


def test_after_a_spec_change_the_earlier_specs_winners_warm_start_with_new_knobs_at_defaults(tmp_path, spec_copy,
                                                                                            caplog):
    """A spec change (here: a knob added since the records were measured) retires every record of the pass:
    with no retired record of the current spec, a new study takes the winners of earlier specs, the knobs
    they lack at the key's defaults; a config with a knob the spec no longer has is dropped.  Once the
    current spec has retired records of its own, the earlier spec's are not used."""
    from pathtune.specs import load_spec

    spec = load_spec(spec_copy)
    key = _key()
    d = default_config(spec, key)
    earlier = KernelKey(pass_="fwd", backend="triton", spec_hash="e" * 64, codegen_version="1", source_hash=OLD)

    def measured_before(config):   # the record of a spec without ut_diag_block (which this one adds)
        return {n: v for n, v in config.to_dict().items() if n != "ut_diag_block"}

    b, a = d.replace(block_n=64), d.replace(num_stages=3)
    url = f"sqlite:///{tmp_path / 'tune.sqlite3'}"
    _record(url, [(ENV, earlier, key.workload, measured_before(b), _ok(0.9, T0 + timedelta(hours=1))),
                  (ENV, earlier, key.workload, measured_before(a), _ok(1.0, T0 + timedelta(hours=1))),
                  (ENV, earlier, key.workload, dict(measured_before(d), gone_knob=2), _ok(0.5, T0))])
    prep = FakePreparer(workers=4)
    tuner = _tuner(url, spec_copy, preparer=prep, budget=Budget(trials=3), seed_neighbours=0)
    with caplog.at_level(logging.INFO, logger="pathtune.tune"):
        (result,) = tuner.run()
    tuner.close()
    assert prep.batches[0] == [d.to_dict(), b.to_dict(), a.to_dict()]
    assert result.seeded_retired == 2
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "2 configs that won under retired kernel sources of an earlier spec" in text
    assert "knob 'gone_knob' is not used by pass fwd" in text

    # the current spec's own retired record wins over every earlier spec's
    url2 = f"sqlite:///{tmp_path / 'tune2.sqlite3'}"
    e = d.replace(num_warps=8)
    _record(url2, [(ENV, earlier, key.workload, measured_before(b), _ok(0.9, T0 + timedelta(hours=5))),
                   (ENV, _kernel(spec), key.workload, e, _ok(1.2, T0))])
    prep = FakePreparer(workers=4)
    tuner = _tuner(url2, spec_copy, preparer=prep, budget=Budget(trials=2), seed_neighbours=0)
    tuner.run()
    tuner.close()
    assert prep.batches[0] == [d.to_dict(), e.to_dict()]


def test_seeded_configs_of_every_key_compile_in_one_wave(tmp_path, spec_copy, caplog):
    """Several keys: the seeded configs of all of them (defaults, warm start) compile in one wave before any key
    is measured, a config shared by two length buckets of one shape once; each key's first batch then measures
    them without compiling them again, and only proposals beyond the seeds reach the compile workers later."""
    from optuna.trial import TrialState

    from pathtune.specs import load_spec

    spec = load_spec(spec_copy)
    facts, want = _facts(spec)
    url = f"sqlite:///{tmp_path / 'tune.sqlite3'}"
    _record(url, facts)
    keys = [_key(bucket=1024), _key(bucket=2048)]
    prep = FakePreparer(workers=3)
    opts = dict(storage=url, budget=Budget(trials=5), measure_fn=tune_fake.measure, spec_path=spec_copy,
                startup_trials=2, heartbeat=None, env_info=ENV, seed_retired=3, seed_neighbours=0, preparer=prep)
    tuner = Tuner(keys, TuneOptions(**opts))
    with caplog.at_level(logging.INFO, logger="pathtune.tune"):
        results = tuner.run()
    tuner.close()
    default = default_config(spec, keys[0]).to_dict()
    seeded = [default] + [c.to_dict() for c in want[:3]]
    # the T2048 key: its default (the T1024 default, the same kernels: compiled once) and its one retired winner
    seeded.append(dict(default, chunk_size=32))
    assert prep.batches[0] == seeded
    for later in prep.batches[1:]:
        assert not [c for c in later if c in seeded]
    assert "compiled the seeded configs of 2 keys in one wave: 5 configs, 6 trials" in \
        "\n".join(r.getMessage() for r in caplog.records)
    for res in results:
        assert res.trials == 5 and res.default_ms is not None
    import optuna

    for name in optuna.get_all_study_names(url):
        study = optuna.load_study(study_name=name, storage=url)
        assert not study.get_trials(states=(TrialState.WAITING, TrialState.RUNNING))


def test_shipped_file_with_a_config_outside_the_knob_space_is_skipped(tmp_path, spec_copy, monkeypatch, caplog):
    """A shipped file holding a config outside the spec's knob space is skipped whole, with a warning
    naming the file and the knob, and the user's database opens without it."""
    from pathtune.specs import load_spec

    spec = load_spec(spec_copy)
    facts, _ = _facts(spec)
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    doc = {"format": "pathtune-results", "version": 1, "runs": [{"run_id": "r", "command": "pathtune tune"}],
           "records": [results_record(env, k, wl, c, m, run_id="r") for env, k, wl, c, m in facts]}
    (shipped / "TEST-GPU-20261101T000000Z-bad.json").write_text(json.dumps(doc))   # write_results refuses it
    monkeypatch.setenv("PATHTUNE_SHIPPED_DIR", str(shipped))
    with caplog.at_level(logging.WARNING, logger="pathtune.perf_db"):
        with PerfDB.open_default(f"sqlite:///{tmp_path / 'db.sqlite3'}", current_keys=None) as db:
            assert db.query() == []
    assert any("TEST-GPU-20261101T000000Z-bad.json" in r.getMessage() and "chunk_size=96 is not in its domain"
               in r.getMessage() for r in caplog.records)


def test_cli_seed_retired_unbatched_and_help(tmp_path, spec_copy, monkeypatch):
    """``pathtune tune --seed-retired K`` (the measuring process compiles: no batches): the default and
    the retired winners run first even when the first trial outlasts the wall budget."""
    from optuna.trial import TrialState
    from typer.testing import CliRunner

    from pathtune.cli import app
    from pathtune.runtime.environment import collect_env
    from pathtune.specs import load_spec

    spec = load_spec(spec_copy)
    env = collect_env()           # the local tune keys records by this host's environment
    facts, want = _facts(spec)
    url = f"sqlite:///{tmp_path / 'tune.sqlite3'}"
    _record(url, [(env if e is ENV else e, k, wl, c, m) for e, k, wl, c, m in facts])
    args = ["tune", "--head-dim", "64", "--pass", "fwd", "--buckets", "1024", "--storage", url, "--measure-with",
            f"{HERE / 'tune_fake.py'}:measure", "--startup-trials", "2", "--seed-neighbours", "0", "--spec",
            str(spec_copy)]
    monkeypatch.setenv("PATHTUNE_FAKE_SLEEP", "0.5")       # each "measurement" outlasts the whole budget
    res = CliRunner().invoke(app, [*args, "--seed-retired", "2", "--budget", "0.2s"])
    monkeypatch.delenv("PATHTUNE_FAKE_SLEEP")
    assert res.exit_code == 0, res.output
    assert "2 configs that won under retired kernel sources" in res.output and "no longer validates" in res.output
    default = default_config(spec, _key()).to_dict()
    assert _measured(tmp_path) == [default] + [c.to_dict() for c in want[:2]]
    study = _study(url)
    assert study.user_attrs["retired_seeded"] == 2

    res = CliRunner().invoke(app, [*args, "--seed-retired", "2", "--budget", "5", "--resume"])
    assert res.exit_code == 0, res.output
    assert "won under retired kernel sources" not in res.output
    study = _study(url)
    assert len(study.get_trials(states=(TrialState.COMPLETE,))) >= 5
    assert len([t for t in study.get_trials() if t.user_attrs.get("seeded_retired")]) == 2

    res = CliRunner().invoke(app, ["tune", "--help"])
    assert "--seed-retired" in res.output


def test_cli_both_gates_tunes_the_fox_and_the_plain_keys_in_one_run(tmp_path, spec_copy):
    from typer.testing import CliRunner

    from pathtune.cli import app

    url = f"sqlite:///{tmp_path / 'tune.sqlite3'}"
    args = ["tune", "--head-dim", "64", "--pass", "fwd", "--buckets", "1024", "--storage", url, "--measure-with",
            f"{HERE / 'tune_fake.py'}:measure", "--startup-trials", "0", "--seed-neighbours", "0", "--spec",
            str(spec_copy), "--budget", "2", "--both-gates"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "pathtune tune: 2 keys" in res.output
    with PerfDB(url, current_keys=None) as db:
        assert {r["workload"]["use_gate"] for r in db.query()} == {True, False}


def test_rank_and_select():
    from pathtune.specs import load_spec

    spec = load_spec()
    key = _key()
    d = default_config(spec, key)
    rows = [
        {"config": d.replace(num_warps=8).to_dict(), "median_ms": 2.0, "source_hash": "new", "created_at": T0},
        {"config": d.replace(num_stages=3).to_dict(), "median_ms": 3.0, "source_hash": "new",
         "created_at": T0 - timedelta(days=9)},                          # the source's newest time counts
        {"config": d.replace(block_n=64).to_dict(), "median_ms": 0.5, "source_hash": "old",
         "created_at": T0 - timedelta(days=1)},
        {"config": d.replace(block_n=32).to_dict(), "median_ms": 0.1, "source_hash": "undated", "created_at": None},
        {"config": d.replace(num_warps=8).to_dict(), "median_ms": 1.5, "source_hash": "new", "created_at": None},
    ]
    for r in rows:
        r["config_hash"] = Config(r["config"]).hash
        r["origin"] = "test"
    ranked = rank_retired(rows)
    assert [(r["source_hash"], r["median_ms"]) for r in ranked] == [("new", 1.5), ("new", 3.0), ("old", 0.5),
                                                                     ("undated", 0.1)]
    warm = select_retired(spec, key, d, rows, 3)
    assert [c for c, _ in warm.configs] == [d.replace(num_warps=8), d.replace(num_stages=3), d.replace(block_n=64)]
    assert select_retired(spec, key, d, rows, 0).configs == []
    assert select_retired(spec, key, d, [], 3).configs == []


@pytest.mark.parametrize("batched", [True, False], ids=["batched", "unbatched"])
def test_a_trial_cap_never_cuts_the_seeded_configs(tmp_path, spec_copy, batched):
    """--budget 3 with two --seed-config values and a warm start: the default, both user seeds and every retired
    winner are measured (the previous winner would else be the one cut, as the user's seeds come first); a
    resumed study at its cap measures a newly given seed too, and nothing the sampler proposes."""
    from optuna.trial import TrialState

    from pathtune.specs import load_spec

    spec = load_spec(spec_copy)
    facts, want = _facts(spec)
    url = f"sqlite:///{tmp_path / 'tune.sqlite3'}"
    _record(url, facts)
    seeds = [{"block_m": 64}, {"ut_diag_block": 16}]
    prep = {"preparer": FakePreparer(workers=2)} if batched else {}
    tuner = _tuner(url, spec_copy, budget=Budget(trials=3), seed_configs=seeds, seed_neighbours=0, **prep)
    tuner.run()
    tuner.close()
    default = default_config(spec, _key())
    study = _study(url)
    done = [t.user_attrs["config"] for t in study.get_trials(states=(TrialState.COMPLETE,))]
    expect = [default.to_dict()] + [default.replace(**s).to_dict() for s in seeds] + [c.to_dict() for c in want[:3]]
    assert sorted(map(json.dumps, done)) == sorted(map(json.dumps, expect)), len(done)
    assert not study.get_trials(states=(TrialState.WAITING,))

    late = {"num_warps": 8, "block_m": 64}
    tuner = _tuner(url, spec_copy, budget=Budget(trials=3), seed_configs=[late], seed_neighbours=0, resume=True,
                   **({"preparer": FakePreparer(workers=2)} if batched else {}))
    tuner.run()
    tuner.close()
    done2 = [t.user_attrs["config"] for t in _study(url).get_trials(states=(TrialState.COMPLETE,))]
    assert len(done2) == len(done) + 1 and default.replace(**late).to_dict() in done2


def test_each_key_is_compared_with_the_previous_kernels_best(tmp_path, spec_copy, capsys):
    """A key's result carries the fastest ok time under retired kernel sources on this GPU (any of them: 0.40 ms,
    the older source's) and the tuned time over it; the tune report adds that ratio as a column and lists, after
    the table, the keys more than SLOWER_THAN_PREVIOUS slower (not those within it, nor a key without a retired
    time)."""
    import dataclasses

    from pathtune.cli import tune as tune_cli
    from pathtune.specs import load_spec

    spec = load_spec(spec_copy)
    facts, _ = _facts(spec)
    url = f"sqlite:///{tmp_path / 'tune.sqlite3'}"
    _record(url, facts)
    tuner = _tuner(url, spec_copy, budget=Budget(trials=2), seed_neighbours=0, preparer=FakePreparer(workers=2))
    (result,) = tuner.run()
    tuner.close()
    assert result.previous_ms == pytest.approx(0.40) and result.previous_source == OLDER
    assert result.vs_previous == pytest.approx(result.best_ms / 0.40)
    assert result.to_dict()["previous_ms"] == pytest.approx(0.40)

    near = dataclasses.replace(result, best_ms=0.41)                     # within noise of the previous best
    slow = dataclasses.replace(result, best_ms=0.50)
    none = dataclasses.replace(result, previous_ms=None, previous_source=None)
    for r, flagged in ((near, False), (slow, True), (none, False)):
        tune_cli._report([r], None)
        out = capsys.readouterr().out
        assert ("slower than the previous kernels' best" in out) == flagged, out
        assert ("1.25x the 0.4" in out) == flagged, out
        assert (f"{OLDER[:10]}" in out) == flagged, out


def _other_gpu_facts(spec):
    """Records of the fwd D64 T1024 key under the CURRENT kernels on two other GPUs (and what must not be used),
    and the configs a new study must measure after its default, in order."""
    key = _key()
    d = default_config(spec, key)
    a, b, e = d.replace(num_stages=3), d.replace(block_n=64), d.replace(num_warps=8)
    now = _kernel(spec, tune_fake.SOURCE_HASH)
    wl = key.workload
    gpu_b, gpu_c = make_env(gpu="TEST-GPU-B"), make_env(gpu="TEST-GPU-C")
    facts = [
        (gpu_c, now, wl, e, _ok(0.40, T0 + timedelta(hours=2))),         # the newest GPU: its fastest first
        (gpu_c, now, wl, b, _ok(0.45, T0 + timedelta(hours=2))),
        (gpu_b, now, wl, dict(d.to_dict(), chunk_size=96), _ok(0.30, T0)),   # no longer validates: dropped
        (gpu_b, now, wl, b, _ok(0.50, T0)),                              # b again: once
        (gpu_b, now, wl, a, _ok(0.41, T0)),                              # after GPU C's second (one per GPU a round)
        (gpu_b, now, wl, d, _ok(0.20, T0)),                              # the default's knobs: not again
        # never used: a retired source, another workload, a failure on another GPU
        (gpu_b, _kernel(spec), wl, d.replace(block_m=64), _ok(0.1, T0)),
        (gpu_b, now, _key(bucket=2048).workload, d.replace(chunk_size=32), _ok(0.1, T0)),
        (gpu_c, now, wl, d.replace(inter_num_warps=4), Measurement(status="wrong", errors={"o": 0.5})),
    ]
    return facts, [e, b, a]


@pytest.mark.parametrize("where", ["perf_db", "shipped"])
def test_a_new_study_also_measures_the_winners_of_other_gpus_under_the_current_kernels(tmp_path, spec_copy, caplog,
                                                                                        monkeypatch, where):
    """--seed-other-gpus K: a new study on a GPU without records of the key measures, right after its default and
    in its first batch, the fastest configs other GPUs measured for the same key under the current kernels and
    spec (each GPU's fastest first, the newest GPU first; the default's knobs, duplicates and configs that no longer
    validate left out), from perf_db or from the shipped results; K = 0 seeds none."""
    from optuna.trial import TrialState

    from pathtune.specs import load_spec

    spec = load_spec(spec_copy)
    facts, want = _other_gpu_facts(spec)
    url = f"sqlite:///{tmp_path / 'tune.sqlite3'}"
    if where == "perf_db":
        _record(url, facts)
    else:
        shipped = tmp_path / "shipped"
        shipped.mkdir()
        valid = [f for f in facts if not KnobSpace(spec, "fwd").validate(dict(f[3]), f[2])]
        write_results(shipped / "TEST-GPU-B-20261101T000000Z-d64-fwd.json",
                      [results_record(env, k, wl, c, m, run_id=f"tune-shipped-{i}")
                       for i, (env, k, wl, c, m) in enumerate(valid)])
        monkeypatch.setenv("PATHTUNE_SHIPPED_DIR", str(shipped))
    prep = FakePreparer(workers=4)
    tuner = _tuner(url, spec_copy, preparer=prep, seed_retired=0, seed_other_gpus=3, budget=Budget(trials=4))
    with caplog.at_level(logging.INFO, logger="pathtune.tune"):
        tuner.run()
    tuner.close()
    default = default_config(spec, _key()).to_dict()
    assert prep.batches[0] == [default] + [c.to_dict() for c in want]
    study = _study(url)
    seeded = [t for t in sorted(study.get_trials(states=(TrialState.COMPLETE,)), key=lambda t: t.number)
              if t.user_attrs.get("seeded_other_gpu")]
    assert [t.user_attrs["other_gpu"] for t in seeded] == ["TEST-GPU-C", "TEST-GPU-C", "TEST-GPU-B"]
    assert [t.user_attrs["other_gpu_ms"] for t in seeded] == [0.40, 0.45, 0.41]
    assert study.user_attrs["other_gpus_seeded"] == 3
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "the fastest configs of other GPUs under these kernels: 0.4 ms on TEST-GPU-C" in text
    if where == "perf_db":
        assert "chunk_size=96 is not in its domain" in text

    url0 = f"sqlite:///{tmp_path / 'off.sqlite3'}"
    if where == "perf_db":
        _record(url0, facts)
    prep0 = FakePreparer(workers=4)
    tuner = _tuner(url0, spec_copy, preparer=prep0, seed_retired=0, budget=Budget(trials=1))
    tuner.run()
    tuner.close()
    assert prep0.batches[0] == [default]
