"""``--refine N``: after a new study's seeded configs, the tuner measures up to N recombinations of what they
changed from the default (``tuning.space.refine_configs``), with the cost model of tests/tune_fake.py (every
knob value a factor on the time; nothing here is a real measurement)."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import tune_fake  # noqa: E402
from pathtune.specs import load_spec  # noqa: E402
from pathtune.tuning.space import default_config, plan_keys, refine_configs  # noqa: E402
from pathtune.tuning.tuner import Budget  # noqa: E402
from test_tune_warm import make_env  # noqa: E402

ENV = make_env()


def _key(pass_="fwd"):
    return plan_keys([64], ["bfloat16"], [pass_], ["triton"], [1024])[0]


def test_undoes_the_fastest_configs_changes_then_joins_two_winners():
    spec = load_spec()
    key = _key()
    d = default_config(spec, key)
    best = d.replace(num_warps=8, block_m=64)                  # two changes: each undone alone
    win = d.replace(inter_num_warps=4)                          # faster than the default
    clash = d.replace(num_warps=2, superchunk_size=2048)        # sets num_warps another way than best: no union
    lose = d.replace(num_stages=1)                              # slower than the default: never joined
    measured = [(d, 1.0), (best, 0.8), (win, 0.9), (clash, 0.95), (lose, 1.2)]
    got = refine_configs(spec, key, d, measured, 10)
    assert got == [d.replace(num_warps=8),                       # block_m undone (knobs in name order)
                   d.replace(block_m=64),                        # num_warps undone
                   d.replace(num_warps=8, block_m=64, inter_num_warps=4),          # best + win
                   d.replace(inter_num_warps=4, num_warps=2, superchunk_size=2048)]  # win + clash
    assert refine_configs(spec, key, d, measured, 2) == got[:2]
    assert refine_configs(spec, key, d, measured, 0) == []
    # what was measured already is never proposed again
    again = refine_configs(spec, key, d, measured + [(got[0], 1.05), (got[2], 1.02)], 10)
    assert again == [got[1], got[3]]


def test_one_change_is_not_undone_and_a_failed_default_makes_every_config_a_winner():
    spec = load_spec()
    key = _key()
    d = default_config(spec, key)
    a, b = d.replace(num_warps=8), d.replace(num_stages=3)
    # the default failed (not among the measured): both configs count as winners, and their union is proposed
    assert refine_configs(spec, key, d, [(a, 1.3), (b, 1.4)], 5) == [d.replace(num_warps=8, num_stages=3)]
    # nothing faster than the default: nothing to join or undo
    assert refine_configs(spec, key, d, [(d, 1.0), (a, 1.3), (b, 1.4)], 5) == []


def test_a_union_the_constraints_forbid_is_skipped():
    spec = load_spec()
    key = _key("bwd")
    d = default_config(spec, key)
    pairs, big = d.replace(bwd_walk_chunks=2), d.replace(chunk_size=128)    # two chunks per walk need C <= 64
    assert refine_configs(spec, key, d, [(d, 1.0), (pairs, 0.9), (big, 0.95)], 5) == []


def _run(url, spec_copy, refine, batched, resume=False):
    results, notes = tune_fake.run_tuner([_key()], url, spec_copy, ENV, batched=batched, budget=Budget(trials=2),
                                         seed_configs=SEEDS, refine=refine, resume=resume)
    return results[0], notes


def _complete(url):
    import optuna
    from optuna.trial import TrialState

    (name,) = optuna.get_all_study_names(url)
    return optuna.load_study(study_name=name, storage=url).get_trials(states=(TrialState.COMPLETE,))


# the fastest seed carries one change that costs (block_m 64: 1.07x in the cost model), the other seed wins alone
SEEDS = [{"num_warps": 8, "superchunk_size": 2048, "num_stages": 3, "block_m": 64}, {"inter_num_warps": 4}]


@pytest.mark.parametrize("batched", [True, False], ids=["batched", "unbatched"])
def test_the_tuner_measures_the_recombinations_past_the_trial_cap_once(tmp_path, spec_copy, batched):
    spec = load_spec(spec_copy)
    d = default_config(spec, _key())
    url = f"sqlite:///{tmp_path / 'tune.sqlite3'}"
    result, notes = _run(url, spec_copy, refine=5, batched=batched)
    done = _complete(url)
    refined = [t.user_attrs["config"] for t in done if t.user_attrs.get("seeded_refine")]
    cut = d.replace(num_warps=8, superchunk_size=2048, num_stages=3)          # the costly change undone
    assert cut.to_dict() in refined
    assert d.replace(**SEEDS[0], **SEEDS[1]).to_dict() in refined            # the two winners joined
    assert len(refined) == 5 and len(done) == 3 + 5                          # a cap of 2 trials cut none of them
    assert result.best_config == cut.to_dict()
    assert math.isclose(result.best_ms, tune_fake.cost_ms(cut.to_dict(), 1024), rel_tol=1e-6)
    assert any("refine: 5 recombinations" in n for n in notes)
    # a resumed study is not refined again
    _run(url, spec_copy, refine=5, batched=batched, resume=True)
    assert len(_complete(url)) == len(done)


def test_refine_zero_measures_the_seeded_configs_only(tmp_path, spec_copy):
    url = f"sqlite:///{tmp_path / 'tune.sqlite3'}"
    _run(url, spec_copy, refine=0, batched=True)
    done = _complete(url)
    assert len(done) == 3 and not any(t.user_attrs.get("seeded_refine") for t in done)
