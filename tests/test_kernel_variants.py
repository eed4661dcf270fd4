"""The candidate kernels that GPU probes time (benchmarks/variants/)
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


@pytest.mark.parametrize("gate,HQ", [(False, 4), (True, 2)])
def test_bwd_inter_rows_equals_shipped(gate, HQ):
    """The keys-as-rows key-side inter backward: every gradient as the shipped kernel's (several later
    super-chunks per key tile, GQA, a ragged last super-chunk)."""
    from kernel_variants import Capture, swapped
    from variants import bwd_inter_rows

    import pathtune.codegen.triton.backward as bwd
    from pathtune.codegen.triton import path_attention_triton

    q, k, v, w, beta, g = _inputs(5, 1, 120, HQ, 2, 32, gate)
    p = TritonParams(chunk_size=16, superchunk_size=32, block_n=16, bwd_block_n=16, bwd_block_m=16)
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(6)).to(q.dtype)

    def grads():
        xs = [None if x is None else x.detach().clone().requires_grad_(True) for x in (q, k, v, w, beta, g)]
        o, _ = path_attention_triton(*xs, config=p)
        live = [x for x in xs if x is not None]
        return torch.autograd.grad(o, live, do)

    ref = grads()
    with swapped(bwd, "bwd_inter_dkv_kernel", bwd_inter_rows.kernel()), \
            Capture(bwd, "bwd_inter_dkv_kernel") as launched:
        got = grads()
    assert launched.calls and launched.real is bwd_inter_rows.kernel()
    for a, b in zip(got, ref):
        assert torch.isfinite(a.float()).all() and rel(a, b) < 1e-5
