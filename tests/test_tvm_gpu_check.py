"""Dry run of benchmarks/tvm_gpu_check.py on the CPU: its forward / decode / stage checks, driven with the GPU
kernels run through the CUDA emulator (tests/test_tvm_emulated.py), so the script the lead runs on the H200
is exercised before it gets there. Timings are GPU-only and not run here."""
from __future__ import annotations

import shutil

import pytest

tvm = pytest.importorskip("tvm", reason="apache-tvm is not installed (pip install 'pathtune[tvm]')")
if shutil.which("nvcc") is None or shutil.which("g++") is None:
    pytest.skip("needs nvcc and g++", allow_module_level=True)

from pathtune.codegen.tvm.build import make_kernel  # noqa: E402
from pathtune.codegen.tvm.cuda_emu import EmulatedKernel  # noqa: E402
from pathtune.codegen.tvm.params import KernelDims, TVMParams  # noqa: E402
from pathtune.codegen.tvm.toolchain import compile_cuda, ensure_cuda_build_env  # noqa: E402
from repo_scripts import load_script  # noqa: E402

gpu_check = load_script("benchmarks/tvm_gpu_check.py")


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


def test_decode_summary_ranks_variants_against_triton():
    """The closing table of a GPU run: per workload and length, the Triton baseline, then the TVM variants
    fastest first with their ratio to it (rows as _time_decode writes them)."""
    base = dict(kind="dec_time", D=128, H=8, HQ=32, gated=False, L=4096)
    rows = [dict(base, set="dec-a", tvm_graph_ms=0.3, tvm_ms=0.35, tvm_GBps=670.0, regs=200, spill_bytes=0,
                 triton_graph_ms=0.2, triton_cfg="N256w8s2", triton_GBps=1000.0, sdpa_ms=0.1),
            dict(base, set="dec-b", tvm_graph_ms=0.25, tvm_ms=0.3, tvm_GBps=800.0, regs=150, spill_bytes=0),
            dict(base, set="dec-c", tvm_graph_ms="error: RuntimeError: x", tvm_ms=1.0, regs=150, spill_bytes=0)]
    lines = gpu_check._decode_summary(rows)
    assert "triton 0.2 ms (N256w8s2" in lines[0]
    assert [ln.split()[0] for ln in lines[1:]] == ["dec-b", "dec-a", "dec-c"]
    assert "1.25x triton" in lines[1] and "1.50x triton" in lines[2]


@pytest.mark.timeout(900)
def test_gpu_check_decode_timing_rows_dry_run(cpu_mode, monkeypatch):
    """The decode timing code the GPU run executes (TVM eager + graph, the Triton decode baseline over its
    configs, SDPA, the torch step, GB/s, the summary), on the CPU: emulated TVM kernels, the Triton decode in
    Triton's interpreter (tests/conftest.py), each benchmark replaced by one call."""
    monkeypatch.setattr(gpu_check, "_bench", lambda fn: (fn(), 1.0)[1])
    monkeypatch.setattr(gpu_check, "_bench_graph", lambda fn: (fn(), 0.5)[1])
    monkeypatch.setattr(gpu_check, "DEC_LENGTHS", (37,))
    monkeypatch.setattr(gpu_check, "DEC_BATCH", 1)
    monkeypatch.setattr(gpu_check, "TRITON_DEC_CONFIGS", (None, dict(decode_block_n=64, decode_num_warps=4,
                                                                      decode_splits=2)))
    entry = dict(id="dry-dec-time", pass_="decode", variant="simt", baselines=True,
                 knobs=dict(decode_rows_per_thread=2, decode_splits=2, decode_num_warps=1, decode_prefetch=1),
                 dims=dict(H=1, HQ=2, D=32, DV=32, dtype="bfloat16", gated=True),
                 ptxas={"decode": {"decode_kernel": dict(registers=100, spill_stores=0)}})
    rows = gpu_check._check_decode(entry, _emulated(entry), timing=True, sizes=((1, 20),))
    t = [r for r in rows if r["kind"] == "dec_time"]
    assert len(t) == 1, rows
    r = t[0]
    assert r["tvm_ms"] == 1.0 and r["tvm_graph_ms"] == 0.5 and r["regs"] == 100
    assert r["triton_graph_ms"] == 0.5 and r["triton_cfg"] == "heuristic", r
    assert isinstance(r["sdpa_ms"], float) and isinstance(r["torch_ref_ms"], float), r
    assert r["tvm_GBps"] == pytest.approx(r["bytes_moved"] / 0.5e-3 / 1e9)
    assert r["bytes_floor"] == 1 * 37 * 1 * (2 * 32 + 32) * 2
    assert any("0.5 ms" in ln for ln in gpu_check._decode_summary(rows))


@pytest.mark.timeout(600)
def test_decode_bench_tvm_path_on_emulated_kernels(monkeypatch):
    """`pathtune bench --pass decode --backends tvm`'s TVM path (tuning/decode_tvm.py: the accuracy gate on a
    copy of batch 0, the timed step with the cache length reset) through TVMDecode and the generated CUDA of a
    small decode set run in the emulator; the timer replaced by one call."""
    from pathtune.codegen.tvm.runtime import TVMDecode
    from pathtune.tuning import decode_bench
    from pathtune.tuning.decode_tvm import TVMSet

    entry = dict(id="dry-bench", pass_="decode", variant="simt",
                 knobs=dict(decode_block_n=32, decode_splits=2, decode_num_warps=1),
                 dims=dict(H=2, HQ=2, D=32, DV=32, dtype="bfloat16", gated=True))
    kernels = _emulated(entry)
    tvm_set = TVMSet(entry["id"], entry["knobs"], KernelDims(**entry["dims"]), {}, None)
    calls = []
    monkeypatch.setattr(decode_bench, "_median_ms", lambda fn: (fn(), calls.append(1), 0.5)[2])
    rows = decode_bench.run_decode_bench(
        ((2, 32),), (48,), (True,), batch=2, baselines=(), device="cpu", backends=("tvm",), tvm_sets=[tvm_set],
        tvm_loader=lambda s: TVMDecode(kernels, s.dims, TVMParams.from_config(s.knobs)), log=lambda s: None)
    (row,) = rows
    assert not row.failures, row.failures
    assert row.times["tvm"] == 0.5 and len(calls) == 1
    assert row.tvm_sweep[0]["errors"]["o"] < 2e-2 and row.tvm_sweep[0]["errors"]["k"] < 2e-2
    assert row.tvm_params["decode_splits"] == 2 and row.tvm_params["set"] == "dry-bench"
