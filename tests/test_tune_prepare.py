"""Batched tuning: candidates compiled in parallel child processes, then measured one at a time.

* ``Preparer`` against stub children (no torch in them): results in task order, several children at
  once, a child that dies or hangs is a recorded ``crash`` / ``timeout``, ``should_stop`` cuts the
  batch short.
* ``Tuner`` with an injected preparer and the cost model of tune_fake.py: every measured config was
  compiled first, in batches; a config whose compile child failed is recorded with that status and
  never measured in the tuner's process; the seeded default leads the first batch; lookups and the
  trial budget hold as in the unbatched loop.
(The real child, ``python -m pathtune.tuning.prepare`` on the Triton kernels, runs in
test_tune_triton.py under the interpreter.)
"""
from __future__ import annotations

import json
import sys
import textwrap
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import tune_fake  # noqa: E402
from pathtune.tuning.measure import MeasureTask  # noqa: E402
from pathtune.tuning.prepare import PREPARED, Preparer  # noqa: E402

STUB = textwrap.dedent("""
    import json, os, sys, time
    task = json.loads(sys.stdin.read())
    what = task["config"]["what"]
    if what == "die":
        os._exit(7)
    time.sleep(float(task["config"].get("sleep", 0)))
    print("some compiler chatter")
    if what == "oor":
        print("pathtune-prepare-result: " + json.dumps({"status": "out_of_resources", "message": "smem"}))
    else:
        print("pathtune-prepare-result: " + json.dumps({"status": "prepared", "seconds": 0.1, "id": task["task_id"]}))
""")


def _task(i, **config):
    return MeasureTask(pass_="fwd", backend="triton", workload={}, config=config, batch=1, seq_len=16, task_id=str(i))


def _stub(tmp_path, **kw):
    path = tmp_path / "stub.py"
    path.write_text(STUB)
    return Preparer(command=[sys.executable, str(path)], **kw)


def test_preparer_runs_children_in_parallel_and_records_failures(tmp_path):
    prep = _stub(tmp_path, workers=4, timeout_s=20)
    tasks = [_task(0, what="ok", sleep=1.0), _task(1, what="die"), _task(2, what="oor"),
             _task(3, what="ok", sleep=1.0), _task(4, what="ok", sleep=1.0)]
    t0 = time.monotonic()
    out = prep.run(tasks)
    elapsed = time.monotonic() - t0
    assert [r["status"] for r in out] == [PREPARED, "crash", "out_of_resources", PREPARED, PREPARED]
    assert [out[i]["id"] for i in (0, 3, 4)] == ["0", "3", "4"]        # results in task order
    assert "exited with code 7" in out[1]["message"]
    assert elapsed < 2.9, f"three 1 s children on 4 workers took {elapsed:.1f} s: not parallel"


def test_preparer_timeout_and_stop(tmp_path):
    prep = _stub(tmp_path, workers=2, timeout_s=1.0)
    out = prep.run([_task(0, what="ok", sleep=30), _task(1, what="ok")])
    assert out[0]["status"] == "timeout" and "killed" in out[0]["message"]
    assert out[1]["status"] == PREPARED

    prep = _stub(tmp_path, workers=1, timeout_s=30)
    t0 = time.monotonic()
    calls = []

    def stop():
        calls.append(1)
        return time.monotonic() - t0 > 0.5

    out = prep.run([_task(0, what="ok", sleep=30), _task(1, what="ok")], should_stop=stop)
    assert time.monotonic() - t0 < 10
    assert [r["status"] for r in out] == ["interrupted", "interrupted"]


def test_preparer_kills_a_straggler_once_half_the_batch_compiled(tmp_path):
    """A child far slower than the median of its batch (ptxas on a spilling config) is killed and
    recorded as timeout, so the batch does not wait minutes for it; the hard timeout stays the cap."""
    prep = _stub(tmp_path, workers=4, timeout_s=60, straggler_factor=3.0, straggler_floor_s=1.5)
    tasks = [_task(i, what="ok", sleep=0.3) for i in range(3)] + [_task(3, what="ok", sleep=30)]
    t0 = time.monotonic()
    out = prep.run(tasks)
    assert time.monotonic() - t0 < 10
    assert [r["status"] for r in out] == [PREPARED] * 3 + ["timeout"]
    assert "straggler" in out[3]["message"] and "killed" in out[3]["message"]

    # fewer than four tasks: no straggler rule (a median of one or two says little)
    out = _stub(tmp_path, workers=3, timeout_s=60, straggler_floor_s=0.1).run(
        [_task(0, what="ok", sleep=0.1), _task(1, what="ok", sleep=1.5)])
    assert [r["status"] for r in out] == [PREPARED, PREPARED]


def test_real_child_ignores_a_pathtune_folder_in_the_working_directory(tmp_path, monkeypatch):
    """A source checkout's root holds a `pathtune/` folder (the package's face, without its
    subpackages); `python -m` in a child started there must still import the installed package."""
    decoy = tmp_path / "checkout"
    (decoy / "pathtune" / "tuning").mkdir(parents=True)
    (decoy / "pathtune" / "__init__.py").write_text("")
    (decoy / "pathtune" / "tuning" / "__init__.py").write_text("raise ImportError('the decoy was imported')\n")
    monkeypatch.chdir(decoy)
    (out,) = Preparer(workers=1, timeout_s=120).run([_task(0, what="x")])   # fails fast inside prepare()
    assert not out.get("child_failed"), out
    assert out["status"] == "crash" and "head_dim" in out["message"]     # prepare() ran: empty workload


def _num_warps_2_fails(config):
    return "ptxas: too many registers" if config.get("num_warps") == 2 else None


class FakePreparer(tune_fake.FakePreparer):
    """Records each batch; configs with num_warps == 2 'fail to compile'."""

    def __init__(self, workers):
        super().__init__(workers, fails=_num_warps_2_fails)


def _measured(tmp_path):
    path = tmp_path / "calls.log"
    lines = path.read_text().splitlines() if path.exists() else []
    return [line.split(" ", 4) for line in lines if line.startswith("start")]


def test_tuner_compiles_batches_before_measuring(tmp_path, spec_copy):
    import optuna
    from optuna.trial import TrialState

    from pathtune.perf_db import PerfDB
    from pathtune.specs import load_spec
    from pathtune.tuning.space import default_config, plan_keys
    from pathtune.tuning.tuner import Budget, TuneOptions, Tuner

    url = f"sqlite:///{tmp_path / 'tune.sqlite3'}"
    keys = plan_keys([64], ["bfloat16"], ["fwd"], ["triton"], [1024])
    prep = FakePreparer(workers=4)
    opts = TuneOptions(storage=url, budget=Budget(trials=14), measure_fn=tune_fake.measure, preparer=prep,
                       spec_path=spec_copy, startup_trials=4, heartbeat=None)
    tuner = Tuner(keys, opts)
    (result,) = tuner.run()
    tuner.close()

    default = default_config(load_spec(spec_copy), keys[0])
    assert prep.batches[0][0] == default.to_dict(), "the seeded default leads the first batch"
    assert all(len(b) <= 4 for b in prep.batches) and len(prep.batches) >= 4
    compiled = [json.dumps(c, sort_keys=True) for b in prep.batches for c in b]
    assert len(compiled) == len(set(compiled)), "a config was compiled twice"

    measured = _measured(tmp_path)
    bad_compiles = sum(1 for b in prep.batches for c in b if c.get("num_warps") == 2)
    assert bad_compiles > 0, "the test wants at least one failing compile among the proposals"
    assert len(measured) == len(compiled) - bad_compiles
    assert not any("('num_warps', 2)" in m[4] for m in measured), "a config that failed to compile was run"

    with PerfDB(url, current_keys=None) as db:
        rows = db.query()
    assert len(rows) == len(compiled)
    for r in rows:
        want = "compile_error" if r["config"].get("num_warps") == 2 else (tune_fake.failure(r["config"]) or "ok")
        assert r["status"] == want
        if want == "compile_error":
            assert r["message"].startswith("compile child:") and r["median_ms"] is None
    assert tuner.fatal is None, "a compile child's fault must not stop the tuner"

    (name,) = optuna.get_all_study_names(url)
    study = optuna.load_study(study_name=name, storage=url)
    complete = study.get_trials(states=(TrialState.COMPLETE,))
    assert len(complete) == 14 and result.trials == 14
    assert not study.get_trials(states=(TrialState.RUNNING,))
    assert study.best_trial.user_attrs["status"] == "ok"
    assert result.best_ms == pytest.approx(tune_fake.cost_ms(result.best_config, 1024))

    # resumed with a larger budget: nothing measured or compiled again
    n_measured, n_compiled = len(measured), len(compiled)
    prep2 = FakePreparer(workers=4)
    tuner = Tuner(keys, TuneOptions(storage=url, budget=Budget(trials=20), measure_fn=tune_fake.measure,
                                    preparer=prep2, spec_path=spec_copy, startup_trials=4, heartbeat=None,
                                    resume=True))
    tuner.run()
    tuner.close()
    again = [json.dumps(c, sort_keys=True) for b in prep2.batches for c in b]
    assert not set(again) & set(compiled)
    assert len(_measured(tmp_path)) - n_measured == len(again) - sum(
        1 for b in prep2.batches for c in b if c.get("num_warps") == 2)
    assert n_compiled + len(again) == len({*compiled, *again})


@pytest.mark.parametrize("passes", [["fwd"], ["fwd", "bwd"]], ids=["one-key", "keys-compile-wave"])
def test_tuner_stops_when_every_compile_child_dies(tmp_path, spec_copy, passes):
    """A setup problem (children cannot import pathtune, ...) is not a property of the configs: the
    tuner stops with a fatal error instead of recording every proposal as a crash -- at its first key, or
    with several keys at the compile wave of their seeded configs, before any key is measured."""
    import optuna
    from optuna.trial import TrialState

    from pathtune.perf_db import PerfDB
    from pathtune.tuning.space import plan_keys
    from pathtune.tuning.tuner import Budget, TuneOptions, Tuner

    class Broken(FakePreparer):
        def run(self, tasks, should_stop=None):
            self.batches.append(tasks)
            return [{"status": "crash", "child_failed": True, "message": "No module named 'pathtune.tuning'"}
                    for _ in tasks]

    url = f"sqlite:///{tmp_path / 'tune.sqlite3'}"
    keys = plan_keys([64], ["bfloat16"], passes, ["triton"], [1024])
    tuner = Tuner(keys, TuneOptions(storage=url, budget=Budget(trials=10), measure_fn=tune_fake.measure,
                                    preparer=Broken(workers=3), spec_path=spec_copy, heartbeat=None))
    results = tuner.run()
    tuner.close()
    assert tuner.fatal and "No module named" in tuner.fatal
    if len(keys) == 1:
        assert len(results) == 1, "the run stops at the first key"
    else:
        assert results == [], "the run stops at the compile wave, before any key"
    with PerfDB(url, current_keys=None) as db:
        assert db.query() == []
    assert not _measured(tmp_path)
    names = optuna.get_all_study_names(url)
    assert len(names) == len(keys)
    for name in names:
        study = optuna.load_study(study_name=name, storage=url)
        assert not study.get_trials(states=(TrialState.COMPLETE, TrialState.RUNNING))
        assert all(t.user_attrs.get("interrupted") for t in study.get_trials(states=(TrialState.FAIL,)))


def test_tuner_abandons_compiled_trials_when_stopped(tmp_path, spec_copy):
    import optuna
    from optuna.trial import TrialState

    from pathtune.tuning.space import plan_keys
    from pathtune.tuning.tuner import Budget, TuneOptions, Tuner, requeue_interrupted

    url = f"sqlite:///{tmp_path / 'tune.sqlite3'}"
    keys = plan_keys([64], ["bfloat16"], ["fwd"], ["triton"], [1024])
    calls = []

    def measure_then_stop(task):
        calls.append(task.config)
        tuner.stop_requested = True          # as a first Ctrl-C during the first measurement
        return tune_fake.measure(task)

    tuner = Tuner(keys, TuneOptions(storage=url, budget=Budget(trials=10), measure_fn=measure_then_stop,
                                    preparer=FakePreparer(workers=3), spec_path=spec_copy, heartbeat=None))
    tuner.run()
    tuner.close()
    assert len(calls) == 1
    (name,) = optuna.get_all_study_names(url)
    study = optuna.load_study(study_name=name, storage=url)
    failed = study.get_trials(states=(TrialState.FAIL,))
    assert len(study.get_trials(states=(TrialState.COMPLETE,))) == 1
    assert failed and all(t.user_attrs.get("interrupted") for t in failed)
    assert not study.get_trials(states=(TrialState.RUNNING,))
    assert requeue_interrupted(study) == len(failed)     # --resume measures them next


def test_resume_on_sqlite_requeues_a_killed_workers_running_trials_default_first(tmp_path, spec_copy):
    """A batched worker killed by SIGTERM/SIGKILL leaves its asked trials RUNNING (no heartbeats); on
    SQLite (one worker) ``--resume`` puts them back in the queue where they were, so the seeded default
    is still the first config a resumed key measures, even with a budget of one trial."""
    import optuna
    from optuna.trial import TrialState

    from pathtune.tuning.space import default_config, plan_keys
    from pathtune.tuning.tuner import Budget, TuneOptions, Tuner

    url = f"sqlite:///{tmp_path / 'tune.sqlite3'}"
    keys = plan_keys([64], ["bfloat16"], ["fwd"], ["triton"], [1024])
    opts = dict(storage=url, preparer=FakePreparer(workers=3), spec_path=spec_copy, heartbeat=None,
                seed_neighbours=4)
    killed = Tuner(keys, TuneOptions(budget=Budget(trials=10), measure_fn=tune_fake.measure, **opts))
    study = killed.open_study(keys[0])
    asked = [study.ask() for _ in range(3)]              # the killed worker's batch: default + 2 neighbours
    killed.close()
    assert [t.number for t in study.get_trials(states=(TrialState.RUNNING,))] == [t.number for t in asked]

    measured = []

    def measure(task):
        measured.append(task.config)
        return tune_fake.measure(task)

    measure.__module__ = tune_fake.__name__          # the same fake kernel source, so the same study
    resumed = Tuner(keys, TuneOptions(budget=Budget(trials=1), measure_fn=measure, resume=True, **opts))
    resumed.run()
    resumed.close()
    study = optuna.load_study(study_name=study.study_name, storage=url)
    default = default_config(resumed.spec, keys[0]).to_dict()
    assert measured and {k: measured[0][k] for k in default} == default
    assert study.trials[0].state != TrialState.WAITING and study.trials[0].number == 0, \
        [(t.number, t.state) for t in study.trials]
    assert not study.get_trials(states=(TrialState.RUNNING,))
