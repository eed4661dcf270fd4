"""`pathtune bench-build-tvm`: the forward module sets the bench's TVM column loads on a GPU host, built here
(sm_90 machine code, no GPU), then opened the way the GPU host opens them (runtime only, fresh process)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

tvm = pytest.importorskip("tvm", reason="apache-tvm is not installed (pip install 'pathtune[tvm]')")
if shutil.which("nvcc") is None:
    pytest.skip("needs nvcc", allow_module_level=True)

from pathtune.codegen.tvm.build import source_hash  # noqa: E402
from pathtune.tuning.tvm_bench import bench_dims, build_bench_modules, folder_bytes, set_id  # noqa: E402

KNOBS = dict(chunk_size=32, superchunk_size=256, block_n=32, num_warps=2)


@pytest.mark.timeout(600)
def test_build_then_open_with_the_runtime_only(tmp_path):
    out = tmp_path / "tvm_bench"
    dims = bench_dims(32, True)
    manifest = build_bench_modules([dims], KNOBS, out, log=lambda s: None)
    (entry,) = manifest["sets"]
    sid = set_id(dims)
    assert entry["id"] == sid == "fwd-D32-H32-bfloat16-fox" and "build_error" not in entry
    assert manifest["source_hash"] == source_hash() and manifest["arch"] == "sm_90"
    assert entry["config"]["chunk_size"] == 32 and entry["config"]["block_m"] == 128   # spec fwd Config
    for name in ("ut", "transport", "scan"):
        assert (out / sid / f"{name}.so").stat().st_size > 0
        assert json.loads((out / sid / f"{name}.json").read_text())["arch"] == "sm_90"
    assert {p.name for p in (out / "tvm_runtime").iterdir()} == {"libtvm_runtime.so", "libtvm_runtime_cuda.so"}
    assert folder_bytes(out) < 15 * 2**20

    # a set that cannot build (tf32 scan operands: the tensor-core scan has no tf32 mma) is recorded with its
    # status; the set built before is kept
    manifest = build_bench_modules([bench_dims(32, False)], dict(KNOBS, scan_precision="tf32"), out,
                                   log=lambda s: None)
    by_id = {s["id"]: s for s in manifest["sets"]}
    assert set(by_id) == {sid, "fwd-D32-H32-bfloat16-path"}
    assert "build_error" not in by_id[sid]

    # the GPU host's path: tvm_ffi + the folder's runtime libraries, no `import tvm` (libcuda stubbed here)
    code = (
        "import ctypes, sys\n"
        "from pathtune.codegen.tvm.toolchain import stub_path\n"
        "ctypes.CDLL(str(stub_path()), mode=ctypes.RTLD_GLOBAL)\n"
        "from pathtune.tuning.tvm_bench import TVMBenchModules\n"
        f"m = TVMBenchModules.open({str(out)!r})\n"
        "m.require((32,), (True,))\n"
        "s = m.load(32, True)\n"
        "assert sorted(s.kernels) == ['scan', 'transport', 'ut'] and all(map(callable, s.kernels.values()))\n"
        "assert s.params.chunk_size == 32 and s.dims.gated\n"
        "assert 'tvm' not in sys.modules, 'the bench must not import the TVM compiler'\n"
        f"assert str(m.manifest['sets'][0]['id']).endswith('fox') and {str(out)!r} in s.where\n"
        "print('OK', m.build_status(32, False))\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "UnsupportedConfig" in by_id["fwd-D32-H32-bfloat16-path"]["build_error"]
    assert p.stdout.split() == ["OK", "compile_error"]

    # sets built from other TVM sources are not carried into a new manifest (its source hash covers every set)
    doc = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps(dict(doc, source_hash="0" * 16)))
    assert build_bench_modules([], None, out, log=lambda s: None)["sets"] == []
    assert not (out / sid).exists()


def test_cli_build_rejects_bad_configs(tmp_path):
    from typer.testing import CliRunner

    from pathtune.cli import app

    result = CliRunner().invoke(app, ["bench-build-tvm", "--head-dim", "32", "--config", '{"chunk_size": 48}',
                                      "--out", str(tmp_path / "x")], env={"COLUMNS": "250"})
    assert result.exit_code == 2 and "chunk_size" in result.output
    assert not (tmp_path / "x").exists()
