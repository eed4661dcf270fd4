"""Records and packs that enter from files are checked against the spec's knob space (perf_db/_validate.py):
`pathtune import` and `load_pack` refuse a Triton config of the current spec that is outside its pass's
knob domains or constraints, or a status-ok time that is missing, NaN or <= 0, naming the record and the
knob; nothing is added.  `pathtune bench --record` stores the pass's own knobs, as the tuner does."""
import json
import math

import pytest
from typer.testing import CliRunner

from pathtune.cli import app
from pathtune.perf_db import (
    KernelKey,
    Measurement,
    PerfDB,
    PerfDBError,
    ResultsFormatError,
    results_record,
)
from pathtune.perf_db._pack import Pack
from pathtune.perf_db._results import parse_results
from pathtune.specs import KnobSpace, Workload, load_spec

SPEC = load_spec()
ENV = {"gpu_name": "TEST-GPU", "gpu_count": 1, "compute_capability": "9.0", "sm_count": 132,
       "gpu_memory_bytes": 150_000_000_000, "driver": "550.54.15", "cuda_runtime": "12.4", "ptxas": "12.4.131",
       "torch": "2.5.1", "triton": "3.2.0", "tvm": None, "pathtune": "0.1.0", "host": "test-host"}
WL = Workload(64, 64, 8, 2, "bfloat16", True, "decode", 4096)

pytestmark = pytest.mark.usefixtures("isolated_perf_db")


def _doc(config, median_ms=0.1, spec_hash=SPEC.hash, backend="triton"):
    kernel = KernelKey(pass_="decode", backend=backend, spec_hash=spec_hash, source_hash="src")
    rec = results_record(ENV, kernel, WL, KnobSpace(SPEC, "decode").default(), Measurement(status="ok", median_ms=1.0,
                                                                                         bench_method="synthetic"),
                         run_id="r1")
    rec["config"] = config
    rec["measurement"]["median_ms"] = median_ms
    return {"format": "pathtune-results", "version": 1, "runs": [{"run_id": "r1", "command": "pathtune tune"}],
            "records": [rec]}


def _default(**change):
    return {**KnobSpace(SPEC, "decode").default().to_dict(), **change}


@pytest.mark.parametrize("change, match", [
    (dict(decode_splits=3), r"decode_splits=3 is not in its domain"),
    (dict(decode_num_warps=64), r"decode_num_warps=64 is not in its domain"),
    (dict(block_m=128), r"knob 'block_m' is not used by pass decode"),
])
def test_results_with_configs_outside_the_knob_space_are_refused(change, match):
    with pytest.raises(ResultsFormatError, match=r"records\[0\]: config is not in the spec's decode knob space: "
                                                 + match):
        parse_results(_doc(_default(**change)))


@pytest.mark.parametrize("ms", [math.nan, 0.0, -1.0, None])
def test_ok_records_need_a_positive_finite_time(ms):
    with pytest.raises((ResultsFormatError, PerfDBError), match=r"median_ms|time"):
        parse_results(_doc(_default(), median_ms=ms))


def test_other_specs_and_backends_keep_their_own_knobs():
    parse_results(_doc(_default(decode_splits=3), spec_hash="0" * 64))        # retired spec: not checkable here
    parse_results(_doc({"layout": "split"}, backend="tvm"))                   # TVM knobs are its own


def test_import_refuses_a_bad_record_and_adds_nothing(tmp_path):
    url = f"sqlite:///{tmp_path / 'perf.sqlite3'}"
    PerfDB(url).close()
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(_doc(_default(decode_splits=3))))
    result = CliRunner().invoke(app, ["import", str(path), "--db", url])
    assert result.exit_code != 0
    assert "decode_splits=3 is not in its domain" in result.output and "Traceback" not in result.output
    with PerfDB(url, current_keys=None) as db:
        assert db.query() == []


def _pack(config, median_ms=0.1):
    return {"format": "pathtune-pack", "version": 1,
            "_metadata": {"gpu_name": "TEST-GPU", "spec_hash": SPEC.hash},
            "entries": [{"workload": WL.to_dict(), "pass": "decode", "backend": "triton", "config": config,
                         "median_ms": median_ms}],
            "default": {}}


def test_packs_with_bad_entries_are_refused():
    Pack(_pack(_default()))
    with pytest.raises(PerfDBError, match=r"entries\[0\] \(triton decode D=64 T<=4096\): decode_splits=3 is not in "
                                          r"its domain .*export the pack again"):
        Pack(_pack(_default(decode_splits=3)))
    with pytest.raises(PerfDBError, match=r"entries\[0\].*median_ms must be a positive finite time"):
        Pack(_pack(_default(), median_ms=float("nan")))
    bad_default = dict(_pack(_default()),
                       default={"decode": {"backend": "triton", "config": _default(decode_splits=3)}})
    with pytest.raises(PerfDBError, match=r"default\['decode'\]: decode_splits=3 is not in its domain"):
        Pack(bad_default)


def test_bench_records_hold_the_pass_knobs_only(tmp_path):
    """The bench recorder keys a fwd row by the fwd knobs and a bwd row by the bwd knobs (spec spelling),
    like the tuner: a fwd record with the decode and backward knobs in it is refused on import."""
    from pathtune.codegen.triton import TritonParams
    from pathtune.runtime.dispatch import pass_config

    for pass_ in ("fwd", "bwd", "decode"):
        cfg = pass_config(pass_, TritonParams.heuristic(128))
        assert set(cfg.to_dict()) == set(KnobSpace(SPEC, pass_).knobs)
        assert not KnobSpace(SPEC, pass_).validate(cfg.to_dict(), {"D": 128, "DV": 128})
        assert cfg.to_dict()["beta_clip_eps"] == "off"
