"""The backward between super-chunks reads every pair's transition Om_{I,J} from a buffer that
``bwd_pair_transitions_kernel`` fills once per backward (codegen/triton/bwd_inter.py): checked here
against the float64 torch reference; the kernels that read it are covered end to end by
tests/test_triton_backward.py."""
from __future__ import annotations

import os

import pytest
import torch

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("interpreter tests (TRITON_INTERPRET=1)", allow_module_level=True)

import pathtune.codegen.triton.backward as tri_backward  # noqa: E402
from pathtune.codegen.triton._layout import build_tables  # noqa: E402
from pathtune.codegen.triton.bwd_inter import bwd_pair_transitions_kernel  # noqa: E402


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("dtype,rows", [(torch.float16, 16), (torch.bfloat16, 32), (torch.float32, 32)])
def test_pair_transitions_match_torch(dtype, rows):
    """Packed sequences of 1, 2, 5 and 3 super-chunks: every Om_{I,J}, J < I, written (the buffer starts
    as NaN) and equal to the float64 product to the storage type's rounding (one rounding per pair,
    not one per step of the walk); entries J >= I untouched."""
    BD, H, S = 32, 2, 32
    lens = [20, 64, 150, 70]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    tb = build_tables(1, sum(lens), cu, 16, S, torch.device("cpu"))
    gen = torch.Generator().manual_seed(71)
    what = torch.eye(BD) + 0.3 * torch.randn(tb.n_sc, H, BD, BD, generator=gen) / BD ** 0.5
    like = torch.empty(tb.n_pairs, H, BD, BD, dtype=torch.float64)
    ref = tri_backward._superchunk_pairs_torch(what.double(), tb, like)
    om = torch.full((tb.n_pairs, H, BD, BD), float("nan"), dtype=dtype)
    bwd_pair_transitions_kernel[(tb.n_sc, H, BD // rows)](
        what, om, tb.sc_seq, tb.seq_start, tb.seq_end, tb.seq_sc_base, tb.seq_pair_base,
        H=H, BD=BD, S=S, ROWS=rows, TP="ieee", num_warps=4)
    pairs = [pb + i * nsc + j for nsc, pb in zip(tb.seq_nsc_host, tb.pair_base_host)
             for i in range(nsc) for j in range(i)]
    assert len(pairs) == 0 + 1 + 10 + 3
    unit = {torch.float16: 2 ** -11, torch.bfloat16: 2 ** -8, torch.float32: 1e-6}[dtype]
    assert rel(om[pairs], ref[pairs]) < unit
    rest = sorted(set(range(tb.n_pairs)) - set(pairs))
    assert torch.isnan(om[rest].float()).all()
