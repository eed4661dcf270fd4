"""CPU numerics of the TVM backend: each S-TIR stage, built unscheduled for llvm, against the float64
reference pieces (runtime.reference), then the whole forward and the decode step through the same host
code the GPU path uses. Skipped without apache-tvm (pip install 'pathtune[tvm]')."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

tvm = pytest.importorskip("tvm", reason="apache-tvm is not installed (pip install 'pathtune[tvm]')")

from pathtune.codegen.tvm import host  # noqa: E402
from pathtune.codegen.tvm.build import compile_cpu_kernels  # noqa: E402
from pathtune.codegen.tvm.params import KernelDims, TVMParams, UnsupportedConfig  # noqa: E402
from pathtune.runtime.reference import (  # noqa: E402
    apply_gate,
    apply_transition,
    boundary_adjust_keys,
    boundary_adjust_queries,
    chunk_transition,
    diagonal_logits,
    naive_path_attention,
    online_softmax_update,
    path_attention_decode_step,
    path_attention_prefill,
    superchunk_transport,
    ut_transform,
)

F64 = torch.float64
TOL = 1e-12


def _llvm(func, name="probe"):
    return tvm.compile(tvm.IRModule({name: func}), target="llvm")[name]


def _unit(*shape):
    return F.normalize(torch.randn(*shape, dtype=F64), dim=-1)


def _beta(*shape):
    return 1.5 + 0.5 * torch.rand(*shape, dtype=F64)          # the hard regime, beta in [1.5, 2)


def _maxerr(a, b):
    return (a - b).abs().max().item()


# ---------------------------------------------------------------- single stages (one macro each)

def test_ut_inverse_stage():
    from pathtune.codegen.tvm.stage_probes import probe_ut_inverse

    n, C, D = 5, 16, 8
    W, b = _unit(n, C, D), _beta(n, C)
    A = torch.empty(n, C, C, dtype=F64)
    _llvm(probe_ut_inverse(C, D))(W, b, A)
    A_ref, _ = ut_transform(W, b)
    assert _maxerr(A, A_ref) < TOL


@pytest.mark.parametrize("C", [32, 64, 128])
def test_ut_inverse_blocked(C):
    """C > 16: 16 x 16 diagonal blocks by forward substitution, then log2(C/16) merge levels."""
    from pathtune.codegen.tvm.stage_probes import probe_ut_inverse

    n, D = 2, 16
    W, b = _unit(n, C, D), _beta(n, C)
    b[1, C // 2 + 3:] = 0.0                                       # padding rows (beta = 0) inside a block
    A = torch.empty(n, C, C, dtype=F64)
    _llvm(probe_ut_inverse(C, D))(W, b, A)
    A_ref, _ = ut_transform(W, b)
    assert _maxerr(A, A_ref) < TOL * max(1.0, A_ref.abs().max().item())
    assert (torch.triu(A, 1) == 0).all()


def test_boundary_adjust_stage():
    from pathtune.codegen.tvm.stage_probes import probe_boundary_queries, probe_diag_logits

    n, C, D = 4, 16, 8
    Q, K, W, b = torch.randn(n, C, D, dtype=F64), torch.randn(n, C, D, dtype=F64), _unit(n, C, D), _beta(n, C)
    A, U = ut_transform(W, b)
    M = A @ torch.tril(W @ K.transpose(-1, -2), -1)
    QW, X = torch.empty(n, C, C, dtype=F64), torch.empty(n, C, D, dtype=F64)
    _llvm(probe_boundary_queries(C, D))(Q, W, U, QW, X)
    assert _maxerr(X, boundary_adjust_queries(Q, W, U)) < TOL
    assert _maxerr(QW, torch.tril(Q @ W.transpose(-1, -2))) < TOL
    S = torch.empty(n, C, C, dtype=F64)
    _llvm(probe_diag_logits(C, D))(Q, K, W, U, M, S)
    assert _maxerr(torch.tril(S), diagonal_logits(Q, K, W, A)) < TOL


def test_lowrank_update_stage():
    from pathtune.codegen.tvm.stage_probes import probe_lowrank_update

    n, C, D = 4, 16, 8
    X, W, b = torch.randn(n, C, D, dtype=F64), _unit(n, C, D), _beta(n, C)
    _, U = ut_transform(W, b)
    Y = torch.empty_like(X)
    _llvm(probe_lowrank_update(C, D))(X, W, U, Y)
    assert _maxerr(Y, apply_transition(X, W, U)) < TOL
    assert _maxerr(Y, X @ chunk_transition(W, U)) < 1e-10


def test_online_softmax_stage():
    from pathtune.codegen.tvm.stage_probes import probe_online_softmax

    n, C, N, DV = 3, 8, 12, 6
    L2 = torch.randn(n, C, N, dtype=F64) * 3                      # base-2 logits
    V = torch.randn(n, N, DV, dtype=F64)
    m0, l0, acc0 = torch.randn(n, C, dtype=F64), torch.rand(n, C, dtype=F64) + 0.5, torch.randn(n, C, DV, dtype=F64)
    st = torch.zeros(n, 4, C, dtype=F64)
    st[:, 0], st[:, 1] = m0, l0
    acc = acc0.clone()
    _llvm(probe_online_softmax(C, N, DV))(L2, V, st, acc)
    # the reference works in base e: scale base-2 quantities by ln 2
    ln2 = torch.log(torch.tensor(2.0, dtype=F64))
    m_ref, l_ref, acc_ref = online_softmax_update((m0 * ln2, l0, acc0), L2 * ln2, V)
    assert _maxerr(st[:, 0] * ln2, m_ref) < TOL
    assert _maxerr(st[:, 1], l_ref) < TOL
    assert _maxerr(acc, acc_ref) < TOL


@pytest.mark.parametrize("diag", [False, True])
def test_fox_bias_stage(diag):
    from pathtune.codegen.tvm.stage_probes import probe_fox_logits

    n, C, N, nvalid = 2, 8, 8, 6
    S, cq, ck = torch.randn(n, C, N, dtype=F64), torch.randn(n, C, dtype=F64), torch.randn(n, N, dtype=F64)
    out = torch.empty_like(S)
    _llvm(probe_fox_logits(C, N, diag))(S, cq, ck, out, 0.3, 0.3, nvalid)
    ref = apply_gate(S, cq, ck, 0.3, "inside_scale")
    if diag:
        i = torch.arange(C)[:, None]
        j = torch.arange(N)[None, :]
        keep = (j <= i) & (j < nvalid)
        assert _maxerr(out[:, keep], ref[:, keep]) < TOL
        assert (out[:, ~keep] < -1e37).all()
    else:
        assert _maxerr(out, ref) < TOL


@pytest.mark.parametrize("C,s,D", [(8, 3, 8), (32, 2, 128)])   # (32, 2, 128): U staged 16 rows at a time
def test_superchunk_transport_stage(C, s, D):
    from pathtune.codegen.tvm.stage_probes import probe_transport

    n = 2
    W, b, K = _unit(n, s * C, D), _beta(n, s * C), torch.randn(n, s * C, D, dtype=F64)
    Kt, U, P = [], [], []
    for c in range(s):
        sl = slice(c * C, (c + 1) * C)
        A, Uc = ut_transform(W[:, sl], b[:, sl])
        Kt.append(boundary_adjust_keys(K[:, sl], W[:, sl], A))
        U.append(Uc)
        P.append(chunk_transition(W[:, sl], Uc))
    KJ_ref, What_ref = superchunk_transport(Kt, P)
    KJ, What = torch.empty(s * C, n, D, dtype=F64), torch.empty(n, D, D, dtype=F64)

    def tok(x):                                                   # [n, s*C, D] -> token-major [s*C, n, D]
        return x.transpose(0, 1).contiguous()

    _llvm(probe_transport(C, s, D))(tok(torch.cat(Kt, 1)), tok(W), tok(torch.cat(U, 1)), KJ, What)
    assert _maxerr(KJ, tok(torch.cat(KJ_ref, 1))) < TOL
    assert _maxerr(What, What_ref) < TOL


# ---------------------------------------------------------------- the whole forward, float64

def _inputs(B, T, HQ, H, D, DV, gated, dtype=F64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, HQ, D, generator=gen, dtype=F64)
    k = torch.randn(B, T, H, D, generator=gen, dtype=F64)
    v = torch.randn(B, T, H, DV, generator=gen, dtype=F64)
    w = F.normalize(torch.randn(B, T, H, D, generator=gen, dtype=F64), dim=-1)
    beta = 1.5 + 0.5 * torch.rand(B, T, H, generator=gen, dtype=F64)
    g = torch.log(0.9 + 0.1 * torch.rand(B, T, HQ, generator=gen, dtype=F64)) if gated else None
    cast = (lambda x: x.to(dtype)) if dtype != F64 else (lambda x: x)
    return cast(q), cast(k), cast(v), w, beta, g


@pytest.fixture(scope="module")
def fwd64():
    """Compiled once per module: (gated) -> (kernels, params, dims)."""
    params = TVMParams(chunk_size=8, superchunk_size=24, block_n=12)
    out = {}
    for gated in (False, True):
        dims = KernelDims(H=2, HQ=4, D=16, DV=12, dtype="float64", gated=gated)
        out[gated] = (compile_cpu_kernels("fwd", params, dims, fdt="float64"), params, dims)
    return out


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("varlen", [False, True])
def test_forward_matches_naive_float64(fwd64, gated, varlen):
    kernels, params, dims = fwd64[gated]
    if varlen:
        q, k, v, w, beta, g = _inputs(1, 75, 4, 2, 16, 12, gated)
        cu = torch.tensor([0, 5, 31, 75])
    else:
        q, k, v, w, beta, g = _inputs(2, 61, 4, 2, 16, 12, gated)
        cu = None
    o, lse = host.forward(kernels, q, k, v, w, beta, g, scale=0.3, cu_seqlens=cu, params=params, dims=dims,
                          fdt=F64)
    ref, ref_lse = naive_path_attention(q, k, v, w, beta, g, scale=0.3, cu_seqlens=cu, return_lse=True)
    assert _maxerr(o, ref) < 1e-11
    assert _maxerr(lse, ref_lse) < 1e-11


@pytest.mark.parametrize("dtype,scan", [("bfloat16", "fp16"), ("float16", "bf16")])
def test_forward_low_precision_float32_build(dtype, scan):
    """The kernels' rounding model (bf16/fp16 q/k/v, fp16/bf16 scan operands, fp32 accumulation)."""
    params = TVMParams(chunk_size=16, superchunk_size=64, block_n=32, scan_precision=scan)
    dims = KernelDims(H=1, HQ=2, D=32, DV=32, dtype=dtype, gated=True)
    kernels = compile_cpu_kernels("fwd", params, dims, fdt="float32")
    q, k, v, w, beta, g = _inputs(1, 150, 2, 1, 32, 32, True, dtype=getattr(torch, dtype))
    o, lse = host.forward(kernels, q, k, v, w.float(), beta.float(), g.float(), scale=32 ** -0.5, cu_seqlens=None,
                          params=params, dims=dims)
    ref, ref_lse = naive_path_attention(q.double(), k.double(), v.double(), w, beta, g, scale=32 ** -0.5,
                                        return_lse=True)
    rel = ((o.double() - ref).norm() / ref.norm()).item()
    assert rel < 4e-3                                            # the spec's accuracy gate for o
    assert _maxerr(lse.double(), ref_lse) < 1e-2


# ---------------------------------------------------------------- decode

# (D, DV, H, HQ, gated, prefill length, knobs): every case runs 4 steps, so the cache crosses step tiles and
# split boundaries; lengths are no multiple of any tile; the last case leaves most splits empty.
DECODE_CASES = [
    (64, 64, 2, 4, True, 53, dict(decode_splits=3, decode_num_warps=1, decode_vec=8, decode_rows_per_thread=2)),
    (64, 64, 2, 4, False, 53, dict(decode_splits=5, decode_num_warps=2, decode_vec=8, decode_rows_per_thread=1,
                                    decode_prefetch=1)),
    (128, 128, 1, 4, True, 45, dict(decode_splits=2, decode_num_warps=1, decode_vec=8, decode_rows_per_thread=2,
                                     decode_prefetch=1)),
    (128, 128, 2, 2, False, 45, dict(decode_splits=4, decode_num_warps=1, decode_vec=8, decode_threads_per_row=8,
                                      decode_rows_per_thread=3)),
    (128, 64, 1, 2, True, 3, dict(decode_splits=8, decode_num_warps=1, decode_vec=4, decode_rows_per_thread=1)),
]


def _decode_steps(kernels, params, dims, B, T0, steps, dtype=F64, fdt=F64):
    """Prefill (reference), then ``steps`` decode steps through host.decode_step and the reference, side by side;
    yields (o, lse, ref, ref_lse, cache, cache_ref) after each step."""
    H, HQ, D, DV, gated = dims.H, dims.HQ, dims.D, dims.DV, dims.gated
    q, k, v, w, beta, g = _inputs(B, T0, HQ, H, D, DV, gated, dtype=dtype)
    _, cache_ref = path_attention_prefill(q, k, v, w, beta, g, max_len=T0 + steps + 2)
    _, cache = path_attention_prefill(q, k, v, w, beta, g, max_len=T0 + steps + 2)
    if fdt != F64 and gated:
        cache.c, cache_ref.c = cache.c.to(fdt), cache_ref.c.to(fdt)
    for step in range(steps):
        qt, kt, vt, wt, bt, gt = (None if x is None else x[:, 0] for x in _inputs(B, 1, HQ, H, D, DV, gated,
                                                                                  dtype=dtype, seed=100 + step))
        if fdt != F64:
            wt, bt, gt = wt.to(fdt), bt.to(fdt), None if gt is None else gt.to(fdt)
        ref, ref_lse = path_attention_decode_step(qt, kt, vt, wt, bt, gt, cache_ref, scale=D ** -0.5,
                                                  return_lse=True)
        o, lse = host.decode_step(kernels, qt, kt, vt, wt, bt, gt, cache, scale=D ** -0.5, params=params, dims=dims,
                                  fdt=fdt)
        yield o, lse, ref, ref_lse, cache, cache_ref


@pytest.mark.parametrize("case", DECODE_CASES,
                         ids=[f"D{c[0]}-DV{c[1]}-G{c[3] // c[2]}-{'fox' if c[4] else 'path'}-L{c[5]}"
                              f"-s{c[6]['decode_splits']}" for c in DECODE_CASES])
def test_decode_step_matches_reference(case):
    """The decode kernel's CPU form (the same generator as the GPU kernel, thread loops serial, the shuffle
    butterfly replayed) in float64 against the float64 recurrent reference: o, lse, the in-place updated keys,
    the appended value and gate cumsum."""
    D, DV, H, HQ, gated, T0, knobs = case
    params = TVMParams(**knobs)
    dims = KernelDims(H=H, HQ=HQ, D=D, DV=DV, dtype="float64", gated=gated)
    kernels = compile_cpu_kernels("decode", params, dims, fdt="float64")
    for o, lse, ref, ref_lse, cache, cache_ref in _decode_steps(kernels, params, dims, 2, T0, 4):
        assert _maxerr(o, ref) < 1e-12 and _maxerr(lse, ref_lse) < 1e-12
        n = cache_ref.length
        assert cache.length == n
        assert _maxerr(cache.k[:, :n], cache_ref.k[:, :n]) < 1e-12        # the in-place rank-1 update
        assert _maxerr(cache.v[:, :n], cache_ref.v[:, :n]) == 0
        if gated:
            assert _maxerr(cache.c[:, :n], cache_ref.c[:, :n]) < 1e-12


def test_decode_from_an_empty_cache():
    """L = 0 .. 4: one row, then a handful, spread over 4 splits (most empty), against the reference."""
    from pathtune.runtime.reference import PaTHKVCache

    params = TVMParams(decode_splits=4, decode_num_warps=1, decode_vec=4, decode_rows_per_thread=1,
                       decode_prefetch=1)
    dims = KernelDims(H=2, HQ=4, D=64, DV=64, dtype="float64", gated=True)
    kernels = compile_cpu_kernels("decode", params, dims, fdt="float64")
    cache_ref = PaTHKVCache.empty(2, 2, 64, 64, 4, max_len=8, gated=True, dtype=F64, gate_dtype=F64)
    cache = PaTHKVCache.empty(2, 2, 64, 64, 4, max_len=8, gated=True, dtype=F64, gate_dtype=F64)
    for step in range(5):
        qt, kt, vt, wt, bt, gt = (x[:, 0] for x in _inputs(2, 1, 4, 2, 64, 64, True, seed=200 + step))
        ref, ref_lse = path_attention_decode_step(qt, kt, vt, wt, bt, gt, cache_ref, scale=0.125, return_lse=True)
        o, lse = host.decode_step(kernels, qt, kt, vt, wt, bt, gt, cache, scale=0.125, params=params, dims=dims,
                                  fdt=F64)
        n = cache_ref.length
        assert _maxerr(o, ref) < 1e-12 and _maxerr(lse, ref_lse) < 1e-12
        assert _maxerr(cache.k[:, :n], cache_ref.k[:, :n]) < 1e-12 and _maxerr(cache.c[:, :n], cache_ref.c[:, :n]) == 0


def test_decode_step_bf16_rounding_model():
    """bf16 cache, float32 math (the GPU kernel's precision): keys rounded as the reference rounds them."""
    params = TVMParams(decode_splits=3, decode_num_warps=1, decode_rows_per_thread=2, decode_prefetch=1)
    dims = KernelDims(H=1, HQ=2, D=64, DV=64, dtype="bfloat16", gated=True)
    kernels = compile_cpu_kernels("decode", params, dims, fdt="float32")
    for o, lse, ref, ref_lse, cache, cache_ref in _decode_steps(kernels, params, dims, 2, 37, 3, dtype=torch.bfloat16,
                                                                fdt=torch.float32):
        n = cache_ref.length
        dk = (cache.k[:, :n].float() - cache_ref.k[:, :n].float()).abs()
        ulp = cache_ref.k[:, :n].float().abs().clamp_min(1e-30) * 2.0 ** -7
        assert bool((dk <= ulp).all())                                      # at most one bf16 ulp (sum order)
        assert (o.float() - ref.float()).abs().max().item() < 2e-2
        assert (lse - ref_lse).abs().max().item() < 2e-3                  # a key one ulp off moves its logit ~5e-4


def test_decode_layout_resolution():
    from pathtune.codegen.tvm.stir_decode import decode_layout

    lay = decode_layout(TVMParams(), 128, 128, "bfloat16")       # spec defaults: 4 warps, block_n 128
    assert (lay.vec, lay.tpr, lay.ng, lay.nj, lay.rpt, lay.bn) == (8, 16, 8, 1, 4, 32)
    lay = decode_layout(TVMParams(decode_num_warps=8), 64, 64, "bfloat16")
    assert (lay.vec, lay.tpr, lay.ng, lay.rpt) == (8, 8, 32, 4)
    lay = decode_layout(TVMParams(decode_block_n=64), 128, 64, "float16")   # DV != D: 8 lanes, two vectors of K
    assert (lay.tpr, lay.nj, lay.njv, lay.rpt) == (8, 2, 1, 4)
    assert decode_layout(TVMParams(), 128, 128, "float32").vec == 4
    assert decode_layout(TVMParams(decode_threads_per_row=32, decode_vec=4), 128, 128, "bfloat16").nj == 1
    for bad in (dict(decode_vec=3), dict(decode_threads_per_row=64), dict(decode_rows_per_thread=9),
                dict(decode_threads_per_row=32, decode_vec=8)):
        with pytest.raises(UnsupportedConfig):
            decode_layout(TVMParams(**bad), 128, 128, "bfloat16")


# ---------------------------------------------------------------- knobs

def test_params_read_from_config():
    from pathtune.specs import KnobSpace, load_spec

    spec = load_spec()
    cfg = KnobSpace(spec, "fwd").default().replace(chunk_size=32, block_n=128, num_warps=8, beta_clip_eps=0.015625)
    p = TVMParams.from_config(cfg)
    assert (p.chunk_size, p.block_n, p.num_warps, p.threads) == (32, 128, 8, 256)
    assert p.beta_max == 2.0 - 0.015625
    d = TVMParams.from_config(KnobSpace(spec, "decode").default())
    assert d.decode_threads == 32 * d.decode_num_warps


def test_unsupported_tc_config_is_typed():
    from pathtune.codegen.tvm.tc_scan import check_tc_supported

    with pytest.raises(UnsupportedConfig):
        check_tc_supported(TVMParams(chunk_size=32, superchunk_size=256, num_warps=4),
                           KernelDims(H=1, HQ=1, D=64, DV=64))          # 32 rows cannot feed 4 warps of m16 tiles
    with pytest.raises(UnsupportedConfig):
        check_tc_supported(TVMParams(scan_precision="tf32"), KernelDims(H=1, HQ=1, D=64, DV=64))
