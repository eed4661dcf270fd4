"""Lazy key rotation of the Triton decode step (codegen/triton/decode.py): a pending window of W tokens, the
cache rotated into the newest frame only when more than W tokens would be pending (decided on the device);
one-token steps rotate the frame rows in the attention pass, multi-token steps in a second pass in compact WY form.

CPU: the kernels run in Triton's interpreter (tests/conftest.py) at tiny shapes, with small windows so a few
steps cross several flushes. Every output is checked against the float64 recompute (naive attention over the
whole sequence) and the key cache (``cache.k`` materializes pending rows) against the float64 current-frame
keys; relative Frobenius errors, inputs with beta in [1.5, 2) and real gate decay (log-sigmoid gates).
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

import pathtune
from pathtune.codegen.kv_cache import PaTHKVCache
from pathtune.codegen.triton import TritonParams, path_decode_triton
from pathtune.codegen.triton.decode import _fdot, _rotate_pending, _transition, _wy
from pathtune.runtime.reference import naive_path_attention
from pathtune.runtime.reference.recurrent import current_frame_keys, path_attention_prefill

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL_O = {torch.float32: 2e-5, torch.bfloat16: 1.2e-2, torch.float16: 2e-3}
# keys vs the float64 current-frame keys, after the prompt's rounding and a few flushes (the decode probe's 1e-2
# for bf16; one fp16 rounding is ~2e-4)
TOL_K = {torch.float32: 2e-6, torch.bfloat16: 1e-2, torch.float16: 2e-3}
CFG = dict(decode_splits=2, decode_block_n=16)


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def sequence(B, T, HQ, H, D, gate, dtype, seed):
    gen = torch.Generator().manual_seed(seed)

    def r(*s):
        return torch.randn(*s, generator=gen).to(DEV)
    q, k, v = r(B, T, HQ, D).to(dtype), r(B, T, H, D).to(dtype), r(B, T, H, D).to(dtype)
    w = F.normalize(r(B, T, H, D), dim=-1)
    beta = (torch.rand(B, T, H, generator=gen) * 0.5 + 1.5).to(DEV)
    g = F.logsigmoid(r(B, T, HQ) + 3.0) if gate else None
    return [q, k, v, w, beta, g]


def f64(xs):
    return [None if x is None else x.double() for x in xs]


def cut(xs, a, b):
    return [None if x is None else x[:, a:b] for x in xs]


def prefill(full, P, cdt, static_cap=None):
    """A Triton-ready cache of the first P tokens: the float64 reference prefill, stored in cdt (gate cumsum fp32)."""
    ref = path_attention_prefill(*f64(cut(full, 0, P)), cache_dtype=cdt)[1]
    cap = P if static_cap is None else static_cap
    k = torch.zeros(ref.k.shape[0], cap, *ref.k.shape[2:], dtype=cdt, device=DEV)
    v = torch.zeros(ref.v.shape[0], cap, *ref.v.shape[2:], dtype=cdt, device=DEV)
    k[:, :P], v[:, :P] = ref.k[:, :P], ref.v[:, :P]
    c = None
    if ref.c is not None:
        c = torch.zeros(ref.c.shape[0], cap, ref.c.shape[2], dtype=torch.float32, device=DEV)
        c[:, :P] = ref.c[:, :P]
    return PaTHKVCache(k, v, c, P, full[0].shape[2], static=static_cap is not None)


@pytest.mark.parametrize("HQ,H,gate,cdt,steps,window", [
    (2, 2, True, torch.bfloat16, (1,) * 11, 3),          # MHA one token: the row path, 3 flushes
    (4, 2, False, torch.bfloat16, (4, 4, 4, 4, 4), 6),   # GQA, 4 tokens a step, ungated
    (4, 2, True, torch.float16, (16, 4, 16, 4), 16),     # 16-token steps; the 4-token steps flush
    (2, 1, True, torch.bfloat16, (1, 4, 1, 16, 2, 1), 4),  # MQA, mixed step sizes
    (2, 2, True, torch.float32, (1, 3, 1, 1, 2, 5, 1), 4),  # fp32: tight bounds
])
def test_many_steps_cross_flushes_vs_float64_recompute(HQ, H, gate, cdt, steps, window):
    """Decode steps of several sizes over a growable cache (it reallocates on the way) crossing several flushes:
    every output against the float64 naive attention of the whole sequence; at the end (and on a copy after every
    step) the materialized keys against the float64 current-frame keys; the device state equals the host mirrors."""
    B, D, P = 2, 16, 21
    dt = torch.float32 if cdt == torch.float32 else cdt
    full = sequence(B, P + sum(steps), HQ, H, D, gate, dt, seed=HQ + len(steps))
    ref_o = naive_path_attention(*f64(full))
    cache = prefill(full, P, cdt)
    t, frames = P, []
    for tn in steps:
        o = path_decode_triton(*cut(full, t, t + tn), cache, config=CFG, window=window)
        t += tn
        assert rel(o, ref_o[:, t - tn:t]) < TOL_O[cdt], (t, rel(o, ref_o[:, t - tn:t]))
        host = (cache.length, cache.frame)
        assert cache.state_tensor.tolist() == [*host, *cache.old_rows]
        frames.append(host[1])
        assert host[0] - host[1] <= window
        kr = current_frame_keys(*f64((full[1][:, :t], full[3][:, :t], full[4][:, :t])))
        assert rel(copy.deepcopy(cache).k[:, :t], kr) < TOL_K[cdt]
    assert len(set(frames)) >= 3, frames      # the window was flushed more than once
    assert cache.length == t and cache.max_len >= t
    kr = current_frame_keys(*f64((full[1][:, :t], full[3][:, :t], full[4][:, :t])))
    assert rel(cache.k[:, :t], kr) < TOL_K[cdt]
    assert cache.frame == t                   # reading k materialized the pending rows
    if gate:
        assert rel(cache.c[:, :t], torch.cumsum(full[5].double(), 1)[:, :t]) < 1e-6


@pytest.mark.parametrize("HQ,H,tn", [(2, 2, 1), (4, 2, 3)])
def test_flush_and_non_flush_steps_equal_the_eager_scheme(HQ, H, tn):
    """Twin caches: window 0 (rotate on every step: the old data path) and window 5; step by step the outputs agree
    to the float64 tolerance (fp32 cache), on flush steps and on the steps in between, and so do the keys."""
    B, D, P = 2, 16, 30
    steps = 6
    full = sequence(B, P + steps * tn, HQ, H, D, True, torch.float32, seed=7 + tn)
    eager, lazy = prefill(full, P, torch.float32), prefill(full, P, torch.float32)
    kinds = set()
    for i in range(steps):
        xs = cut(full, P + i * tn, P + (i + 1) * tn)
        f0 = lazy.frame
        oe = path_decode_triton(*xs, eager, config=CFG, window=0)
        ol = path_decode_triton(*xs, lazy, config=CFG, window=5)
        kinds.add(lazy.frame != f0)
        assert eager.frame == eager.length        # window 0: nothing ever pending
        assert rel(ol, oe) < TOL_O[torch.float32], (i, rel(ol, oe))
    assert kinds == {True, False}                 # both kinds of step ran
    n = eager.length
    assert rel(lazy.k[:, :n], eager.k[:, :n]) < 1e-6


def test_pending_rows_are_materialized_for_the_reference_backend():
    """A cache the Triton step left with pending rows, continued by the reference backend through the public API:
    the reference sees current-frame keys and its output matches the float64 recompute."""
    B, HQ, H, D, P = 1, 2, 2, 32, 12
    full = sequence(B, P + 5, HQ, H, D, True, torch.float32, seed=3)
    ref_o = naive_path_attention(*f64(full))
    cache = prefill(full, P, torch.float32)
    path_decode_triton(*cut(full, P, P + 3), cache, config=CFG, window=8)
    assert cache.length - cache.frame == 3
    o = pathtune.path_attention_decode(*cut(full, P + 3, P + 5), cache, backend="reference")
    assert cache.frame == cache.length == P + 5
    assert rel(o, ref_o[:, P + 3:]) < 1e-6


def test_static_cache_window_and_state():
    """A static cache: the pending window is allocated by the first step and kept; the capacity guard still holds;
    setting the length declares every row current (nothing pending); set_state refuses pending rows without a
    window."""
    B, HQ, H, D, P = 1, 2, 2, 16, 10
    full = sequence(B, P + 4, HQ, H, D, False, torch.float32, seed=5)
    cache = prefill(full, P, torch.float32, static_cap=P + 4)
    with pytest.raises(ValueError, match="pending window"):
        cache.set_state(P, P - 2)
    path_decode_triton(*cut(full, P, P + 1), cache, config=CFG)
    W = TritonParams.from_config(CFG).decode_pending_window
    pw = cache.pending_window(W)[0]
    path_decode_triton(*cut(full, P + 1, P + 4), cache, config=CFG)
    assert cache.pending_window(W)[0] is pw and cache.max_len == P + 4
    assert (cache.length, cache.frame) == (P + 4, P)
    cache.length = P
    assert cache.state_tensor.tolist() == [P, P, 0, P] and cache.frame == P


def test_skipping_the_pending_walk_is_detected():
    """Can-fail control: a cache whose pending rows are declared current (their rotations dropped) gives keys and
    outputs far from the recompute, by much more than the tolerance."""
    B, HQ, H, D, P = 1, 2, 2, 16, 20
    full = sequence(B, P + 4, HQ, H, D, True, torch.float32, seed=11)
    ref_o = naive_path_attention(*f64(full))
    cache = prefill(full, P, torch.float32)
    path_decode_triton(*cut(full, P, P + 3), cache, config=CFG, window=8)
    broken = copy.deepcopy(cache)
    broken.length = P + 3                      # drops the pending rotations
    o = path_decode_triton(*cut(full, P + 3, P + 4), broken, config=CFG, window=8)
    assert rel(o, ref_o[:, P + 3:]) > 100 * TOL_O[torch.float32]
    o = path_decode_triton(*cut(full, P + 3, P + 4), cache, config=CFG, window=8)
    assert rel(o, ref_o[:, P + 3:]) < TOL_O[torch.float32]


def test_window_made_inside_a_capture_has_no_captured_fill(monkeypatch):
    """Inside a CUDA-graph capture (simulated) the pending window is allocated without a fill or copy (captured, it
    would re-run at every replay and wipe the slots the replayed steps wrote); growing a window that holds pending
    rows there raises with what to do. Outside a capture the window grows and keeps its slots."""
    import pathtune.codegen.kv_cache as kv

    cache = PaTHKVCache.empty(1, 2, 8, 8, max_len=8, device=DEV)
    fills = []
    real_zeros = torch.zeros
    monkeypatch.setattr(kv.torch, "zeros", lambda *a, **k: fills.append(a) or real_zeros(*a, **k))
    monkeypatch.setattr(kv, "_capturing", lambda t: True)
    pw, pb = cache.pending_window(4)
    assert pw.shape == (1, 4, 2, 8) and pb.shape == (1, 4, 2) and not fills
    cache._len, cache._frame = 3, 1                       # two rows pending in the 4-slot window
    with pytest.raises(RuntimeError, match="run one eager step"):
        cache.pending_window(8)
    monkeypatch.setattr(kv, "_capturing", lambda t: False)
    pw.fill_(1.0)
    pw8, _ = cache.pending_window(8)
    assert pw8.shape[1] == 8 and bool((pw8[:, :4] == 1).all()) and bool((pw8[:, 4:] == 0).all())


@pytest.mark.gpu
@pytest.mark.parametrize("D,H,HQ,gate,TN", [(64, 8, 8, False, 1), (128, 2, 8, True, 4)])
def test_gpu_captured_steps_cross_flushes_bitwise(D, H, HQ, gate, TN):
    """One captured step replayed 40 times (several flushes at the default window, decided on the device) equals
    40 eager steps on a twin cache bitwise (outputs, materialized keys, device state)."""
    gen = torch.Generator(device="cuda").manual_seed(D + TN)
    B, P = 2, 1000
    full = sequence(B, P + 1, HQ, H, D, gate, torch.bfloat16, seed=D)
    cache = prefill(full, P, torch.bfloat16, static_cap=P + 41 * TN)
    twin = copy.deepcopy(cache)

    def fresh():
        xs = [torch.randn(B, TN, HQ, D, device="cuda", generator=gen).bfloat16(),
              torch.randn(B, TN, H, D, device="cuda", generator=gen).bfloat16(),
              torch.randn(B, TN, H, D, device="cuda", generator=gen).bfloat16(),
              F.normalize(torch.randn(B, TN, H, D, device="cuda", generator=gen), dim=-1),
              torch.rand(B, TN, H, device="cuda", generator=gen) * 0.5 + 1.5,
              F.logsigmoid(torch.randn(B, TN, HQ, device="cuda", generator=gen) + 3) if gate else None]
        return xs
    static = fresh()
    warm = copy.deepcopy(cache)
    pathtune.path_attention_decode(*static, warm, backend="triton")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = pathtune.path_attention_decode(*static, cache, backend="triton")
    for _ in range(40):
        xs = fresh()
        for dst, src in zip(static, xs):
            if dst is not None:
                dst.copy_(src)
        graph.replay()
        eager = pathtune.path_attention_decode(*xs, twin, backend="triton")
        assert torch.equal(out, eager)
    assert cache.state_tensor.tolist() == twin.state_tensor.tolist()
    n = twin.length
    assert cache.length == n and torch.equal(cache.k[:, :n], twin.k[:, :n])


@pytest.mark.parametrize("window,tokens,expected", [(16, 1, list(range(17))), (16, 4, [0, 4, 8, 12, 16]),
                                                    (16, 16, [0, 16]), (8, 16, [0]), (0, 1, [0])])
def test_decode_bench_times_a_whole_flush_cycle(window, tokens, expected):
    """The decode bench's timed call replays one flush cycle (the pending counts before each step, the
    last step the one that rotates the cache), so its per-step time is the amortized one."""
    from pathtune.tuning.decode_bench import flush_cycle

    cycle = flush_cycle(window, tokens)
    assert cycle == expected
    assert cycle[-1] + tokens > window and all(p + tokens <= window for p in cycle[:-1])


def test_decode_bench_callable_runs_the_cycle(monkeypatch):
    """pathtune_callable: one call = len(cycle) steps of the public API at the fixed key length, the last one
    a flush (the frame moves to the end), the cache back at T rows before each step."""
    import pathtune.runtime.decode as public
    from pathtune.tuning.decode_bench import pathtune_callable

    calls = []
    real = public.path_attention_decode
    monkeypatch.setattr(public, "path_attention_decode", lambda *a, **k: calls.append(k) or real(*a, **k))
    B, HQ, H, D, P = 1, 2, 2, 32, 12      # a head dim the public API takes
    full = sequence(B, P + 1, HQ, H, D, False, torch.float32, seed=9)
    cache = prefill(full, P, torch.float32, static_cap=P + 1)
    cfg = dict(CFG, decode_pending_window=8)
    run = pathtune_callable(cache, cut(full, P, P + 1), cfg)
    assert run.steps == 9
    run()
    assert len(calls) == 1 + 9 and all(c["config"] == cfg and c["backend"] == "triton" for c in calls)
    assert (cache.length, cache.frame) == (P + 1, P + 1)     # the cycle's last step flushed


def test_decode_bench_graph_timing_is_refused_off_cuda_and_for_tvm():
    """run_decode_bench(graph=True) captures CUDA graphs: on another device, or with the TVM step (launched per
    token from the host), it is a one-line error that says why."""
    from pathtune.tuning.decode_bench import run_decode_bench

    with pytest.raises(ValueError, match="needs device 'cuda'"):
        run_decode_bench(((2, 16),), (64,), (False,), batch=1, baselines=(), device="cpu", graph=True)
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="is for the Triton step"):
            run_decode_bench(((2, 16),), (64,), (False,), batch=1, baselines=(), graph=True,
                             backends=("tvm",), tvm_sets=[object()])


@pytest.mark.gpu
def test_gpu_decode_bench_graph_callable_replays_the_eager_cycle():
    """pathtune_callable(graph=True): the flush cycle of public calls captured once; a replay leaves the cache's
    device state and keys exactly as the eager cycle leaves a twin cache (its last step flushed)."""
    import copy

    from pathtune.tuning.decode_bench import make_cache, make_step, pathtune_callable

    gen = torch.Generator(device="cuda").manual_seed(5)
    cache = make_cache(2, 600, 4, 64, True, device="cuda", gen=gen, extra=1)
    step = make_step(2, 4, 64, True, device="cuda", gen=gen, tokens=1)
    cfg = dict(decode_pending_window=8, decode_splits=2, decode_block_n=128)
    twin = copy.deepcopy(cache)
    eager = pathtune_callable(twin, step, cfg)
    graphed = pathtune_callable(cache, step, cfg, graph=True)
    assert graphed.steps == eager.steps == 9
    k0 = twin.k_buffer.clone()
    cache.k_buffer.copy_(k0)
    eager()
    graphed()
    torch.cuda.synchronize()
    assert cache.state_tensor.tolist() == twin.state_tensor.tolist()
    assert torch.equal(cache.k_buffer, twin.k_buffer)


@pytest.mark.gpu
def test_gpu_tuner_decode_measurement_times_the_flush_cycle_as_a_graph():
    """``pathtune tune``'s decode measurement on the GPU: gate passed, the config's flush cycle captured in one CUDA
    graph and timed per step (the method says so), the time a plain positive number."""
    from pathtune.tuning import measure as M

    wl = dict(head_dim=64, head_dim_v=64, heads_q=8, heads_kv=8, dtype="bfloat16", use_gate=True)
    task = M.MeasureTask(pass_="decode", backend="triton", workload=wl, batch=4, seq_len=2048, check_len=256,
                         config=dict(decode_pending_window=8, decode_splits=2, decode_block_n=128))
    out = M.measure(task)
    assert out["status"] == "ok", out
    assert "CUDA-graph replay of a 9-step flush cycle, per step" in out["bench_method"], out["bench_method"]
    assert 0 < out["p20_ms"] <= out["median_ms"] <= out["p80_ms"]


# ---- multi-token flushes: the frame rows rotated in compact WY form ------------------------------------------

@pytest.mark.parametrize("HQ,H,D,cdt,steps,window,cfg", [
    # GQA, 4 tokens a step (PB 16); 128-row rotation blocks over 16-row splits (masked at the split's end)
    (4, 2, 16, torch.bfloat16, (1, 4, 4, 4, 4), 6, dict(decode_splits=3, decode_block_n=16)),
    # GQA, 16 tokens a step after a pending 1 + 4 (PB 32); 32-row blocks, two per 64-row tile
    (4, 1, 64, torch.float16, (1, 4, 16, 16), 16, dict(decode_splits=2, decode_block_n=64)),
    # MHA, 16 tokens, fp32 cache: tight bounds (the ieee products)
    (2, 2, 32, torch.float32, (2, 16, 3, 16), 16, dict(decode_splits=2, decode_block_n=16)),
    # MHA, 4 tokens, bf16, one split owning every tile
    (2, 2, 16, torch.bfloat16, (3, 4, 4), 4, dict(decode_splits=1, decode_block_n=16)),
])
def test_multi_token_flush_steps_vs_float64(HQ, H, D, cdt, steps, window, cfg):
    """Steps of several tokens that flush with rows pending from earlier steps (window slots) plus this step's:
    the frame rows are rotated after the attention pass by all pending transitions at once (I - W^T T W). Every
    output against the float64 naive attention; after each flush the stored keys (nothing pending: no
    materialization) against the float64 current-frame keys."""
    B, P = 2, 150 if D == 64 else 45
    dt = torch.float32 if cdt == torch.float32 else cdt
    full = sequence(B, P + sum(steps), HQ, H, D, True, dt, seed=D + sum(steps))
    ref_o = naive_path_attention(*f64(full))
    cache = prefill(full, P, cdt)
    t, flushed = P, []
    for tn in steps:
        pending = cache.length - cache.frame
        o = path_decode_triton(*cut(full, t, t + tn), cache, config=cfg, window=window)
        t += tn
        assert rel(o, ref_o[:, t - tn:t]) < TOL_O[cdt], (t, rel(o, ref_o[:, t - tn:t]))
        if cache.frame == t:
            flushed.append((tn, pending))
            kr = current_frame_keys(*f64((full[1][:, :t], full[3][:, :t], full[4][:, :t])))
            assert rel(cache.k_buffer[:, :t], kr) < TOL_K[cdt], (t, rel(cache.k_buffer[:, :t], kr))
    assert any(tn > 1 and pending > 0 for tn, pending in flushed), flushed
    assert rel(cache.c[:, :t], torch.cumsum(full[5].double(), 1)[:, :t]) < 1e-6


def test_multi_token_flush_equals_the_one_token_steps():
    """The same 8 tokens fed as two 4-token steps (the second flushes: compact WY form over 4 window slots and
    4 new tokens) and as eight 1-token steps (the last flushes: compact WY form over 7 window slots and the new
    token) on twin fp32 caches: keys and outputs agree to fp32 rounding."""
    B, HQ, H, D, P = 2, 4, 2, 32, 40
    full = sequence(B, P + 8, HQ, H, D, True, torch.float32, seed=13)
    multi, single = prefill(full, P, torch.float32), prefill(full, P, torch.float32)
    om = torch.cat([path_decode_triton(*cut(full, P + i, P + i + 4), multi, config=CFG, window=7)
                    for i in (0, 4)], dim=1)
    os_ = torch.cat([path_decode_triton(*cut(full, P + i, P + i + 1), single, config=CFG, window=7)
                     for i in range(8)], dim=1)
    assert multi.frame == single.frame == P + 8
    assert rel(om, os_) < TOL_O[torch.float32]
    assert rel(multi.k_buffer[:, :P + 8], single.k_buffer[:, :P + 8]) < 1e-6


@triton.jit
def _rotate_serial(K, pos, F, n_rot, pw_base, pb_base, wb, bb, P, H: tl.constexpr, D: tl.constexpr, d, dmask,
                   BETA_MAX: tl.constexpr):
    """K [rows, BD] fp32 holding the keys of positions ``pos``: H_F, H_{F+1}, .., H_{F+n_rot-1} applied in order by
    rank-one updates, each to the rows before its position (frame rows: all of them; a pending row j: H_{j+1} on)."""
    for s in range(0, n_rot):
        w, beta = _transition(pw_base, pb_base, wb, bb, s, P, H, D, d, dmask, BETA_MAX)
        a = tl.where(pos < F + s, beta * tl.sum(K * w[None, :], axis=1), 0.0)
        K = K - a[:, None] * w[None, :]
    return K


@triton.jit
def _wy_vs_serial_kernel(k_ptr, ser_ptr, wy_ptr, pser_ptr, pwy_ptr, pw_ptr, pb_ptr, w_ptr, b_ptr, P, NP,
                         H: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, PB: tl.constexpr, ROWS: tl.constexpr,
                         BETA_MAX: tl.constexpr):
    d = tl.arange(0, BD)
    dmask = d < D
    r = tl.arange(0, ROWS)
    off = r[:, None] * D + d[None, :]
    K = tl.load(k_ptr + off, mask=dmask[None, :], other=0.0)
    frame = ROWS   # every row is a frame row: all NP transitions apply
    Ks = _rotate_serial(K, r, frame, NP, pw_ptr, pb_ptr, w_ptr, b_ptr, P, H, D, d, dmask, BETA_MAX)
    Wm, M = _wy(frame, NP, pw_ptr, pb_ptr, w_ptr, b_ptr, P, H, D, d, dmask, PB, BETA_MAX, True)
    Kw = K - _fdot(_fdot(K, tl.trans(Wm), True), M, True)
    tl.store(ser_ptr + off, Ks, mask=dmask[None, :])
    tl.store(wy_ptr + off, Kw, mask=dmask[None, :])
    # the pending block: row s at position F + s (here F = 0) gets the transitions after its own
    s = tl.arange(0, PB)
    poff = s[:, None] * D + d[None, :]
    Kp = tl.load(k_ptr + poff, mask=(s < NP)[:, None] & dmask[None, :], other=0.0)
    Wp, Mp = _wy(0, NP, pw_ptr, pb_ptr, w_ptr, b_ptr, P, H, D, d, dmask, PB, BETA_MAX, True)
    tl.store(pser_ptr + poff, _rotate_serial(Kp, s, 0, NP, pw_ptr, pb_ptr, w_ptr, b_ptr, P, H, D, d, dmask,
                                             BETA_MAX), mask=(s < NP)[:, None] & dmask[None, :])
    tl.store(pwy_ptr + poff, _rotate_pending(Kp, Wp, Mp, PB, False, True), mask=(s < NP)[:, None] & dmask[None, :])


def test_compact_wy_form_equals_the_serial_rotation():
    """decode.py's ``_wy`` (W, M = T W from the window slots and this step's tokens) applied as k - (k W^T) M
    equals serial rank-one updates (H_F first) and the float64 serial product, in the interpreter, and so does
    ``_rotate_pending`` (each pending row by the transitions after its own position) for
    pending counts with and without padding (NP < PB) and beta in [1.5, 2) (one beta 0: an identity
    transition); the reversed order (H_{N-1} first) is far off, so the check can fail."""
    gen = torch.Generator().manual_seed(0)
    H, D, ROWS = 2, 24, 16   # D padded to BD = 32; the pointers address kv head 1 of 2
    for P, TN, PB in ((3, 4, 16), (16, 16, 32), (0, 16, 16), (5, 11, 16)):
        NP = P + TN
        k = torch.randn(ROWS, D, generator=gen, dtype=torch.float64)
        ws = F.normalize(torch.randn(NP, H, D, generator=gen, dtype=torch.float64), dim=-1)
        bs = torch.rand(NP, H, generator=gen, dtype=torch.float64) * 0.5 + 1.5
        bs[NP // 2, 1] = 0.0
        pw = torch.zeros(max(P, 1), H, D)
        pb = torch.zeros(max(P, 1), H)
        pw[:P], pb[:P] = ws[:P].float(), bs[:P].float()
        wn, bn = ws[P:].float().contiguous(), bs[P:].float().contiguous()
        ser, wy = torch.zeros(ROWS, D), torch.zeros(ROWS, D)
        kp = torch.randn(PB, D, generator=gen, dtype=torch.float64)
        pser, pwy = torch.zeros(PB, D), torch.zeros(PB, D)
        _wy_vs_serial_kernel[(1,)](torch.cat([k, kp]).float()[:max(ROWS, PB)].contiguous(), ser, wy, pser, pwy,
                                   pw[:, 1], pb[:, 1], wn[:, 1], bn[:, 1], P, NP,
                                   H=H, D=D, BD=32, PB=PB, ROWS=ROWS, BETA_MAX=2.0)
        kin = torch.cat([k, kp])[:max(ROWS, PB)]
        pexact = kin[:PB].clone()                 # row s: k_s^T H_{s+1} ... H_{N-1} (positions 0 .. NP-1)
        for s in range(NP):
            w, b = ws[s, 1], bs[s, 1]
            upd = b * (pexact @ w)[:, None] * w[None, :]
            pexact = pexact - torch.where((torch.arange(PB) < s)[:, None], upd, torch.zeros_like(upd))
        assert rel(pser[:NP], pexact[:NP]) < 1e-5, (P, TN, rel(pser[:NP], pexact[:NP]))
        assert rel(pwy[:NP], pexact[:NP]) < 1e-5, (P, TN, rel(pwy[:NP], pexact[:NP]))
        assert rel(pwy[:NP], kin[:NP]) > 0.1     # the rows did move
        exact = k.clone()
        for s in range(NP):                       # k^T H_F H_{F+1} ... H_{N-1}
            w, b = ws[s, 1], bs[s, 1]
            exact = exact - b * (exact @ w)[:, None] * w[None, :]
        reverse = k.clone()
        for s in reversed(range(NP)):
            w, b = ws[s, 1], bs[s, 1]
            reverse = reverse - b * (reverse @ w)[:, None] * w[None, :]
        assert rel(ser, exact) < 1e-5, (P, TN, rel(ser, exact))
        assert rel(wy, exact) < 1e-5, (P, TN, rel(wy, exact))
        assert rel(wy, ser) < 1e-5
        assert rel(reverse, exact) > 0.1


@pytest.mark.parametrize("HQ,H,cdt", [(2, 2, torch.float32), (4, 2, torch.bfloat16)])
def test_gate_heads_copy_follows_the_gate_cumsum(HQ, H, cdt):
    """The head-major copy of the gate cumsum the Triton step reads (``gate_heads``): equal to ``c`` below the length
    after Triton steps (which write both), after a reference step (which appends to ``c`` only: the next Triton step
    completes the copy) and after the cache grows; outputs against the float64 recompute throughout.  Can-fail: a
    copy whose rows are wrong while marked current moves the next gated output."""
    B, D, P = 2, 16, 21
    steps = (1, 4, 1, "ref", 3, 1, 4, 1)
    n_tok = sum(1 if s == "ref" else s for s in steps)
    full = sequence(B, P + n_tok, HQ, H, D, True, torch.float32 if cdt == torch.float32 else cdt, seed=31)
    ref_o = naive_path_attention(*f64(full))
    cache = prefill(full, P, cdt)
    t = P
    for s in steps:
        tn = 1 if s == "ref" else s
        xs = cut(full, t, t + tn)
        if s == "ref":
            o = pathtune.path_attention_decode(*xs, cache, backend="reference")
        else:
            o = path_decode_triton(*xs, cache, config=CFG, window=4)
        t += tn
        assert rel(o, ref_o[:, t - tn:t]) < TOL_O[cdt], (s, t)
        if s != "ref":
            assert torch.equal(cache.gate_heads()[:, :, :t], cache.c[:, :t].transpose(1, 2)), t
    assert cache.max_len > P                      # the cache grew on the way
    twin = copy.deepcopy(cache)
    xs = cut(full, t - 1, t)                      # any gated token: only the two outputs are compared
    cache.gate_heads()[:, :, :t // 2] += 5.0      # wrong offsets for the older half of the keys
    assert not torch.allclose(path_decode_triton(*xs, cache, config=CFG, window=4),
                              path_decode_triton(*xs, twin, config=CFG, window=4), atol=1e-3)
