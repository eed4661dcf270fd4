"""`pathtune bench --backends triton,tvm --tvm-modules DIR`: the TVM forward column.

The CLI's errors (no folder, no runtime, missing or stale module sets) come before any GPU work; the row
logic runs the real host code (codegen/tvm/host.py) with the forward kernels built for the CPU (llvm), so
the accuracy gate, per-stage times, failures, table, JSON and perf_db records are those of real kernels.
(The sm_90 kernels' generated CUDA through the same host code: tests/test_tvm_emulated.py; the module-set
build: tests/test_bench_tvm_build.py.)"""
from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from dataclasses import asdict

import pytest
from typer.testing import CliRunner

from pathtune.cli import app
from pathtune.tuning import bench
from pathtune.tuning.tvm_bench import FORMAT, TVMBenchError, TVMBenchModules, bench_dims, fwd_config, set_id

runner = CliRunner()
KNOBS = dict(chunk_size=32, superchunk_size=256, block_n=32, num_warps=2)   # spec-valid, tiny


def _run(*args):
    result = runner.invoke(app, list(args), env={"COLUMNS": "250"})
    return result, " ".join(result.output.split())


def _manifest(head_dims=(64,), gates=(False, True), src=None, broken=()):
    from pathtune.codegen.tvm.build import source_hash

    sets = []
    for D in head_dims:
        for gate in gates:
            dims = bench_dims(D, gate)
            sid = set_id(dims)
            entry = dict(id=sid, dims=dims.key(), config=fwd_config(KNOBS, dims), knobs=KNOBS,
                         kernels={n: f"{sid}/{n}.so" for n in ("ut", "transport", "scan")})
            if (D, gate) in broken:
                entry.update(build_error="BuildError: ptxas: too many resources requested", status="compile_error")
                del entry["kernels"]
            sets.append(entry)
    return dict(format=FORMAT, version=1, arch="sm_90", source_hash=src or source_hash(), sets=sets)


def _folder(tmp_path, **kw):
    (tmp_path / "manifest.json").write_text(json.dumps(_manifest(**kw)))
    return tmp_path


# ---------------------------------------------------------------- CLI errors

def test_cli_tvm_needs_a_modules_folder():
    result, out = _run("bench", "--backends", "triton,tvm", "--forward-only")
    assert result.exit_code == 2
    assert "--tvm-modules" in out and "bench-build-tvm" in out


def test_cli_rejects_unknown_backends():
    result, out = _run("bench", "--backends", "triton,cuda")
    assert result.exit_code == 2 and "--backends takes triton and/or tvm" in out


def test_cli_folder_without_manifest_says_how_to_build_it(tmp_path):
    result, out = _run("bench", "--backends", "tvm", "--tvm-modules", str(tmp_path), "--head-dim", "64")
    assert result.exit_code == 1, out
    assert "no manifest.json" in out and f"pathtune bench-build-tvm --head-dim 64,128 --out {tmp_path}" in out
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_cli_folder_of_another_kind_is_refused(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps(dict(arch="sm_90", sets=[])))   # a gpu_check bundle
    result, out = _run("bench", "--backends", "tvm", "--tvm-modules", str(tmp_path))
    assert result.exit_code == 1 and "not a bench module folder" in out


def test_cli_without_the_tvm_runtime(tmp_path):
    """A GPU host where tvm_ffi is not installed: a clear message and exit 1, not a traceback."""
    folder = _folder(tmp_path)
    code = ("import sys; sys.modules['tvm_ffi'] = None\n"          # `import tvm_ffi` raises ImportError
            "from pathtune.cli import app\n"
            f"app(['bench', '--backends', 'triton,tvm', '--tvm-modules', {str(folder)!r}, '--head-dim', '64'])\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={"COLUMNS": "250", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    out = " ".join((p.stdout + p.stderr).split())
    assert p.returncode == 1, out
    assert "import tvm_ffi` failed" in out and "apache-tvm-ffi" in out and "Traceback" not in out


# ---------------------------------------------------------------- module sets checked up front

def test_missing_sets_are_named_with_the_build_command(tmp_path):
    mods = TVMBenchModules(tmp_path, _manifest(head_dims=(64,)))
    with pytest.raises(TVMBenchError) as e:
        mods.require((64, 128), (False, True))
    msg = str(e.value)
    assert "fwd-D128-H8-bfloat16-path, fwd-D128-H8-bfloat16-fox" in msg
    assert f"pathtune bench-build-tvm --head-dim 64,128 --gate both --out {tmp_path}" in msg
    mods.require((64,), (True,))                                     # what it has is enough for D=64
    # run_bench checks before any work (no GPU here: the TVM error comes first)
    with pytest.raises(TVMBenchError, match="fwd-D128-H8-bfloat16-fox"):
        bench.run_bench((128,), (64,), (True,), backends=("tvm",), tvm_modules=mods, device="cuda")


def test_modules_from_other_sources_are_refused(tmp_path):
    mods = TVMBenchModules(tmp_path, _manifest(src="0" * 16))
    with pytest.raises(TVMBenchError, match="other TVM kernel sources.*rebuild"):
        mods.require((64,), (False,))


def test_build_config_is_validated_against_the_spec():
    dims = bench_dims(64, False)
    assert fwd_config(None, dims)["chunk_size"] == 64                # the spec defaults
    with pytest.raises(ValueError, match="chunk_size"):
        fwd_config(dict(chunk_size=48), dims)
    with pytest.raises(ValueError, match="decode_splits"):
        fwd_config(dict(decode_splits=4), dims)                      # a decode knob is no fwd knob


# ---------------------------------------------------------------- rows with real (CPU-built) TVM kernels

_CPU_KERNELS: dict = {}


class CPUModules(TVMBenchModules):
    """The manifest logic of TVMBenchModules; kernels built for the CPU instead of loaded from the folder
    (``corrupt``: a set whose scan output is damaged, as a wrong kernel would be)."""

    def __init__(self, folder, manifest, corrupt=()):
        super().__init__(folder, manifest)
        self.corrupt = corrupt

    def _kernels(self, entry, dims):
        from pathtune.codegen.tvm.build import compile_cpu_kernels

        key = (dims, json.dumps(entry["config"], sort_keys=True))
        if key not in _CPU_KERNELS:                                  # shared by the tests (compiling takes seconds)
            _CPU_KERNELS[key] = compile_cpu_kernels("fwd", entry["config"], dims, fdt="float32")
        kernels = _CPU_KERNELS[key]
        if dims.gated in self.corrupt:
            scan = kernels["scan"]

            def bad_scan(*args):
                scan(*args)
                o = args[-9]                 # host.forward's scan arguments end: o, lse, 5 tables, 2 scales
                o.mul_(1.1)
            kernels = dict(kernels, scan=bad_scan)
        return kernels


@pytest.fixture
def small_bench(monkeypatch):
    """bench at D=32 with one head; Triton's own accuracy/timing stubbed (tested elsewhere); the timer is one
    wall-clock call (the bench's is do_bench on the GPU)."""
    pytest.importorskip("tvm", reason="apache-tvm is not installed (pip install 'pathtune[tvm]')")
    monkeypatch.setitem(bench.HEADS_FOR_DIM, 32, 1)

    def timer(fn):
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    monkeypatch.setattr(bench, "_median_ms", timer)
    monkeypatch.setattr(bench, "_accuracy", lambda *a, **kw: {"o": 1e-3})
    monkeypatch.setattr(bench, "_pathtune_callable", lambda *a: (lambda: time.sleep(0.002)))


def test_tvm_rows_time_check_and_record(tmp_path, small_bench):
    """Gated and ungated rows at T = 2 super-chunks: the o error of the real kernels vs the float64 oracle,
    time and ratio to the Triton forward, per-stage times (ut, transport, scan, host), and perf_db rows with
    backend "tvm" keyed by the spec fwd Config the modules were built with."""
    from pathtune.codegen.tvm.build import source_hash
    from pathtune.perf_db import PerfDB

    mods = CPUModules(tmp_path, _manifest(head_dims=(32,)))
    rows = bench.run_bench((32,), (512,), (False, True), tokens=512, baselines=(), backward=False, device="cpu",
                           backends=("triton", "tvm"), tvm_modules=mods, log=lambda s: None)
    assert len(rows) == 2
    for row in rows:
        assert not row.failures, row.failures
        assert row.statuses == {"tvm": "ok"}
        assert 0 < row.errors["tvm_o"] < 4e-3                        # the spec's gate for o
        assert row.ratios["tvm_f/pathtune_f"] == row.times["tvm_f"] / row.times["pathtune_f"]
        assert set(row.tvm_stages) == {"ut", "transport", "scan", "host"}
        kernels = sum(t for name, t in row.tvm_stages.items() if name != "host")
        assert min(row.tvm_stages.values()) >= 0 and row.tvm_stages["host"] == max(0.0, row.times["tvm_f"] - kernels)
        assert row.configs["tvm"]["superchunk_size"] == 256
        assert row.dispatch["tvm"].endswith(set_id(bench_dims(32, row.gate)))
        json.dumps(asdict(row))                                      # the --json file
    assert bench.format_table(rows).columns[-3].header == "tvm f"

    url = f"sqlite:///{tmp_path / 'perf.sqlite3'}"
    assert bench.record_rows(rows, url, None, "pathtune bench --backends triton,tvm (test)") == 4
    with PerfDB(url, current_keys=None) as db:
        recorded = db.query()
    tvm = [r for r in recorded if r["backend"] == "tvm"]
    assert all(set(r["errors"]) == {"o"} for r in recorded)           # each backend its own o error
    assert len(tvm) == 2 and {r["status"] for r in tvm} == {"ok"}
    assert sorted(r["median_ms"] for r in tvm) == sorted(r.times["tvm_f"] for r in rows)
    assert all(r["config"]["chunk_size"] == 32 and r["source_hash"] == source_hash() for r in tvm)


def test_failing_sets_are_row_failures(tmp_path, small_bench):
    """A set that did not build and a kernel whose output is wrong: recorded statuses, no time, no crash; the
    other rows and the Triton column are unaffected."""
    from pathtune.perf_db import PerfDB

    mods = CPUModules(tmp_path, _manifest(head_dims=(32,), broken={(32, False)}), corrupt=(True,))
    rows = bench.run_bench((32,), (512,), (False, True), tokens=512, baselines=(), backward=False, device="cpu",
                           backends=("triton", "tvm"), tvm_modules=mods, log=lambda s: None)
    unbuilt, wrong = rows
    assert unbuilt.statuses["tvm"] == "compile_error" and "did not build" in unbuilt.failures["tvm"]
    assert wrong.statuses["tvm"] == "wrong" and "accuracy gate" in wrong.failures["tvm"]
    assert wrong.errors["tvm_o"] > 4e-3 and math.isfinite(wrong.errors["tvm_o"])
    for row in rows:
        assert "tvm_f" not in row.times and not row.ratios and row.times["pathtune_f"] > 0
    url = f"sqlite:///{tmp_path / 'perf.sqlite3'}"
    bench.record_rows(rows, url, None, "pathtune bench (test)")
    with PerfDB(url, current_keys=None) as db:
        statuses = sorted(r["status"] for r in db.query() if r["backend"] == "tvm")
    assert statuses == ["compile_error", "wrong"]


def test_profile_row_notes_errors_and_skips_failed_tvm(tmp_path):
    """The per-kernel breakdown is diagnostic: a profiler failure is noted in the row, a failed TVM row is
    not profiled (its set may not load)."""
    from pathtune.tuning.bench import BenchRow
    from pathtune.tuning.tvm_bench import profile_row

    row = BenchRow(64, 4096, 8, 16, False, failures={"tvm": "BuildError: x"})

    def broken():
        raise RuntimeError("CUPTI unavailable")
    profile_row(row, (), TVMBenchModules(tmp_path, _manifest()), broken)
    assert row.tvm_profile == {} and row.triton_stages["error"].startswith("RuntimeError")


@pytest.mark.gpu
def test_device_kernel_ms_names_the_triton_forward_kernels():
    from pathtune.tuning.tvm_bench import device_kernel_ms

    xs = bench.make_inputs(2, 2048, 8, 8, 64, 64, True, device="cuda", seed=0)
    ms = device_kernel_ms(bench._pathtune_callable(*xs, None, False))
    assert all(t > 0 for t in ms.values()), ms
    assert any(n.startswith("ut_chunk") for n in ms) and any(n.startswith("scan_") for n in ms), ms
