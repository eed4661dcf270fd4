"""Triton backward (codegen/triton) against torch.autograd through the float64 oracle.

The kernels run in Triton's CPU interpreter (``TRITON_INTERPRET=1``, exported by .ci/run).
Gradients come from ``path_attention_triton`` + ``torch.autograd`` (the ``pathtune::path_attn_fwd``
custom op and its registered backward, which recomputes the O(T) state and launches the seven
backward stages).  The reference gradients are ``torch.autograd.grad`` of ``naive_path_attention``
in float64 on the same (rounded) inputs; no finite differences are needed here because the
oracle's own autograd is pinned by ``gradcheck`` in tests/test_reference.py.

Per gradient (dq, dk, dv, dw, dbeta, dg): ||grad - ref||_F / ||ref||_F < tol.  Measured errors in
the interpreter: float32 + tf32 ~5e-7, float16 + fp16 ~1e-3.

The last tests prove the comparison can fail: a kernel that ignores the gate, or a wrong reverse
cumsum for dg (both injected with monkeypatch, no file is edited), must be far from the oracle.
"""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

pytestmark = [
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                       reason="Triton kernel tests run in the CPU interpreter: set TRITON_INTERPRET=1 before "
                              "starting pytest (.ci/run does)"),
    # triton 3.6's interpreter: int() of a size-1 array, once per launch
    pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning"),
]

import pathtune.codegen.triton.backward as tri_backward  # noqa: E402
import pathtune.codegen.triton.forward as tri_forward  # noqa: E402
from pathtune.codegen.triton import TritonParams, path_attention_triton  # noqa: E402
from pathtune.runtime.reference import naive_path_attention  # noqa: E402

F32, F16, F64 = torch.float32, torch.float16, torch.float64
SCAN = {F32: "tf32", F16: "fp16"}
TOL = {F32: 2e-5, F16: 5e-3}
CAUGHT = 1e-2  # 500x the float32 tolerance: an error above it is "caught"
NAMES = ("dq", "dk", "dv", "dw", "dbeta", "dg")


def rel(a, b):
    a, b = a.detach().to(F64), b.detach().to(F64)
    return ((a - b).norm() / b.norm()).item()


def make_inputs(seed, *, B=1, T=150, HQ=2, H=1, D=16, DV=16, dtype=F32, gate=False, beta_range=(1.5, 2.0)):
    """q, k, v in ``dtype``; w (unit rows), beta ~ U(beta_range), g = log U(0.9, 1) in float32;
    plus an upstream gradient dO (``dtype``)."""
    gen = torch.Generator().manual_seed(seed)

    def rn(*s):
        return torch.randn(*s, generator=gen, dtype=F64)

    def ru(lo, hi, *s):
        return lo + (hi - lo) * torch.rand(*s, generator=gen, dtype=F64)

    q, k, v = rn(B, T, HQ, D).to(dtype), rn(B, T, H, D).to(dtype), rn(B, T, H, DV).to(dtype)
    w = F.normalize(rn(B, T, H, D), dim=-1).to(F32)
    lo, hi = beta_range
    beta = ru(lo, hi, B, T, H).clamp_min(1e-3).to(F32)
    g = torch.log(ru(0.9, 1.0, B, T, HQ)).to(F32) if gate else None
    do = rn(B, T, HQ, DV).to(dtype)
    return (q, k, v, w, beta, g), do


def params(dtype=F32, **kw):
    base = dict(chunk_size=16, superchunk_size=32, block_n=16, bwd_block_n=16,
                scan_precision=SCAN[dtype])
    base.update(kw)
    return tri_backward.TritonBwdParams(**base)


def _one_superchunk_per_range(monkeypatch):
    """Every backward in this test runs its per-range stages in token ranges of one super-chunk each."""
    monkeypatch.setattr(tri_backward, "_range_budget", lambda params: 1)


def _leaves(inputs, dtype=None):
    return [None if x is None else x.detach().to(dtype or x.dtype).clone().requires_grad_(True) for x in inputs]


def kernel_grads(inputs, do, p, **kw):
    """Gradients of <o, dO> through path_attention_triton + autograd (None for an absent g)."""
    xs = _leaves(inputs)
    o, lse = path_attention_triton(*xs, config=p, **kw)
    assert o.grad_fn is not None
    live = [x for x in xs if x is not None]
    grads = iter(torch.autograd.grad(o, live, do))
    out = [None if x is None else next(grads) for x in xs]
    for x, gx in zip(xs, out):
        if x is not None:
            assert gx.shape == x.shape and gx.dtype == x.dtype and torch.isfinite(gx).all()
    return out


def oracle_grads(inputs, do, *, beta_fn=None, **kw):
    """Float64 autograd gradients of <o, dO> through the oracle (beta_fn: applied to beta first)."""
    xs = _leaves(inputs, F64)
    q, k, v, w, beta, g = xs
    o = naive_path_attention(q, k, v, w, beta if beta_fn is None else beta_fn(beta), g, **kw)
    live = [x for x in xs if x is not None]
    grads = iter(torch.autograd.grad(o, live, do.to(F64)))
    return [None if x is None else next(grads) for x in xs]


def check(got, ref, tol):
    errs = {n: rel(a, b) for n, a, b in zip(NAMES, got, ref) if b is not None}
    print("rel err " + " ".join(f"{n} {e:.2e}" for n, e in errs.items()) + f" (tol {tol:g})")
    bad = {n: e for n, e in errs.items() if not e < tol}
    assert not bad, f"gradients off (tol {tol:g}): {bad}; all: {errs}"
    return errs


def run_case(inputs, do, p, dtype=F32, **kw):
    got = kernel_grads(inputs, do, p, **kw)
    ref = oracle_grads(inputs, do, **kw)
    check(got, ref, TOL[dtype])
    return got, ref


# ----------------------------------------------------------------------------- gate variants

@pytest.mark.parametrize("gate,placement,B", [(False, "inside_scale", 2), (True, "inside_scale", 1),
                                              (True, "outside_scale", 1)],
                         ids=["nogate-B2", "gate-inside", "gate-outside"])
def test_backward_gate_variants(gate, placement, B):
    """T=150: 10 UT chunks and 5 super-chunks of 32 (both last ones partial)."""
    inputs, do = make_inputs(300 + 2 * gate + (placement == "outside_scale"), B=B, T=150, gate=gate)
    got, _ = run_case(inputs, do, params(), gate_placement=placement)
    if gate:
        # the comparison can fail: gradients of the ungated oracle, or of the other placement, are far off
        ref_nog = oracle_grads((*inputs[:5], None), do)
        other = "outside_scale" if placement == "inside_scale" else "inside_scale"
        ref_oth = oracle_grads(inputs, do, gate_placement=other)
        assert rel(got[0], ref_nog[0]) > CAUGHT and rel(got[1], ref_nog[1]) > CAUGHT
        assert rel(got[0], ref_oth[0]) > CAUGHT and rel(got[5], ref_oth[5]) > CAUGHT


# ----------------------------------------------------------------------------- shapes and lengths

def test_backward_gqa():
    """HQ=4 on H=2: dk, dv, dw, dbeta sum over the two query heads of each group; dg per query head."""
    inputs, do = make_inputs(310, T=100, HQ=4, H=2, gate=True)
    run_case(inputs, do, params())


def test_backward_head_dims():
    """D=24 (not a power of two) with DV=16."""
    inputs, do = make_inputs(320, T=80, D=24, DV=16, gate=True)
    run_case(inputs, do, params())


@pytest.mark.parametrize("T", [20, 32, 37], ids=lambda t: f"T{t}")
def test_backward_short(T):
    """T <= one super-chunk (20: 2 chunks, last partial; 32: exactly one) takes the path without the
    inter-super-chunk stages; T=37 has a second super-chunk of 5 tokens."""
    inputs, do = make_inputs(330 + T, T=T, gate=True)
    run_case(inputs, do, params())


def test_backward_chunk32():
    """chunk_size 32, superchunk 64 (block_n 32, bwd tiles 32): 3 super-chunks at T=150."""
    inputs, do = make_inputs(340, T=150, gate=True)
    run_case(inputs, do, params(chunk_size=32, superchunk_size=64, block_n=32, bwd_block_n=32))


@pytest.mark.parametrize("S,block_m", [(32, 16), (64, 32), (64, 64)], ids=lambda v: str(v))
def test_backward_inter_query_step(S, block_m):
    """bwd_block_m, the query rows per step of the key-side inter pass, is independent of the UT
    chunk (16 here): one chunk, two chunks, a whole super-chunk per step."""
    inputs, do = make_inputs(350 + S + block_m, T=150, gate=True)
    run_case(inputs, do, params(superchunk_size=S, bwd_block_m=block_m))


def test_backward_precision_knobs():
    """The backward's precision knobs reach its kernels (tf32 transitions and UT products): under the
    interpreter tf32 products are exact, so the float32 tolerance still holds."""
    inputs, do = make_inputs(345, T=110, gate=True)
    run_case(inputs, do, params(bwd_transition_precision="tf32", ut_precision="tf32", ut_grad_precision="tf32x3"))


def test_backward_beta_full_range():
    """beta ~ U(0, 2), no gate."""
    inputs, do = make_inputs(350, T=120, beta_range=(0.0, 2.0))
    run_case(inputs, do, params())


@pytest.mark.parametrize("lens,gate", [((45, 1, 74), True), ((1, 70, 29), False)],
                         ids=["45-1-74-gate", "1-70-29-nogate"])
def test_backward_varlen(lens, gate):
    """Packed varlen with a length-1 sequence; the oracle runs each sequence separately (cu_seqlens).
    dg is a reverse cumsum of dc that must stop at every sequence end."""
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    inputs, do = make_inputs(360 + lens[0], T=sum(lens), HQ=2, H=1, gate=gate)
    got, _ = run_case(inputs, do, params(), cu_seqlens=cu)
    # gradients must not leak across sequence boundaries: the unsegmented oracle's differ
    ref_whole = oracle_grads(inputs, do)
    assert rel(got[1], ref_whole[1]) > CAUGHT


# ----------------------------------------------------------------------------- precision, clip

def test_backward_fp16_gqa():
    inputs, do = make_inputs(370, T=100, HQ=4, H=2, dtype=F16, gate=True)
    run_case(inputs, do, params(F16), dtype=F16)


def test_backward_beta_clip():
    """beta_clip_eps: gradients of the oracle on min(beta, 2 - eps); dbeta = 0 where beta was clipped."""
    eps = 0.015625
    inputs, do = make_inputs(380, T=100, gate=True, beta_range=(1.9, 2.0))
    beta = inputs[4]
    clipped = beta > 2 - eps
    assert clipped.float().mean() > 0.05
    got = kernel_grads(inputs, do, params(beta_clip_eps=eps))
    ref = oracle_grads(inputs, do, beta_fn=lambda b: b.clamp(max=2 - eps))
    errs = check(got, ref, TOL[F32])
    assert (got[4][clipped] == 0).all()
    ref_unclipped = oracle_grads(inputs, do)
    assert rel(got[4], ref_unclipped[4]) > 100 * max(errs["dbeta"], 1e-7)


# ----------------------------------------------------------------------------- super-chunk chain, D > 64 path

@pytest.mark.parametrize("BD", [16, 32])
def test_superchunk_chain_torch_matches_kernel(BD):
    """Head dims above 64 replace bwd_superchunk_chain_kernel by ``_superchunk_chain_torch`` (too slow
    to reach end to end in the interpreter).  The kernel itself is pinned by the gradient tests above;
    here the torch version must give the same dWhat on random What / dOm, for packed sequences of
    1, 2, 5 and 3 super-chunks."""
    chain_torch = getattr(tri_backward, "_superchunk_chain_torch", None)
    if chain_torch is None:
        pytest.skip("backward has no torch super-chunk chain")
    from pathtune.codegen.triton._layout import build_tables

    S = 32
    lens = [20, 64, 150, 70]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    tb = build_tables(1, sum(lens), cu, 16, S, torch.device("cpu"))
    H = 2
    gen = torch.Generator().manual_seed(430 + BD)
    what = torch.eye(BD) + 0.3 * torch.randn(tb.n_sc, H, BD, BD, generator=gen)
    dom = torch.randn(tb.n_pairs, H, BD, BD, generator=gen)
    ref = chain_torch(what, dom.clone(), tb)
    got = torch.zeros_like(what)
    tri_backward.bwd_superchunk_chain_kernel[(tb.n_seq, H)](
        what, dom.clone(), got, tb.seq_start, tb.seq_end, tb.seq_sc_base, tb.seq_pair_base,
        H=H, BD=BD, S=S, TP="ieee", num_warps=4)
    assert got.abs().sum() > 0
    assert rel(ref, got) < 1e-5


# ----------------------------------------------------------------------------- wide head dims, column-blocked

TRANSITION_KERNELS = ((tri_forward, "scan_inter_kernel"), (tri_backward, "bwd_inter_dkv_kernel"),
                      (tri_backward, "bwd_inter_dq_kernel"))


def _record_transition_blocks(spy_launches):
    """{kernel: [(BD, DB) per launch]} of the three kernels with D x D transition products
    (DB < BD: the column-blocked path of wide head dims)."""
    return {name: spy_launches(mod, name, lambda grid, kw: (kw["BD"], kw["DB"])) for mod, name in TRANSITION_KERNELS}


@pytest.mark.parametrize("D,DV,HQ,H,lens,gate,dtype", [
    (256, 256, 2, 1, None, True, F32),
    (192, 128, 4, 2, None, True, F32),
    (256, 256, 2, 1, (45, 1, 74), True, F32),
    (192, 192, 2, 1, None, False, F32),
    (256, 256, 2, 1, None, True, F16),
], ids=["D256", "D192-DV128-gqa", "D256-varlen", "D192-nogate", "D256-fp16"])
def test_backward_wide_head_dims(monkeypatch, spy_launches, D, DV, HQ, H, lens, gate, dtype):
    """D = 192 / 256 (padded to 256): the inter-super-chunk kernels run column-blocked on the Om_{I,J}
    of every super-chunk pair (precomputed in torch), forward and backward.  T = 100: 4 super-chunks
    of 32 (varlen 45 / 1 / 74: 2 + 1 + 3); GQA with DV != D; D = 192 leaves the fourth column block
    empty; one case without the gate; fp16 (scan dtype fp16: the KZ / Z scratch rows are fp16)."""
    seen = _record_transition_blocks(spy_launches)
    T = sum(lens) if lens else 100
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32) if lens else None
    inputs, do = make_inputs(460 + D + DV + HQ + len(lens or ()), T=T, HQ=HQ, H=H, D=D, DV=DV, gate=gate,
                             dtype=dtype)
    kw = {} if cu is None else dict(cu_seqlens=cu)
    run_case(inputs, do, params(dtype), dtype=dtype, **kw)
    # forward, its recompute in the backward (prepare_state runs no scan), dkv, dq: all column-blocked
    launched = {name: blocks for name, blocks in seen.items() if blocks}
    assert launched == {"scan_inter_kernel": [(256, 64)], "bwd_inter_dkv_kernel": [(256, 64)],
                        "bwd_inter_dq_kernel": [(256, 64)]}, seen


@pytest.mark.parametrize("D,DV,HQ,H,lens", [(40, 24, 4, 2, None), (24, 16, 2, 1, (45, 1, 74))],
                         ids=["D40-gqa", "D24-varlen"])
def test_column_blocked_transitions_at_small_head_dims(monkeypatch, spy_launches, D, DV, HQ, H, lens):
    """The column-blocked path forced at small head dims (blocks of 16): D = 40 on BD = 64 has two
    full column blocks, a partial third and an empty fourth; D = 24 on BD = 32 a partial second.
    Exercises the masks of column blocks that straddle D, which D = 192 / 256 (multiples of 64) do not."""
    monkeypatch.setattr(tri_forward, "TRANSITION_BLOCKED_ABOVE", 16)
    monkeypatch.setattr(tri_forward, "TRANSITION_COLUMN_BLOCK", 16)
    seen = _record_transition_blocks(spy_launches)
    T = sum(lens) if lens else 120
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32) if lens else None
    inputs, do = make_inputs(470 + D, T=T, HQ=HQ, H=H, D=D, DV=DV, gate=True)
    kw = {} if cu is None else dict(cu_seqlens=cu)
    run_case(inputs, do, params(), **kw)
    BD = 64 if D > 32 else 32
    assert {k: set(v) for k, v in seen.items()} == {name: {(BD, 16)} for _, name in TRANSITION_KERNELS}


def test_superchunk_pairs_torch():
    """Om_{I,J} = What_{I-1} ... What_{J+1} (identity for J = I-1) at pair_base + I * n_sc + J, for
    packed sequences of 1, 2, 5 and 3 super-chunks, against the product taken one factor at a time."""
    from pathtune.codegen.triton._layout import build_tables

    lens = [20, 64, 150, 70]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    tb = build_tables(1, sum(lens), cu, 16, 32, torch.device("cpu"))
    H, BD = 2, 16
    gen = torch.Generator().manual_seed(480)
    what = torch.eye(BD) + 0.3 * torch.randn(tb.n_sc, H, BD, BD, generator=gen)
    om = tri_backward._superchunk_pairs_torch(what, tb, torch.zeros(tb.n_pairs, H, BD, BD))
    n_checked = 0
    for nsc, base, pb in zip(tb.seq_nsc_host, tb.sc_base_host, tb.pair_base_host):
        for i in range(nsc):
            for j in range(i):
                ref = torch.eye(BD).expand(H, BD, BD).to(F64)
                for k in range(i - 1, j, -1):       # What_{I-1} first, What_{J+1} last
                    ref = ref @ what[base + k].to(F64)
                assert rel(om[pb + i * nsc + j], ref) < 1e-6, (nsc, i, j)
                n_checked += 1
    assert n_checked == 0 + 1 + 10 + 3


def test_last_superchunk_transition_is_zero_and_backward_warns_nothing():
    """No super-chunk follows a sequence's last one, so its transition What is never computed; the
    forward leaves it zero (the backward's dkv kernel reads it into a dead product rather than
    branching), and the backward then runs without a floating-point warning."""
    import warnings

    inputs, do = make_inputs(440, T=70, gate=True)  # 3 super-chunks of 32
    q, k, v, w, beta, g = inputs
    p, scale = params(), 16 ** -0.5
    o, lse, st = tri_forward.path_attention_fwd(q, k, v, w, beta, g, scale=scale, cu_seqlens=None, params=p)
    last = [base + n - 1 for base, n in zip(st.tables.sc_base_host, st.tables.seq_nsc_host)]
    assert torch.count_nonzero(st.what[last]) == 0
    assert torch.count_nonzero(st.what[0]) > 0  # a real transition was written
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        grads = tri_backward.path_attention_bwd(do, q, k, v, w, beta, g, o, lse, st, scale=scale, params=p)
    assert all(torch.isfinite(x).all() for x in grads)


# ----------------------------------------------------------------------------- the gate gradient's two sides

@pytest.mark.parametrize("S,bound", [(128, 1e-5), (32, 2e-3)], ids=["one-superchunk", "superchunks-of-32"])
def test_gate_grad_vanishes_at_every_sequence_start(S, bound):
    """g at a sequence's first token enters every row's cumsum c alike, so the logits' biases c_i - c_j never see
    it: its exact gradient is 0.  dg there is the sum of dc over the whole sequence, row sums of dS minus column
    sums, which cancel only as far as both sides come from the same computed dS.  Inside a super-chunk they do
    (the walk and the diagonal tile add both sides of every dS tile they form: 1.3e-7 of max |dg| in the first
    case); a query side taken as d lse, which the row sums equal in exact arithmetic, leaves the rounding error
    of the fp16 output in delta summed over the sequence (8.4e-4 there, 7.9e-4 in the second case).  Across
    super-chunks the key side comes from bwd_inter_dkv's own recomputation of dS, so the two sides agree to its
    16-bit rounding only (3.5e-4).  Varlen with a one-token sequence, GQA, fp16, UT chunks of 16."""
    lens = (70, 1, 97)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    inputs, do = make_inputs(420, T=sum(lens), HQ=4, H=2, gate=True, dtype=F16)
    dg = kernel_grads(inputs, do, params(F16, superchunk_size=S), cu_seqlens=cu)[5].to(F64)[0]       # [T, HQ]
    worst = (dg[cu[:-1].long()].abs().max() / dg.abs().max()).item()
    print(f"|dg| at the sequence starts / max |dg|: {worst:.2e}")
    assert worst < bound, f"dg at the sequence starts is {worst:.2e} of max |dg| (0 in exact arithmetic)"


# ----------------------------------------------------------------------------- lse as an output

def test_backward_through_lse():
    """A loss that uses lse: either its gradients match the oracle or backward refuses loudly."""
    inputs, do = make_inputs(390, T=64, gate=True)
    dl = torch.randn(1, 64, 2, generator=torch.Generator().manual_seed(391))
    xs = _leaves(inputs)
    o, lse = path_attention_triton(*xs, config=params())
    try:
        got = torch.autograd.grad((o * do).sum() + (lse * dl).sum(), xs)
    except RuntimeError:
        return  # lse declared non-differentiable: acceptable
    ys = _leaves(inputs, F64)
    o_r, lse_r = naive_path_attention(*ys, return_lse=True)
    ref = torch.autograd.grad((o_r * do.to(F64)).sum() + (lse_r * dl.to(F64)).sum(), ys)
    check(got, ref, TOL[F32])


# ----------------------------------------------------------------------------- the tests can fail

def test_backward_runs_through_custom_op(monkeypatch):
    """The gradients above really come from the Triton backward: the custom op's backward calls
    path_attention_bwd once per backward pass."""
    calls = []
    real = tri_backward.path_attention_bwd

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(tri_backward, "path_attention_bwd", counting)
    inputs, do = make_inputs(400, T=40, gate=True)
    got = kernel_grads(inputs, do, params())
    assert len(calls) == 1
    check(got, oracle_grads(inputs, do), TOL[F32])


def test_mutation_gate_ignored_is_caught(monkeypatch):
    """Mutant: the kernels drop the FoX gate (gate cumsum replaced by zeros in forward and in the
    backward's recomputation).  Against the gated oracle the errors must be huge; against the
    ungated oracle dq/dk/dv/dw/dbeta match, which shows the mutant is the one intended."""
    monkeypatch.setattr(tri_forward, "gate_cumsum",
                        lambda g, cu, head_major=False: torch.zeros(g.shape[2], g.shape[0] * g.shape[1], dtype=F32)
                        if head_major else torch.zeros_like(g, dtype=F32))
    inputs, do = make_inputs(410, T=64, gate=True)
    p = params()
    xs = _leaves(inputs)
    o, lse = path_attention_triton(*xs, config=p)
    o_ref, lse_ref = naive_path_attention(*_leaves(inputs, F64), return_lse=True)
    assert rel(o, o_ref) > CAUGHT
    got = kernel_grads(inputs, do, p)
    ref = oracle_grads(inputs, do)
    errs = {n: rel(a, b) for n, a, b in zip(NAMES, got, ref)}
    assert errs["dq"] > CAUGHT and errs["dk"] > CAUGHT and errs["dg"] > CAUGHT, errs
    ref_nog = oracle_grads((*inputs[:5], None), do)
    check(got[:5], ref_nog[:5], TOL[F32])


def test_mutation_gate_grad_is_caught(monkeypatch):
    """Mutant: dg = dc (the reverse cumsum over each sequence is skipped).  dg must fail, the others
    must still pass (the gate's forward is intact)."""
    monkeypatch.setattr(tri_backward, "_gate_grad", lambda dc, tables, shape: dc.t().to(F64).reshape(shape))
    inputs, do = make_inputs(420, T=64, gate=True)
    got = kernel_grads(inputs, do, params())
    ref = oracle_grads(inputs, do)
    assert rel(got[5], ref[5]) > CAUGHT
    check(got[:5], ref[:5], TOL[F32])


# ----------------------------------------------------------------------------- per-range stages 5-7

def _range_counts(monkeypatch) -> list:
    """The number of token ranges of every backward from here on, appended as each runs (``_ranges`` spied)."""
    counts, real_ranges = [], tri_backward._ranges

    def spy(*a):
        out = real_ranges(*a)
        counts.append(len(out))
        return out

    monkeypatch.setattr(tri_backward, "_ranges", spy)
    return counts


@pytest.mark.parametrize("case", ["dense_gqa", "varlen"])
def test_range_split_gives_identical_gradients(monkeypatch, case):
    """Above bwd_range_budget_mib the transport, intra and UT backward stages run per token range of
    whole super-chunks, on u / K~ / m recomputed for the range.  Split into one super-chunk per
    range, the gradients are bitwise those of one launch over the stream (every program computes
    the same tile; a row's atomic adds come from the same programs in the same order), and match
    the oracle.  Varlen: sequences shorter than a super-chunk, with a partial chunk, and ranges
    that start in the middle of a sequence."""
    if case == "dense_gqa":
        inputs, do = make_inputs(450, B=2, T=100, HQ=4, H=2, gate=True)
        kw = {}
    else:
        inputs, do = make_inputs(451, B=1, T=150, gate=True)
        kw = dict(cu_seqlens=torch.tensor([0, 20, 21, 101, 150]))
    p = params()
    ranges = _range_counts(monkeypatch)
    whole = kernel_grads(inputs, do, params(bwd_range_budget_mib=0), **kw)     # one range, through the knob
    _one_superchunk_per_range(monkeypatch)
    split = kernel_grads(inputs, do, p, **kw)
    n_sc = 8 if case == "dense_gqa" else 1 + 1 + 3 + 2
    assert ranges == [1, n_sc]
    for name, a, b in zip(NAMES, split, whole):
        if b is not None:
            assert torch.equal(a, b), name
    check(split, oracle_grads(inputs, do, **kw), TOL[F32])


@pytest.mark.parametrize("gate", [True, False])
def test_ranged_backward_starts_from_the_forwards_compact_state(monkeypatch, gate):
    """When stages 5-7 run in token ranges (which recompute u, K~ in the scan dtype and m), the backward's own
    recompute of the forward state is the forward's compact one (16-bit u, K~, w: bwd_prep and the
    transport read it); one range reads it in its kernels and gets float32.  The ranged gradients are
    bitwise those of one range started from the same compact state, and match the oracle."""
    inputs, do = make_inputs(452, B=2, T=100, HQ=4, H=2, dtype=F16, gate=gate)
    q, k, v, w, beta, g = inputs
    p, scale = params(F16), 16 ** -0.5
    one = params(F16, bwd_range_budget_mib=0)
    o, lse, _ = tri_forward.path_attention_fwd(q, k, v, w, beta, g, scale=scale, cu_seqlens=None, params=p)
    assert tri_backward.backward_state(q, k, w, beta, g, cu_seqlens=None, params=one).u.dtype == F32
    whole_state = tri_forward.prepare_state(q, k, w, beta, g, cu_seqlens=None, params=p, compact=True)
    whole = tri_backward.path_attention_bwd(do, q, k, v, w, beta, g, o, lse, whole_state, scale=scale, params=one)
    _one_superchunk_per_range(monkeypatch)
    state = tri_backward.backward_state(q, k, w, beta, g, cu_seqlens=None, params=p)
    assert state.u.dtype == F16 and state.wd is not None
    split = tri_backward.path_attention_bwd(do, q, k, v, w, beta, g, o, lse, state, scale=scale, params=p)
    assert state.u is None and state.wd is None             # released once bwd_prep and the transport ran
    for name, a, b in zip(NAMES, split, whole):
        if b is not None:
            assert torch.equal(a, b), name
    check(split, oracle_grads(inputs, do), TOL[F16])


@pytest.mark.parametrize("mode", ["keep", "keep_inter"])
@pytest.mark.parametrize("dtype,ranged,varlen,gate,D", [
    (F16, True, False, True, 16), (F16, False, False, False, 16), (F32, False, True, True, 16),
    (F16, True, True, False, 16), (F16, True, False, True, 64)],
    ids=["fp16-ranged-gate", "fp16-one-range", "fp32-varlen-gate", "fp16-ranged-varlen", "fp16-ranged-gate-D64"])
def test_kept_forward_state_gives_the_recomputed_gradients(monkeypatch, spy_launches, dtype, ranged, varlen, gate,
                                                           D, mode):
    """bwd_forward_state keep: the forward op returns its compact state, autograd keeps it, and the
    backward reads it instead of running the UT stage and the transport again; keep_inter: the forward's
    queries at their super-chunk start, transported keys and transitions, and the backward's inter stages read
    them while its per-range stages recompute U, K~, M (in either mode no ``backward_state`` call, no query
    chain in ``bwd_prep_kernel``); under keep every range reads its rows of the kept U, K~, M and w copy and
    recomputes only A and M (no U, K~ recompute in the backward).  Where the recompute would build
    the same state (token ranges, or a float32 scan) the gradients are bitwise the recompute's; in one range of a
    16-bit scan the recompute reads a float32 state and the kept one is 16-bit: both match the oracle.  Varlen: the
    kept transitions tensor has rows for the most super-chunks the sequence count allows."""
    inputs, do = make_inputs(453 + D, B=1 if varlen else 2, T=150 if varlen else 100, HQ=4, H=2, D=D, DV=D,
                             dtype=dtype, gate=gate)
    kw = dict(cu_seqlens=torch.tensor([0, 20, 21, 101, 150])) if varlen else {}
    _ranges(monkeypatch, ranged)
    calls = []
    real_state = tri_backward.backward_state
    monkeypatch.setattr(tri_backward, "backward_state", lambda *a, **k: calls.append(1) or real_state(*a, **k))
    chains = spy_launches(tri_backward, "bwd_prep_kernel", lambda grid, kw: kw["CHAIN"])   # the query chain walked
    recomputed = kernel_grads(inputs, do, params(dtype, bwd_forward_state="recompute"), **kw)
    assert calls == [1] and chains == [True]
    recomputes = []       # the backward's per-range U, K~, M recompute (A and M alone are not counted)
    real_ut = tri_backward.ut_recompute
    monkeypatch.setattr(tri_backward, "ut_recompute",
                        lambda *a, **k: (k.get("write_uk", True) and recomputes.append(1)) or real_ut(*a, **k))
    counts = _range_counts(monkeypatch)
    kept = kernel_grads(inputs, do, params(dtype, bwd_forward_state=mode), **kw)
    assert calls == [1] and chains == [True, False]         # the kept state: nothing recomputed before the ranges
    assert len(counts) == 1 and (counts[0] > 1) == ranged
    # keep: no U, K~ recompute in any range (A and M only, for the UT backward); keep_inter: one per range
    assert len(recomputes) == (0 if mode == "keep" else counts[0])
    if ranged or dtype == F32:
        for name, a, b in zip(NAMES, kept, recomputed):
            if b is not None:
                assert torch.equal(a, b), name
    check(kept, oracle_grads(inputs, do, **kw), TOL[dtype])


@pytest.mark.parametrize("out_dtype,D,C,diag_block",
                         [(torch.bfloat16, 64, 64, 16), (F16, 40, 16, 8), (F32, 64, 32, 16)],
                         ids=["bf16-D64", "fp16-D40", "fp32-D64"])
def test_ut_recompute_is_the_forward_stage_plus_a(out_dtype, D, C, diag_block):
    """The backward's one-launch UT stage (``ut_recompute``, padded head dims from 64): u, K~, m and w's copy equal
    to the forward's fused stage's for a state of the same type, bit for bit (a token range's recompute is the
    forward's state); A = T^{-1} diag(beta) against float64 and against the three-launch stage's A; with
    ``write_uk`` off (a range reading a kept state) the same m and A bit for bit.  A partial last chunk; D = 40 masks
    columns of its padded 64."""
    from pathtune.codegen.triton._layout import build_tables
    from pathtune.codegen.triton.forward import ut_forward, ut_fused
    from pathtune.runtime.reference.blockwise import ut_transform

    T, H = 2 * C + 5, 2
    gen = torch.Generator().manual_seed(D + C)
    w = F.normalize(torch.randn(T, H, D, generator=gen), dim=-1).to(F16 if out_dtype == F16 else torch.bfloat16)
    k = torch.randn(T, H, D, generator=gen).to(w.dtype)
    beta = 1.5 + 0.5 * torch.rand(T, H, generator=gen)
    p = params(F32, chunk_size=C, superchunk_size=2 * C, ut_diag_block=diag_block)
    tables = build_tables(1, T, None, C, 2 * C, torch.device("cpu"), block_m=p.block_m)
    u, kt, m, a, wd = tri_backward.ut_recompute(k, w, beta, tables, H, D, C, p, out_dtype)
    fu, fkt, fm, fwd_w = ut_fused(k, w, beta, tables, H, D, C, p, out_dtype=out_dtype, write_w=out_dtype != F32)
    assert u.dtype == kt.dtype == out_dtype and m.dtype == a.dtype == F32
    for mine, forward in ((u, fu), (kt, fkt), (m, fm), (wd, fwd_w)):
        assert (mine is None and forward is None) or torch.equal(mine, forward)
    *_, a3, _ = ut_forward(k, w, beta, tables, H, D, C, p, keep_a=True)
    for c0 in range(0, T, C):
        sl = slice(c0, min(c0 + C, T))
        n = sl.stop - sl.start
        for h in range(H):
            ref, _ = ut_transform(w[sl, h].to(F64), beta[sl, h].to(F64))
            assert rel(a[sl, h, :n], ref) < 1e-5 and rel(a[sl, h, :n], a3[sl, h, :n]) < 1e-5
    none_u, none_kt, m2, a2, none_w = tri_backward.ut_recompute(k, w, beta, tables, H, D, C, p, out_dtype,
                                                                write_uk=False)
    assert none_u is None and none_kt is None and none_w is None
    assert torch.equal(m2, m) and torch.equal(a2, a)


def test_range_budget():
    """bwd_range_budget_mib, the spec's memory knob (default 256 MiB: 8 ranges at the tuner's 32768 tokens, D=64,
    H=16, bwd_intra's chain-state slots and the transport backward's stored states and gradients included; the
    memory probe's extra peak at T=16384, B=2 stays under 1 GiB): params without the bwd knobs take the default,
    0 is no bound, a negative budget is refused when the config is resolved."""
    from pathtune.codegen._knobs import resolve
    from pathtune.specs import load_spec

    knob = load_spec().knobs["bwd_range_budget_mib"]
    assert knob.default == 256 and knob.role == "memory"
    assert tri_backward._range_budget(TritonParams()) == 256 << 20
    assert tri_backward._range_budget(resolve("triton", "bwd", None, (64, 64))) == 256 << 20
    assert tri_backward._range_budget(resolve("triton", "bwd", {"bwd_range_budget_mib": 128}, (64, 64))) == 128 << 20
    assert tri_backward._range_budget(params(bwd_range_budget_mib=0)) is None
    with pytest.raises(ValueError, match="bwd_range_budget_mib"):
        resolve("triton", "bwd", {"bwd_range_budget_mib": -5}, (64, 64))
    per_token = tri_backward._phase2_bytes_per_token(16, 64, 64, 1024, True)
    assert -(-32768 * per_token // (256 << 20)) == 8
    assert -(-32768 * per_token // (128 << 20)) == 16


def test_range_budget_reaches_the_backward_through_the_config(monkeypatch):
    """The knob in the config the autograd op carries sets the backward's range count: 0 runs one range, the
    default splits a stream whose working set is over it (here: the budget read as bytes), and the gradients are
    the same either way."""
    inputs, do = make_inputs(455, B=2, T=100, HQ=4, H=2, gate=True)
    counts = []
    real_ranges = tri_backward._ranges
    monkeypatch.setattr(tri_backward, "_ranges", lambda *a: counts.append(a[-1]) or real_ranges(*a))
    real_budget = tri_backward._range_budget
    # the budget read as bytes instead of MiB: these 200 tokens' working set is over the default, as at scale
    monkeypatch.setattr(tri_backward, "_range_budget",
                        lambda p: None if real_budget(p) is None else real_budget(p) >> 20)
    split = kernel_grads(inputs, do, params())
    whole = kernel_grads(inputs, do, params(bwd_range_budget_mib=0))
    assert counts == [8, 1]       # 2 sequences x 4 super-chunks, then one range
    for name, a, b in zip(NAMES, split, whole):
        if b is not None:
            assert torch.equal(a, b), name


@pytest.mark.parametrize("D,S,HQ,H,dtype", [(16, 32, 4, 2, F16), (64, 64, 4, 2, F16), (128, 64, 2, 2, F16),
                                            (64, 64, 4, 2, F32), (32, 128, 4, 1, F16)],
                         ids=["D16", "D64", "D128-transport-bound", "D64-fp32", "D32-S128-walk-bound"])
def test_range_budget_is_the_ranges_peak(monkeypatch, D, S, HQ, H, dtype):
    """The per-token count the range budget divides by (``_phase2_bytes_per_token``) bounds the range loop's real
    peak: with a budget of two super-chunks' count, the storages the backward allocates from its first range on
    (every torch allocation, tracked until freed by benchmarks/memory_probe.py's ``LiveMemory`` at exact sizes;
    the launches stubbed so that only the host's buffers count) peak at most at that budget -- both where the
    transport backward's states set the peak and where the walk's chain states do, for a 16-bit and a float32
    scan.  The count adds those two, which are never alive together, so it runs over the peak by their smaller
    share (here at most 1.5x): a range buffer it misses fails the first bound once the peak outgrows that slack
    (leaving out the transport's states does; the walk's float32 copy of dV's rows alone hides in it)."""
    inputs, do = make_inputs(460 + D, B=2, T=2 * S, HQ=HQ, H=H, D=D, DV=D, dtype=dtype, gate=True)
    q, k, v, w, beta, g = inputs
    p, scale = params(dtype, superchunk_size=S), D ** -0.5
    o, lse, _ = tri_forward.path_attention_fwd(q, k, v, w, beta, g, scale=scale, cu_seqlens=None, params=p)
    state = tri_backward.backward_state(q, k, w, beta, g, cu_seqlens=None, params=p)
    per_token = tri_backward._phase2_bytes_per_token(H, D, p.chunk_size, S, True, HQ, p.scan_torch_dtype.itemsize, D)
    budget = 2 * S * per_token
    monkeypatch.setattr(tri_backward, "_range_budget", lambda params: budget)
    from repo_scripts import load_benchmark_script

    counts = _range_counts(monkeypatch)
    probe = load_benchmark_script(monkeypatch, "benchmarks/memory_probe.py")
    mode = probe.LiveMemory(rounding=lambda nbytes: nbytes)
    entered = []
    real_tables = tri_backward._range_tables

    def tables_then_count(*a):      # counting starts where the range loop does; the mode leaves with the call
        entered.append(mode.__enter__())
        return real_tables(*a)

    monkeypatch.setattr(tri_backward, "_range_tables", tables_then_count)
    with probe.no_triton_launches():
        try:
            tri_backward.path_attention_bwd(do, q, k, v, w, beta, g, o, lse, state, scale=scale, params=p)
        finally:
            if entered:
                mode.__exit__(None, None, None)
    assert counts == [2]
    assert budget / 1.5 <= mode.peak <= budget, (mode.peak, budget)


# ----------------------------------------------------------------------------- blocked super-chunk chain kernels

def _packed_chain_case(BD, seed, H=2, S=32):
    """Tables of packed sequences of 1, 2, 5 and 3 super-chunks; What near the identity, random dOm."""
    from pathtune.codegen.triton._layout import build_tables

    lens = [20, 64, 150, 70]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    tb = build_tables(1, sum(lens), cu, 16, S, torch.device("cpu"))
    gen = torch.Generator().manual_seed(seed)
    what = torch.eye(BD) + 0.3 * torch.randn(tb.n_sc, H, BD, BD, generator=gen) / BD ** 0.5
    dom = torch.randn(tb.n_pairs, H, BD, BD, generator=gen)
    return tb, what, dom


@pytest.mark.parametrize("BD,blocks", [(32, (16, 16, 16, 4)), (128, None)], ids=["BD32-blocked", "BD128"])
def test_blocked_chain_kernels_match_torch(monkeypatch, BD, blocks):
    """bwd_chain_rows_kernel + bwd_chain_dwhat_kernel (the super-chunk chain above padded head dim 64,
    both ways: carrying Om's columns, and reading every pair's Om) and bwd_superchunk_pairs_kernel
    against the float64 torch references, for packed sequences of 1, 2, 5 and 3 super-chunks.  Outputs
    start as NaN: every dWhat entry (zero for a sequence's first and last super-chunk) and every
    Om_{I,J}, J < I, is written.  BD = 32 with 16 x 16 blocks runs several row and column blocks."""
    from pathtune.codegen.triton import bwd_chain

    if blocks is not None:
        monkeypatch.setattr(tri_backward, "chain_blocks", lambda bd: blocks)
    tb, what, dom = _packed_chain_case(BD, 500 + BD)
    H, S = what.shape[1], 32
    rows, cb, dcb, warps = tri_backward.chain_blocks(BD)
    ref = tri_backward._superchunk_chain_torch(what.to(F64), dom.to(F64), tb)
    om_ref = tri_backward._superchunk_pairs_torch(what.to(F64), tb, dom.to(F64))
    t = (tb.sc_seq, tb.seq_start, tb.seq_end, tb.seq_sc_base, tb.seq_pair_base)
    om = torch.full_like(dom, float("nan"))
    bwd_chain.bwd_superchunk_pairs_kernel[(tb.n_sc, H, BD // rows)](
        what, om, *t, H=H, BD=BD, S=S, ROWS=rows, CB=cb, TP="ieee", num_warps=warps)
    pairs = [pb + i * nsc + j for nsc, pb in zip(tb.seq_nsc_host, tb.pair_base_host)
             for i in range(nsc) for j in range(i)]
    assert len(pairs) == 0 + 1 + 10 + 3
    assert rel(om[pairs], om_ref[pairs]) < 1e-6
    for has_om in (False, True):
        d = dom.clone()
        bwd_chain.bwd_chain_rows_kernel[(tb.n_sc, H, BD // rows)](
            what, d, *t, H=H, BD=BD, S=S, ROWS=rows, CB=cb, TP="ieee", num_warps=warps)
        got = torch.full_like(what, float("nan"))
        bwd_chain.bwd_chain_dwhat_kernel[(tb.n_sc, H, (BD // dcb) ** 2)](
            what, om if has_om else what, d, got, *t, H=H, BD=BD, S=S, CB=dcb, HAS_OM=has_om, TP="ieee",
            num_warps=warps)
        assert torch.isfinite(got).all() and got.abs().sum() > 0
        assert rel(got, ref) < 1e-6, has_om
        first_last = [base + j for nsc, base in zip(tb.seq_nsc_host, tb.sc_base_host) for j in {0, nsc - 1}]
        assert torch.count_nonzero(got[first_last]) == 0


def test_superchunk_chain_host_paths_agree():
    """``superchunk_chain`` (the host side stage 4 calls) gives the same dWhat through the per-sequence
    kernel (padded head dims <= CHAIN_KERNEL_MAX_BD) and through the blocked kernels above it."""
    tb, what, dom = _packed_chain_case(32, 510)
    narrow = tri_backward.superchunk_chain(what, dom.clone(), tb, 32, "ieee")
    try:
        tri_backward.CHAIN_KERNEL_MAX_BD, saved = 16, tri_backward.CHAIN_KERNEL_MAX_BD
        wide = tri_backward.superchunk_chain(what, dom.clone(), tb, 32, "ieee")
        om = tri_backward.superchunk_pairs(what, tb, dom, 32, "ieee")
        wide_om = tri_backward.superchunk_chain(what, dom.clone(), tb, 32, "ieee", om=om)
    finally:
        tri_backward.CHAIN_KERNEL_MAX_BD = saved
    assert rel(wide, narrow) < 1e-6 and rel(wide_om, narrow) < 1e-6


@pytest.mark.parametrize("lens", [None, (45, 1, 74)], ids=["dense-B2", "varlen"])
def test_backward_through_blocked_chain(monkeypatch, spy_launches, lens):
    """End to end with the blocked chain kernels forced at a small head dim (CHAIN_KERNEL_MAX_BD below
    the padded 32): the gradients, dw and dbeta through dWhat included, match the oracle; varlen
    with 2 + 1 + 3 super-chunks, and a range split (one super-chunk per range) on the same call."""
    monkeypatch.setattr(tri_backward, "CHAIN_KERNEL_MAX_BD", 16)
    monkeypatch.setattr(tri_backward, "chain_blocks", lambda bd: (16, 16, 16, 4))
    launched = spy_launches(tri_backward, "bwd_chain_dwhat_kernel")
    T = sum(lens) if lens else 100
    B = 1 if lens else 2
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32) if lens else None
    inputs, do = make_inputs(520 + T, B=B, T=T, HQ=2, H=1, D=24, DV=16, gate=True)
    kw = {} if cu is None else dict(cu_seqlens=cu)
    _one_superchunk_per_range(monkeypatch)
    run_case(inputs, do, params(), **kw)
    assert launched


@pytest.mark.parametrize("HQ", [3, 20])
def test_gate_grad_kernel_matches_torch(monkeypatch, HQ):
    """dg = reversed cumsum of dc per sequence (``gate_grad_kernel``) against the float64 torch version,
    spans of 64 tokens (several per sequence, a sequence of exactly one span and one of a span plus
    one token, a length-1 sequence), heads in one block and in two (the second partial)."""
    from pathtune.codegen.triton._layout import build_tables

    monkeypatch.setattr(tri_backward, "GATE_GRAD_SPAN", 64)
    lens = [1, 150, 37, 64, 65]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    tb = build_tables(1, sum(lens), cu, 16, 32, torch.device("cpu"))
    dc = 1.0 + 1e-3 * torch.randn(HQ, sum(lens), generator=torch.Generator().manual_seed(530 + HQ))   # head-major
    got = tri_backward._gate_grad(dc, tb, (1, sum(lens), HQ))
    ref = tri_backward._gate_grad_torch(dc, tb, (1, sum(lens), HQ))
    assert got.dtype == F32 and got.shape == (1, sum(lens), HQ)
    assert rel(got, ref) < 1e-7


# ----------------------------------------------------------------------------- the dkv kernel's gate sums

@pytest.mark.parametrize("dtype", [F32, F16], ids=["fp32", "fp16"])
def test_dkv_gate_sums_by_product_and_by_reduction(monkeypatch, dtype):
    """bwd_inter_dkv_kernel's two ways to the FoX gate's key-side sums (``backward.gate_sums_by_mma``: dS^T
    times a ones column, or row reductions) give the same gradients (dg up to the 16-bit rounding of dS^T's
    terms in the product) and the oracle's; GQA, three super-chunks in the longer sequence so that dkv
    walks two later ones."""
    inputs, do = make_inputs(457, B=2, T=100, HQ=4, H=2, dtype=dtype, gate=True)
    p = params(dtype)
    grads = {}
    for by_mma in (True, False):
        monkeypatch.setattr(tri_backward, "gate_sums_by_mma", lambda BD, by_mma=by_mma: by_mma)
        grads[by_mma] = kernel_grads(inputs, do, p)
    for name, a, b in zip(NAMES, grads[True], grads[False]):
        assert rel(a, b) < (1e-6 if dtype == F32 or name != "dg" else 2e-3), (name, rel(a, b))
    ref = oracle_grads(inputs, do)
    for got in grads.values():
        check(got, ref, TOL[dtype])


def _far_gate_inputs(seed, lens, dtype):
    """Packed sequences (GQA 4 / 2, D 16) whose gate cumsums sit far from zero: the first four tokens of each
    sequence forget hard (log gate -60), the rest mildly (log U(0.9, 1)).  Logit offsets are then ~ -240 (a
    bf16 part alone is off by up to 1 there) while the offsets' differences between a query and its keys stay
    small, so every later key keeps its weight."""
    inputs, do = make_inputs(seed, T=sum(lens), HQ=4, H=2, dtype=dtype, gate=True)
    g = inputs[5].clone()
    start = 0
    for n in lens:
        g[:, start:start + min(n, 4)] = -60.0
        start += n
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    return (*inputs[:5], g), do, cu


@pytest.mark.parametrize("dtype", [F32, F16])
def test_backward_gate_offsets_far_from_zero(dtype):
    """The kernels add the gate's logit offsets as float32 differences of cumsums far from zero
    (``_far_gate_inputs``: ~ -240, where a bf16 copy of an offset would be off by up to 1): the oracle's
    gradients at the usual tolerance, varlen and GQA, three super-chunks in the longest sequence (every walk
    of the backward runs: dq, dk / dv between super-chunks, the intra walk)."""
    inputs, do, cu = _far_gate_inputs(471, (70, 9, 41), dtype)
    run_case(inputs, do, params(dtype), dtype, cu_seqlens=cu)


@pytest.mark.parametrize("gate", [True, False])
def test_dq_between_superchunks_over_unset_dy_rows(monkeypatch, gate):
    """bwd_inter_dq_kernel stores every row of dy it owns (the launcher does not zero it); gated, it adds each
    super-chunk's share into those rows (stored at the first, read-modify-written after), ungated it stores its
    register tile once.  With dy's unzeroed rows holding garbage: the oracle's gradients (packed sequences of three
    super-chunks and a short one, GQA).  With the gated kernel's first share added to whatever dy held instead of
    stored over it, it is caught."""
    import pathtune.codegen.triton.bwd_inter as tri_inter
    from repo_scripts import load_benchmark_script
    kv = load_benchmark_script(monkeypatch, "benchmarks/kernel_variants.py")
    lens = (70, 9, 41)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    inputs, do = make_inputs(481, T=sum(lens), HQ=4, H=2, gate=gate)
    real_carve = tri_backward._carve
    monkeypatch.setattr(tri_backward, "_carve", lambda shapes, dtype, device, *, zero: [
        t if zero else t.fill_(7.0) for t in real_carve(shapes, dtype, device, zero=zero)])
    got = kernel_grads(inputs, do, params(), cu_seqlens=cu)
    check(got, oracle_grads(inputs, do, cu_seqlens=cu), TOL[F32])
    if gate:
        mutant = [("                    if step > 0:\n                        upd += tl.load(",
                   "                    if True:\n                        upd += tl.load(")]
        monkeypatch.setattr(tri_backward, "bwd_inter_dq_kernel", kv.load_variant_module(
            kv.module_source(tri_inter), "dq_dy_unset", mutant).bwd_inter_dq_kernel)
        bad = kernel_grads(inputs, do, params(), cu_seqlens=cu)
        assert rel(bad[0], got[0]) > CAUGHT


@pytest.mark.parametrize("gate,dtype", [(True, F32), (False, F32), (True, F16)])
def test_key_side_steps_unmasked_inside_the_sequence_and_masked_at_its_end(monkeypatch, gate, dtype):
    """bwd_inter_dkv_kernel loads its whole query steps without masks and ends a sequence's last super-chunk with one
    masked step (``_dkv_superchunk``): the oracle's gradients for packed sequences whose last super-chunks end inside
    a step (70 = 2 * 32 + 6 tokens at super-chunks of 32 and steps of 16), one shorter than a step and one a whole
    number of steps (GQA; head dims 16 and 24, the latter with column masks below its padded width).  With the last
    step loaded unmasked like the others it is caught: the next sequence's rows enter the sums."""
    import pathtune.codegen.triton.bwd_inter as tri_inter
    from repo_scripts import load_benchmark_script
    kv = load_benchmark_script(monkeypatch, "benchmarks/kernel_variants.py")
    lens = (70, 9, 64, 41)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    for D, DV in ((16, 16), (24, 16)):
        inputs, do = make_inputs(491 + D, T=sum(lens), HQ=4, H=2, D=D, DV=DV, dtype=dtype, gate=gate)
        p = params(dtype, bwd_block_m=16)
        shipped = kernel_grads(inputs, do, p, cu_seqlens=cu)
        check(shipped, oracle_grads(inputs, do, cu_seqlens=cu), TOL[dtype])
    # mutant: the last step of a super-chunk unmasked like the others
    tail = "USE_GATE, GATE_SUM_MMA, GATE_MMA, True, INTERP)"
    mutant = kv.load_variant_module(kv.module_source(tri_inter), "dkv_tail_unmasked",
                                    [(tail, tail.replace("True", "False"))])
    monkeypatch.setattr(tri_backward, "bwd_inter_dkv_kernel", mutant.bwd_inter_dkv_kernel)
    xs = _leaves(inputs)
    bad = torch.autograd.grad(path_attention_triton(*xs, config=p, cu_seqlens=cu)[0],
                              [x for x in xs if x is not None], do)
    assert not all(torch.isfinite(a).all() and rel(a, b) < CAUGHT for a, b in zip(bad, shipped) if b is not None)


def test_kernel_probe_gate_parts_still_apply(monkeypatch):
    """benchmarks/dev_kernel_probe.py's timing-only dkv variants (the gate without its row sums / its logit
    bias) are text replacements of this tree's bwd_inter.py: each must still find its text and build."""
    from repo_scripts import load_benchmark_script

    probe = load_benchmark_script(monkeypatch, "benchmarks/dev_kernel_probe.py")
    src = probe.module_source(probe.inter_mod)
    for tag, _label, reps in probe.DKV_GATE_PARTS:
        kernel = probe.load_variant(src, "bwd_inter_dkv_kernel", f"test_dkv_{tag}", reps)
        assert kernel.arg_names == tri_backward.bwd_inter_dkv_kernel.arg_names, tag


def test_precision_probe_variants_still_apply(monkeypatch):
    """benchmarks/precision_probe.py's variants (one group of UT products at tf32x3, the diagonal tile's Q W^T M on
    fp16 operands) are text replacements of this tree's ut.py / ut_bwd.py / bwd_intra.py: each must still find its
    text and build a kernel with the shipped one's arguments, and each must change the kernel's code."""
    from repo_scripts import load_benchmark_script

    probe = load_benchmark_script(monkeypatch, "benchmarks/precision_probe.py")
    for name, parts in probe.VARIANTS.items():
        for module, launcher, kernel, edits in parts:
            src = probe.module_source(module)
            built = probe.load_variant(src, kernel, f"test_precision_{name}_{kernel}", edits)
            assert built.arg_names == getattr(launcher, kernel).arg_names, (name, kernel)
            assert all(new not in src for _old, new in edits), (name, kernel)


@pytest.mark.parametrize("rows", [16])
def test_transport_backward_at_fewer_rows_per_program(monkeypatch, spy_launches, rows):
    """The transport backward's two kernels take any power-of-two ROWS >= 16 (rows of the suffix product per
    program, the chain kernel's third grid axis; the stored states' layout follows it; the grads kernel's
    products have ROWS as their inner dimension, which sm_90 needs >= 16): at D = 32 with 16 rows instead of the
    launcher's 32 the gradients equal the shipped launch's and the oracle's (5 super-chunks, FoX gate, GQA).
    The dev kernel probe times these launches at D 64 / 128 (``--only transport``): twice the programs on a
    serial per-program chain."""
    import pathtune.codegen.triton.backward as bwd_mod

    inputs, do = make_inputs(900 + rows, T=150, HQ=2, H=1, D=32, DV=16, gate=True)
    p = params()
    ship = kernel_grads(inputs, do, p)
    seen = spy_launches(bwd_mod, "bwd_transport_chain_kernel", lambda grid, kw: (grid[2], kw["ROWS"]))
    monkeypatch.setattr(bwd_mod, "transport_backward_rows", lambda BD: rows)
    got = kernel_grads(inputs, do, p)
    assert seen and all(s == (32 // rows, rows) for s in seen), seen
    for name, a, b in zip(NAMES, got, ship):
        assert rel(a, b) < 1e-5, (name, rel(a, b))
    check(got, oracle_grads(inputs, do), TOL[F32])


# ----------------------------------------------------------------------------- candidate kernels (benchmarks/variants)

def _candidate(monkeypatch, path):
    """The candidate module at ``path`` (benchmarks/ on sys.path for its kernel_variants import)."""
    from repo_scripts import load_benchmark_script

    return load_benchmark_script(monkeypatch, path)


def _ranges(monkeypatch, ranged):
    """Ranged: one super-chunk per range (the per-range recompute's 16-bit state); else one range."""
    if ranged:
        _one_superchunk_per_range(monkeypatch)
    else:
        monkeypatch.setattr(tri_backward, "_range_budget", lambda params: None)


def _same_grads(got, shipped, dtype, inputs, do):
    """A candidate's gradients: the shipped kernel's up to rounding, and the oracle's within tolerance."""
    for name, a, b in zip(NAMES, got, shipped):
        if b is not None:
            assert rel(a, b) < (1e-6 if dtype == F32 else 1e-3), (name, rel(a, b))
    check(got, oracle_grads(inputs, do), TOL[dtype])


@pytest.mark.parametrize("dtype,gate", [(F32, True), (F16, False)], ids=["fp32-gate", "fp16"])
def test_key_side_pass_takes_its_own_tile_and_warps(spy_launches, dtype, gate):
    """bwd_dkv_block_n / bwd_dkv_num_warps set the key-side pass's (bwd_inter_dkv_kernel's) key tile, grid and warps
    alone: dq keeps bwd_block_n / bwd_inter_num_warps, the gradients are the shared tile's up to rounding and the
    oracle's; 0 (their default) takes dq's.  GQA, several super-chunks, a partial last one."""
    inputs, do = make_inputs(83, B=2, T=150, HQ=4, H=2, dtype=dtype, gate=gate)
    base = dict(chunk_size=16, superchunk_size=64, block_n=16, bwd_block_n=16, scan_precision=SCAN[dtype])
    shared, own = (tri_backward.TritonBwdParams(**base, **extra)
                   for extra in ({}, dict(bwd_dkv_block_n=32, bwd_dkv_num_warps=8)))
    assert (shared.bwd_dkv_block_n, shared.bwd_dkv_num_warps) == (0, 0)
    launch = lambda grid, kw: (tuple(grid), kw["BLOCK_N"], kw["num_warps"])  # noqa: E731
    dkv, dq = spy_launches(tri_backward, "bwd_inter_dkv_kernel", launch), spy_launches(tri_backward,
                                                                                        "bwd_inter_dq_kernel", launch)
    ref = kernel_grads(inputs, do, shared)
    assert dkv and {(b, w) for _, b, w in dkv} == {(16, 4)} and all(g[0] % 4 == 0 for g, _, _ in dkv), dkv
    n = len(dkv)
    got = kernel_grads(inputs, do, own)
    assert {(b, w) for _, b, w in dkv[n:]} == {(32, 8)}, dkv[n:]
    assert [g[0] * 2 for g, _, _ in dkv[n:]] == [g[0] for g, _, _ in dkv[:n]]     # half the key tiles
    assert {(b, w) for _, b, w in dq} == {(16, 4)}, dq
    _same_grads(got, ref, dtype, inputs, do)


@pytest.mark.parametrize("dtype,ranged,gate", [(F32, False, True), (F16, True, True), (F16, False, False)],
                         ids=["fp32-one-range-gate", "fp16-ranged-gate", "fp16-one-range"])
def test_walk_and_prep_run_one_program_per_chunk_and_head_on_a_flat_grid(monkeypatch, spy_launches, dtype, ranged,
                                                                          gate):
    """bwd_intra's walk and diagonal kernels and bwd_prep run on the grid (chunks * query heads,), each program's
    (chunk, head) from ``_ops.chunk_and_head``, over packed sequences (partial super-chunks), GQA: the gradients the
    oracle's.  The walk or bwd_prep with a wrong split of the program id into heads is caught."""
    import pathtune.codegen.triton.bwd_intra as intra_mod
    import pathtune.codegen.triton.bwd_prep as prep_mod
    from candidate_helpers import WRONG_ORDER
    from repo_scripts import ROOT

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import kernel_variants as kv

    inputs, do = make_inputs(521, B=1, T=170, HQ=4, H=2, dtype=dtype, gate=gate)
    cu = torch.tensor([0, 90, 91, 170], dtype=torch.int32)
    p = params(dtype, superchunk_size=64)
    _ranges(monkeypatch, ranged)
    grids = {name: spy_launches(tri_backward, name) for name in ("bwd_intra_walk_kernel", "bwd_intra_diag_kernel",
                                                                 "bwd_prep_kernel")}
    shipped = kernel_grads(inputs, do, p, cu_seqlens=cu)
    n_chunks = 6 + 1 + 5           # chunks of 16 tokens: 90, 1, 79 tokens
    assert grids["bwd_prep_kernel"] == [(n_chunks * 4,)], grids
    for name in ("bwd_intra_walk_kernel", "bwd_intra_diag_kernel"):     # one launch per token range
        assert grids[name] and all(len(g) == 1 for g in grids[name]), grids
        assert sum(g[0] for g in grids[name]) == n_chunks * 4 if ranged else grids[name] == [(n_chunks * 4,)]
    check(shipped, oracle_grads(inputs, do, cu_seqlens=cu), TOL[dtype])
    live = [b for b in shipped if b is not None]
    for mod, name in ((intra_mod, "bwd_intra_walk_kernel"), (prep_mod, "bwd_prep_kernel")):
        with monkeypatch.context() as m:
            m.setattr(tri_backward, name, kv.load_variant(kv.module_source(mod), name, f"{name}_wrong_order",
                                                          WRONG_ORDER))
            xs = _leaves(inputs)
            o, _ = path_attention_triton(*xs, config=p, cu_seqlens=cu)
            bad = torch.autograd.grad(o, [x for x in xs if x is not None], do)
        assert not all(bool(torch.isfinite(a).all()) for a in bad) or max(map(rel, bad, live)) > CAUGHT, name


@pytest.mark.parametrize("dtype,ranged", [(F32, False), (F16, True)], ids=["fp32-one-range", "fp16-ranged"])
def test_chunks_fastest_order_candidate(monkeypatch, dtype, ranged):
    """benchmarks/variants/chunks_fastest.py (the per-chunk kernels in the former order: chunks fastest, heads
    slowest, on the shipped flat grid) in every launcher's place: o the shipped forward's and the gradients the
    shipped ones up to rounding, both the oracle's, over packed sequences of several super-chunks, GQA.  The same
    edit with the program id split wrongly is caught."""
    import sys

    import pathtune.codegen.triton.bwd_intra as intra_mod

    cand = _candidate(monkeypatch, "benchmarks/variants/chunks_fastest.py")
    kv = sys.modules["kernel_variants"]
    inputs, do = make_inputs(619, B=1, T=170, HQ=4, H=2, dtype=dtype, gate=True)
    cu = torch.tensor([0, 90, 91, 170], dtype=torch.int32)
    p = params(dtype, superchunk_size=64)
    _ranges(monkeypatch, ranged)
    o0, _ = path_attention_triton(*inputs, config=p, cu_seqlens=cu)
    shipped = kernel_grads(inputs, do, p, cu_seqlens=cu)
    monkeypatch.setattr(tri_forward, "scan_intra_kernel", cand.scan_intra_kernel)
    for name in ("bwd_prep_kernel", "bwd_intra_walk_kernel", "bwd_intra_diag_kernel"):
        monkeypatch.setattr(tri_backward, name, getattr(cand, name))
    o1, _ = path_attention_triton(*inputs, config=p, cu_seqlens=cu)
    assert rel(o1, o0) < (1e-6 if dtype == F32 else 1e-3)
    got = kernel_grads(inputs, do, p, cu_seqlens=cu)
    for name, a, b in zip(NAMES, got, shipped):
        if b is not None:
            assert rel(a, b) < (1e-6 if dtype == F32 else 1e-3), (name, rel(a, b))
    check(got, oracle_grads(inputs, do, cu_seqlens=cu), TOL[dtype])
    wrong = [(old, new.replace("tl.program_id(0) // n_all", "(tl.program_id(0) // n_all) // 2")) for old, new in
             cand.ORDER]
    monkeypatch.setattr(tri_backward, "bwd_intra_walk_kernel", kv.load_variant(
        kv.module_source(intra_mod), "bwd_intra_walk_kernel", "chunks_fastest_wrong", wrong))
    bad = kernel_grads(inputs, do, p, cu_seqlens=cu)
    assert max(rel(a, b) for a, b in zip(bad, shipped) if b is not None) > CAUGHT


@pytest.mark.parametrize("dtype,ranged,gate", [(F32, False, True), (F16, True, True), (F32, True, False)],
                         ids=["fp32-one-range-fox", "fp16-ranged-fox", "fp32-ranged-path"])
def test_walk_of_two_chunks_per_program(monkeypatch, spy_launches, dtype, ranged, gate):
    """bwd_walk_chunks 2 (two query chunks per walk program, stacked into one tile): the gradients of one chunk per
    program up to rounding, and the oracle's, over packed sequences whose super-chunks hold four, three, two and
    one chunks with partial last chunks (pairs, a lone last chunk, a pair cut by the sequence's end), GQA; the
    pairs kernel is what runs.  Without the upper chain's extra step masked for the lower chain it is caught."""
    import pathtune.codegen.triton.bwd_intra as intra_mod
    from repo_scripts import load_benchmark_script

    lens = (90, 1, 79, 112)
    inputs, do = make_inputs(631, B=1, T=sum(lens), HQ=4, H=2, dtype=dtype, gate=gate)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    _ranges(monkeypatch, ranged)
    shipped = kernel_grads(inputs, do, params(dtype, superchunk_size=64), cu_seqlens=cu)
    p = params(dtype, superchunk_size=64, bwd_walk_chunks=2)
    pairs = spy_launches(tri_backward, "bwd_intra_walk_pairs_kernel")
    single = spy_launches(tri_backward, "bwd_intra_walk_kernel")
    got = kernel_grads(inputs, do, p, cu_seqlens=cu)
    assert pairs and not single, (pairs, single)
    for name, a, b in zip(NAMES, got, shipped):
        if b is not None:
            assert rel(a, b) < (1e-5 if dtype == F32 else 2e-3), (name, rel(a, b))
    check(got, oracle_grads(inputs, do, cu_seqlens=cu), TOL[dtype])
    kv = load_benchmark_script(monkeypatch, "benchmarks/kernel_variants.py")
    mutant = kv.load_variant(kv.module_source(intra_mod), "bwd_intra_walk_pairs_kernel", "walk_pairs_unmasked",
                             [("    if LAST:\n", "    if False:\n")])
    monkeypatch.setattr(tri_backward, "bwd_intra_walk_pairs_kernel", mutant)
    bad = kernel_grads(inputs, do, p, cu_seqlens=cu)
    assert max(rel(a, b) for a, b in zip(bad, shipped) if b is not None) > CAUGHT


@pytest.mark.parametrize("dtype", [F32, F16], ids=["fp32", "fp16"])
def test_inter_kernels_add_the_gate_offsets_by_product(monkeypatch, spy_launches, dtype):
    """bwd_gate_bias product: ``bwd_inter_dq_kernel`` and ``bwd_inter_dkv_kernel`` add the keys' gate offsets as one
    more K = 16 step of the logits' product (their bf16 parts: dq reads them from the backward's copy, dkv builds
    its key tile's): the gradients of the subtracting kernels up to rounding, and the oracle's, over packed
    sequences of several super-chunks (the kernels between super-chunks run), GQA; the product path is what runs,
    and only with a gate.  Parts of the wrong sign are caught in either kernel."""
    import pathtune.codegen.triton.bwd_inter as inter_mod
    from repo_scripts import load_benchmark_script

    lens = (90, 1, 79, 112)
    inputs, do = make_inputs(633, B=1, T=sum(lens), HQ=4, H=2, dtype=dtype, gate=True)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    shipped = kernel_grads(inputs, do, params(dtype), cu_seqlens=cu)
    p = params(dtype, bwd_gate_bias="product")
    flags = spy_launches(tri_backward, "bwd_inter_dkv_kernel", lambda grid, kw: kw["GATE_MMA"])
    dq_flags = spy_launches(tri_backward, "bwd_inter_dq_kernel", lambda grid, kw: kw["GATE_MMA"])
    got = kernel_grads(inputs, do, p, cu_seqlens=cu)
    assert flags == dq_flags == [True]
    for name, a, b in zip(NAMES, got, shipped):
        assert rel(a, b) < (1e-5 if dtype == F32 else 2e-3), (name, rel(a, b))
    check(got, oracle_grads(inputs, do, cu_seqlens=cu), TOL[dtype])
    kernel_grads(inputs[:5] + (None,), do, p, cu_seqlens=cu)
    assert flags == dq_flags == [True, False]

    def caught():
        bad = kernel_grads(inputs, do, p, cu_seqlens=cu)
        return max(rel(a, b) for a, b in zip(bad, shipped) if b is not None) > CAUGHT

    real_parts = tri_backward.gate_parts
    with monkeypatch.context() as m:        # dq's parts of the wrong sign
        m.setattr(tri_backward, "gate_parts", lambda gc, ratio: real_parts(gc, -ratio))
        assert caught()
    kv = load_benchmark_script(monkeypatch, "benchmarks/kernel_variants.py")
    mutant = kv.load_variant(kv.module_source(inter_mod), "bwd_inter_dkv_kernel", "dkv_parts_sign",
                             [("bias_parts(ck_s * (-1.0 / qk_scale))", "bias_parts(ck_s * (1.0 / qk_scale))")])
    monkeypatch.setattr(tri_backward, "bwd_inter_dkv_kernel", mutant)
    assert caught()


@pytest.mark.parametrize("dtype,walk_chunks", [(F32, 1), (F16, 1), (F16, 2)], ids=["fp32", "fp16", "fp16-pairs"])
def test_walk_sums_the_gate_by_product(monkeypatch, spy_launches, dtype, walk_chunks):
    """bwd_gate_sums product: the walk inside a super-chunk takes the gate's sums of dS (a key's over the rows, a
    query row's over the keys) from products of its 16-bit dS with a ones column: the reducing walk's gradients up
    to that rounding (dg; the others unchanged), and the oracle's, over packed sequences with super-chunks of
    several chunks, GQA, the one-chunk and the two-chunk walk; the flag reaches the walk, only with a gate.  Column
    sums of the wrong sign are caught."""
    import pathtune.codegen.triton.bwd_intra as intra_mod
    from repo_scripts import load_benchmark_script

    lens = (90, 1, 79, 112)
    inputs, do = make_inputs(637, B=1, T=sum(lens), HQ=4, H=2, dtype=dtype, gate=True)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    base = dict(superchunk_size=64, bwd_walk_chunks=walk_chunks)
    shipped = kernel_grads(inputs, do, params(dtype, **base), cu_seqlens=cu)
    p = params(dtype, bwd_gate_sums="product", **base)
    walk = "bwd_intra_walk_pairs_kernel" if walk_chunks == 2 else "bwd_intra_walk_kernel"
    flags = spy_launches(tri_backward, walk, lambda grid, kw: kw["GATE_SUM_MMA"])
    got = kernel_grads(inputs, do, p, cu_seqlens=cu)
    assert flags == [True]
    for name, a, b in zip(NAMES, got, shipped):
        assert rel(a, b) < (1e-5 if dtype == F32 else 2e-3), (name, rel(a, b))
    check(got, oracle_grads(inputs, do, cu_seqlens=cu), TOL[dtype])
    kernel_grads(inputs[:5] + (None,), do, p, cu_seqlens=cu)
    assert flags == [True, False]
    kv = load_benchmark_script(monkeypatch, "benchmarks/kernel_variants.py")
    mutant = kv.load_variant(kv.module_source(intra_mod), walk, "walk_gate_sums_sign",
                             [("_acc(dc_h + krows, -tl.sum(mm(dsdT", "_acc(dc_h + krows, tl.sum(mm(dsdT")])
    monkeypatch.setattr(tri_backward, walk, mutant)
    bad = kernel_grads(inputs, do, p, cu_seqlens=cu)
    assert max(rel(a, b) for a, b in zip(bad, shipped) if b is not None) > CAUGHT


def test_walk_launch_follows_the_knob():
    """backward.intra_walk_launch: bwd_walk_chunks 2 runs the pairs walk on 8 warps and one stage up to padded head
    dim 128 (whatever bwd_num_warps says), one chunk per program above it and at 1; params without the bwd knobs
    take the spec default (1); other values fail when the params are built."""
    B = tri_backward
    two = B.TritonBwdParams(bwd_walk_chunks=2, bwd_num_warps=4)
    assert B.intra_walk_launch(two, 64, 2) == (B.bwd_intra_walk_pairs_kernel, 8, 1)
    assert B.intra_walk_launch(two, 128, 4) == (B.bwd_intra_walk_pairs_kernel, 8, 1)
    assert B.intra_walk_launch(two, 256, 2) == (B.bwd_intra_walk_kernel, 4, B.intra_walk_stages(256, 2))
    for one in (B.TritonBwdParams(bwd_num_warps=8), TritonParams(bwd_num_warps=8)):
        assert B.intra_walk_launch(one, 128, 2) == (B.bwd_intra_walk_kernel, 8, B.intra_walk_stages(128, 2))
    with pytest.raises(ValueError, match="bwd_walk_chunks must be 1 or 2"):
        B.TritonBwdParams(bwd_walk_chunks=3)


@pytest.mark.parametrize("ranged,varlen", [(False, True), (True, False)], ids=["one-range-varlen", "ranged-dense"])
def test_transport_gradients_fill_their_unzeroed_buffers(monkeypatch, ranged, varlen):
    """dK~, dW, dU of a token range and dY are carved without a memset: the transport backward stores every row of
    the first three (zeros in a sequence's last super-chunk), the dq kernel every row of dY (zeros in a sequence's
    first).  Poisoned with NaN here, so a row nobody stores shows in the gradients: packed sequences of one, two and
    three super-chunks with partial last ones, several ranges or one.  The gradients are the oracle's; the
    transport kernel without its zero stores is caught, and so is the dq kernel without its."""
    import pathtune.codegen.triton.bwd_chain as chain_mod
    import pathtune.codegen.triton.bwd_inter as inter_mod
    from repo_scripts import ROOT

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import kernel_variants as kv

    carve = tri_backward._carve
    poisoned = []

    def nan_carve(shapes, dtype, device, *, zero):
        out = carve(shapes, dtype, device, zero=zero)
        if not zero:
            for t in out:
                t.fill_(float("nan"))
            poisoned.append(len(out))
        return out

    monkeypatch.setattr(tri_backward, "_carve", nan_carve)
    _ranges(monkeypatch, ranged)
    inputs, do = make_inputs(907, B=1 if varlen else 2, T=170 if varlen else 150, HQ=4, H=2, gate=True)
    kw = dict(cu_seqlens=torch.tensor([0, 40, 130, 170], dtype=torch.int32)) if varlen else {}
    p = params(superchunk_size=32, chunk_size=16)
    got = kernel_grads(inputs, do, p, **kw)
    assert sorted(set(poisoned)) == [1, 3], poisoned      # dY; each range's dK~, dW, dU
    check(got, oracle_grads(inputs, do, **kw), TOL[F32])
    src = kv.module_source(inter_mod)
    start = src.index("    elif DB == BD:  # a sequence's first super-chunk")
    cut = src[start:src.index("@triton.jit\ndef _dkv_superchunk(")]
    no_zero_dy = kv.load_variant_module(src, "dq_no_zero_stores", [(cut, "\n\n")])
    monkeypatch.setattr(tri_backward, "bwd_inter_dq_kernel", no_zero_dy.bwd_inter_dq_kernel)
    with pytest.raises(AssertionError):     # kernel_grads: every gradient finite
        kernel_grads(inputs, do, p, **kw)
    monkeypatch.setattr(tri_backward, "bwd_inter_dq_kernel", inter_mod.bwd_inter_dq_kernel)
    src = kv.module_source(chain_mod)
    last = "        tl.store(dkt_ptr + off, zero, mask=zmask)\n"
    cut = src[src.index("    else:   # the sequence's last super-chunk"):src.index(last) + len(last)]
    bad = kv.load_variant_module(src, "transport_no_zero_stores", [(cut, "")])
    monkeypatch.setattr(tri_backward, "bwd_transport_grads_kernel", bad.bwd_transport_grads_kernel)
    with pytest.raises(AssertionError):     # kernel_grads: every gradient finite
        kernel_grads(inputs, do, p, **kw)


@pytest.mark.parametrize("dtype,ranged,gate", [(F16, True, True), (F32, False, False)], ids=["fp16-ranged-gate",
                                                                                            "fp32-one-range"])
def test_transport_backward_on_16_bit_operands(monkeypatch, spy_launches, dtype, ranged, gate):
    """bwd_transition_precision fp16: the transport backward's two kernels on 16-bit operands with the gradients
    scaled by powers of two, the backward's other transition products at tf32.  The gradients are the tf32
    config's up to the 16-bit rounding and the oracle's (at the 16-bit tolerance), over packed sequences of several
    super-chunks (partial ones), GQA; in float32 with the output's gradient scaled by 2^-30 (under fp16's smallest
    subnormal: without the scales every transport product would be zero).  The same kernels without the chain's
    scales, or storing G_m in its scaled units, are caught."""
    import pathtune.codegen.triton.bwd_chain as chain_mod
    from repo_scripts import ROOT

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import kernel_variants as kv

    inputs, do = make_inputs(733, B=1, T=170, HQ=4, H=2, dtype=dtype, gate=gate)
    if dtype == F32:
        do = do * 2.0 ** -30
    cu = torch.tensor([0, 90, 91, 170], dtype=torch.int32)
    _ranges(monkeypatch, ranged)
    tps = {name: spy_launches(tri_backward, name, lambda grid, kw: kw["TP"]) for name in (
        "bwd_transport_chain_kernel", "bwd_transport_grads_kernel", "bwd_inter_dkv_kernel", "bwd_intra_diag_kernel")}
    tf32 = kernel_grads(inputs, do, params(dtype, superchunk_size=64, bwd_transition_precision="tf32"), cu_seqlens=cu)
    p = params(dtype, superchunk_size=64, bwd_transition_precision="fp16")
    got = kernel_grads(inputs, do, p, cu_seqlens=cu)
    for name, seen in tps.items():      # the transport backward at fp16, every other transition product at tf32
        n = len(seen) // 2
        assert seen[:n] == ["tf32"] * n and seen[n:] == ["fp16" if "transport" in name else "tf32"] * n, (name, seen)
    for name, a, b in zip(NAMES, got, tf32):
        if b is not None:
            assert rel(a, b) < 2e-3, (name, rel(a, b))
    check(got, oracle_grads(inputs, do, cu_seqlens=cu), TOL[F16])
    for tag, edit in (("unscaled_store", ("G * tl.exp2(gexp)[:, None])", "G)")),
                      ("no_scales", ("gexp = _pow2_floor(amax) + 6.0", "gexp = amax * 0.0"))):
        wrong = kv.load_variant_module(kv.module_source(chain_mod), f"bwd_chain_{tag}", [edit])
        with monkeypatch.context() as m:
            m.setattr(tri_backward, "bwd_transport_chain_kernel", wrong.bwd_transport_chain_kernel)
            bad = kernel_grads(inputs, do, p, cu_seqlens=cu)
        caught = max(rel(a, b) for a, b in zip(bad, tf32) if b is not None) > CAUGHT
        assert caught or (tag == "no_scales" and dtype == F16), tag
