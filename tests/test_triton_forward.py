"""Triton forward (codegen/triton) against the float64 oracle ``naive_path_attention``.

Runs the real Triton kernels in Triton's CPU interpreter (``TRITON_INTERPRET=1``, exported by
.ci/run; it must be set before triton is imported, so the module is skipped without it).

Every test draws fresh inputs from its own ``torch.Generator`` seed, rounds them to the kernel's
input dtype, and compares ``o`` and ``lse`` with the oracle evaluated in float64 on exactly those
rounded inputs: error = ||x - ref||_F / ||ref||_F per tensor.

Sizes are small (the interpreter is slow) but chosen so that several UT chunks AND several
super-chunks are exercised: chunk_size 16, superchunk_size 32 (or 64), block_n 16.

Measured errors (interpreter): float32 inputs + scan_precision tf32 ~3e-7, float16 + fp16 ~7e-4,
bfloat16 + bf16 ~1e-2 (the interpreter truncates float32 -> bfloat16 stores), hence the bounds.
Each gated test also checks that the oracle comparison can fail: the kernel output is far from
the oracle without the gate / with the other gate placement / with unclipped beta.
"""
from __future__ import annotations

import dataclasses
import os
import sys

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

from pathtune.codegen.triton import TritonParams, path_attention_triton  # noqa: E402
from pathtune.runtime.reference import naive_path_attention  # noqa: E402

F32, F16, BF16, F64 = torch.float32, torch.float16, torch.bfloat16, torch.float64
SCAN = {F32: "tf32", F16: "fp16", BF16: "bf16"}
TOL = {F32: 1e-5, F16: 2e-3, BF16: 3e-2}
# an error above this means "the test would have caught it" (>= 1000x the float32 tolerance)
CAUGHT = 1e-2


def rel(a, b):
    a, b = a.detach().to(F64), b.detach().to(F64)
    return ((a - b).norm() / b.norm()).item()


def make_inputs(seed, *, B=1, T=150, HQ=2, H=1, D=16, DV=16, dtype=F32, gate=False, beta_range=(1.5, 2.0)):
    """q, k, v in ``dtype``; w (unit rows), beta ~ U(beta_range), g = log U(0.9, 1) in float32."""
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
    return q, k, v, w, beta, g


def params(dtype=F32, **kw):
    base = dict(chunk_size=16, superchunk_size=32, block_n=16, bwd_block_n=16,
                scan_precision=SCAN[dtype])
    base.update(kw)
    return TritonParams(**base)


def oracle(q, k, v, w, beta, g, **kw):
    """Oracle in float64 on the given (already rounded) inputs -> (o, lse)."""
    return naive_path_attention(*(x.to(F64) if x is not None else None for x in (q, k, v, w, beta, g)),
                                return_lse=True, **kw)


def run(inputs, p, **kw):
    o, lse = path_attention_triton(*inputs, config=p, **kw)
    q, v = inputs[0], inputs[2]
    B, T, HQ, _ = q.shape
    assert o.shape == (B, T, HQ, v.shape[-1]) and o.dtype == q.dtype
    assert lse.shape == (B, T, HQ) and lse.dtype == F32
    assert torch.isfinite(o).all() and torch.isfinite(lse).all()
    return o, lse


def check(o, lse, o_ref, lse_ref, tol):
    eo, el = rel(o, o_ref), rel(lse, lse_ref)
    print(f"rel err o {eo:.2e} lse {el:.2e} (tol {tol:g})")
    assert eo < tol and el < tol, f"rel err o {eo:.3e}, lse {el:.3e} (tol {tol:g})"
    return eo, el


# ----------------------------------------------------------------------------- gate variants

@pytest.mark.parametrize("gate,placement", [(False, "inside_scale"), (True, "inside_scale"),
                                            (True, "outside_scale")],
                         ids=["nogate", "gate-inside", "gate-outside"])
def test_forward_gate_variants(gate, placement):
    """B=2, T=150: 10 UT chunks (last one partial), 5 super-chunks of 32 (last partial)."""
    x = make_inputs(100 + 2 * gate + (placement == "outside_scale"), B=2, T=150, gate=gate)
    o, lse = run(x, params(), gate_placement=placement)
    o_ref, lse_ref = oracle(*x, gate_placement=placement)
    check(o, lse, o_ref, lse_ref, TOL[F32])
    if gate:
        # the comparison can fail: dropping the gate, or the other placement, is far off
        o_nog, _ = oracle(*x[:5], None)
        other = "outside_scale" if placement == "inside_scale" else "inside_scale"
        o_oth, _ = oracle(*x, gate_placement=other)
        assert rel(o, o_nog) > CAUGHT and rel(o, o_oth) > CAUGHT


# ----------------------------------------------------------------------------- shapes

def test_forward_gqa():
    """HQ=4 query heads on H=2 kv heads: query head h reads kv head h // 2; gate per query head."""
    x = make_inputs(110, B=1, T=100, HQ=4, H=2, gate=True)
    o, lse = run(x, params())
    o_ref, lse_ref = oracle(*x)
    check(o, lse, o_ref, lse_ref, TOL[F32])
    # a wrong head mapping (h % H instead of h // G) would be caught
    q, k, v, w, beta, g = x
    perm = torch.tensor([0, 2, 1, 3])
    o_bad, _ = oracle(q[:, :, perm], k, v, w, beta, g[:, :, perm])
    assert rel(o, o_bad[:, :, perm]) > CAUGHT


@pytest.mark.parametrize("D,DV", [(24, 16), (16, 32)], ids=["D24-DV16", "D16-DV32"])
def test_forward_head_dims(D, DV):
    """D != DV; D=24 is not a power of two (padded to 32 inside the kernels)."""
    x = make_inputs(120 + D, B=1, T=100, HQ=2, H=1, D=D, DV=DV, gate=True)
    o, lse = run(x, params())
    check(o, lse, *oracle(*x), TOL[F32])


# ----------------------------------------------------------------------------- sequence lengths

@pytest.mark.parametrize("T,S", [(1, 32), (5, 32), (20, 32), (32, 32), (37, 32), (64, 32), (150, 64)],
                         ids=lambda v: str(v))
def test_forward_lengths(T, S):
    """One token; less than a chunk; one super-chunk (partial / exact); ragged T over 2 super-chunks
    (37); exactly 2 full super-chunks (64); 150 tokens over 3 super-chunks of 64 (last partial)."""
    x = make_inputs(130 + T, B=1, T=T, HQ=2, H=1, gate=True)
    o, lse = run(x, params(superchunk_size=S))
    check(o, lse, *oracle(*x), TOL[F32])


def test_forward_chunk32():
    """chunk_size 32 (superchunk 64, block_n 32): 5 chunks and 3 super-chunks at T=150."""
    x = make_inputs(140, B=1, T=150, HQ=2, H=1, gate=True)
    o, lse = run(x, params(chunk_size=32, superchunk_size=64, block_n=32))
    check(o, lse, *oracle(*x), TOL[F32])


@pytest.mark.parametrize("lens", [(150,), (70, 1, 100)], ids=["150", "70-1-100"])
def test_forward_inter_block_smaller_than_superchunk(lens):
    """The inter-super-chunk kernel with query tile block_m 16 < superchunk 64: several query
    blocks per super-chunk, a ragged last block, and blocks that end at a sequence boundary
    (their rows of the next sequence must be left alone)."""
    T = sum(lens)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32) if len(lens) > 1 else None
    x = make_inputs(170 + len(lens), B=1, T=T, HQ=2, H=1, gate=True)
    o, lse = run(x, params(superchunk_size=64, block_m=16), cu_seqlens=cu)
    check(o, lse, *oracle(*x, cu_seqlens=cu), TOL[F32])


def test_forward_beta_full_range():
    """beta ~ U(0, 2) (small and sign-flipping transitions mixed), no gate."""
    x = make_inputs(150, B=1, T=150, HQ=2, H=1, beta_range=(0.0, 2.0))
    o, lse = run(x, params())
    check(o, lse, *oracle(*x), TOL[F32])


# ----------------------------------------------------------------------------- varlen

@pytest.mark.parametrize("lens", [(70, 1, 79), (1, 100, 37)], ids=["70-1-79", "1-100-37"])
def test_forward_varlen(lens):
    """Packed sequences (one of length 1) == each sequence separately through the oracle.

    The gate's cumulative sum must restart at every sequence start, and nothing may cross a
    boundary (the unpacked oracle over the whole stream is far off)."""
    T = sum(lens)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    x = make_inputs(160 + lens[0], B=1, T=T, HQ=2, H=1, gate=True)
    o, lse = run(x, params(), cu_seqlens=cu)
    o_sep, l_sep = [], []
    for b_, e_ in zip(cu[:-1].tolist(), cu[1:].tolist()):
        o_s, l_s = oracle(*(t[:, b_:e_] for t in x))
        o_sep.append(o_s)
        l_sep.append(l_s)
    o_ref, lse_ref = torch.cat(o_sep, 1), torch.cat(l_sep, 1)
    check(o, lse, o_ref, lse_ref, TOL[F32])
    # the packed oracle agrees with the separate runs, the unsegmented one does not
    o_pk, _ = oracle(*x, cu_seqlens=cu)
    assert rel(o_pk, o_ref) < 1e-12
    o_whole, _ = oracle(*x)
    assert rel(o, o_whole) > CAUGHT


# ----------------------------------------------------------------------------- precisions

def test_forward_fp16():
    x = make_inputs(170, B=1, T=150, HQ=4, H=2, dtype=F16, gate=True)
    o, lse = run(x, params(F16))
    check(o, lse, *oracle(*x), TOL[F16])


def test_forward_fp16_nogate_varlen():
    cu = torch.tensor([0, 50, 51, 120], dtype=torch.int64)
    x = make_inputs(171, B=1, T=120, HQ=2, H=1, dtype=F16)
    o, lse = run(x, params(F16), cu_seqlens=cu)
    check(o, lse, *oracle(*x, cu_seqlens=cu), TOL[F16])


def test_forward_bf16_loose():
    """bfloat16 only with a loose bound: the interpreter truncates float32 -> bfloat16 stores."""
    x = make_inputs(180, B=1, T=100, HQ=2, H=1, dtype=BF16, gate=True)
    o, lse = run(x, params(BF16))
    check(o, lse, *oracle(*x), TOL[BF16])


@pytest.mark.parametrize("tp,tol", [("fp16", TOL[F16]), ("bf16", 5e-3)])
def test_forward_transition_precision_16bit(tp, tol):
    """transition_precision fp16 / bf16: the transport, X What_J and the diagonal tile's products on
    16-bit operands (``_ops.tdot``), over 5 super-chunks with GQA and the gate; the float32 mode on
    the same inputs is the comparison point (both near the oracle, and not identical)."""
    x = make_inputs(175, B=1, T=160, HQ=4, H=2, dtype=F16, gate=True)
    o, lse = run(x, params(F16, transition_precision=tp))
    check(o, lse, *oracle(*x), tol)
    o32, _ = run(x, params(F16, transition_precision="ieee"))
    assert 0 < rel(o, o32) < tol


def test_forward_compact_state():
    """A forward's own state holds U, K~ and w in the scan's 16-bit type (what its scan and transport
    read); the state the backward builds keeps them float32, and tf32 scans keep float32 too."""
    from pathtune.codegen.triton.forward import prepare_state

    q, k, v, w, beta, g = make_inputs(176, B=1, T=70, HQ=2, H=1, dtype=F16, gate=True)
    st = prepare_state(q, k, w, beta, g, cu_seqlens=None, params=params(F16), compact=True)
    assert st.u.dtype == st.kt.dtype == st.wd.dtype == F16 and st.m.dtype == F32
    assert torch.equal(st.wd, w.reshape(70, 1, 16).to(F16))
    full = prepare_state(q, k, w, beta, g, cu_seqlens=None, params=params(F16))
    assert full.u.dtype == full.kt.dtype == F32 and full.wd is None
    assert rel(st.u, full.u) < 1e-3 and rel(st.kt, full.kt) < 1e-3
    st32 = prepare_state(q, k, w, beta, g, cu_seqlens=None, params=params(F32), compact=True)
    assert st32.u.dtype == F32 and st32.wd is None


@pytest.mark.parametrize("lens", [(2, 3000), (1, 7, 2600, 1, 392)], ids=["dense", "varlen"])
def test_gate_cumsum_kernel(lens):
    """The Triton gate cumsum (spans of GATE_CUMSUM_SPAN tokens in parallel, tiles of 64 tokens, a compensated
    running total) equals the float64 cumsum to about one float32 ulp of the largest |c|,
    restarting at every sequence start; HQ = 5 exercises the masked head lanes."""
    from pathtune.codegen.triton._layout import GATE_CUMSUM_SPAN, _gate_cumsum_torch, gate_cumsum

    assert max(lens) > 2 * GATE_CUMSUM_SPAN      # several spans per sequence
    gen = torch.Generator().manual_seed(177)
    if lens[0] == 2:      # dense [2, 3000, 5]
        g, cu = torch.log(0.95 + 0.05 * torch.rand(2, 3000, 5, generator=gen)), None
    else:
        g = torch.log(0.95 + 0.05 * torch.rand(1, sum(lens[1:]), 5, generator=gen))
        cu = torch.tensor([0] + list(lens[1:]), dtype=torch.int64).cumsum(0)
    c = gate_cumsum(g, cu)
    ref = _gate_cumsum_torch(g.double(), cu).double() if cu is None else _ref_varlen(g, cu)
    assert c.dtype == F32 and c.shape == g.shape and c.is_contiguous()
    err = (c.double() - ref).abs().max().item()
    assert err <= 4 * torch.finfo(F32).eps * ref.abs().max().item(), err
    if cu is not None:
        for t in cu[:-1].tolist():   # each sequence restarts
            assert c[0, t].equal(g[0, t])
    # head-major [HQ, B * T]: the same values, from the kernel and from the float64 torch version
    hm = gate_cumsum(g, cu, head_major=True)
    assert hm.shape == (5, g.shape[0] * g.shape[1]) and hm.is_contiguous()
    assert hm.equal(c.reshape(-1, 5).t())
    hm64 = _gate_cumsum_torch(g.double(), cu, head_major=True)
    assert hm64.shape == hm.shape and hm64.equal(_gate_cumsum_torch(g.double(), cu).reshape(-1, 5).t())


def _ref_varlen(g, cu):
    out = torch.empty_like(g, dtype=F64)
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        out[:, a:b] = g[:, a:b].double().cumsum(1)
    return out


def test_dense_tables_cached():
    """A dense batch's tables are built once per shape (no host work, no copies on later calls)."""
    from pathtune.codegen.triton._layout import build_tables

    a = build_tables(2, 300, None, 16, 64, torch.device("cpu"), block_m=32)
    assert build_tables(2, 300, None, 16, 64, "cpu", block_m=32) is a
    assert build_tables(2, 301, None, 16, 64, "cpu", block_m=32) is not a
    assert a.n_chunks == 2 * 19 and a.chunk_tok0[19].item() == 300


# ----------------------------------------------------------------------------- beta clip

def test_forward_beta_clip():
    """beta_clip_eps: the kernels compute the oracle on min(beta, 2 - eps).

    beta ~ U(1.9, 2) so that ~16% of the betas are clipped and the clip is visible (the
    unclipped oracle is farther away than the tolerance by orders of magnitude)."""
    eps = 0.015625
    x = make_inputs(190, B=1, T=150, HQ=2, H=1, gate=True, beta_range=(1.9, 2.0))
    q, k, v, w, beta, g = x
    assert (beta > 2 - eps).float().mean() > 0.05
    o, lse = run(x, params(beta_clip_eps=eps))
    o_ref, lse_ref = oracle(q, k, v, w, beta.clamp(max=2 - eps), g)
    eo, _ = check(o, lse, o_ref, lse_ref, TOL[F32])
    o_unclipped, _ = oracle(*x)
    assert rel(o, o_unclipped) > 100 * max(eo, 1e-7)


# ----------------------------------------------------------------------------- public API

@pytest.mark.parametrize("gate", [False, True], ids=["nogate", "gate"])
def test_public_api_triton_backend(gate):
    """pathtune.path_attention(..., backend="triton") on CPU tensors (allowed by TRITON_INTERPRET=1):
    spec defaults (chunk 64, scan fp16), spec head dim 32, float32 inputs, T=100 (2 chunks)."""
    import pathtune

    x = make_inputs(200 + gate, B=2, T=100, HQ=2, H=1, D=32, DV=32, gate=gate)
    o, lse = pathtune.path_attention(*x, backend="triton", return_lse=True)
    assert o.shape == (2, 100, 2, 32) and o.dtype == F32 and lse.dtype == F32
    o_ref, lse_ref = oracle(*x)
    check(o, lse, o_ref, lse_ref, TOL[F16])  # default scan_precision is fp16
    # same numbers as the direct entry point with the spec's default parameters
    o2, lse2 = path_attention_triton(*x, config=None)
    assert torch.equal(o, o2) and torch.equal(lse, lse2)


@pytest.mark.parametrize("C,ut_precision,D", [(32, "tf32x3", 32), (64, "tf32x3", 32), (128, "tf32x3", 32),
                                               (64, "tf32", 32), (64, "tf32x3", 96), (32, "tf32x3", 128)])
def test_ut_stage_against_reference(C, ut_precision, D):
    """The UT stage alone (U, K~, M of every chunk) at the GPU chunk sizes, vs the float64
    reference ut_transform: the blocked inverse combines C / 16 diagonal blocks; D = 96 and 128
    span two 64-wide column blocks (ut_chunk accumulates over them, ut_apply splits over them;
    96 masks half of the second)."""
    from pathtune.codegen.triton.forward import prepare_state
    from pathtune.runtime.reference.blockwise import boundary_adjust_keys, ut_transform

    T = C + C // 2 + 3  # one full chunk and a ragged one
    x = make_inputs(190 + C + D, B=1, T=T, HQ=1, H=1, D=D, DV=32, gate=False)
    q, k, v, w, beta, _ = x
    st = prepare_state(q, k, w, beta, None, cu_seqlens=None,
                       params=params(chunk_size=C, superchunk_size=2 * C, block_n=16, ut_precision=ut_precision))
    for c0 in range(0, T, C):
        sl = slice(c0, min(c0 + C, T))
        W, b, K = w[0, sl, 0].to(F64), beta[0, sl, 0].to(F64), k[0, sl, 0].to(F64)
        A, U = ut_transform(W, b)
        n = W.shape[0]
        assert rel(st.u[sl, 0], U) < 1e-5
        assert rel(st.kt[sl, 0], boundary_adjust_keys(K, W, A)) < 1e-5
        M = A @ torch.tril(W @ K.T, -1)
        assert rel(st.m[sl, 0, :n], M) < 1e-5


@pytest.mark.parametrize("dtype,C,D,parallel,diag_block", [
    (torch.bfloat16, 64, 64, False, 16), (torch.float16, 64, 96, False, 16), (torch.bfloat16, 64, 32, True, 16),
    (torch.bfloat16, 32, 128, False, 16), (torch.bfloat16, 64, 64, True, 8), (torch.float16, 64, 64, True, 8)])
def test_ut_fused_16bit_inputs(dtype, C, D, parallel, diag_block):
    """The forward's one-launch UT stage on 16-bit w / k (its W W^T and W K^T on 16-bit tensor cores,
    A W and M^T W as two 16-bit passes of A = hi + lo): U, K~, M vs float64 on the same rounded inputs,
    and equal to the three-launch path (ut_forward, float32 products) to float32-level error.
    ``parallel``: the w of a chunk nearly parallel at beta = 2 (the ill-conditioned case of the
    diagonal substitution; with 8-row blocks more of the inverse comes from the merge products)."""
    from pathtune.codegen.triton._layout import build_tables
    from pathtune.codegen.triton.forward import ut_apply_mode, ut_forward, ut_fused
    from pathtune.runtime.reference.blockwise import boundary_adjust_keys, ut_transform

    T, H = C + C // 2 + 3, 2
    g = torch.Generator().manual_seed(C + D + parallel)
    w = torch.randn(T, H, D, generator=g)
    if parallel:
        w = w[:1] + 0.02 * torch.randn(T, H, D, generator=g)
    w = F.normalize(w, dim=-1).to(dtype)
    k = torch.randn(T, H, D, generator=g).to(dtype)
    beta = (torch.full((T, H), 2.0) if parallel else 1.5 + 0.5 * torch.rand(T, H, generator=g)).to(dtype)
    p = params(chunk_size=C, superchunk_size=2 * C, block_n=16, ut_diag_block=diag_block)
    assert ut_apply_mode(p, torch.float16) == "split"
    assert ut_apply_mode(p, torch.float32) == p.ut_precision     # the backward's float32 state
    tables = build_tables(1, T, None, C, 2 * C, torch.device("cpu"), block_m=p.block_m)
    u, kt, m, wd = ut_fused(k, w, beta, tables, H, D, C, p, write_w=True, out_dtype=torch.float32,
                            apply_mode="split")
    u3, kt3, m3, _, _ = ut_forward(k, w, beta, tables, H, D, C, p)
    assert torch.equal(wd, w.float())
    # A's hi + lo split keeps 16 (bf16) / 22 (fp16) bits; nearly parallel w amplify every rounding (the
    # float32 three-launch path loses digits there too: its own error is the yardstick); below the
    # half-ulp of the fp16 store (2.4e-4) that the split feeds; the block merges at fp16x3 (22 bits) add
    # ~2e-6 at the nearly parallel bf16 case's conditioning (4.2e-5 there against 4.0e-5 at exact float32)
    tol = 6e-5 if dtype == torch.bfloat16 else 1e-6
    for c0 in range(0, T, C):
        sl = slice(c0, min(c0 + C, T))
        for h in range(H):
            W, b, K = w[sl, h].to(F64), beta[sl, h].to(F64), k[sl, h].to(F64)
            A, U = ut_transform(W, b)
            Kt, M = boundary_adjust_keys(K, W, A), A @ torch.tril(W @ K.T, -1)
            n = W.shape[0]
            for mine, three, ref, t in ((u[sl, h], u3[sl, h], U, tol), (kt[sl, h], kt3[sl, h], Kt, tol),
                                        (m[sl, h, :n], m3[sl, h, :n], M, 1e-5)):
                assert rel(mine, ref) < min(max(t, 8 * rel(three, ref)), 2.4e-4), (rel(mine, ref), rel(three, ref))


def _ut_stage_reference(w, k, beta, cu, C, out_dtype):
    """(U, K~, M) [N, H, *] of the UT stage in float64 per sequence of ``cu``, chunked from each
    sequence's start, on w rounded as the kernels take it for a state of ``out_dtype``."""
    from pathtune.runtime.reference.blockwise import ut_stage_tokens

    w_in = w.to(out_dtype).float() if out_dtype != torch.float32 else w
    refs = ([], [], [])
    for s0, s1 in zip(cu[:-1].tolist(), cu[1:].tolist()):
        n = s1 - s0
        pad = (-n) % C
        wp = F.pad(w_in[s0:s1], (0, 0, 0, 0, 0, pad))
        kp = F.pad(k[s0:s1].float(), (0, 0, 0, 0, 0, pad))
        bp = F.pad(beta[s0:s1], (0, 0, 0, pad))
        for acc, x in zip(refs, ut_stage_tokens(wp, kp, bp, C)):
            acc.append(x[:n])
    return tuple(torch.cat(x) for x in refs)


@pytest.mark.parametrize("D,out_dtype,up,lens", [
    (64, torch.bfloat16, "tf32x3", None),
    (64, torch.float16, "tf32", None),
    (48, torch.float32, "tf32x3", (70, 1, 57)),
    (128, torch.bfloat16, "fp16x3", None),
], ids=["D64-bf16-tf32x3", "D64-fp16-tf32", "D48-fp32-varlen", "D128-bf16-fp16x3"])
def test_ut_fused_diag_block_8(D, out_dtype, up, lens):
    """ut_fused with 8-row diagonal blocks (the spec's ut_diag_block) gives the U, K~, M and w copy of
    the 16-row blocks: as close to a float64 evaluation of the same formulas, and close to the 16-row
    outputs.  Chunks of 64 (the default), a partial last chunk, varlen sequences whose chunks end
    mid-block; w unit-norm, beta in [1.5, 2)."""
    from pathtune.codegen.triton import forward as fwd
    from pathtune.codegen.triton._layout import build_tables

    diag_block = 8

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
    got = fwd.ut_fused(k, w, beta, tables, H, D, C, TritonParams(ut_precision=up, ut_diag_block=diag_block),
                       out_dtype=out_dtype, write_w=True)
    refs = _ut_stage_reference(w, k, beta, cu, C, out_dtype)
    for i, name in enumerate(("u", "kt", "m")):
        ref = refs[i]
        e_new, e_old, e_pair = rel(got[i], ref), rel(shipped[i], ref), rel(got[i], shipped[i])
        print(f"{name}: {diag_block}-row {e_new:.2e} 16-row {e_old:.2e} apart {e_pair:.2e}")
        assert e_new < 1.5 * e_old + 1e-6, (name, e_new, e_old)
        assert e_pair < 1e-2 if out_dtype != torch.float32 else e_pair < 1e-4, (name, e_pair)
    assert torch.equal(got[3], shipped[3])


# float32 state: rel. error bound against float64; 16-bit state: bound (the rounding of U, K~, M,
# amplified where the w of a block are nearly parallel at beta = 2)
_SUBSTITUTION_BOUNDS = {False: {torch.float32: 1e-6, torch.bfloat16: 1.6e-2},
                        True: {torch.float32: 1.2e-4, torch.bfloat16: 0.4}}


@pytest.mark.parametrize("diag_block,parallel,lens", [(16, False, (150,)), (8, True, (150,)), (16, True, (70, 1, 57)),
                                                       (8, False, (70, 1, 57)), (32, True, (70, 1, 57))])
def test_ut_fused_diagonal_substitution_against_float64(diag_block, parallel, lens):
    """The one-launch UT stage's diagonal-block substitution (a transposed [C, SB] inverse whose step
    products reduce inside one warp) at every ut_diag_block: U, K~ and M against the float64 evaluation
    for a float32 and a bf16 state, with a partial last chunk, varlen sequences whose chunks end mid-block,
    and w nearly parallel at beta = 2 (the ill-conditioned substitution); the w copy is w at the
    state's precision."""
    from pathtune.codegen.triton import forward as fwd
    from pathtune.codegen.triton._layout import build_tables

    H, C, D = 2, 64, 64
    N = sum(lens)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    g = torch.Generator().manual_seed(diag_block + len(lens) + parallel)
    w = torch.randn(N, H, D, generator=g)
    if parallel:
        w = w[:1] + 0.02 * torch.randn(N, H, D, generator=g)
    w = F.normalize(w, dim=-1)
    k = torch.randn(N, H, D, generator=g).to(torch.bfloat16)
    beta = torch.full((N, H), 2.0) if parallel else 1.5 + 0.5 * torch.rand(N, H, generator=g)
    p = TritonParams(ut_precision="tf32x3", ut_diag_block=diag_block)
    tables = build_tables(1, N, cu if len(lens) > 1 else None, C, p.superchunk_size, torch.device("cpu"),
                          block_m=p.block_m)
    for out_dtype in (torch.bfloat16, torch.float32):
        got = fwd.ut_fused(k, w, beta, tables, H, D, C, p, out_dtype=out_dtype, write_w=True)
        refs = _ut_stage_reference(w, k, beta, cu, C, out_dtype)
        for name, mine, ref in zip(("u", "kt", "m"), got[:3], refs):
            err = rel(mine, ref)
            print(f"{name} {out_dtype}: {err:.2e}")
            assert err < _SUBSTITUTION_BOUNDS[parallel][out_dtype], (name, out_dtype, err)
        assert rel(got[3], w) < (8e-3 if out_dtype == torch.bfloat16 else 1e-7)


@pytest.mark.parametrize("D", [16, 32])
def test_ut_fused_compact_state_more_tokens_than_dims(D):
    """The fused kernel's 16-bit state when a chunk holds more tokens than head dims (C = 64 > D: the w
    of a chunk are linearly dependent): U, K~ and M equal the float32 three-launch path's on the same
    fp16-rounded w, up to the fp16 store.  (``prepare_state`` sends padded head dims under 64 to the
    three-launch path on the GPU, ``UT_FUSED_MIN_BD``; the kernel's logic is still checked here.)"""
    from pathtune.codegen.triton._layout import build_tables
    from pathtune.codegen.triton.forward import ut_forward, ut_fused

    C, T, H = 64, 150, 2
    g = torch.Generator().manual_seed(D)
    w = F.normalize(torch.randn(T, H, D, generator=g), dim=-1)
    k = torch.randn(T, H, D, generator=g).to(torch.bfloat16)
    beta = 1.5 + 0.5 * torch.rand(T, H, generator=g)
    p = params(chunk_size=C, superchunk_size=2 * C, block_n=16)
    tables = build_tables(1, T, None, C, 2 * C, torch.device("cpu"), block_m=p.block_m)
    u, kt, m, wd = ut_fused(k, w, beta, tables, H, D, C, p, write_w=True, out_dtype=torch.float16)
    # the reference path on the same 16-bit rounded w the compact state uses
    u3, kt3, m3, _, _ = ut_forward(k, w.half().float(), beta, tables, H, D, C, p)
    assert torch.isfinite(u).all() and torch.isfinite(kt).all()
    assert rel(u, u3.double()) < 2e-3 and rel(kt, kt3.double()) < 2e-3 and rel(m, m3.double()) < 1e-4


# ----------------------------------------------------------------------------- wide head dims

def _record_transition_blocks(spy_launches):
    """(BD, DB) of every scan_inter_kernel launch (DB < BD: the column-blocked transition path)."""
    import pathtune.codegen.triton.forward as tri_forward

    return spy_launches(tri_forward, "scan_inter_kernel", lambda grid, kw: (kw["BD"], kw["DB"]))


def _misaligned_copy(t: torch.Tensor, offset: int) -> torch.Tensor:
    """A contiguous copy of t that starts ``offset`` elements into a larger buffer (not 16-byte aligned)."""
    buf = torch.empty(t.numel() + offset, dtype=t.dtype)
    buf[offset:] = t.reshape(-1)
    out = buf[offset:].view(t.shape)
    assert out.is_contiguous() and out.data_ptr() % 16 != 0
    return out


@pytest.mark.parametrize("D,DV,offset,tma", [(32, 32, 0, True), (32, 16, 0, True), (24, 32, 0, False),
                                             (32, 32, 1, False)],
                         ids=["D32-tma", "DV16-tma", "D24-block-pointers", "v-misaligned-block-pointers"])
def test_inter_key_loads_tma_or_block_pointers(spy_launches, D, DV, offset, tma):
    """scan_inter_kernel reads the transported keys and the values as TMA blocks where both head dims are
    their own powers of two and both tensors are 16-byte aligned, else with block pointers (D = 24; v a
    contiguous view one element into its buffer); both paths match the oracle (3 super-chunks, FoX gate)."""
    import pathtune.codegen.triton.forward as tri_forward

    seen = spy_launches(tri_forward, "scan_inter_kernel", lambda grid, kw: kw["TMA"])
    q, k, v, w, beta, g = make_inputs(230 + D + DV + offset, B=1, T=90, HQ=2, H=1, D=D, DV=DV, gate=True)
    if offset:
        v = _misaligned_copy(v, offset)
    o, lse = run((q, k, v, w, beta, g), params())
    check(o, lse, *oracle(q, k, v, w, beta, g), TOL[F32])
    assert seen == [tma], seen


def _far_gates(g, lens):
    """g with the first four tokens of each packed sequence forgetting hard (log gate -60): the gate cumsums, and
    so the keys' logit offsets, then sit ~ -240 away from zero (a bf16 copy of one is off by up to 1) while a
    query's offset minus its keys' stays small, so every later key keeps its weight."""
    g = g.clone()
    start = 0
    for n in lens:
        g[:, start:start + min(n, 4)] = -60.0
        start += n
    return g


@pytest.mark.parametrize("dtype,D,DV,offset,tma", [(F32, 32, 32, 0, True), (F16, 32, 32, 0, True),
                                                   (F32, 24, 32, 0, False), (F32, 32, 32, 1, False)],
                         ids=["tma", "fp16-tma", "D24-block-pointers", "v-misaligned-block-pointers"])
def test_gate_offsets_by_product(monkeypatch, spy_launches, dtype, D, DV, offset, tma):
    """gate_bias product: ``gate_parts_kernel`` writes the keys' gate offsets as three bf16 parts and both scans add
    them by a K = 16 product (TMA or pointer loads of the parts, as of their key tiles).  With offsets far from
    zero (``_far_gates``; packed sequences, GQA, three super-chunks in the longest): the oracle's o and lse, and the
    subtracting kernels' o to float32 rounding.  Parts holding the high part alone are caught."""
    import pathtune.codegen.triton.forward as tri_forward
    import pathtune.codegen.triton.gate_bias as tri_gate
    from repo_scripts import load_benchmark_script

    lens = (70, 9, 41)
    seen = spy_launches(tri_forward, "scan_inter_kernel", lambda grid, kw: (kw["TMA"], kw["GATE_MMA"]))
    seen_intra = spy_launches(tri_forward, "scan_intra_kernel", lambda grid, kw: kw["GATE_MMA"])
    q, k, v, w, beta, g = make_inputs(240 + D + DV + offset, B=1, T=sum(lens), HQ=4, H=2, D=D, DV=DV, dtype=dtype,
                                      gate=True)
    g = _far_gates(g, lens)
    if offset:
        v = _misaligned_copy(v, offset)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    x = (q, k, v, w, beta, g)
    product = {**params(dtype).__dict__, "gate_bias": "product"}
    o, lse = run(x, product, cu_seqlens=cu)
    o_ref, lse_ref = oracle(*x, cu_seqlens=cu)
    check(o, lse, o_ref, lse_ref, TOL[dtype])
    assert seen == [(tma, True)] and seen_intra == [True], (seen, seen_intra)
    o_sub, lse_sub = run(x, {**product, "gate_bias": "subtract"}, cu_seqlens=cu)
    assert rel(o, o_sub) < TOL[dtype] and rel(lse, lse_sub) < TOL[dtype]
    assert seen[-1] == (tma, False) and seen_intra[-1] is False
    kv = load_benchmark_script(monkeypatch, "benchmarks/kernel_variants.py")
    mutant = kv.load_variant_module(kv.module_source(tri_gate), "gate_parts_hi_only", [(
        "bias_parts(x), mask", "bias_parts(x.to(tl.bfloat16).to(tl.float32)), mask")])
    monkeypatch.setattr(tri_forward, "gate_parts_kernel", mutant.gate_parts_kernel)
    o_bad, _ = run(x, product, cu_seqlens=cu)
    assert rel(o_bad, o_ref) > 4 * TOL[dtype]      # fails the oracle check above with a margin (fp16: 6.8x)


def test_transition_column_block():
    """Padded head dims up to 128 keep one BD x BD transition product (DB == BD: the code path the
    D <= 128 kernels always had); 256 (D = 192 and 256) runs column blocks of 64."""
    from pathtune.codegen.triton.forward import transition_column_block

    assert [transition_column_block(bd) for bd in (16, 32, 64, 128)] == [16, 32, 64, 128]
    assert transition_column_block(256) == 64


@pytest.mark.parametrize("D,DV,HQ,H,lens", [(256, 256, 2, 1, None), (192, 64, 4, 2, None),
                                            (256, 128, 2, 1, (45, 1, 74))],
                         ids=["D256", "D192-DV64-gqa", "D256-DV128-varlen"])
def test_forward_wide_head_dims(monkeypatch, spy_launches, D, DV, HQ, H, lens):
    """D = 192 / 256 (padded to 256): the inter-super-chunk scan applies What_J in 64-column blocks.
    T = 120 over 4 super-chunks of 32 (varlen: 45 / 1 / 74 tokens, 2 + 1 + 3 super-chunks), FoX gate;
    D = 192 leaves the fourth column block empty, DV != D, GQA."""
    seen = _record_transition_blocks(spy_launches)
    T = sum(lens) if lens else 120
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32) if lens else None
    x = make_inputs(210 + D + DV + HQ, B=1, T=T, HQ=HQ, H=H, D=D, DV=DV, gate=True)
    o, lse = run(x, params(), cu_seqlens=cu)
    check(o, lse, *oracle(*x, cu_seqlens=cu), TOL[F32])
    assert seen == [(256, 64)], seen       # the column-blocked path ran


@pytest.mark.parametrize("D,DV,offset,stages,tma", [(32, 32, 0, 1, True), (32, 16, 0, 2, True), (24, 32, 0, 2, False),
                                                    (32, 32, 1, 1, False)],
                         ids=["D32-tma", "DV16-tma-2-stages", "D24-pointers-2-stages", "v-misaligned-pointers"])
def test_intra_walk_loads_tma_or_pointers(spy_launches, D, DV, offset, stages, tma):
    """scan_intra_kernel's walk over the earlier chunks of a super-chunk reads K~, W, U and V as TMA blocks
    where both head dims are their own powers of two and every tensor is 16-byte aligned, else with pointer
    tiles (D = 24; v a contiguous view one element into its buffer), pipelined over ``intra_num_stages``;
    every path matches the oracle: super-chunks of 4 chunks (walks of up to 3 steps), FoX gate, GQA, a
    sequence ending inside a chunk."""
    import pathtune.codegen.triton.forward as tri_forward

    seen = spy_launches(tri_forward, "scan_intra_kernel", lambda grid, kw: (kw["TMA"], kw["WALK_STAGES"]))
    q, k, v, w, beta, g = make_inputs(260 + D + DV + offset, B=1, T=90, HQ=4, H=2, D=D, DV=DV, gate=True)
    if offset:
        v = _misaligned_copy(v, offset)
    o, lse = run((q, k, v, w, beta, g), params(superchunk_size=64, intra_num_stages=stages))
    check(o, lse, *oracle(q, k, v, w, beta, g), TOL[F32])
    assert seen == [(tma, stages)], seen


@pytest.mark.slow
def test_ut_stage_compiles_under_a_register_cap_for_sm90():
    """compile_kernel's ``maxnreg`` (the kernel probe's --maxnreg): the UT stage at ut_precision tf32 compiles for
    sm_90 under caps of 168 and 128 registers, within them (3 or 4 programs per multiprocessor instead of 2)."""
    import subprocess
    import textwrap

    ptxas = os.path.join(os.path.dirname(__import__("triton").__file__), "backends", "nvidia", "bin", "ptxas")
    if not os.path.exists(ptxas):
        pytest.skip("Triton's bundled ptxas is missing")
    child = textwrap.dedent("""
        from dataclasses import replace
        from pathtune.codegen.triton import compile_check as cc
        from pathtune.codegen.triton.params import TritonParams
        for D in (64, 128):
            p = replace(TritonParams.heuristic(D, D), ut_precision="tf32")
            fn, sig, const, nw, ns = cc.forward_kernels(p, D, D)[0]
            assert fn.fn.__name__ == "ut_fused_kernel"
            for cap in (168, 128):
                r = cc.compile_kernel(fn, sig, const, num_warps=nw, num_stages=ns, aligned=True, maxnreg=cap)
                print("RESULT", D, cap, r.registers, r.spill_bytes, flush=True)
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [line.split()[1:] for line in res.stdout.splitlines() if line.startswith("RESULT")]
    assert len(rows) == 4
    for D, cap, regs, spills in rows:
        assert int(regs) <= int(cap), (D, cap, regs, spills)


@pytest.mark.parametrize("cu", [None, (0, 70, 71, 150)], ids=["dense-gqa", "varlen-gqa"])
def test_scan_intra_runs_one_program_per_chunk_and_head_on_a_flat_grid(monkeypatch, spy_launches, cu):
    """scan_intra_kernel's grid is (chunks * query heads,), each program's (chunk, head) from ``_ops.chunk_and_head``
    (heads fastest, chunks last to first): o and lse the oracle's over packed sequences of several super-chunks,
    GQA; the kernel with a wrong split of the program id into heads is caught."""
    import pathtune.codegen.triton.scan_fwd as scan_mod
    from candidate_helpers import WRONG_ORDER
    from pathtune.codegen.triton import forward as fwd
    from repo_scripts import ROOT

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import kernel_variants as kv

    kw = {} if cu is None else dict(cu_seqlens=torch.tensor(cu, dtype=torch.int32))
    x = make_inputs(733, B=1 if cu else 2, T=150, HQ=4, H=2, gate=True)
    p = params(superchunk_size=64)
    grids = spy_launches(fwd, "scan_intra_kernel")
    o0, l0 = run(x, p, **kw)
    n_chunks = 5 + 1 + 5 if cu else 2 * 10          # chunks of 16 tokens: 70, 1, 79 tokens; or 2 x 150
    assert grids == [(n_chunks * 4,)], grids
    check(o0, l0, *oracle(*x, **kw), TOL[F32])
    monkeypatch.setattr(fwd, "scan_intra_kernel", kv.load_variant(kv.module_source(scan_mod), "scan_intra_kernel",
                                                                  "scan_wrong_order", WRONG_ORDER))
    o2, l2 = path_attention_triton(*x, config=p, **kw)
    assert not (torch.isfinite(o2).all() and rel(o2, o0) < CAUGHT)


def test_transport_runs_64_row_programs(monkeypatch, spy_launches):
    """The super-chunk transport at D = 64 (several super-chunks, GQA, Dv != D): one 64-row program per super-chunk
    and kv head (``forward.transport_rows``), o and lse the oracle's.  Launched at 32 rows on that grid (half of
    Suf's rows never walked) it is caught."""
    from pathtune.codegen.triton import forward as fwd
    from pathtune.codegen.triton.transport import superchunk_transport_kernel as real

    x = make_inputs(741, B=1, T=200, HQ=2, H=1, D=64, DV=32, gate=True)
    p = params(superchunk_size=64)
    seen = spy_launches(fwd, "superchunk_transport_kernel", lambda grid, kw: (grid[2], kw["ROWS"]))
    o0, l0 = run(x, p)
    assert seen == [(1, 64)], seen
    check(o0, l0, *oracle(*x), TOL[F32])

    class HalfRows:
        def __getitem__(self, grid):
            return lambda *a, **kw: real[grid](*a, **dict(kw, ROWS=32))
    monkeypatch.setattr(fwd, "superchunk_transport_kernel", HalfRows())
    o2, _ = path_attention_triton(*x, config=p)
    assert not torch.isfinite(o2).all() or rel(o2, o0) > CAUGHT


@pytest.mark.parametrize("dtype,tp,m16", [(F16, "fp16", F16), (BF16, "bf16", BF16), (BF16, "fp16", F16)])
@pytest.mark.parametrize("diag_block", [8, 16])
def test_ut_stage_stores_m_in_the_scans_16bit_type(monkeypatch, dtype, tp, m16, diag_block):
    """Where the scan rounds M to a 16-bit transition type anyway (transition_precision fp16 / bf16, a compact
    state), the UT stage stores M in that type (``forward.ut_state_m_dtype``) with the diagonal inverse's scratch in
    U's rows, and the forward's o and lse are those of a float32 M bit for bit (packed sequences of several
    super-chunks, GQA, the gate); at tf32, and under bwd_forward_state keep (whose backward reads M as float32), M
    stays float32.  Scratch rows narrower than the diagonal blocks are caught."""
    from pathtune.codegen.triton import forward as fwd

    cu = torch.tensor((0, 70, 71, 150), dtype=torch.int32)
    x = make_inputs(737, B=1, T=150, HQ=4, H=2, D=64, DV=64, dtype=dtype, gate=True)
    p = params(dtype, superchunk_size=64, transition_precision=tp, ut_diag_block=diag_block)
    seen = []
    real_ut_fused = fwd.ut_fused

    def spy(*a, **kw):
        out = real_ut_fused(*a, **kw)
        seen.append(out[2].dtype)
        return out

    monkeypatch.setattr(fwd, "ut_fused", spy)
    o1, l1 = run(x, p, cu_seqlens=cu)
    assert seen == [m16]
    check(o1, l1, *oracle(*x, cu_seqlens=cu), TOL[dtype])
    with monkeypatch.context() as m:
        m.setattr(fwd, "ut_state_m_dtype", lambda *a: F32)
        o0, l0 = run(x, p, cu_seqlens=cu)
    assert seen == [m16, F32]
    assert torch.equal(o1, o0) and torch.equal(l1, l0)
    run(x, params(dtype, superchunk_size=64, transition_precision="tf32", ut_diag_block=diag_block), cu_seqlens=cu)
    assert seen[-1] == F32
    fwd.path_attention_fwd(*x, scale=64 ** -0.5, cu_seqlens=cu, params=dataclasses.replace(p, bwd_forward_state="keep"))
    assert seen[-1] == F32
    real_kernel = fwd.ut_fused_kernel

    class NarrowScratch:    # half a diagonal block's words a row: the blocks of neighbouring rows overlap
        def __getitem__(self, grid):
            return lambda *a, **kw: real_kernel[grid](*a, **dict(kw, RS=diag_block // 2))
    monkeypatch.setattr(fwd, "ut_fused_kernel", NarrowScratch())
    o2, _ = path_attention_triton(*x, config=p, cu_seqlens=cu)
    assert not (torch.isfinite(o2).all() and rel(o2, o0) < CAUGHT)
