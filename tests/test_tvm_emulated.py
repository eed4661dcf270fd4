"""The GPU kernels themselves, run on the CPU: each kernel is built for sm_90 exactly as for the GPU
(nvcc, machine code checked), and its generated CUDA source is also compiled with g++ against
codegen/tvm/cuda_emu.h (threads, barriers, shuffles, dynamic shared memory and mma.sync m16n8k16 with the
PTX fragment maps), then run through the same host code as on the GPU and compared with the float64
oracle. This checks the tensor-core scan's fragment and index math, masks and barrier placement without
a GPU. Skipped without apache-tvm, nvcc or g++."""
from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F

tvm = pytest.importorskip("tvm", reason="apache-tvm is not installed (pip install 'pathtune[tvm]')")
if shutil.which("nvcc") is None or shutil.which("g++") is None:
    pytest.skip("needs nvcc (the real sm_90 build) and g++ (the CPU emulation)", allow_module_level=True)

from pathtune.codegen.tvm import host  # noqa: E402
from pathtune.codegen.tvm.build import make_kernel  # noqa: E402
from pathtune.codegen.tvm.cuda_emu import EmulatedKernel  # noqa: E402
from pathtune.codegen.tvm.params import KernelDims, TVMParams  # noqa: E402
from pathtune.codegen.tvm.toolchain import compile_cuda, ensure_cuda_build_env  # noqa: E402
from pathtune.runtime.reference import (  # noqa: E402
    naive_path_attention,
    path_attention_decode_step,
    path_attention_prefill,
)

GRID = {"ut": ("NC", "H"), "transport": ("NSC", "H"), "scan": ("NC", "HQ"), "decode": ("B", "H", "NSPLIT"),
        "decode_merge": ("B", "HQ")}


@pytest.fixture(scope="module", autouse=True)
def _cuda_env():
    ensure_cuda_build_env()


def _emulated(names, params, dims, variant="tc"):
    consts = dict(H=dims.H, HQ=dims.HQ, NSPLIT=params.decode_splits)
    out = {}
    for name in names:
        mod, is_tirx = make_kernel(name, params, dims, target="cuda", variant=variant)
        ex = compile_cuda(mod, "sm_90", tirx=is_tirx, explicit_barriers=not is_tirx, what=name)
        grid = tuple(consts.get(g, g) for g in GRID[name])
        threads = params.decode_threads if name.startswith("decode") else params.threads
        out[name] = EmulatedKernel(ex, list(mod.functions.values())[0], grid=grid, threads=threads)
    return out


def _inputs(B, T, HQ, H, D, DV, gated, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, HQ, D, generator=gen).to(dtype)
    k = torch.randn(B, T, H, D, generator=gen).to(dtype)
    v = torch.randn(B, T, H, DV, generator=gen).to(dtype)
    w = F.normalize(torch.randn(B, T, H, D, generator=gen), dim=-1)
    beta = 1.5 + 0.5 * torch.rand(B, T, H, generator=gen)            # beta in [1.5, 2)
    g = torch.log(0.95 + 0.05 * torch.rand(B, T, HQ, generator=gen)) if gated else None
    return q, k, v, w, beta, g


def _rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


# (variant, C, S, block_n, warps, H, HQ, D, DV, dtype, scan, gated, T, cu_seqlens)
FWD_CASES = [
    ("tc", 32, 64, 32, 2, 1, 2, 32, 32, "bfloat16", "fp16", True, 150, None),      # 3 super-chunks, GQA
    ("tc", 64, 128, 64, 2, 1, 1, 32, 32, "bfloat16", "fp16", False, 150, None),    # 2 m16 tiles per warp
    ("tc", 32, 128, 64, 2, 2, 4, 32, 64, "float16", "bf16", True, 200, [0, 33, 150, 200]),  # varlen, DV != D
    ("simt", 32, 64, 32, 1, 1, 2, 32, 32, "bfloat16", "fp16", True, 150, None),    # CUDA-core scan
    ("tc", 64, 128, 64, 4, 1, 1, 64, 64, "bfloat16", "fp16", False, 300, None),    # 4 warps, register tiles x2
]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("case", FWD_CASES, ids=[f"{c[0]}-C{c[1]}-w{c[4]}-{c[9]}" for c in FWD_CASES])
def test_forward_gpu_kernels_emulated(case):
    variant, C, S, BN, W, H, HQ, D, DV, dtype, scan, gated, T, cu = case
    params = TVMParams(chunk_size=C, superchunk_size=S, block_n=BN, num_warps=W, scan_precision=scan)
    dims = KernelDims(H=H, HQ=HQ, D=D, DV=DV, dtype=dtype, gated=gated)
    kernels = _emulated(("ut", "transport", "scan"), params, dims, variant)
    q, k, v, w, beta, g = _inputs(1, T, HQ, H, D, DV, gated, getattr(torch, dtype))
    cu_t = None if cu is None else torch.tensor(cu)
    o, lse = host.forward(kernels, q, k, v, w, beta, g, scale=D ** -0.5, cu_seqlens=cu_t, params=params, dims=dims)
    ref, ref_lse = naive_path_attention(q.double(), k.double(), v.double(), w.double(), beta.double(),
                                        None if g is None else g.double(), scale=D ** -0.5, cu_seqlens=cu_t,
                                        return_lse=True)
    assert not torch.isnan(o).any()
    assert _rel(o, ref) < 4e-3                       # the spec's accuracy gate for o
    assert (lse.double() - ref_lse).abs().max().item() < 1e-2


# (C, D, warps, cu_seqlens): the register-tiled UT kernel alone (blocked inverse: 1, 2, 3 merge levels)
UT_EMU_CASES = [(32, 32, 1, [0, 45, 90]), (64, 64, 4, [0, 70, 128]), (128, 64, 4, [0, 100, 128]),
                (128, 128, 4, [0, 100, 256])]   # the last: the low-memory form (K, M read from global)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", UT_EMU_CASES, ids=[f"C{c[0]}-D{c[1]}-w{c[2]}" for c in UT_EMU_CASES])
def test_ut_kernel_emulated(case):
    from pathtune.runtime.reference import boundary_adjust_keys, ut_transform

    C, D, W, cu = case
    params = TVMParams(chunk_size=C, superchunk_size=2 * C, block_n=C, num_warps=W)
    dims = KernelDims(H=2, HQ=2, D=D, DV=D, dtype="bfloat16", gated=False)
    ut = _emulated(("ut",), params, dims)["ut"]
    q, k, v, w, beta, _ = _inputs(1, cu[-1], 2, 2, D, D, False, torch.bfloat16, seed=3)
    tab = host.build_tables(1, cu[-1], torch.tensor(cu), C, 2 * C, "cpu")
    N = cu[-1]
    wt, bt, kt_in = w[0].float().contiguous(), beta[0].float().contiguous(), k[0].contiguous()
    u, ktil, m = torch.empty(N, 2, D), torch.empty(N, 2, D), torch.empty(N, 2, C)
    ut(wt, bt, kt_in, u, ktil, m, tab.chunk_tok0, tab.chunk_seq, tab.seq_end, params.beta_max)
    for s0, s1 in zip(cu[:-1], cu[1:]):
        for c0 in range(s0, s1, C):
            rows = slice(c0, min(c0 + C, s1))
            n = rows.stop - rows.start
            for h in range(2):
                Wc = torch.zeros(C, D, dtype=torch.float64)
                Kc = torch.zeros(C, D, dtype=torch.float64)
                bc = torch.zeros(C, dtype=torch.float64)
                Wc[:n], Kc[:n] = wt[rows, h].double(), kt_in[rows, h].double()
                bc[:n] = bt[rows, h].double().clamp(max=params.beta_max)
                A, U = ut_transform(Wc, bc)
                M = A @ torch.tril(Wc @ Kc.T, -1)
                assert (u[rows, h].double() - U[:n]).abs().max().item() < 1e-4
                assert (m[rows, h].double() - M[:n]).abs().max().item() < 1e-3
                assert (ktil[rows, h].double() - boundary_adjust_keys(Kc, Wc, A)[:n]).abs().max().item() < 1e-3


# (C, S, D, warps): the transport kernel alone; C 64 D 128 stages U by 16-row slices (two blocks per SM)
TRANSPORT_EMU_CASES = [(32, 96, 64, 2), (64, 128, 128, 4)]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", TRANSPORT_EMU_CASES, ids=[f"C{c[0]}-S{c[1]}-D{c[2]}" for c in TRANSPORT_EMU_CASES])
def test_transport_kernel_emulated(case):
    from pathtune.codegen.tvm.stir_transport import transport_slice

    C, S, D, W = case
    params = TVMParams(chunk_size=C, superchunk_size=S, block_n=C, num_warps=W)
    dims = KernelDims(H=1, HQ=1, D=D, DV=D, dtype="bfloat16", gated=False)
    tr = _emulated(("transport",), params, dims)["transport"]
    assert (D == 128) == (transport_slice(C, D) < C)
    N = 2 * S + C                                                  # two full super-chunks, then a short last one
    gen = torch.Generator().manual_seed(5)
    ktil, w, u = (0.3 * torch.randn(N, 1, D, generator=gen) for _ in range(3))
    tab = host.build_tables(1, N, None, C, S, "cpu")
    kj = torch.zeros(N, 1, D, dtype=host.torch_dtype(params.scan_dtype()))
    what = torch.empty(tab.n_sc, 1, D, D)
    tr(ktil, w, u, kj, what, tab.sc_tok0, tab.sc_seq, tab.seq_end)
    for j in range(2):
        Suf = torch.eye(D, dtype=torch.float64)
        for c in reversed(range(S // C)):
            rows = slice(j * S + c * C, j * S + (c + 1) * C)
            K, Wc, Uc = (x[rows, 0].double() for x in (ktil, w, u))
            assert (kj[rows, 0].double() - K @ Suf.T).abs().max().item() < 2e-2 * max(1.0, (K @ Suf.T).abs().max())
            Suf = Suf - (Suf @ Wc.T) @ Uc
        assert (what[j, 0].double() - Suf).abs().max().item() < 1e-4


# (H, HQ, D, gated, prefill length, knobs): the generated CUDA of the decode kernel (vector loads, warp-shuffle
# row sums, register online softmax, shared-memory combine) on the CPU
DECODE_EMU_CASES = [
    (2, 4, 32, False, 45, dict(decode_block_n=32, decode_splits=3, decode_num_warps=1)),
    (2, 4, 32, True, 45, dict(decode_block_n=32, decode_splits=3, decode_num_warps=1)),
    (1, 4, 64, True, 70, dict(decode_rows_per_thread=2, decode_splits=2, decode_num_warps=2, decode_prefetch=1)),
    (2, 2, 128, False, 41, dict(decode_threads_per_row=32, decode_vec=4, decode_rows_per_thread=3, decode_splits=4,
                                decode_num_warps=1, decode_prefetch=1)),
]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", DECODE_EMU_CASES, ids=[f"D{c[2]}-G{c[1] // c[0]}-{'fox' if c[3] else 'path'}-"
                                                        f"{'pf' if c[5].get('decode_prefetch') else 'nopf'}"
                                                        for c in DECODE_EMU_CASES])
def test_decode_gpu_kernels_emulated(case):
    H, HQ, D, gated, T0, knobs = case
    DV = D
    params = TVMParams(**knobs)
    dims = KernelDims(H=H, HQ=HQ, D=D, DV=DV, dtype="bfloat16", gated=gated)
    kernels = _emulated(("decode", "decode_merge"), params, dims)
    q, k, v, w, beta, g = _inputs(2, T0, HQ, H, D, DV, gated, torch.bfloat16)
    _, cache_ref = path_attention_prefill(q, k, v, w, beta, g, max_len=T0 + 5)
    _, cache = path_attention_prefill(q, k, v, w, beta, g, max_len=T0 + 5)
    for step in range(3):
        qt, kt, vt, wt, bt, gt = (None if x is None else x[:, 0]
                                  for x in _inputs(2, 1, HQ, H, D, DV, gated, torch.bfloat16, seed=10 + step))
        ref, ref_lse = path_attention_decode_step(qt, kt, vt, wt, bt, gt, cache_ref, scale=D ** -0.5, return_lse=True)
        o, lse = host.decode_step(kernels, qt, kt, vt, wt, bt, gt, cache, scale=D ** -0.5, params=params, dims=dims)
        n = cache_ref.length
        assert cache.length == n
        assert (cache.k[:, :n].float() - cache_ref.k[:, :n].float()).abs().max().item() < 1e-2   # cache dtype ulp
        assert torch.equal(cache.v[:, :n], cache_ref.v[:, :n])
        if gated:
            assert (cache.c[:, :n] - cache_ref.c[:, :n]).abs().max().item() < 1e-6
        assert (o.float() - ref.float()).abs().max().item() < 2e-2
        assert (lse - ref_lse).abs().max().item() < 2e-3
