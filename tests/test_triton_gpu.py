"""GPU matrix of the Triton backend: forward and every gradient vs the float64 oracle.

Head dims x dtypes x GQA x FoX x varlen at lengths that cross several super-chunks (superchunk
512, T ~ 1300, ragged), bf16/fp16 q/k/v with float32 w/beta/g, beta ~ U(1.5, 2), gate decay
log U(0.95, 1).  Tolerances: the spec's numerics.accuracy (relative Frobenius error).
Skipped without CUDA (the same kernels run on the CPU under TRITON_INTERPRET=1 in
test_triton_forward.py / test_triton_backward.py).

    python -m pytest -q -m gpu tests/test_triton_gpu.py
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pathtune.specs import load_spec

pytestmark = pytest.mark.gpu

TOL = load_spec().numerics.accuracy.tolerances
GRADS = ("dq", "dk", "dv", "dw", "dbeta", "dg")

CASES = [  # (D, DV, dtype, HQ, H, gate, lens)
    (32, 32, torch.bfloat16, 4, 4, True, None),
    (64, 64, torch.bfloat16, 4, 4, True, None),
    (64, 64, torch.float16, 4, 4, True, None),
    (64, 64, torch.bfloat16, 8, 2, True, None),
    (64, 64, torch.bfloat16, 4, 4, False, None),
    (64, 64, torch.bfloat16, 4, 2, True, (700, 1, 1093, 300)),
    (96, 64, torch.bfloat16, 4, 4, True, None),
    (128, 128, torch.bfloat16, 4, 4, True, None),
    (128, 128, torch.float16, 4, 2, True, None),
    (128, 128, torch.bfloat16, 4, 4, True, (513, 1500)),
]


def _id(case):
    D, DV, dt, HQ, H, gate, lens = case
    return (f"D{D}{'' if DV == D else f'-DV{DV}'}-{str(dt)[6:]}-{HQ}q{H}kv-{'fox' if gate else 'path'}"
            f"{'-varlen' if lens else ''}")


# Head dims above 128 (padded to 256: the column-blocked D x D transitions, backward.py's per-pair Om)
# with their heuristic tiles: (D, DV, dtype, HQ, H, gate, lens, B, T, config).  T = 4096 at the
# heuristic's super-chunk of 2048 (2 super-chunks), at 512 (8 super-chunks, 28 pairs), and varlen.
WIDE_CASES = [
    (192, 192, torch.bfloat16, 4, 4, True, None, 1, 4096, None),
    (256, 256, torch.bfloat16, 4, 4, True, None, 1, 4096, None),
    (256, 256, torch.bfloat16, 8, 2, True, None, 1, 4096, dict(superchunk_size=512)),
    (192, 128, torch.float16, 4, 2, True, None, 2, 1300, dict(superchunk_size=512)),
    (256, 256, torch.bfloat16, 4, 4, False, (1500, 1, 2600), 1, None, dict(superchunk_size=512)),
]


def _wide_id(case):
    *narrow, B, T, config = case
    S = (config or {}).get("superchunk_size", "h")
    return f"{_id(narrow)}-B{B}-T{T or sum(narrow[-1])}-S{S}"


def _tol(name):
    return getattr(TOL, name) if hasattr(TOL, name) else TOL[name]


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_triton_matches_float64_oracle(case):
    D, DV, dt, HQ, H, gate, lens = case
    _check_against_oracle(D, DV, dt, HQ, H, gate, lens, B=1 if lens else 2, T=sum(lens) if lens else 1300,
                          config=dict(superchunk_size=512), seed=D * 131 + HQ * 7 + H + int(gate))


@pytest.mark.parametrize("case", WIDE_CASES, ids=_wide_id)
def test_triton_wide_head_dims_match_float64_oracle(case):
    """Head dims 192 / 256 with the heuristic's tiles (config: overrides of TritonParams.heuristic).
    The oracle sweeps in checkpointed segments at T = 4096 (without, autograd keeps ~40 GiB per head)."""
    D, DV, dt, HQ, H, gate, lens, B, T, config = case
    _check_against_oracle(D, DV, dt, HQ, H, gate, lens, B=B, T=T or sum(lens), config=config,
                          seed=D * 131 + DV + HQ * 7 + H + int(gate) + 1, checkpoint_steps=64)


@pytest.mark.parametrize("case,range_mib", [((64, 64, torch.bfloat16, 4, 2, True, (700, 1, 1093, 300)), 1),
                                             ((128, 128, torch.bfloat16, 4, 4, True, None), 0),
                                             ((64, 64, torch.float16, 4, 4, False, None), 1)],
                         ids=["D64-varlen-fox-ranged", "D128-fox-one-range", "D64-fp16-path-ranged"])
def test_kept_forward_state_matches_float64_oracle(case, range_mib):
    """bwd_forward_state keep (the backward reads the forward's compact state): forward and gradients
    within the spec's tolerances, with the backward in one token range per super-chunk and in one range."""
    D, DV, dt, HQ, H, gate, lens = case
    _check_against_oracle(D, DV, dt, HQ, H, gate, lens, B=1 if lens else 2, T=sum(lens) if lens else 1300,
                          config=dict(superchunk_size=512, bwd_forward_state="keep", bwd_range_budget_mib=range_mib),
                          seed=D * 17 + HQ + H)


@pytest.mark.parametrize("case,range_mib", [((64, 64, torch.bfloat16, 4, 2, True, (700, 1, 1093, 300)), 1),
                                             ((128, 128, torch.bfloat16, 4, 4, True, None), 0),
                                             ((128, 128, torch.float16, 8, 4, False, None), 1)],
                         ids=["D64-varlen-fox-ranged", "D128-fox-one-range", "D128-fp16-gqa-path-ranged"])
def test_transport_backward_on_16_bit_operands_matches_float64_oracle(case, range_mib):
    """bwd_transition_precision fp16 (the transport backward on 16-bit operands, gradients scaled by powers of
    two): forward and gradients within the spec's tolerances, ranged (the range's 16-bit u) and in one range (a
    float32 state's operands rounded to fp16)."""
    D, DV, dt, HQ, H, gate, lens = case
    _check_against_oracle(D, DV, dt, HQ, H, gate, lens, B=1 if lens else 2, T=sum(lens) if lens else 1300,
                          config=dict(superchunk_size=512, bwd_transition_precision="fp16",
                                      bwd_range_budget_mib=range_mib), seed=D * 19 + HQ + H)


@pytest.mark.parametrize("case,range_mib", [((64, 64, torch.bfloat16, 4, 2, True, (700, 1, 1093, 300)), 1),
                                             ((128, 128, torch.bfloat16, 4, 4, True, None), 0),
                                             ((128, 128, torch.float16, 8, 4, False, (517, 64, 719)), 1)],
                         ids=["D64-varlen-fox-ranged", "D128-fox-one-range", "D128-fp16-gqa-path-varlen-ranged"])
def test_walk_of_two_chunks_per_program_matches_float64_oracle(case, range_mib):
    """bwd_walk_chunks 2 (the walk inside a super-chunk on two query chunks per program, 8 warps): forward and
    gradients within the spec's tolerances, ranged and in one range, with sequences whose super-chunks end on an
    odd chunk count and inside a chunk."""
    D, DV, dt, HQ, H, gate, lens = case
    _check_against_oracle(D, DV, dt, HQ, H, gate, lens, B=1 if lens else 2, T=sum(lens) if lens else 1300,
                          config=dict(superchunk_size=512, bwd_walk_chunks=2, bwd_range_budget_mib=range_mib),
                          seed=D * 23 + HQ + H)


@pytest.mark.parametrize("case,config", [
    ((64, 64, torch.bfloat16, 4, 2, True, (700, 1, 1093, 300)), dict(superchunk_size=256)),
    ((128, 128, torch.bfloat16, 4, 4, True, None), dict(superchunk_size=256, num_stages=2)),
    ((128, 128, torch.float16, 8, 4, True, (517, 64, 719)), dict(superchunk_size=256, num_stages=2, block_n=64))],
    ids=["D64-varlen-gqa", "D128", "D128-fp16-gqa-varlen-block64"])
def test_gate_offsets_by_product_match_float64_oracle(case, config):
    """gate_bias product (the FoX gate's key offsets by a K = 16 product of their bf16 parts in the forward's scan
    between super-chunks; num_stages 2 at D 128, where three stages do not fit with the parts): forward and
    gradients within the spec's tolerances, with several super-chunks per sequence."""
    D, DV, dt, HQ, H, gate, lens = case
    _check_against_oracle(D, DV, dt, HQ, H, gate, lens, B=1 if lens else 2, T=sum(lens) if lens else 1300,
                          config=dict(config, gate_bias="product"), seed=D * 29 + HQ + H)


def _check_against_oracle(D, DV, dt, HQ, H, gate, lens, *, B, T, config, seed, checkpoint_steps=None):
    from pathtune.codegen.triton import path_attention_triton
    from pathtune.tuning.measure import oracle_by_kv_head

    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(seed)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device=dev) if lens else None
    q = torch.randn(B, T, HQ, D, device=dev, generator=gen).to(dt)
    k = torch.randn(B, T, H, D, device=dev, generator=gen).to(dt)
    v = torch.randn(B, T, H, DV, device=dev, generator=gen).to(dt)
    w = F.normalize(torch.randn(B, T, H, D, device=dev, generator=gen), dim=-1)
    beta = 1.5 + 0.5 * torch.rand(B, T, H, device=dev, generator=gen)
    g = torch.log(0.95 + 0.05 * torch.rand(B, T, HQ, device=dev, generator=gen)) if gate else None
    leaves = [q, k, v, w, beta] + ([g] if gate else [])

    do = torch.randn(B, T, HQ, DV, device=dev, generator=gen).to(dt)
    # one kv head at a time: the oracle's autograd sweep keeps ~25-40 GiB per call at T ~ 1300 with all
    # heads at once, and several test workers share the GPU
    ref, ref_g = oracle_by_kv_head(leaves + ([] if gate else [None]), list(range(H)), do, cu_seqlens=cu,
                                   checkpoint_steps=checkpoint_steps)

    xs = [x.detach().clone().requires_grad_() for x in leaves]
    o, _ = path_attention_triton(*xs[:5], xs[5] if gate else None, cu_seqlens=cu, config=config)
    got_g = torch.autograd.grad(o, xs, do)

    def rel(a, b):
        return ((a.double() - b.double()).norm() / b.double().norm()).item()

    errs = {"o": rel(o, ref)} | {n: rel(a, b) for n, a, b in zip(GRADS, got_g, ref_g)}
    print(f"D{D}-DV{DV}-{str(dt)[6:]}-{HQ}q{H}kv-B{B}-T{T}{'-fox' if gate else ''}{'-varlen' if lens else ''}",
          config, {k_: f"{e:.2e}" for k_, e in errs.items()})
    bad = {n: e for n, e in errs.items() if not e < _tol(n)}
    assert not bad, f"over the spec tolerance: {bad} (all: {errs})"


@pytest.mark.parametrize("D,gate", [(64, True), (128, False)], ids=["D64-fox", "D128-path"])
def test_forward_is_cuda_graph_capturable(D, gate):
    """A dense forward at fixed shapes issues no host synchronisation and no host-to-device copy once
    warm (cached tables, the gate cumsum on the GPU, the transport's side stream joined in-stream), so
    it captures into a CUDA graph; a replay on new inputs equals the eager call."""
    import pathtune

    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(D)
    B, T, H = 2, 2500, 4          # 3 super-chunks of the heuristic's 1024, the last one partial

    def inputs():
        q, k, v = (torch.randn(B, T, H, D, device=dev, generator=gen).to(torch.bfloat16) for _ in range(3))
        w = F.normalize(torch.randn(B, T, H, D, device=dev, generator=gen), dim=-1)
        beta = 1.5 + 0.5 * torch.rand(B, T, H, device=dev, generator=gen)
        g = torch.log(0.95 + 0.05 * torch.rand(B, T, H, device=dev, generator=gen)) if gate else None
        return q, k, v, w, beta, g

    static = inputs()

    def call():
        return pathtune.path_attention(*static, backend="triton")

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(2):
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        out = call()
    fresh = inputs()
    for dst, src in zip(static, fresh):
        if dst is not None:
            dst.copy_(src)
    graph.replay()
    torch.cuda.synchronize()
    with torch.no_grad():
        eager = pathtune.path_attention(*fresh, backend="triton")
    assert torch.equal(out, eager)


@pytest.mark.parametrize("gate", [True, False], ids=["fox", "path"])
def test_forward_backward_is_cuda_graph_capturable(monkeypatch, gate):
    """A training step's attention at fixed shapes (forward, then the gradients of every input through autograd,
    several token ranges) captures into one CUDA graph, as ``torch.cuda.graph`` / ``torch.compile(mode=
    "reduce-overhead")`` users capture a model: no host synchronisation and no host-to-device copy once warm.  A
    replay on new inputs equals the eager step: o bit for bit, the gradients up to the order of the backward's
    atomic adds."""
    import pathtune
    import pathtune.codegen.triton.backward as bwd_mod

    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(5)
    B, T, H, D = 2, 2500, 4, 64

    def inputs():
        q, k, v = (torch.randn(B, T, H, D, device=dev, generator=gen).to(torch.bfloat16) for _ in range(3))
        w = F.normalize(torch.randn(B, T, H, D, device=dev, generator=gen), dim=-1)
        beta = 1.5 + 0.5 * torch.rand(B, T, H, device=dev, generator=gen)
        g = torch.log(0.95 + 0.05 * torch.rand(B, T, H, device=dev, generator=gen)) if gate else None
        do = torch.randn(B, T, H, D, device=dev, generator=gen).to(torch.bfloat16)
        return [q, k, v, w, beta, g], do

    static, do_static = inputs()
    leaves = [x.requires_grad_() for x in static if x is not None]
    monkeypatch.setattr(bwd_mod, "_range_budget", lambda params: 1 << 20)     # several token ranges

    def step():
        o = pathtune.path_attention(*static, backend="triton")
        return [o, *torch.autograd.grad(o, leaves, do_static)]

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    fresh, do_fresh = inputs()
    with torch.no_grad():
        for dst, src in zip(static, fresh):
            if dst is not None:
                dst.copy_(src)
        do_static.copy_(do_fresh)
    graph.replay()
    torch.cuda.synchronize()
    xs = [x.detach().clone().requires_grad_() if x is not None else None for x in fresh]
    o = pathtune.path_attention(*xs, backend="triton")
    eager = [o, *torch.autograd.grad(o, [x for x in xs if x is not None], do_fresh)]
    assert torch.equal(out[0], eager[0])
    for name, a, b in zip(("dq", "dk", "dv", "dw", "dbeta", "dg"), out[1:], eager[1:]):
        err = float((a.double() - b.double()).norm() / b.double().norm())
        assert err < 2e-3, (name, err)
