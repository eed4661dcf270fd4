"""``--confirm N``: after a key's study its N fastest configs are re-timed in interleaved rounds, each round a perf_db
run of its own (``tuning.confirm``).  Timings come from the cost model of tests/tune_fake.py, with host jitter
added here to chosen draws (nothing here is a real measurement)."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import tune_fake  # noqa: E402
from pathtune.perf_db import PerfDB  # noqa: E402
from pathtune.specs import load_spec  # noqa: E402
from pathtune.tuning import confirm as cf  # noqa: E402
from pathtune.tuning.space import default_config, plan_keys  # noqa: E402
from pathtune.tuning.tuner import Budget  # noqa: E402
from test_tune_warm import make_env  # noqa: E402

SOURCE_HASH = "fake-jitter-v1"      # the tuner keys rows by the measuring module's SOURCE_HASH
ENV = make_env()
SEEDS = [{"num_warps": 8}, {"inter_num_warps": 4}, {"block_n": 64}]

# what the measure function below does: per config hash, the factor on each of its draws in order (1.0 after the
# list), a failing draw as "wrong"; and the order of the calls
JITTER: dict[str, list] = {}
CALLS: list[tuple[str, int]] = []


def measure(task):
    from pathtune.specs import Config

    h = Config(task.config).hash
    CALLS.append((h, task.trial_number))
    out = tune_fake.measure(task)
    plan = JITTER.get(h, [])
    n = sum(1 for c, _ in CALLS if c == h) - 1
    factor = plan[n] if n < len(plan) else 1.0
    if factor == "wrong":
        return {"status": "wrong", "errors": {"o": 0.02}, "message": "accuracy gate: o 0.02 > 0.004"}
    if out.get("status") == "ok":
        out = {**out, "median_ms": out["median_ms"] * factor, "p20_ms": out["p20_ms"] * factor,
               "p80_ms": out["p80_ms"] * factor}
    return out


def _key():
    return plan_keys([64], ["bfloat16"], ["fwd"], ["triton"], [1024])[0]


def _configs(spec_copy):
    spec = load_spec(spec_copy)
    d = default_config(spec, _key())
    return d, [d.replace(**s) for s in SEEDS]


def _run(url, spec_copy, confirm, batched, rounds=3):
    results, notes = tune_fake.run_tuner([_key()], url, spec_copy, ENV, measure_fn=measure, batched=batched,
                                         budget=Budget(trials=2), seed_configs=SEEDS, confirm=confirm,
                                         confirm_rounds=rounds)
    return results[0], notes


@pytest.fixture(autouse=True)
def _fresh_jitter():
    JITTER.clear()
    CALLS.clear()
    yield
    JITTER.clear()
    CALLS.clear()


def test_candidates_are_the_fastest_distinct_configs_and_rounds_rotate(spec_copy):
    d, (a, b, c) = _configs(spec_copy)
    got = cf.confirm_candidates([(d, 1.0), (a, 0.9), (b, 0.95), (a, 0.8), (c, 1.2), (b, None)], 3)
    assert [(x.config, x.first_ms) for x in got] == [(a, 0.8), (b, 0.95), (d, 1.0)]   # a counts with its faster time
    assert cf.confirm_candidates([(a, 0.9), (a, 0.8)], 3) == []            # one distinct config: nothing to rank
    assert cf.confirm_candidates([(a, 0.9), (b, 0.8)], 0) == []
    assert [cf.round_order(3, r) for r in range(4)] == [[0, 1, 2], [1, 2, 0], [2, 0, 1], [0, 1, 2]]


def test_note_names_each_draw_and_a_moved_winner(spec_copy):
    d, (a, b, _c) = _configs(spec_copy)
    first = cf.ConfirmedConfig(a, 0.8, [0.95, 0.97])
    second = cf.ConfirmedConfig(b, 0.9, [0.85, None], [(2, "wrong", "o")])
    text = cf.confirm_note("K", [first, second], d, 2)
    assert text.startswith("K: confirm: 2 configs x 2 rounds: num_warps=8: 0.8 then [0.95, 0.97]")
    assert "the winner stands" in text                                   # 0.8 is still the cleanest draw
    second.draws[1] = 0.7
    second.failures.clear()
    assert "the winner is now inter_num_warps=4 (0.7 ms against 0.8)" in cf.confirm_note("K", [first, second], d, 2)


@pytest.mark.parametrize("batched", [True, False], ids=["batched", "unbatched"])
def test_a_config_slowed_by_jitter_in_its_one_timing_wins_after_the_confirmation(tmp_path, spec_copy, batched):
    d, seeds = _configs(spec_copy)
    truth = {c.hash: tune_fake.cost_ms(c.to_dict(), 1024) for c in [d, *seeds]}
    fastest = min([d, *seeds], key=lambda c: truth[c.hash])
    # its study timing 8 % slow: it loses, third of four; a config outside the N fastest gets no second draw
    JITTER[fastest.hash] = [1.08]
    url = f"sqlite:///{tmp_path / 'tune.sqlite3'}"
    result, _ = _run(url, spec_copy, confirm=0, batched=batched)
    assert result.confirmed is None and result.best_config != fastest.to_dict()

    CALLS.clear()
    url2 = f"sqlite:///{tmp_path / 'tune2.sqlite3'}"
    result, notes = _run(url2, spec_copy, confirm=3, batched=batched)
    assert result.confirmed == 3 and result.best_config == fastest.to_dict()
    assert math.isclose(result.best_ms, truth[fastest.hash], rel_tol=1e-6)
    (note,) = [n for n in notes if ": confirm: " in n]
    assert "3 configs x 3 rounds" in note and "the winner is now" in note
    # three rounds, each of the three candidates once, each round starting one later, on fresh trial numbers
    draws = [(h, t) for h, t in CALLS if t >= cf.CONFIRM_TRIAL_BASE]
    assert len(draws) == 9 and len({t for _, t in draws}) == 9
    rounds = [[h for h, _ in draws[i:i + 3]] for i in (0, 3, 6)]
    assert rounds[1] == rounds[0][1:] + rounds[0][:1] and rounds[2] == rounds[1][1:] + rounds[1][:1]
    assert fastest.hash in rounds[0] and len(set(rounds[0])) == 3        # the fourth config got no second draw
    # each round is its own run, every draw a row of it
    db = PerfDB(url2)
    rows = [r for r in db.query(gpu="TEST-GPU") if "-confirm-" in r["run_id"]]
    assert sorted({r["run_id"].rsplit("-", 1)[1] for r in rows}) == ["r1", "r2", "r3"]
    assert len(rows) == 9 and all(r["status"] == "ok" for r in rows)
    db.close()


def test_a_draw_that_fails_its_gate_is_recorded_and_named(tmp_path, spec_copy):
    d, seeds = _configs(spec_copy)
    truth = {c.hash: tune_fake.cost_ms(c.to_dict(), 1024) for c in [d, *seeds]}
    fastest = min([d, *seeds], key=lambda c: truth[c.hash])
    JITTER[fastest.hash] = [1.0, 1.0, "wrong"]       # the study's draw, round 1 ok, round 2 fails the gate
    url = f"sqlite:///{tmp_path / 'tune.sqlite3'}"
    result, notes = _run(url, spec_copy, confirm=2, batched=True, rounds=2)
    (note,) = [n for n in notes if ": confirm: " in n]
    assert "failed round 2 (wrong: accuracy gate" in note and "still serves" in note
    db = PerfDB(url)
    failed = [r for r in db.query(gpu="TEST-GPU") if "-confirm-" in r["run_id"] and r["status"] != "ok"]
    assert [(r["status"], r["run_id"][-2:]) for r in failed] == [("wrong", "r2")]
    db.close()


def test_confirm_skips_a_study_with_one_ok_config(tmp_path, spec_copy):
    (result,), notes = tune_fake.run_tuner([_key()], f"sqlite:///{tmp_path / 'tune.sqlite3'}", spec_copy, ENV,
                                           measure_fn=measure, workers=1, budget=Budget(trials=1), confirm=3)
    assert result.confirmed is None and any("fewer than two ok configs" in n for n in notes)
    assert not [t for _, t in CALLS if t >= cf.CONFIRM_TRIAL_BASE]


def test_the_cli_confirms_and_its_results_file_carries_every_round(tmp_path):
    import json

    from typer.testing import CliRunner

    from pathtune.cli import app

    url = f"sqlite:///{tmp_path / 'tune.sqlite3'}"
    out = tmp_path / "results.json"
    res = CliRunner().invoke(app, ["tune", "--head-dim", "64", "--pass", "fwd", "--buckets", "1024", "--storage", url,
                                   "--measure-with", f"{HERE / 'tune_fake.py'}:measure", "--startup-trials", "4",
                                   "--seed-neighbours", "0", "--budget", "6", "--confirm", "2", "--confirm-rounds", "2",
                                   "--results-out", str(out)])
    assert res.exit_code == 0, res.output
    assert ": confirm: 2 configs x 2 rounds:" in res.output
    data = json.loads(out.read_text())
    confirm_runs = sorted((r["run_id"][-2:], r["notes"].split(": ")[-1]) for r in data["runs"]
                          if "-confirm-" in r["run_id"])
    assert confirm_runs == [("r1", "confirmation round 1 of 2 (2 configs)"),
                            ("r2", "confirmation round 2 of 2 (2 configs)")]
    assert sum(1 for r in data["records"] if "-confirm-" in r["run_id"]) == 4
    with PerfDB(f"sqlite:///{tmp_path / 'other.sqlite3'}") as other:
        assert other.ingest(out).added == len(data["records"])


def test_a_stop_ends_the_confirmation_between_draws(spec_copy):
    from types import SimpleNamespace

    d, (a, b, _c) = _configs(spec_copy)
    stored, runs = [], []
    ctx = SimpleNamespace(run_id="tune-x", study_name="s", fatal=None,
                          measure_fn=lambda task: {"status": "ok", "median_ms": 1.0},
                          task=lambda config, n: SimpleNamespace(config=config, trial_number=n),
                          store=lambda config, result, run_id, trial_number: stored.append((run_id, trial_number)))
    cands = [cf.ConfirmedConfig(c, 1.0) for c in (d, a, b)]
    done = cf.confirm_key(ctx, cands, 3, start_run=lambda run_id, notes: runs.append(run_id),
                          should_stop=lambda: len(stored) >= 4, stamp="T")
    assert done == 1 and runs == ["tune-x-confirm-T-r1", "tune-x-confirm-T-r2"]
    assert [n - cf.CONFIRM_TRIAL_BASE for _, n in stored] == [0, 1, 2, 4]     # round 2 starts with the second
