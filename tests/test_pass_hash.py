"""Per-pass spec hashes (``Spec.pass_hash``) and record currency: a change to one pass's part of the spec
changes that pass's hash only, and records carrying either their pass's hash or the full spec hash of the
current spec are current (synthetic records on GPU "TEST-GPU"; the shipped files are read, not changed)."""
import copy
import json

import pytest
import yaml

from pathtune.perf_db import KernelKey, Measurement, PerfDB, default_current_keys, export_pack, load_pack
from pathtune.perf_db._keys import SPEC_BACKENDS, stale_reasons
from pathtune.perf_db._results import parse_results, results_record
from pathtune.perf_db._retired import retired_in_records
from pathtune.perf_db._shipped import SHIPPED_DIR
from pathtune.perf_db._validate import config_problems
from pathtune.specs import KnobSpace, Workload, default_spec_path, load_spec

SPEC = load_spec()
GPU = "TEST-GPU"
ENV = {"gpu_name": GPU, "gpu_count": 1, "compute_capability": "9.0", "sm_count": 132,
       "gpu_memory_bytes": 150_000_000_000, "driver": "550.54.15", "cuda_runtime": "12.4", "ptxas": "12.4.131",
       "torch": "2.5.1", "triton": "3.2.0", "tvm": None, "tvm_ffi": None, "pathtune": "0.1.0", "python": "3.11.0",
       "platform": "test", "host": "test-host"}

pytestmark = pytest.mark.usefixtures("isolated_perf_db")


@pytest.fixture(scope="module")
def raw():
    return yaml.safe_load(default_spec_path().read_text())


def variant(tmp_path, raw, fn, name="spec.yaml"):
    data = copy.deepcopy(raw)
    fn(data)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_spec(path)


def changed(spec):
    """The passes whose hash differs from the packaged spec's."""
    return {p for p in SPEC.passes if spec.pass_hash(p) != SPEC.pass_hash(p)}


# ---- the hash --------------------------------------------------------------------------------------

def test_pass_hashes_are_deterministic_and_distinct(raw, tmp_path):
    assert set(SPEC.pass_hashes) == {"fwd", "bwd", "decode"}
    hashes = [SPEC.hash, *SPEC.pass_hashes.values()]
    assert len(set(hashes)) == 4 and all(len(h) == 64 for h in hashes)
    # a function of the content only: not of YAML formatting or key order
    reordered = variant(tmp_path, raw, lambda d: d.update(dict(reversed(list(d.items())))))
    assert reordered.pass_hashes == SPEC.pass_hashes
    doc = json.loads(SPEC.pass_canonical_json("decode"))
    assert doc["pass"] == "decode" and set(doc["spec"]["passes"]) == {"decode"}
    assert set(doc["spec"]["knobs"]) == set(SPEC.passes["decode"].knobs)
    with pytest.raises(ValueError, match="unknown pass 'nope'"):
        SPEC.pass_hash("nope")


def test_a_decode_only_knob_changes_the_decode_hash_only(raw, tmp_path):
    def add(d):
        d["knobs"]["decode_extra"] = {"type": "int", "domain": [1, 2], "default": 1}
        d["passes"]["decode"]["knobs"].append("decode_extra")

    spec = variant(tmp_path, raw, add)
    assert changed(spec) == {"decode"} and spec.hash != SPEC.hash


def test_a_fwd_only_knob_domain_changes_the_fwd_hash_only(raw, tmp_path):
    spec = variant(tmp_path, raw, lambda d: d["knobs"]["inter_num_warps"].update(domain=[2, 4, 8]))
    assert changed(spec) == {"fwd"}


def test_a_knob_shared_by_fwd_and_bwd_changes_both(raw, tmp_path):
    spec = variant(tmp_path, raw, lambda d: d["knobs"]["ut_precision"].update(default="tf32"))
    assert changed(spec) == {"fwd", "bwd"}


def test_what_else_belongs_to_one_pass_or_to_all(raw, tmp_path):
    # a constraint whose knobs are all the backward's
    bwd_rule = variant(tmp_path, raw, lambda d: d["constraints"].append(
        {"expr": "bwd_block_n <= 128", "message": "m"}), "a.yaml")
    assert changed(bwd_rule) == {"bwd"}
    # a stage variant serving the decode pass only, and one served by one more pass
    dec_variant = variant(tmp_path, raw, lambda d: d["stages"]["householder_chain"]["variants"].update(
        windowed={"passes": ["decode"]}), "b.yaml")
    assert changed(dec_variant) == {"decode"}
    more = variant(tmp_path, raw, lambda d: d["stages"]["ut_inverse"]["variants"]["fused"].update(
        passes=["fwd", "bwd", "decode"]), "c.yaml")
    assert changed(more) == {"decode"}
    # a TVM knob the decode kernel reads
    tvm = variant(tmp_path, raw, lambda d: d["backends"]["tvm"]["knobs"]["decode_vec"].update(default=4), "d.yaml")
    assert changed(tvm) == {"decode"}
    # what every pass reads: the numerics (tolerances), a knob of all passes, the tensors
    tol = variant(tmp_path, raw, lambda d: d["numerics"]["accuracy"]["tolerances"].update(o=5e-3), "e.yaml")
    clip = variant(tmp_path, raw, lambda d: d["knobs"]["beta_clip_eps"].update(default=0.001), "f.yaml")
    dtypes = variant(tmp_path, raw, lambda d: d["tensors"]["q"].update(dtypes=["bfloat16", "float32", "float64"]),
                     "g.yaml")
    assert changed(tol) == changed(clip) == changed(dtypes) == {"fwd", "bwd", "decode"}
    # documentation and the untuned configs change no hash
    doc = variant(tmp_path, raw, lambda d: d["stages"]["ut_inverse"].update(description="other words"), "h.yaml")
    assert doc.pass_hashes == SPEC.pass_hashes and doc.hash == SPEC.hash


# ---- currency --------------------------------------------------------------------------------------

def kernel(pass_="fwd", spec_hash=None, backend="triton", source="src"):
    return KernelKey(pass_=pass_, backend=backend, spec_hash=SPEC.pass_hash(pass_) if spec_hash is None else spec_hash,
                     codegen_version="1", source_hash=source)


def wl(pass_="fwd", seq=1024):
    return Workload(64, 64, 8, 8, "bfloat16", False, pass_, seq)


def ok(ms):
    return Measurement(status="ok", median_ms=ms, errors={"o": 1e-3})


def test_records_of_the_pass_hash_and_of_the_full_hash_are_current(raw, tmp_path):
    other = variant(tmp_path, raw, lambda d: d["knobs"]["decode_splits"].update(domain=[1, 2, 4, 8, 16, 32]))
    for pass_ in SPEC.passes:
        keys = default_current_keys(SPEC.name, pass_, "triton")
        assert keys["spec_hash"] == SPEC.pass_hash(pass_)          # what new records carry
        assert not stale_reasons({"spec_hash": SPEC.pass_hash(pass_)}, keys)
        assert not stale_reasons({"spec_hash": SPEC.hash}, keys)
        assert stale_reasons({"spec_hash": "0" * 64}, keys) == [f"spec_hash {'0' * 12} != current "
                                                                f"{SPEC.pass_hash(pass_)[:12]}"]
        assert stale_reasons({"spec_hash": other.hash}, keys)     # a record of another spec
        for p in set(SPEC.passes) - {pass_}:
            assert stale_reasons({"spec_hash": SPEC.pass_hash(p)}, keys)   # another pass's hash
    # the other spec differs in the decode pass only: its fwd hash is the current one
    assert other.pass_hash("fwd") == SPEC.pass_hash("fwd")
    assert stale_reasons({"spec_hash": other.pass_hash("decode")}, default_current_keys(SPEC.name, "decode", "tvm"))
    assert default_current_keys(SPEC.name, "fwd", "sdpa") is None


def test_perf_db_serves_both_and_retires_another_spec(tmp_path):
    url = f"sqlite:///{tmp_path / 'perf.sqlite3'}"
    base = KnobSpace(SPEC, "fwd").default()
    with PerfDB(url) as db:                                        # the default current keys
        db.record(ENV, kernel(spec_hash=SPEC.hash), wl(), base.replace(num_warps=8), ok(1.0))
        db.record(ENV, kernel(), wl(), base.replace(num_warps=2), ok(1.2))
        db.record(ENV, kernel(spec_hash="0" * 64), wl(), base, ok(0.5))   # another spec: stale
        assert db.best(ENV, "fwd", wl())["config"]["num_warps"] == 8
        rows = db.query(pass_="fwd")
        assert sorted(bool(r["stale"]) for r in rows) == [False, False, True]
        assert len(db.query(pass_="fwd", include_stale=False)) == 2
        # the tuner asks with the pass hash and finds what was measured under the full hash, and back
        assert db.lookup(ENV, kernel(), wl(), base.replace(num_warps=8))["spec_hash"] == SPEC.hash
        assert db.lookup(ENV, kernel(spec_hash=SPEC.hash), wl(), base.replace(num_warps=2)) is not None
        assert db.lookup(ENV, kernel(spec_hash="0" * 64), wl(), base.replace(num_warps=8)) is None
        # a new source retires both; a new study warm-starts from both
        assert {r["config"]["num_warps"] for r in db.retired(ENV, kernel(source="new"), wl())} == {8, 2}
        report = db.gc(dry_run=True, env_info=ENV)
        assert report.total == 1 and report.reasons == {"spec_hash changed": 1}
        # a pack stores the full hash, exported from records of both kinds
        doc = export_pack(db, GPU, tmp_path / "pack.json")
    assert doc["_metadata"]["spec_hash"] == SPEC.hash and len(doc["entries"]) == 1
    pack = load_pack(tmp_path / "pack.json")
    assert pack.lookup(wl(), env_info=ENV).config["num_warps"] == 8


def test_retired_in_results_files_matches_both_hashes():
    base = KnobSpace(SPEC, "decode").default()
    recs = [results_record(ENV, kernel("decode", h, source="old"), wl("decode"), base.replace(decode_splits=s),
                           ok(0.1), run_id="r")
            for h, s in ((SPEC.hash, 8), (SPEC.pass_hash("decode"), 2), ("0" * 64, 16))]
    _, records = parse_results({"format": "pathtune-results", "version": 1, "runs": [{"run_id": "r",
                                "command": "pathtune tune"}], "records": recs})
    rows = retired_in_records(records, ENV, kernel("decode", source="new"), wl("decode"))
    assert {r["config"]["decode_splits"] for r in rows} == {8, 2}
    rows = retired_in_records(records, ENV, kernel("decode", "0" * 64, source="new"), wl("decode"))
    assert {r["config"]["decode_splits"] for r in rows} == {16}


def test_records_of_the_pass_hash_are_validated_like_the_full_hash():
    bad = {**KnobSpace(SPEC, "decode").default().to_dict(), "decode_splits": 3}
    for h in (SPEC.hash, SPEC.pass_hash("decode")):
        assert config_problems("triton", "decode", h, bad)
    assert not config_problems("triton", "decode", "0" * 64, bad)          # another spec: not checkable here
    assert not config_problems("triton", "decode", SPEC.pass_hash("fwd"), bad)


def _shipped_kernels():
    for path in sorted(SHIPPED_DIR.glob("*.json")):
        for rec in json.loads(path.read_text())["records"]:
            yield path.name, rec["kernel"]


@pytest.mark.skipif(not list(SHIPPED_DIR.glob("*.json")), reason="nothing shipped")
def test_no_shipped_record_current_before_is_retired_now():
    """Before per-pass hashes, current meant: the full spec hash (and, for the dispatcher, the pass's kernel
    source hash). Every shipped record current under that rule is current under the new one."""
    from pathtune.provenance import current_keys

    seen = 0
    for name, k in _shipped_kernels():
        op, pass_, backend = k.get("op", SPEC.name), k["pass"], k["backend"]
        old = ({"spec_hash": SPEC.hash, "source_hash": None}
               if backend in SPEC_BACKENDS and op == SPEC.name else None)
        if stale_reasons(k, old):
            continue
        seen += 1
        assert not stale_reasons(k, default_current_keys(op, pass_, backend)), (name, k)
        here = current_keys(op, pass_, backend)
        if not stale_reasons(k, {**(old or {}), "source_hash": (here or {}).get("source_hash")}):
            assert not stale_reasons(k, here), (name, k)
    if not seen:   # every full-hash record was measured under an earlier spec: nothing left to compare
        pytest.skip("no shipped record carries the current full spec hash")


def test_spec_show_prints_each_pass_hash():
    from typer.testing import CliRunner

    from pathtune.cli import app

    result = CliRunner().invoke(app, ["spec", "show"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert f"spec hash: {SPEC.hash}" in result.output
    for pass_, h in SPEC.pass_hashes.items():
        assert f"{pass_} hash:" in result.output and h in result.output


def test_the_tuner_keys_records_and_studies_by_the_pass_hash(tmp_path, monkeypatch):
    """New records and studies carry the pass hash; a study of the same key named by the full hash (opened
    before per-pass hashes, under this spec) is the one continued."""
    import sys
    from pathlib import Path

    import optuna

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import tune_fake
    from pathtune.tuning.space import plan_keys, study_name
    from pathtune.tuning.tuner import Budget, TuneOptions, Tuner

    monkeypatch.setenv("PATHTUNE_CACHE_DIR", str(tmp_path / "cache"))
    url = f"sqlite:///{tmp_path / 'tune.sqlite3'}"
    key = plan_keys([64], ["bfloat16"], ["decode"], ["triton"], [1024])[0]

    def tuner():
        return Tuner([key], TuneOptions(storage=url, budget=Budget(trials=2), measure_fn=tune_fake.measure,
                                        startup_trials=1, heartbeat=None, env_info=ENV))

    t = tuner()
    try:
        assert t.kernel(key).spec_hash == SPEC.pass_hash("decode")
        keys = t.db.current_keys(SPEC.name, "decode", "triton")
        assert keys["spec_hash"] == SPEC.pass_hash("decode") and set(keys["spec_hashes"]) == {SPEC.hash,
                                                                                               keys["spec_hash"]}
        assert t.study_name(key) == study_name(t.env_hash, SPEC.pass_hash("decode"), tune_fake.SOURCE_HASH, key)
        older = study_name(t.env_hash, SPEC.hash, tune_fake.SOURCE_HASH, key)
    finally:
        t.close()
    optuna.create_study(study_name=older, storage=url)
    t = tuner()
    try:
        assert t.study_name(key) == older
    finally:
        t.close()


def test_hashes_of_names_the_pass_hash_then_the_full_hash():
    assert SPEC.hashes_of("decode") == (SPEC.pass_hash("decode"), SPEC.hash)
    assert SPEC.hashes_of("no-such-pass") == (SPEC.hash,)


def test_a_pack_serves_each_pass_while_that_pass_is_unchanged(tmp_path, raw, monkeypatch):
    """A pack exported from current records names each pass's hash: a spec change of another pass (a decode knob)
    leaves its fwd entries served, a change of the fwd part stops them (once said, SoftMismatchWarning), and an
    older pack without pass hashes still needs the full hash to match (PackMismatch)."""
    import warnings

    import pathtune.perf_db._pack as pack_mod
    from pathtune.perf_db import PackMismatch, SoftMismatchWarning

    url = f"sqlite:///{tmp_path / 'perf.sqlite3'}"
    base = KnobSpace(SPEC, "fwd").default()
    with PerfDB(url) as db:
        db.record(ENV, kernel(), wl(), base.replace(num_warps=8), ok(1.0))
        doc = export_pack(db, GPU, tmp_path / "pack.json")
    assert doc["_metadata"]["spec_hashes"] == {"fwd": SPEC.pass_hash("fwd")}
    decode_knob = variant(tmp_path, raw, lambda d: d["knobs"]["decode_pending_window"]["domain"].append(128),
                          "decode.yaml")
    fwd_knob = variant(tmp_path, raw, lambda d: d["knobs"]["block_m"]["domain"].append(512), "fwd.yaml")
    assert changed(decode_knob) == {"decode"} and "fwd" in changed(fwd_knob)
    monkeypatch.setattr(pack_mod, "_packaged_spec", lambda: decode_knob)
    pack = load_pack(tmp_path / "pack.json")
    assert pack.pass_current("fwd") and pack.lookup(wl(), env_info=ENV).config["num_warps"] == 8
    monkeypatch.setattr(pack_mod, "_packaged_spec", lambda: fwd_knob)
    pack = load_pack(tmp_path / "pack.json")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert pack.lookup(wl(), env_info=ENV) is None and pack.lookup(wl(), env_info=ENV) is None
    told = [w for w in caught if issubclass(w.category, SoftMismatchWarning) and "fwd entries" in str(w.message)]
    assert len(told) == 1
    old = dict(doc, _metadata={k: v for k, v in doc["_metadata"].items() if k != "spec_hashes"})
    (tmp_path / "old.json").write_text(json.dumps(old))
    with pytest.raises(PackMismatch, match="spec hash"):
        load_pack(tmp_path / "old.json").lookup(wl(), env_info=ENV)
