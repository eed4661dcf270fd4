"""The candidate kernels that GPU probes time (benchmarks/variants/, benchmarks/ut_probe.py VARIANTS)
compute what the shipped kernels do, checked in Triton's interpreter, so a probe's timing is of a
correct candidate."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("interpreter tests (TRITON_INTERPRET=1)", allow_module_level=True)

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import pathtune.codegen.triton.forward as fwd  # noqa: E402
from pathtune.codegen.triton import TritonParams  # noqa: E402


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def _inputs(seed, B, T, HQ, H, D, gate):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, HQ, D, generator=g).to(torch.bfloat16)
    k = torch.randn(B, T, H, D, generator=g).to(torch.bfloat16)
    v = torch.randn(B, T, H, D, generator=g).to(torch.bfloat16)
    w = F.normalize(torch.randn(B, T, H, D, generator=g), dim=-1)
    beta = 1.5 + 0.5 * torch.rand(B, T, H, generator=g)
    gg = torch.log(0.95 + 0.05 * torch.rand(B, T, HQ, generator=g)) if gate else None
    return q, k, v, w, beta, gg


@pytest.mark.parametrize("B,T,lens,gate", [(2, 300, None, True), (1, 333, (100, 61, 172), False),
                                            (1, 96, None, False)])
def test_scan_intra_pairs_equals_shipped(B, T, lens, gate):
    """Two query chunks per program: same o and lse as the shipped intra kernel, dense with a ragged last
    chunk (an odd count: the last chunk runs with an empty partner) and varlen."""
    from kernel_variants import swapped
    from variants.scan_intra_pairs import scan_intra_pair_kernel

    q, k, v, w, beta, g = _inputs(T, B, T, 4, 2, 32, gate)
    cu = None if lens is None else torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    p = TritonParams(chunk_size=32, superchunk_size=128, block_n=16, block_m=32)
    o0, l0, _ = fwd.path_attention_fwd(q, k, v, w, beta, g, scale=0.2, cu_seqlens=cu, params=p)
    with swapped(fwd, "scan_intra_kernel", scan_intra_pair_kernel):
        o1, l1, _ = fwd.path_attention_fwd(q, k, v, w, beta, g, scale=0.2, cu_seqlens=cu, params=p)
    assert torch.isfinite(o1.float()).all()
    assert rel(o1, o0) < 1e-6 and rel(l1, l0) < 1e-6


@pytest.mark.parametrize("name", ["merges_fp16x3", "merges_M_fp16x3"])
def test_ut_probe_variants_match_shipped(name):
    """ut_probe's ut_fused_kernel variants (block merges / M as three fp16 passes): U, K~, M as the
    shipped kernel's to float32-level error."""
    import ut_probe

    from pathtune.codegen.triton._layout import build_tables

    _, k, _, w, beta, _ = _inputs(7, 1, 150, 2, 2, 64, False)
    kt, wt, bt = k[0], w[0], beta[0]
    p = TritonParams(chunk_size=64, superchunk_size=128, block_n=16)
    tables = build_tables(1, 150, None, 64, 128, torch.device("cpu"), block_m=p.block_m)
    ref = fwd.ut_fused(kt, wt, bt, tables, 2, 64, 64, p, out_dtype=torch.float32)
    with ut_probe._kernel(name):
        got = fwd.ut_fused(kt, wt, bt, tables, 2, 64, 64, p, out_dtype=torch.float32)
    for a, b in zip(got[:3], ref[:3]):
        assert rel(a, b) < 1e-5


@pytest.mark.parametrize("gate", [False, True])
def test_scan_folded_equals_shipped(gate):
    """The folded softmax (scale inside exp2's multiply-add, FoX in the frame without the query's gate
    cumsum, both scan kernels): o and lse as the shipped kernels', up to float32 rounding."""
    from kernel_variants import swapped
    from variants import scan_folded

    q, k, v, w, beta, g = _inputs(11, 2, 300, 4, 2, 32, gate)
    p = TritonParams(chunk_size=32, superchunk_size=64, block_n=16, block_m=32)
    o0, l0, _ = fwd.path_attention_fwd(q, k, v, w, beta, g, scale=0.2, cu_seqlens=None, params=p)
    ks = scan_folded.kernels()
    with swapped(fwd, "scan_intra_kernel", ks["scan_intra_kernel"]), \
            swapped(fwd, "scan_inter_kernel", ks["scan_inter_kernel"]):
        o1, l1, _ = fwd.path_attention_fwd(q, k, v, w, beta, g, scale=0.2, cu_seqlens=None, params=p)
    assert rel(o1, o0) < 1e-4 and rel(l1, l0) < 1e-6
