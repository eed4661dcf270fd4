"""The spec YAML, its schema and error messages, Config, KnobSpace and Workload."""
import copy
import json
import pickle

import pytest
import torch
import yaml

from pathtune.specs import (
    Config,
    Expr,
    ExprError,
    KnobSpace,
    Spec,
    SpecError,
    Workload,
    default_spec_path,
    load_spec,
    seq_bucket,
)

DIMS = {"D": 64, "DV": 64}


@pytest.fixture(scope="module")
def spec():
    return load_spec()


@pytest.fixture(scope="module")
def raw():
    return yaml.safe_load(default_spec_path().read_text())


def write(tmp_path, data, name="spec.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def mutated(raw, fn):
    data = copy.deepcopy(raw)
    fn(data)
    return data


def problems_of(tmp_path, data):
    path = write(tmp_path, data)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    err = info.value
    assert str(path) in str(err)          # the message names the file
    return err, dict(err.problems)


# ---- the packaged spec ------------------------------------------------------------------------------

def test_packaged_spec_is_valid(spec):
    assert spec.name == "path_attention"
    assert {s.kind for s in spec.stages.values()} == {"householder_chain", "ut_inverse", "blockwise_scan",
                                                      "fox_gate"}
    assert spec.stage("fox_gate").placement == "inside_scale"
    assert spec.stage("householder_chain").doc["product_order"] == "later_left"
    assert spec.head_dims == (32, 64, 96, 128, 192, 256) == spec.head_dims_v
    assert spec.tensors.q.shape == ("B", "T", "HQ", "D")
    assert spec.tensors.lse.dtypes[0] == "float32"
    assert spec.numerics.accuracy.tolerances == {"o": 4e-3, "dq": 7e-3, "dk": 7e-3, "dv": 7e-3,
                                                 "dw": 1.2e-2, "dbeta": 1.2e-2, "dg": 1.2e-2}
    assert spec.knobs["beta_clip_eps"].domain == ("off", 0.001, 0.0078125, 0.015625)
    assert spec.knob_passes("chunk_size") == ("fwd", "bwd")
    assert spec.source == str(default_spec_path())


def test_spec_hash_is_sha256_of_canonical_json(spec, raw, tmp_path):
    import hashlib

    content = spec.model_dump(mode="json")
    for backend in content["backends"].values():
        del backend["head_dim_defaults"]
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"))
    assert spec.hash == hashlib.sha256(canonical.encode()).hexdigest()
    # independent of YAML formatting and key order, sensitive to content
    assert load_spec(write(tmp_path, raw)).hash == spec.hash
    changed = mutated(raw, lambda d: d["knobs"]["num_warps"].update(default=8))
    assert load_spec(write(tmp_path, changed, "b.yaml")).hash != spec.hash
    # a backend's untuned configs are not hashed (records store every knob value); its own knobs are
    untuned = mutated(raw, lambda d: d["backends"]["triton"]["head_dim_defaults"][0]["knobs"].update(decode_splits=4))
    assert load_spec(write(tmp_path, untuned, "c.yaml")).hash == spec.hash
    own = mutated(raw, lambda d: d["backends"]["tvm"]["knobs"]["decode_vec"].update(default=4))
    assert load_spec(write(tmp_path, own, "d.yaml")).hash != spec.hash


def test_json_schema_is_published(spec):
    schema = Spec.json_schema()
    assert schema["title"] == "Spec"
    assert {"tensors", "stages", "knobs", "constraints", "passes"} <= set(schema["properties"])
    assert json.dumps(schema)  # serialisable


# ---- bad specs fail with the file and the field path ------------------------------------------------

def test_unknown_stage_kind(raw, tmp_path):
    _, problems = problems_of(tmp_path, mutated(raw, lambda d: d["stages"]["fox_gate"].update(kind="fancy_gate")))
    assert "unknown stage kind 'fancy_gate'" in problems["stages.fox_gate.kind"]
    assert "householder_chain" in problems["stages.fox_gate.kind"]


def test_bad_gate_placement(raw, tmp_path):
    _, problems = problems_of(tmp_path, mutated(raw, lambda d: d["stages"]["fox_gate"].update(placement="inside")))
    assert "'inside_scale' or 'outside_scale'" in problems["stages.fox_gate.placement"]


def test_typo_in_field_name(raw, tmp_path):
    data = mutated(raw, lambda d: d["stages"]["fox_gate"].update(placment="inside_scale"))
    _, problems = problems_of(tmp_path, data)
    assert "did you mean 'placement'" in problems["stages.fox_gate.placment"]


def test_knob_default_outside_domain(raw, tmp_path):
    _, problems = problems_of(tmp_path, mutated(raw, lambda d: d["knobs"]["chunk_size"].update(default=48)))
    assert problems["knobs.chunk_size.default"] == "48 is not in the domain [32, 64, 128]"


def test_knob_wrong_type(raw, tmp_path):
    _, problems = problems_of(tmp_path, mutated(raw, lambda d: d["knobs"]["chunk_size"].update(default="64")))
    assert "int knob" in problems["knobs.chunk_size.default"]
    _, problems = problems_of(tmp_path, mutated(raw, lambda d: d["knobs"]["num_warps"].update(domain=[2, 4.0, 8])))
    assert "num_warps.domain[1]" in " ".join(problems)


def test_unquoted_off_is_explained(raw, tmp_path):
    text = default_spec_path().read_text().replace('default: "off"', "default: off")
    path = tmp_path / "off.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert "quote it" in dict(info.value.problems)["knobs.beta_clip_eps.default"]


def test_constraint_with_unknown_name(raw, tmp_path):
    data = mutated(raw, lambda d: d["constraints"].append({"expr": "superchunk_size % chunk == 0", "message": "m"}))
    _, problems = problems_of(tmp_path, data)
    field = f"constraints[{len(data['constraints']) - 1}].expr"
    assert "unknown knob or workload dim 'chunk'" in problems[field]
    assert "did you mean 'chunk_size'" in problems[field]


@pytest.mark.parametrize("expr, needle", [
    ("superchunk_size ** 2 > 0", "'**' is not allowed"),
    ("__import__('os') == 0", "only min() and max() may be called"),
    ("chunk_size.bit_length() > 0", "only min() and max() may be called"),
    ("chunk_size.real > 0", "Attribute syntax is not allowed"),
    ("chunk_size % 2", "must be a true/false condition"),
    ("beta_clip_eps < 0.01", "cannot compare 'off'"),
    ("chunk_size % decode_splits == 0", "never meet in one pass"),
])
def test_bad_constraint_expressions(raw, tmp_path, expr, needle):
    data = mutated(raw, lambda d: d["constraints"].append({"expr": expr, "message": "m"}))
    _, problems = problems_of(tmp_path, data)
    assert needle in problems[f"constraints[{len(data['constraints']) - 1}].expr"]


def test_defaults_must_satisfy_constraints(raw, tmp_path):
    data = mutated(raw, lambda d: d["constraints"].append({"expr": "chunk_size <= 32", "message": "small chunks"}))
    err, problems = problems_of(tmp_path, data)
    assert "knob defaults violate it" in str(err) and "small chunks" in str(err)


def test_missing_required_tensor(raw, tmp_path):
    _, problems = problems_of(tmp_path, mutated(raw, lambda d: d["tensors"].pop("q")))
    assert problems == {"tensors.q": "required field is missing"}


def test_unknown_dim_in_shape_and_knob_reference(raw, tmp_path):
    def mutate(d):
        d["tensors"]["w"]["shape"] = ["B", "T", "H", "K"]
        d["stages"]["blockwise_scan"]["chunk_knob"] = "chunk"
    _, problems = problems_of(tmp_path, mutated(raw, mutate))
    assert "unknown dim 'K'" in problems["tensors.w.shape[3]"]
    assert "unknown knob 'chunk'" in problems["stages.blockwise_scan.chunk_knob"]


def test_yaml_problems_are_spec_errors(tmp_path):
    dup = tmp_path / "dup.yaml"
    dup.write_text("name: a\nname: b\n")
    with pytest.raises(SpecError, match="duplicate key 'name'"):
        load_spec(dup)
    with pytest.raises(SpecError, match="file not found"):
        load_spec(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n")
    with pytest.raises(SpecError, match="not valid YAML at line"):
        load_spec(broken)


def test_spec_error_is_a_value_error():
    assert issubclass(SpecError, ValueError)


# ---- expressions ------------------------------------------------------------------------------------

def test_expr_evaluates_without_eval():
    e = Expr.parse("chunk_size * max(D, DV) <= 16384 and not (a // 2 % 3 != 1 or -a > 0)")
    assert e.names == {"chunk_size", "D", "DV", "a"}
    assert e.evaluate_bool({"chunk_size": 64, "D": 256, "DV": 64, "a": 2}) is True
    assert e.evaluate_bool({"chunk_size": 128, "D": 256, "DV": 64, "a": 2}) is False
    with pytest.raises(ExprError, match="division by zero"):
        Expr.parse("a % b == 0")({"a": 1, "b": 0})
    for bad in ("a / 2 == 1", "a.b", "[a][0]", "lambda: 1", "open('x')"):
        with pytest.raises(ExprError):
            Expr.parse(bad)


# ---- Config -----------------------------------------------------------------------------------------

def test_config_json_round_trip_hash_and_hashable():
    c = Config(chunk_size=64, beta_clip_eps="off", scan_precision="fp16", eps=0.0078125)
    again = Config.from_json(c.to_json())
    assert again == c and hash(again) == hash(c) and again.hash == c.hash
    assert c.to_json() == '{"beta_clip_eps":"off","chunk_size":64,"eps":0.0078125,"scan_precision":"fp16"}'
    assert len(c.hash) == 16
    assert Config({"b": 1, "a": 2}).hash == Config({"a": 2, "b": 1}).hash   # order-free
    assert Config(a=1) != Config(a=1.0)                                      # JSON types matter
    assert {c: 1}[again] == 1
    assert c.chunk_size == 64 and c["chunk_size"] == 64 and c.get("chunk_size") == 64 and c.get("nope") is None
    assert pickle.loads(pickle.dumps(c)) == c
    assert c.replace(chunk_size=128).chunk_size == 128 and c.chunk_size == 64


def test_config_is_immutable_and_checked():
    c = Config(a=1)
    with pytest.raises(AttributeError):
        c.a = 2
    with pytest.raises(AttributeError, match="no knob 'b'"):
        _ = c.b
    with pytest.raises(TypeError):
        Config(a=[1, 2])
    with pytest.raises(ValueError):
        Config(a=float("nan"))
    with pytest.raises(ValueError):
        Config.from_json("[1, 2]")


def test_config_hash_is_stable_across_runs():
    # a fixed value: perf_db rows are keyed on it, so it must never change silently
    import hashlib

    assert Config(chunk_size=64, num_warps=4).to_json() == '{"chunk_size":64,"num_warps":4}'
    assert Config(chunk_size=64, num_warps=4).hash == \
        hashlib.sha256(b'{"chunk_size":64,"num_warps":4}').hexdigest()[:16] == "5c6036dd9cbfdf85"


# ---- KnobSpace --------------------------------------------------------------------------------------

@pytest.mark.parametrize("pass_", ["fwd", "bwd", "decode"])
def test_default_config_is_valid(spec, pass_):
    space = KnobSpace(spec, pass_)
    default = space.default()
    assert set(default) == set(spec.passes[pass_].knobs)
    for d in spec.head_dims:
        assert space.validate(default, {"D": d, "DV": d}) == []


def test_validate_reports_every_kind_of_problem(spec):
    space = KnobSpace(spec, "fwd")
    bad = space.default().replace(chunk_size=128, superchunk_size=256, block_n=48, bwd_block_n=64)
    problems = space.validate(bad, DIMS)
    assert any("block_n=48 is not in its domain" in p for p in problems)
    assert any("'bwd_block_n' is not used by pass fwd (it belongs to pass bwd)" in p for p in problems)
    problems = space.validate(space.default().replace(chunk_size=128, superchunk_size=256), {"D": 256, "DV": 64})
    assert problems == ["a UT chunk tile (chunk_size x max(D, DV)) must fit in 16384 elements of shared memory "
                        "[chunk_size * max(D, DV) <= 16384 is false for D=256, DV=64, chunk_size=128]"]
    with pytest.raises(ValueError, match="dims must give D, DV"):
        space.validate(space.default(), {"D": 64})
    with pytest.raises(ValueError, match="unknown pass 'fwdd'"):
        KnobSpace(spec, "fwdd")


def test_enumerate_respects_constraints(spec):
    space = KnobSpace(spec, "fwd")
    configs = list(space.enumerate({"D": 256, "DV": 256}))
    assert 0 < len(configs) < space.size
    assert len(set(configs)) == len(configs)
    assert all(c.chunk_size * 256 <= 16384 for c in configs)
    assert all(c.superchunk_size % c.block_n == 0 for c in configs)
    assert all(space.validate(c, {"D": 256, "DV": 256}) == [] for c in configs[::97])
    assert space.default() in configs
    decode = list(KnobSpace(spec, "decode").enumerate(DIMS))
    assert len(decode) == KnobSpace(spec, "decode").size


def test_new_domain_values_need_no_code_change(raw, tmp_path):
    def mutate(d):
        d["knobs"]["chunk_size"]["domain"].insert(0, 16)
        d["knobs"]["decode_splits"]["domain"].append(32)
        d["dims"]["D"]["domain"].append(80)
    spec = load_spec(write(tmp_path, mutated(raw, mutate)))
    assert 80 in spec.head_dims
    assert any(c.chunk_size == 16 for c in KnobSpace(spec, "fwd").enumerate({"D": 80, "DV": 64}))
    assert any(c.decode_splits == 32 for c in KnobSpace(spec, "decode").enumerate(DIMS))


def test_suggest_with_optuna(spec):
    optuna = pytest.importorskip("optuna")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = KnobSpace(spec, "fwd")
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = []

    def objective(trial):
        config = space.suggest(trial, {"D": 256, "DV": 256})
        seen.append(config)
        return float(config.chunk_size)

    study.optimize(objective, n_trials=30)
    states = {t.state for t in study.trials}
    assert optuna.trial.TrialState.COMPLETE in states
    assert optuna.trial.TrialState.PRUNED in states          # chunk_size=128 with D=256 is pruned
    assert all(c.chunk_size * 256 <= 16384 for c in seen)


@pytest.mark.parametrize("allowed", [False, True])
def test_memory_knobs_are_searched_only_when_allowed(spec, allowed):
    """A memory-role knob (bwd_forward_state: keep holds the forward's state until the backward) stays at
    the spec's default in the tuner's search unless the space allows memory knobs (``pathtune tune
    --memory-knobs``): not asked of Optuna (``enumerate`` walks the same ``searched_domain``)."""
    optuna = pytest.importorskip("optuna")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    modes = ("recompute", "keep_inter", "keep")
    assert spec.knobs["bwd_forward_state"].role == "memory"
    assert spec.knobs["bwd_forward_state"].default == "keep_inter"
    space = KnobSpace(spec, "bwd", memory_knobs=allowed)
    assert space.searched_domain("bwd_forward_state") == (modes if allowed else ("keep_inter",))
    assert space.searched_domain("chunk_size") == tuple(spec.knobs["chunk_size"].domain)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = []

    def objective(trial):
        seen.append(space.suggest(trial, {"D": 64, "DV": 64}).bwd_forward_state)
        return 0.0

    study.optimize(objective, n_trials=24)
    asked = {name for t in study.trials for name in t.params}
    assert ("bwd_forward_state" in asked) == allowed
    assert set(seen) == (set(modes) if allowed else {"keep_inter"})


# ---- Workload ---------------------------------------------------------------------------------------

def test_workload_from_tensors():
    q = torch.empty(2, 300, 8, 64, dtype=torch.bfloat16)
    k = torch.empty(2, 300, 2, 64, dtype=torch.bfloat16)
    v = torch.empty(2, 300, 2, 128, dtype=torch.bfloat16)
    wl = Workload.from_tensors(q, k, v)
    assert (wl.head_dim, wl.head_dim_v, wl.heads_q, wl.heads_kv) == (64, 128, 8, 2)
    assert (wl.dtype, wl.use_gate, wl.pass_, wl.seq_bucket, wl.varlen, wl.batch_bucket) == \
        ("bfloat16", False, "fwd", 512, False, 2)
    assert wl.constraint_dims() == {"D": 64, "DV": 128}
    gated = Workload.from_tensors(q, k, v, g=torch.empty(2, 300, 8), pass_="bwd")
    assert gated.use_gate and gated.pass_ == "bwd" and gated.key_hash != wl.key_hash


def test_workload_query_bucket_of_a_decode_call():
    """A decode call's new tokens per sequence are a power-of-two bucket in its key; one-token and fwd / bwd keys
    never name the field (their JSON, hence their hash, is unchanged); other passes refuse a bucket."""
    q = torch.empty(8, 5, 4, 64, dtype=torch.bfloat16)
    k = torch.empty(8, 4100, 4, 64, dtype=torch.bfloat16)
    dec = Workload.from_tensors(q, k, k, pass_="decode")
    assert (dec.query_bucket, dec.seq_bucket) == (8, 8192) and '"query_bucket":8' in dec.key()
    one = Workload.from_tensors(q[:, :1], k, k, pass_="decode")
    assert one.query_bucket == 1 and "query_bucket" not in one.key()
    assert Workload.from_dict(dec.to_dict()) == dec and Workload.from_dict(one.to_dict()) == one
    assert Workload.from_tensors(q, q, q).query_bucket == 1           # fwd: T queries are the sequence
    with pytest.raises(ValueError, match="power of two"):
        Workload(64, 64, 4, 4, "bfloat16", False, "decode", 4096, query_bucket=3)
    with pytest.raises(ValueError, match="decode pass"):
        Workload(64, 64, 4, 4, "bfloat16", False, "fwd", 4096, query_bucket=4)


def test_workload_varlen_buckets_the_longest_sequence():
    q = torch.empty(1, 100, 4, 32)
    cu = torch.tensor([0, 10, 90, 100], dtype=torch.int32)
    wl = Workload.from_tensors(q, q, q, cu_seqlens=cu)
    assert (wl.varlen, wl.seq_bucket, wl.batch_bucket) == (True, 128, 4)
    assert Workload.from_tensors(q, q, q, cu_seqlens=cu, max_seqlen=5).seq_bucket == 16
    assert [seq_bucket(n) for n in (1, 16, 17, 1024, 1025)] == [16, 16, 32, 1024, 2048]


def test_workload_key_round_trip_and_checks():
    wl = Workload(64, 64, 8, 8, "float16", True, "decode", 4096, False, 8)
    key = json.loads(wl.key())
    assert key["pass"] == "decode" and key["key_schema"] == 1 and "pass_" not in key
    assert Workload.from_dict(key) == wl
    assert len(wl.key_hash) == 16
    with pytest.raises(ValueError, match="pass_"):
        Workload(64, 64, 8, 8, "float16", True, "prefill", 4096)
    with pytest.raises(ValueError, match="power of two"):
        Workload(64, 64, 8, 8, "float16", True, "fwd", 1000)
    with pytest.raises(ValueError, match="multiple of heads_kv"):
        Workload(64, 64, 6, 4, "float16", True, "fwd", 1024)
    with pytest.raises(ValueError, match="dtype"):
        Workload(64, 64, 8, 8, "torch.float16", True, "fwd", 1024)


def test_every_problem_is_reported_at_once(raw, tmp_path):
    # Field-level problems are reported together; cross-references are checked once fields are valid.
    def fields(d):
        d["knobs"]["num_warps"]["default"] = 3
        d["stages"]["fox_gate"]["placement"] = "inside"
    _, problems = problems_of(tmp_path, mutated(raw, fields))
    assert set(problems) == {"knobs.num_warps.default", "stages.fox_gate.placement"}

    def references(d):
        d["stages"]["blockwise_scan"]["chunk_knob"] = "chunk"
        d["passes"]["fwd"]["knobs"].append("foo")
        d["constraints"].append({"expr": "superchunk_size % chunk == 0", "message": "m"})
    err, problems = problems_of(tmp_path, mutated(raw, references))
    n_fwd, n_con = len(raw["passes"]["fwd"]["knobs"]), len(raw["constraints"])
    assert set(problems) == {"stages.blockwise_scan.chunk_knob", f"passes.fwd.knobs[{n_fwd}]",
                             f"constraints[{n_con}].expr"}
    assert str(err).startswith(f"invalid spec {tmp_path / 'spec.yaml'}: 3 problems")


def test_g_has_the_interval_of_a_log_gate(spec):
    """g is a log forget gate: at most 0, and finite (-inf is outside, so it is refused, not run into NaN)."""
    assert spec.tensors.g.interval == "(-inf, 0]"
    assert spec.tensors.g.interval_bounds == (float("-inf"), False, 0.0, True)
