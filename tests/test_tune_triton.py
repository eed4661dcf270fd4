"""`pathtune tune` end to end on the real Triton forward kernels (CPU interpreter), into SQLite.

Three trials at a tiny shape (D=32, T=64, 2 heads, float32 q/k/v, accuracy gate on 48 tokens with
o's tolerance tightened to 1e-3): the seeded default (fp16 scan operands, error ~3e-4: ok), a config
forced to fail the gate (bf16 scan operands, error ~4e-3: ``wrong``), and one TPE proposal. The
failed config is recorded with its status and errors and never wins, in Optuna or in perf_db.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                       reason="runs the Triton kernels in the CPU interpreter: set TRITON_INTERPRET=1"),
    pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning"),
]


def test_tune_triton_forward_in_interpreter(tmp_path, monkeypatch):
    import optuna
    from optuna.trial import TrialState
    from typer.testing import CliRunner

    import pathtune.specs
    from pathtune.cli import app
    from pathtune.perf_db import PerfDB
    from pathtune.specs import load_spec
    from pathtune.tuning.space import default_config, plan_keys
    from pathtune.tuning.tuner import Budget, TuneOptions, Tuner

    monkeypatch.setenv("PATHTUNE_SHIPPED_DIR", str(tmp_path / "no-shipped"))
    spec_path = tmp_path / "spec.yaml"
    shutil.copy(Path(pathtune.specs.__file__).parent / "path_attention.yaml", spec_path)
    url = f"sqlite:///{tmp_path / 'tune.sqlite3'}"
    args = ["--head-dim", "32", "--dtype", "float32", "--pass", "fwd", "--buckets", "64", "--tokens", "64",
            "--heads", "2", "--check-len", "48", "--tol", "o=1e-3", "--storage", url, "--spec", str(spec_path),
            "--startup-trials", "2", "--seed", "3", "--seed-neighbours", "0"]

    # create the study (seeded with the default) and queue a config that cannot pass the gate
    keys = plan_keys([32], ["float32"], ["fwd"], ["triton"], [64], heads=2, tokens=64)
    tuner = Tuner(keys, TuneOptions(storage=url, budget=Budget(trials=3), spec_path=spec_path))
    study = tuner.open_study(keys[0])
    default = default_config(load_spec(spec_path), keys[0])     # the runtime's untuned choice
    bad = default.replace(scan_precision="bf16")
    study.enqueue_trial(bad.to_dict(), user_attrs={"forced_failure": True})
    tuner.close()

    res = CliRunner().invoke(app, ["tune", *args, "--budget", "3", "--resume"])
    assert res.exit_code == 0, res.output

    study = optuna.load_study(study_name=study.study_name, storage=url)
    complete = study.get_trials(states=(TrialState.COMPLETE,))
    assert len(complete) == 3
    by_hash = {t.user_attrs["config_hash"]: t for t in complete}
    assert by_hash[default.hash].user_attrs["status"] == "ok"
    assert by_hash[bad.hash].user_attrs["status"] == "wrong"
    assert study.best_trial.user_attrs["config_hash"] != bad.hash

    with PerfDB(url, current_keys=None) as db:
        rows = {r["config_hash"]: r for r in db.query()}
        assert len(rows) == len(by_hash)
        ok = rows[default.hash]
        assert ok["status"] == "ok" and ok["errors"]["o"] < 1e-3 and ok["median_ms"] > 0
        assert ok["bench_method"].startswith("perf_counter")
        wrong = rows[bad.hash]
        assert wrong["status"] == "wrong" and wrong["errors"]["o"] > 1e-3 and wrong["median_ms"] is None
        assert "accuracy gate" in wrong["message"]
        best = db.best(ok["env_hash"], "fwd", ok["workload"], backend="triton")
        assert best["config_hash"] != bad.hash
        assert best["median_ms"] == min(r["median_ms"] for r in rows.values() if r["status"] == "ok")

    # two more trials through real compile children (python -m pathtune.tuning.prepare runs the kernels
    # once in the interpreter), then measured here: same statuses, nothing compiled or measured twice
    res = CliRunner().invoke(app, ["tune", *args, "--budget", "5", "--resume", "--compile-workers", "2"])
    assert res.exit_code == 0, res.output
    assert "compile workers 2" in res.output
    study = optuna.load_study(study_name=study.study_name, storage=url)
    complete = study.get_trials(states=(TrialState.COMPLETE,))
    assert len(complete) == 5
    fresh = [t for t in complete[3:] if t.user_attrs.get("source") == "measured"]
    assert fresh and all(t.user_attrs["compile_seconds"] > 0 for t in fresh)
    assert all(set(t.user_attrs["compile_phases"]) == {"startup", "setup", "gate_shape", "timed_shape"} for t in fresh)
    with PerfDB(url, current_keys=None) as db:
        rows = db.query()
        assert len(rows) == len({r["config_hash"] for r in rows})
        assert all(r["status"] in ("ok", "wrong") for r in rows)

