"""GPU build of the TVM backend on a machine without a GPU: every kernel template lowers and nvcc
compiles it to sm_90 machine code (libcuda stub), the tensor-core fragment contract holds, modules are
exported and cached. Skipped without apache-tvm or nvcc.

TVM's 35-second tensor-intrinsic import is never needed: the tensor-core scan uses TIRx primitives.
"""
from __future__ import annotations

import re
import shutil

import numpy as np
import pytest

tvm = pytest.importorskip("tvm", reason="apache-tvm is not installed (pip install 'pathtune[tvm]')")
if shutil.which("nvcc") is None:
    pytest.skip("nvcc is not on PATH (the TVM CUDA build runs nvcc)", allow_module_level=True)

from pathtune.codegen.tvm.build import build_kernels, make_kernel, manifest  # noqa: E402
from pathtune.codegen.tvm.params import KernelDims, TVMParams, UnsupportedConfig  # noqa: E402
from pathtune.codegen.tvm.tc_fragments import (  # noqa: E402
    a_coord,
    a_slots,
    b_coord,
    b_slots,
    d_coord,
    d_slots,
    lay_A,
    lay_B,
    lay_D,
)
from pathtune.codegen.tvm.toolchain import (  # noqa: E402
    SourceOnlyModuleError,
    check_device_binary,
    compile_cuda,
    ensure_cuda_build_env,
)


@pytest.fixture(scope="module", autouse=True)
def _cuda_env():
    ensure_cuda_build_env()


def _cu(ex):
    src = ex.mod.imports[0].inspect_source()
    assert "__global__" in src
    return src


# ---------------------------------------------------------------- the mma fragment contract

@pytest.mark.parametrize("Mt,Kt,Nt", [(1, 1, 1), (1, 4, 8), (2, 3, 2)])
def test_fragment_formulas_match_tile_layouts(Mt, Kt, Nt):
    for s in range(a_slots(Mt, Kt)):
        for lane in range(32):
            r, c = a_coord(s, lane, Mt, Kt)
            got = lay_A(Mt, Kt).apply(r, c, shape=[16 * Mt, 16 * Kt])
            assert (int(got["laneid"]), int(got["m"])) == (lane, s)
    for s in range(b_slots(Kt, Nt)):
        for lane in range(32):
            r, c = b_coord(s, lane, Kt, Nt)
            got = lay_B(Kt, Nt).apply(r, c, shape=[16 * Kt, 8 * Nt])
            assert (int(got["laneid"]), int(got["m"])) == (lane, s)
    for s in range(d_slots(Mt, Nt)):
        for lane in range(32):
            r, c = d_coord(s, lane, Mt, Nt)
            got = lay_D(Mt, Nt).apply(r, c, shape=[16 * Mt, 8 * Nt])
            assert (int(got["laneid"]), int(got["m"])) == (lane, s)
    # an accumulator [R, N] and an A operand [R, N] hold the same element in the same slot
    for s in range(d_slots(Mt, 2 * Kt)):
        for lane in range(32):
            assert d_coord(s, lane, Mt, 2 * Kt) == a_coord(s, lane, Mt, Kt)


def _emulate_mma_calls(src, a, b, d):
    """Run the mma.sync calls of a generated kernel on per-lane register arrays (PTX m16n8k16 semantics)."""
    calls = [c for c in re.findall(r"ptx_mma_sync_aligned_m16n8k16_row_col_f32_\w+\(([^;]*)\);", src) if "&" not in c]
    assert calls

    def idx(tok):
        return int(re.search(r"\[(\d+)\]\s*$", tok.strip()).group(1))

    for c in calls:
        toks = c.split(",")
        di, ai, bi, ci = ([idx(t) for t in toks[i:j]] for i, j in ((0, 4), (4, 8), (8, 10), (10, 14)))
        At, Bt, Ct = np.zeros((16, 16)), np.zeros((16, 8)), np.zeros((16, 8))
        for lane in range(32):
            g, t = lane // 4, lane % 4
            for j, (row, col) in enumerate([(g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8)]):
                At[row, col], At[row, col + 1] = a[lane, 2 * ai[j]], a[lane, 2 * ai[j] + 1]
            for j, k in enumerate([2 * t, 2 * t + 8]):
                Bt[k, g], Bt[k + 1, g] = b[lane, 2 * bi[j]], b[lane, 2 * bi[j] + 1]
            for j, (row, col) in enumerate([(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1)]):
                Ct[row, col] = d[lane, ci[j]]
        Dt = At @ Bt + Ct
        for lane in range(32):
            g, t = lane // 4, lane % 4
            for j, (row, col) in enumerate([(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1)]):
                d[lane, di[j]] = Dt[row, col]
    return len(calls)


def test_warp_gemm_lowering_matches_fragment_formulas():
    """Tx.warp.gemm over our layouts, lowered by TVM to mma.sync, computes A @ B with our slot formulas."""
    from tvm.script import tirx as T
    from tvm.script.tirx import tile as Tx

    Mt, Kt, Nt = 2, 3, 4

    @T.prim_func
    def gemm(d_h: T.handle):
        Dg = T.match_buffer(d_h, (1,), "float32")
        T.device_entry()
        T.cta_id([1])
        T.warp_id([1])
        T.lane_id([32])
        A = T.alloc_buffer((16 * Mt, 16 * Kt), "bfloat16", scope="local", layout=lay_A(Mt, Kt))
        B = T.alloc_buffer((16 * Kt, 8 * Nt), "bfloat16", scope="local", layout=lay_B(Kt, Nt))
        Dd = T.alloc_buffer((16 * Mt, 8 * Nt), "float32", scope="local", layout=lay_D(Mt, Nt))
        Tx.warp.gemm(Dd, A, B, Dd, transpose_A=False, transpose_B=False, alpha=1.0, beta=1.0)
        d = Dd.local(d_slots(Mt, Nt))
        Dg[0] = d[0]

    src = _cu(compile_cuda(tvm.IRModule({"main": gemm}), tirx=True))
    rng = np.random.default_rng(0)
    Am, Bm = rng.standard_normal((16 * Mt, 16 * Kt)), rng.standard_normal((16 * Kt, 8 * Nt))
    a, b, d = np.zeros((32, a_slots(Mt, Kt))), np.zeros((32, b_slots(Kt, Nt))), np.zeros((32, d_slots(Mt, Nt)))
    for lane in range(32):
        for s in range(a.shape[1]):
            a[lane, s] = Am[a_coord(s, lane, Mt, Kt)]
        for s in range(b.shape[1]):
            b[lane, s] = Bm[b_coord(s, lane, Kt, Nt)]
    assert _emulate_mma_calls(src, a, b, d) == Mt * Nt * Kt
    Dm = np.zeros((16 * Mt, 8 * Nt))
    for lane in range(32):
        for s in range(d.shape[1]):
            Dm[d_coord(s, lane, Mt, Nt)] = d[lane, s]
    np.testing.assert_allclose(Dm, Am @ Bm, atol=1e-12)


# ---------------------------------------------------------------- every kernel template builds for sm_90

_P = TVMParams(chunk_size=64, superchunk_size=256, block_n=64, num_warps=4, decode_block_n=64, decode_splits=4)


@pytest.mark.parametrize("name,variant,D,gated,dtype", [
    ("ut", "simt", 64, False, "bfloat16"),
    ("ut", "simt", 128, False, "float16"),
    ("transport", "simt", 128, False, "bfloat16"),
    ("scan", "simt", 64, True, "bfloat16"),
    ("scan", "tc", 64, True, "bfloat16"),
    ("scan", "tc", 128, False, "float16"),
    ("decode", "simt", 128, True, "bfloat16"),
    ("decode", "simt", 64, False, "float16"),
    ("decode_merge", "simt", 128, False, "bfloat16"),
])
def test_kernel_template_compiles_for_sm90(name, variant, D, gated, dtype):
    dims = KernelDims(H=2, HQ=4, D=D, DV=D, dtype=dtype, gated=gated)
    mod, is_tirx = make_kernel(name, _P, dims, target="cuda", variant=variant)
    ex = compile_cuda(mod, "sm_90", tirx=is_tirx, explicit_barriers=not is_tirx, what=name)
    src = _cu(ex)
    if variant == "tc":
        assert "mma.sync.aligned.m16n8k16.row.col.f32" in src       # tensor cores
    check_device_binary(ex)                                       # sm_90 machine code, not source only


def _decode_variant_cases():
    from pathtune.codegen.tvm.build_gpu_check import DEC_DIMS, DEC_KNOBS, DEC_PLAN

    out = []
    for dname, gated in (("D128-G4", True), ("D64-G1", False)):
        for kname in DEC_PLAN[dname]:
            out.append(pytest.param(DEC_KNOBS[kname], dict(DEC_DIMS[dname], gated=gated),
                                    id=f"{dname}-{'fox' if gated else 'path'}-{kname}"))
    return out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("knobs,dims", _decode_variant_cases())
def test_decode_variant_compiles_for_sm90(knobs, dims):
    """Every decode layout the GPU check times (build_gpu_check.DEC_KNOBS) lowers, compiles to sm_90 machine
    code (not source only), uses vector loads and warp shuffles, and fits in registers (ptxas: no spills)."""
    from pathtune.codegen.tvm.toolchain import ptxas_stats

    params, kd = TVMParams.from_config(knobs), KernelDims(**dims)
    mod, is_tirx = make_kernel("decode", params, kd, target="cuda")
    ex = compile_cuda(mod, "sm_90", tirx=is_tirx, explicit_barriers=True, what="decode")
    check_device_binary(ex)
    src = _cu(ex)
    assert "__shfl_xor_sync" in src                                           # the row sums
    assert set(re.findall(r"\*\((\w+)\*\)\(cache_k_ptr", src)) <= {"uint4", "uint2", "nv_bfloat164", "half4"}
    assert re.search(r"\*\((\w+)\*\)\(cache_k_ptr", src)                     # vector loads / stores of key rows
    stats = ptxas_stats(ex)["decode_kernel"]
    assert stats["spill_stores"] == 0 and stats["spill_loads"] == 0 and stats["stack"] == 0, stats


def test_source_only_module_is_an_error():
    class _Fake:
        kind = "cuda"

        def is_runnable(self):
            return False

        def inspect_source(self, fmt):
            return ""

    class _Mod:
        imports = [_Fake()]

    with pytest.raises(SourceOnlyModuleError):
        check_device_binary(_Mod())


def test_unsupported_combinations_are_typed():
    from pathtune.codegen.tvm.tc_scan import check_tc_supported

    with pytest.raises(UnsupportedConfig):
        check_tc_supported(TVMParams(chunk_size=32, superchunk_size=256, num_warps=4), KernelDims(1, 1, 64, 64))
    with pytest.raises(UnsupportedConfig):
        check_tc_supported(TVMParams(scan_precision="tf32"), KernelDims(1, 1, 64, 64))
    with pytest.raises(UnsupportedConfig):
        check_tc_supported(TVMParams(chunk_size=128, superchunk_size=1024, block_n=128), KernelDims(1, 1, 256, 256))


def test_build_exports_and_caches(tmp_path):
    dims = KernelDims(H=1, HQ=2, D=64, DV=64, dtype="bfloat16", gated=False)
    cfg = dict(chunk_size=64, superchunk_size=256, block_n=64, num_warps=4, decode_block_n=64, decode_splits=2)
    paths = build_kernels("decode", cfg, dims, cache_dir=tmp_path)
    assert set(paths) == {"decode", "decode_merge"} and all(p.exists() for p in paths.values())
    meta = manifest(paths)
    assert meta["decode"]["arch"] == "sm_90" and meta["decode"]["dims"]["D"] == 64
    stamp = {n: p.stat().st_mtime_ns for n, p in paths.items()}
    again = build_kernels("decode", cfg, dims, cache_dir=tmp_path)          # cache hit: nothing rebuilt
    assert again == paths and {n: p.stat().st_mtime_ns for n, p in again.items()} == stamp
    other = build_kernels("decode", dict(cfg, decode_splits=4), dims, cache_dir=tmp_path)
    assert other["decode"] != paths["decode"]                                # the knob is in the key


def test_runtime_only_loader_in_a_fresh_process(tmp_path):
    """The GPU-host path: tvm_ffi + libtvm_runtime{,_cuda}.so via ctypes, tvm_ffi.load_module; no `import tvm`.
    (On this GPU-less host the libcuda stub stands in for the driver that the GPU host has.)"""
    import subprocess
    import sys

    dims = KernelDims(H=1, HQ=2, D=64, DV=64, dtype="bfloat16", gated=False)
    paths = build_kernels("decode", dict(decode_block_n=64, decode_splits=2), dims, cache_dir=tmp_path)
    code = (
        "import ctypes, sys\n"
        "from pathtune.codegen.tvm.toolchain import stub_path\n"
        "ctypes.CDLL(str(stub_path()), mode=ctypes.RTLD_GLOBAL)\n"
        "from pathtune.codegen.tvm.runtime import TVMDecode\n"
        f"dec = TVMDecode.from_paths({ {n: str(p) for n, p in paths.items()}!r})\n"
        "assert sorted(dec.kernels) == ['decode', 'decode_merge'] and dec.dims.D == 64\n"
        "assert 'tvm' not in sys.modules, 'the runtime path must not import the TVM compiler'\n"
        "print('ok')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-2000:]
