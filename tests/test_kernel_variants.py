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


@pytest.mark.parametrize("variant", ["ut_sub8"])
@pytest.mark.parametrize("D,out_dtype,up,lens", [
    (64, torch.bfloat16, "tf32x3", None),
    (64, torch.float16, "tf32", None),
    (48, torch.float32, "tf32x3", (70, 1, 57)),
    (128, torch.bfloat16, "fp16x3", None),
], ids=["D64-bf16-tf32x3", "D64-fp16-tf32", "D48-fp32-varlen", "D128-bf16-fp16x3"])
def test_ut_candidates_equal_shipped(D, out_dtype, up, lens, variant):
    """The UT-stage candidates of benchmarks/variants/ (ut_sub8: 8-row diagonal blocks) give the shipped
    ut_fused_kernel's U, K~, M and w copy: as close to a float64
    evaluation of the same formulas, and close to the shipped outputs.  Chunks of 64 (the default), a
    partial last chunk, varlen sequences whose chunks end mid-half; w unit-norm, beta in [1.5, 2)."""
    import importlib

    from ut_probe import ut_reference
    candidate = getattr(importlib.import_module(f"variants.{variant}"), variant)

    from pathtune.codegen.triton import forward as fwd
    from pathtune.codegen.triton._layout import build_tables
    from pathtune.codegen.triton.params import TritonParams

    H, C = 2, 64
    lens = lens or (150,)
    N = sum(lens)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    g = torch.Generator().manual_seed(D + len(lens))
    w = F.normalize(torch.randn(N, H, D, generator=g), dim=-1)
    k = torch.randn(N, H, D, generator=g).to(torch.bfloat16)
    beta = 1.5 + 0.5 * torch.rand(N, H, generator=g)
    p = TritonParams(ut_precision=up)
    tables = build_tables(1, N, cu if len(lens) > 1 else None, C, p.superchunk_size, torch.device("cpu"),
                          block_m=p.block_m)
    shipped = fwd.ut_fused(k, w, beta, tables, H, D, C, p, out_dtype=out_dtype, write_w=True)
    got = candidate(k, w, beta, tables, H, D, C, p, out_dtype=out_dtype, write_w=True)
    # float64 reference per sequence, chunked from each sequence's start (w rounded as the kernels take it)
    w_in = w.to(out_dtype).float() if out_dtype != torch.float32 else w
    refs = {"u": [], "kt": [], "m": []}
    for s0, s1 in zip(cu[:-1].tolist(), cu[1:].tolist()):
        n = s1 - s0
        pad = (-n) % C
        wp = F.pad(w_in[s0:s1], (0, 0, 0, 0, 0, pad))
        kp = F.pad(k[s0:s1].float(), (0, 0, 0, 0, 0, pad))
        bp = F.pad(beta[s0:s1], (0, 0, 0, pad))
        U, Kt, M = ut_reference(wp, kp, bp, C)
        for name, x in zip(("u", "kt", "m"), (U, Kt, M)):
            refs[name].append(x[:n])
    for i, name in enumerate(("u", "kt", "m")):
        ref = torch.cat(refs[name])
        e_new, e_old, e_pair = rel(got[i], ref), rel(shipped[i], ref), rel(got[i], shipped[i])
        print(f"{name}: {variant} {e_new:.2e} shipped {e_old:.2e} {variant}-vs-shipped {e_pair:.2e}")
        assert e_new < 1.5 * e_old + 1e-6, (name, e_new, e_old)
        assert e_pair < 1e-2 if out_dtype != torch.float32 else e_pair < 1e-4, (name, e_pair)
    assert torch.equal(got[3], shipped[3])
