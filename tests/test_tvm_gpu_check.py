"""Dry run of codegen/tvm/gpu_check.py on the CPU: its forward / decode / stage checks, driven with the GPU
kernels run through the CUDA emulator (tests/test_tvm_emulated.py), so the script the lead runs on the H200
is exercised before it gets there. Timings are GPU-only and not run here."""
from __future__ import annotations

import shutil

import pytest

tvm = pytest.importorskip("tvm", reason="apache-tvm is not installed (pip install 'pathtune[tvm]')")
if shutil.which("nvcc") is None or shutil.which("g++") is None:
    pytest.skip("needs nvcc and g++", allow_module_level=True)

from pathtune.codegen.tvm import gpu_check  # noqa: E402
from pathtune.codegen.tvm.build import make_kernel  # noqa: E402
from pathtune.codegen.tvm.cuda_emu import EmulatedKernel  # noqa: E402
from pathtune.codegen.tvm.params import KernelDims, TVMParams  # noqa: E402
from pathtune.codegen.tvm.toolchain import compile_cuda, ensure_cuda_build_env  # noqa: E402


def _emulated(entry):
    ensure_cuda_build_env()
    params, dims = TVMParams.from_config(entry["knobs"]), KernelDims(**entry["dims"])
    grids = {"ut": ("NC", dims.H), "transport": ("NSC", dims.H), "scan": ("NC", dims.HQ),
             "decode": ("B", dims.H, params.decode_splits), "decode_merge": ("B", dims.HQ)}
    names = ("ut", "transport", "scan") if entry["pass_"] == "fwd" else ("decode", "decode_merge")
    out = {}
    for n in names:
        mod, is_tirx = make_kernel(n, params, dims, target="cuda", variant=entry["variant"])
        ex = compile_cuda(mod, tirx=is_tirx, explicit_barriers=not is_tirx)
        threads = params.decode_threads if n.startswith("decode") else params.threads
        out[n] = EmulatedKernel(ex, list(mod.functions.values())[0], grid=grids[n], threads=threads)
    return out


@pytest.fixture
def cpu_mode(monkeypatch):
    monkeypatch.setattr(gpu_check, "DEV", "cpu")


@pytest.mark.timeout(900)
def test_gpu_check_forward_rows_on_emulated_kernels(cpu_mode):
    entry = dict(id="dry-fwd", pass_="fwd", variant="tc", diag=True,
                 knobs=dict(chunk_size=32, superchunk_size=64, block_n=32, num_warps=2),
                 dims=dict(H=1, HQ=2, D=32, DV=32, dtype="bfloat16", gated=True))
    rows = gpu_check._check_forward(entry, _emulated(entry), timing=False)
    kinds = [r["kind"] for r in rows]
    assert kinds.count("fwd_check") == 3 and "stage_diag" in kinds
    assert all(r["ok"] for r in rows), rows


@pytest.mark.timeout(600)
def test_gpu_check_decode_rows_on_emulated_kernels(cpu_mode):
    entry = dict(id="dry-dec", pass_="decode", variant="simt",
                 knobs=dict(decode_block_n=32, decode_splits=2, decode_num_warps=1),
                 dims=dict(H=1, HQ=2, D=32, DV=32, dtype="bfloat16", gated=True))
    rows = gpu_check._check_decode(entry, _emulated(entry), timing=False, sizes=((2, 40), (1, 70)))
    assert len(rows) == 2 and all(r["ok"] for r in rows), rows
