"""CPU float64 tests of pathtune.runtime.reference (naive oracle, blockwise spec, decoding)."""
from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

from pathtune.runtime.reference import (
    PaTHKVCache,
    apply_transition,
    blockwise_path_attention,
    boundary_adjust,
    chunk_transition,
    current_frame_keys,
    naive_path_attention,
    path_attention_decode,
    path_attention_decode_step,
    path_attention_prefill,
    superchunk_transport,
    ut_transform,
)

F64 = torch.float64
TOL = 1e-12


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def make_inputs(seed, B=2, T=37, HQ=4, H=2, D=8, DV=6, beta_range=(0.0, 2.0), gate=None,
                dtype=F64, requires_grad=False):
    """Fresh random inputs; gate in {None, 'decay' (g = log U(0.9,1)), 'long' (g = -U(0,0.5))}."""
    gen = torch.Generator().manual_seed(seed)

    def rn(*s):
        return torch.randn(*s, generator=gen, dtype=F64)

    def ru(lo, hi, *s):
        return lo + (hi - lo) * torch.rand(*s, generator=gen, dtype=F64)

    q, k, v = rn(B, T, HQ, D), rn(B, T, H, D), rn(B, T, H, DV)
    w = F.normalize(rn(B, T, H, D), dim=-1)
    lo, hi = beta_range
    beta = ru(lo, hi, B, T, H).clamp_min(1e-3)
    if gate is None:
        g = None
    elif gate == "decay":
        g = torch.log(ru(0.9, 1.0, B, T, HQ))
    elif gate == "long":
        g = -ru(0.0, 0.5, B, T, HQ)
    else:
        raise ValueError(gate)
    out = [x.to(dtype) if x is not None else None for x in (q, k, v, w, beta, g)]
    if requires_grad:
        for x in out:
            if x is not None:
                x.requires_grad_(True)
    return out


def householder(w, b):
    return torch.eye(w.shape[-1], dtype=w.dtype) - b * torch.outer(w, w)


def dense_logits(q, k, w, beta):
    """S[b,hq,i,j] = q_i^T (H_i ... H_{j+1}) k_j by explicit dense matrix products (j <= i)."""
    B, T, HQ, D = q.shape
    H = k.shape[2]
    G = HQ // H
    S = torch.zeros(B, HQ, T, T, dtype=q.dtype)
    for b in range(B):
        for h in range(H):
            Hs = [householder(w[b, t, h], beta[b, t, h]) for t in range(T)]
            for i in range(T):
                for j in range(i + 1):
                    P = functools.reduce(torch.matmul, [Hs[t] for t in range(i, j, -1)],
                                         torch.eye(D, dtype=q.dtype))
                    for gi in range(G):
                        S[b, h * G + gi, i, j] = q[b, i, h * G + gi] @ P @ k[b, j, h]
    return S


def dense_attention(q, k, v, w, beta, g, scale, placement):
    S = dense_logits(q, k, w, beta)
    T = q.shape[1]
    if g is not None:
        c = torch.cumsum(g, 1).transpose(1, 2)                         # [B,HQ,T]
        Dg = c[..., :, None] - c[..., None, :]
        logits = scale * (S + Dg) if placement == "inside_scale" else scale * S + Dg
    else:
        logits = scale * S
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    logits = logits.masked_fill(~mask, float("-inf"))
    G = q.shape[2] // k.shape[2]
    vv = v.repeat_interleave(G, dim=2).transpose(1, 2)
    return (torch.softmax(logits, -1) @ vv).transpose(1, 2), torch.logsumexp(logits, -1).transpose(1, 2)


# ----------------------------------------------------------------------------- UT identities

def test_ut_identity_and_reverse_order():
    gen = torch.Generator().manual_seed(1)
    L, D = 16, 8
    W = F.normalize(torch.randn(L, D, generator=gen, dtype=F64), dim=-1)
    b = 2 * torch.rand(L, generator=gen, dtype=F64)
    A, U = ut_transform(W, b)
    fwd = torch.eye(D, dtype=F64)
    for t in range(L):
        fwd = householder(W[t], b[t]) @ fwd                      # H_{L-1} ... H_0
    rev = torch.eye(D, dtype=F64)
    for t in range(L):
        rev = rev @ householder(W[t], b[t])                      # H_0 ... H_{L-1}
    ut = torch.eye(D, dtype=F64) - W.T @ A @ W
    assert (fwd - ut).abs().max() < 1e-13
    assert torch.allclose(U, A @ W, atol=0, rtol=0)
    assert (chunk_transition(W, U) - fwd).abs().max() < 1e-13
    assert (rev - ut).abs().max() > 1e-3                          # the wrong order must not match
    assert (rev - (torch.eye(D, dtype=F64) - W.T @ A.T @ W)).abs().max() < 1e-13
    assert torch.equal(A, torch.tril(A))


def test_chunk_pieces_against_products():
    """Q~, K~, diagonal tile, low-rank transition and super-chunk transport vs dense products."""
    gen = torch.Generator().manual_seed(2)
    C, D, s = 6, 5, 3
    n = C * s
    W = F.normalize(torch.randn(n, D, generator=gen, dtype=F64), dim=-1)
    b = 1.5 + 0.5 * torch.rand(n, generator=gen, dtype=F64)
    Q = torch.randn(n, D, generator=gen, dtype=F64)
    K = torch.randn(n, D, generator=gen, dtype=F64)
    Hs = [householder(W[t], b[t]) for t in range(n)]
    eye = torch.eye(D, dtype=F64)

    def prod(hi, lo):                                            # H_hi ... H_lo (I if hi < lo)
        return functools.reduce(torch.matmul, [Hs[t] for t in range(hi, lo - 1, -1)], eye)

    Kt, P = [], []
    for m in range(s):
        sl = slice(m * C, (m + 1) * C)
        A, U = ut_transform(W[sl], b[sl])
        qt, kt, sd = boundary_adjust(Q[sl], K[sl], W[sl], A, U)
        first, last = m * C, (m + 1) * C - 1
        for r in range(C):
            i = first + r
            assert (qt[r] - Q[i] @ prod(i, first)).abs().max() < 1e-13
            assert (kt[r] - prod(last, i + 1) @ K[i]).abs().max() < 1e-13
            for c_ in range(C):
                j = first + c_
                want = Q[i] @ prod(i, j + 1) @ K[j] if j <= i else torch.zeros((), dtype=F64)
                assert (sd[r, c_] - want).abs() < 1e-13
        X = torch.randn(3, D, generator=gen, dtype=F64)
        assert (apply_transition(X, W[sl], U) - X @ prod(last, first)).abs().max() < 1e-13
        Kt.append(kt)
        P.append(chunk_transition(W[sl], U))
    KJ, What = superchunk_transport(Kt, P)
    assert (What - prod(n - 1, 0)).abs().max() < 1e-13
    for m in range(s):
        for r in range(C):
            j = m * C + r
            assert (KJ[m][r] - prod(n - 1, j + 1) @ K[j]).abs().max() < 1e-13


# ----------------------------------------------------------------------------- oracle itself

@pytest.mark.parametrize("gate,placement", [(None, "inside_scale"), ("long", "inside_scale"),
                                            ("decay", "outside_scale")])
def test_naive_matches_dense_products(gate, placement):
    q, k, v, w, beta, g = make_inputs(10, B=1, T=7, HQ=4, H=2, D=4, DV=3, gate=gate)
    scale = 0.7
    o_ref, lse_ref = dense_attention(q, k, v, w, beta, g, scale, placement)
    o, lse = naive_path_attention(q, k, v, w, beta, g, scale=scale, gate_placement=placement,
                                  return_lse=True)
    assert rel(o, o_ref) < TOL and rel(lse, lse_ref) < TOL


def test_naive_reduces_to_fox_attention_when_beta_zero():
    """beta = 0 -> H_t = I: PaTH-FoX is plain softmax attention + (c_i - c_j)."""
    q, k, v, w, beta, g = make_inputs(11, B=1, T=9, HQ=2, H=1, D=4, DV=3, gate="long")
    beta = torch.zeros_like(beta)
    scale = 0.5
    c = torch.cumsum(g, 1).transpose(1, 2)
    qk = q.transpose(1, 2) @ k.transpose(1, 2).repeat_interleave(2, 1).transpose(-1, -2)
    Dg = c[..., :, None] - c[..., None, :]
    mask = torch.ones(9, 9, dtype=torch.bool).tril()
    vv = v.repeat_interleave(2, 2).transpose(1, 2)
    for placement, logits in [("inside_scale", scale * (qk + Dg)), ("outside_scale", scale * qk + Dg)]:
        ref = (torch.softmax(logits.masked_fill(~mask, float("-inf")), -1) @ vv).transpose(1, 2)
        o = naive_path_attention(q, k, v, w, beta, g, scale=scale, gate_placement=placement)
        assert rel(o, ref) < TOL
    # the two placements really differ when scale != 1
    assert rel(naive_path_attention(q, k, v, w, beta, g, scale=scale),
               naive_path_attention(q, k, v, w, beta, g, scale=scale, gate_placement="outside_scale")) > 1e-3


# ----------------------------------------------------------------------------- blockwise vs naive

BLOCKWISE_CASES = [
    # seed, T, HQ, H, D, DV, beta_range, gate, placement, chunk, superchunk
    (20, 37, 4, 2, 8, 6, (0.0, 2.0), None, "inside_scale", 8, 8),
    (21, 37, 4, 2, 8, 6, (1.5, 2.0), "decay", "inside_scale", 8, 32),
    (22, 100, 2, 2, 6, 4, (1.5, 2.0), "long", "inside_scale", 16, 64),
    (23, 100, 4, 1, 4, 7, (0.0, 2.0), "decay", "outside_scale", 8, 16),
    (24, 37, 2, 1, 5, 5, (1.5, 2.0), "long", "outside_scale", 4, 4),
    (25, 100, 4, 2, 8, 3, (0.0, 2.0), None, "inside_scale", 32, 32),
    (26, 37, 4, 2, 8, 6, (0.0, 2.0), "decay", "inside_scale", 64, 256),   # one chunk, padded
]


@pytest.mark.parametrize("case", BLOCKWISE_CASES,
                         ids=lambda c: f"T{c[1]}-HQ{c[2]}H{c[3]}-{c[7]}-{c[8][:3]}-C{c[9]}S{c[10]}")
def test_blockwise_matches_naive(case):
    seed, T, HQ, H, D, DV, br, gate, placement, C, SC = case
    q, k, v, w, beta, g = make_inputs(seed, B=2, T=T, HQ=HQ, H=H, D=D, DV=DV, beta_range=br, gate=gate)
    o_ref, lse_ref = naive_path_attention(q, k, v, w, beta, g, gate_placement=placement, return_lse=True)
    o, lse = blockwise_path_attention(q, k, v, w, beta, g, chunk_size=C, superchunk_size=SC,
                                      gate_placement=placement)
    assert o.shape == (2, T, HQ, DV) and lse.shape == (2, T, HQ)
    assert rel(o, o_ref) < TOL and rel(lse, lse_ref) < TOL


@pytest.mark.parametrize("gate", [None, "long"])
def test_varlen_matches_separate_sequences(gate):
    lens = [13, 41, 22]
    cu = torch.tensor([0, 13, 54, 76])
    q, k, v, w, beta, g = make_inputs(30, B=1, T=sum(lens), HQ=4, H=2, D=6, DV=5, gate=gate,
                                      beta_range=(1.5, 2.0))
    o_sep, l_sep = [], []
    for b_, e_ in zip(cu[:-1].tolist(), cu[1:].tolist()):
        args = [x[:, b_:e_] if x is not None else None for x in (q, k, v, w, beta, g)]
        o_s, l_s = naive_path_attention(*args, return_lse=True)
        o_sep.append(o_s)
        l_sep.append(l_s)
    o_ref, l_ref = torch.cat(o_sep, 1), torch.cat(l_sep, 1)
    o_n, l_n = naive_path_attention(q, k, v, w, beta, g, cu_seqlens=cu, return_lse=True)
    o_b, l_b = blockwise_path_attention(q, k, v, w, beta, g, cu_seqlens=cu, chunk_size=4,
                                        superchunk_size=16)
    assert rel(o_n, o_ref) < TOL and rel(l_n, l_ref) < TOL
    assert rel(o_b, o_ref) < TOL and rel(l_b, l_ref) < TOL
    # packing must matter: the unsegmented result differs
    assert rel(naive_path_attention(q, k, v, w, beta, g), o_ref) > 1e-3


def test_float32_inputs():
    q, k, v, w, beta, g = make_inputs(31, B=1, T=40, gate="decay", dtype=torch.float32)
    o_ref = naive_path_attention(*[x.double() for x in (q, k, v, w, beta, g)])
    o_n, l_n = naive_path_attention(q, k, v, w, beta, g, return_lse=True)
    o_b, l_b = blockwise_path_attention(q, k, v, w, beta, g, chunk_size=8, superchunk_size=16)
    assert o_n.dtype == o_b.dtype == torch.float32 and l_n.dtype == l_b.dtype == torch.float32
    assert rel(o_n.double(), o_ref) < 1e-5 and rel(o_b.double(), o_ref) < 1e-5


def test_bad_arguments():
    q, k, v, w, beta, g = make_inputs(32, B=2, T=5)
    with pytest.raises(ValueError):
        blockwise_path_attention(q, k, v, w, beta, chunk_size=8, superchunk_size=12)
    with pytest.raises(ValueError):
        naive_path_attention(q, k, v, w, beta, cu_seqlens=torch.tensor([0, 2, 5]))   # B != 1
    with pytest.raises(ValueError):
        naive_path_attention(q, k, v, w, beta, gate_placement="after")


# ----------------------------------------------------------------------------- decoding

def frame_keys_by_products(k, w, beta, t):
    """k_j^(t) = H_t ... H_{j+1} k_j for j <= t via dense suffix products."""
    B, T, H, D = k.shape
    out = torch.zeros(B, t + 1, H, D, dtype=k.dtype)
    for b in range(B):
        for h in range(H):
            Suf = torch.eye(D, dtype=k.dtype)                      # H_t ... H_{j+1}
            for j in range(t, -1, -1):
                out[b, j, h] = Suf @ k[b, j, h]
                Suf = Suf @ householder(w[b, j, h], beta[b, j, h])
    return out


@pytest.mark.parametrize("gate,placement,max_len", [(None, "inside_scale", None),
                                                     ("decay", "inside_scale", 64),
                                                     ("long", "outside_scale", None)])
def test_prefill_then_decode_matches_naive(gate, placement, max_len):
    T, T0 = 29, 18
    q, k, v, w, beta, g = make_inputs(40, B=2, T=T, HQ=4, H=2, D=6, DV=5, gate=gate,
                                      beta_range=(1.5, 2.0))
    o_ref, lse_ref = naive_path_attention(q, k, v, w, beta, g, gate_placement=placement, return_lse=True)
    sl = lambda x, a, b_: None if x is None else x[:, a:b_]   # noqa: E731
    o_pre, cache = path_attention_prefill(*[sl(x, 0, T0) for x in (q, k, v, w, beta, g)],
                                          gate_placement=placement, max_len=max_len, chunk_size=4,
                                          superchunk_size=8)
    assert cache.length == T0 and cache.gated == (g is not None)
    assert rel(cache.k[:, :T0], frame_keys_by_products(k, w, beta, T0 - 1)) < TOL
    assert rel(o_pre, o_ref[:, :T0]) < TOL
    outs = []
    for t in range(T0, T):                                       # single steps, then a block
        if t < T0 + 5:
            o_t, lse_t = path_attention_decode_step(
                q[:, t], k[:, t], v[:, t], w[:, t], beta[:, t], None if g is None else g[:, t],
                cache, gate_placement=placement, return_lse=True)
            assert rel(lse_t, lse_ref[:, t]) < TOL
            outs.append(o_t[:, None])
    outs.append(path_attention_decode(*[sl(x, T0 + 5, T) for x in (q, k, v, w, beta, g)], cache,
                                      gate_placement=placement))
    assert rel(torch.cat(outs, 1), o_ref[:, T0:]) < TOL
    assert cache.length == T
    assert rel(cache.k[:, :T], frame_keys_by_products(k, w, beta, T - 1)) < TOL
    assert rel(cache.v[:, :T], v) == 0.0
    if g is not None:
        assert rel(cache.c[:, :T], torch.cumsum(g, 1)) < TOL


def test_decode_from_empty_cache_and_time_dim():
    T = 9
    q, k, v, w, beta, g = make_inputs(41, B=1, T=T, HQ=2, H=1, D=4, DV=3, gate="long")
    o_ref = naive_path_attention(q, k, v, w, beta, g)
    cache = PaTHKVCache.empty(1, 1, 4, 3, 2, gated=True, dtype=F64, gate_dtype=F64)
    outs = [path_attention_decode_step(q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], w[:, t:t + 1],
                                       beta[:, t:t + 1], g[:, t:t + 1], cache) for t in range(T)]
    assert outs[0].shape == (1, 1, 2, 3)
    assert rel(torch.cat(outs, 1), o_ref) < TOL


def test_current_frame_keys_linear_scan():
    q, k, v, w, beta, g = make_inputs(42, B=1, T=23, HQ=2, H=2, D=5, DV=3, beta_range=(1.5, 2.0))
    for C in (4, 8, 64):
        assert rel(current_frame_keys(k, w, beta, chunk_size=C),
                   frame_keys_by_products(k, w, beta, 22)) < TOL


# ----------------------------------------------------------------------------- gradients

def test_gradcheck_naive():
    inputs = make_inputs(50, B=1, T=5, HQ=1, H=1, D=3, DV=2, gate="decay", requires_grad=True)
    for placement in ("inside_scale", "outside_scale"):
        def f(q, k, v, w, beta, g, placement=placement):
            o, lse = naive_path_attention(q, k, v, w, beta, g, gate_placement=placement, return_lse=True)
            return o, lse
        assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-8, rtol=1e-6)


def test_gradcheck_naive_gqa_varlen():
    inputs = make_inputs(51, B=1, T=5, HQ=2, H=1, D=3, DV=2, gate="long", requires_grad=True)
    f = lambda *a: naive_path_attention(*a, cu_seqlens=[0, 2, 5])   # noqa: E731
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-8, rtol=1e-6)


@pytest.mark.parametrize("placement", ["inside_scale", "outside_scale"])
def test_blockwise_gradients_match_naive(placement):
    inputs = make_inputs(52, B=2, T=19, HQ=4, H=2, D=5, DV=4, gate="decay", beta_range=(1.5, 2.0),
                         requires_grad=True)
    gen = torch.Generator().manual_seed(53)
    do = torch.randn(2, 19, 4, 4, generator=gen, dtype=F64)
    dl = torch.randn(2, 19, 4, generator=gen, dtype=F64)

    def grads(fn):
        o, lse = fn()
        return torch.autograd.grad((o * do).sum() + (lse * dl).sum(), inputs)

    g_ref = grads(lambda: naive_path_attention(*inputs, gate_placement=placement, return_lse=True))
    g_blk = grads(lambda: blockwise_path_attention(*inputs, chunk_size=4, superchunk_size=8,
                                                   gate_placement=placement))
    for name, a, b in zip("q k v w beta g".split(), g_blk, g_ref):
        assert rel(a, b) < 1e-10, name


@pytest.mark.parametrize("steps", [1, 7, 50])
def test_naive_checkpointed_sweep_is_identical(steps):
    """checkpoint_steps only changes what autograd keeps: output and every gradient bit for bit,
    varlen segments and a step count that does not divide T included."""
    torch.manual_seed(3)
    B, T, HQ, H, D = 1, 37, 4, 2, 8
    q, k, v = torch.randn(B, T, HQ, D), torch.randn(B, T, H, D), torch.randn(B, T, H, D)
    w = F.normalize(torch.randn(B, T, H, D), dim=-1)
    beta = 1.5 + 0.5 * torch.rand(B, T, H)
    g = torch.log(0.95 + 0.05 * torch.rand(B, T, HQ))
    do = torch.randn(B, T, HQ, D, dtype=torch.float64)
    outs = []
    for ck in (None, steps):
        leaves = [x.double().requires_grad_() for x in (q, k, v, w, beta, g)]
        o = naive_path_attention(*leaves, cu_seqlens=[0, 11, T], checkpoint_steps=ck)
        outs.append([o, *torch.autograd.grad(o, leaves, do)])
    for a, b in zip(*outs):
        assert torch.equal(a, b)
