"""Two frame levels of the Triton decode cache (``decode_frame_bound``, codegen/triton/decode.py, codegen/kv_cache.py):
old rows stay in an older frame mapped by a D x D frame map; a flush rotates only the recent rows and folds its
transitions into the map; a flush that would leave more than the bound past the old rows rotates every row.

CPU: the kernel runs in Triton's interpreter at tiny shapes, with a bound of a few tens of rows and the old rows
aligned to 16 (the key tile; on a GPU the alignment is the largest key tile of the spec), so that a few dozen steps
cross several flushes of both kinds.  Outputs against the float64 naive attention of the whole sequence, keys
(``cache.k`` materializes the old and pending rows) against the float64 current-frame keys; beta in [1.5, 2), real
gate decay.
"""
from __future__ import annotations

import copy
import pickle

import pytest
import torch

import pathtune
from pathtune.codegen._knobs import resolve
from pathtune.codegen.kv_cache import PaTHKVCache
from pathtune.codegen.triton import TritonParams, path_decode_triton
from pathtune.codegen.triton import decode as decode_mod
from pathtune.runtime.reference import naive_path_attention
from pathtune.runtime.reference.recurrent import current_frame_keys
from test_decode_lazy import TOL_K, TOL_O, cut, f64, prefill, rel, sequence

ALIGN = 16
CFG = dict(decode_splits=2, decode_block_n=16, decode_frame_bound=32)


@pytest.fixture(autouse=True)
def small_alignment(monkeypatch, request):
    """Old rows aligned to the tests' key tile (16), so that tiny caches have old rows; prepared steps rebuilt.
    GPU tests keep the real alignment (their key tiles are larger)."""
    gpu = request.node.get_closest_marker("gpu") is not None
    if not gpu:
        monkeypatch.setattr(decode_mod, "FRAME_ALIGN", ALIGN)
    decode_mod._step_cached.cache_clear()
    yield
    decode_mod._step_cached.cache_clear()


def _state(cache):
    return (cache.length, cache.frame, *cache.old_rows)


def run_steps(full, cache, P, steps, cfg, window, ref_o=None, tol=None):
    """Decode ``steps`` (token counts) after a prompt of P; returns the states after each step and the outputs."""
    t, states, outs = P, [], []
    for tn in steps:
        o = path_decode_triton(*cut(full, t, t + tn), cache, config=cfg, window=window)
        t += tn
        if ref_o is not None:
            assert rel(o, ref_o[:, t - tn:t]) < tol, (t, rel(o, ref_o[:, t - tn:t]))
        assert cache.state_tensor.tolist() == list(_state(cache))   # the host mirrors follow the device
        states.append(_state(cache))
        outs.append(o)
    return states, outs


def until_mapped(full, cache, t, limit, pending=False):
    """One-token steps from position t until old rows sit in an older frame (and, with ``pending``, rows are
    pending); returns the position reached."""
    def mapped():
        f1, fp = cache.old_rows
        return f1 > 0 and fp < cache.frame and (cache.length > cache.frame or not pending)
    while not mapped():
        assert t < limit, "no state with old rows in an older frame was reached"
        path_decode_triton(*cut(full, t, t + 1), cache, config=CFG, window=4)
        t += 1
    return t


def kinds_of(states):
    """(big flushes, flushes that kept old rows in an older frame) over consecutive states."""
    big = sum(1 for a, b in zip(states, states[1:]) if b[2] != a[2] or (b[1] != a[1] and b[3] == b[1]))
    kept = sum(1 for a, b in zip(states, states[1:]) if b[1] != a[1] and b[2] > 0 and b[3] < b[1])
    return big, kept


@pytest.mark.parametrize("HQ,H,gate,cdt,steps,window", [
    (2, 2, True, torch.float32, (1,) * 40, 4),            # MHA one token (the row path), fp32: tight bounds
    (2, 2, True, torch.bfloat16, (1,) * 40, 4),           # the same in bf16
    (4, 2, False, torch.bfloat16, (3, 4, 1, 4, 4, 2, 4, 4, 3, 4, 4, 1, 4), 6),   # GQA, multi-token steps
    (4, 2, True, torch.float16, (4, 4, 2, 4, 4, 1, 4, 4, 4, 3, 4, 4), 4),        # fp16, a flush every step or two
    (4, 2, True, torch.float32, (1, 2, 1, 3, 1, 1, 4, 1, 2, 1, 3, 1, 1, 2, 1, 3, 2), 0),   # window 0: every step
])
def test_two_level_steps_vs_float64_recompute(HQ, H, gate, cdt, steps, window):
    """Steps crossing flushes that keep old rows (the frame map in use) and big flushes: every output against the
    float64 recompute, the device state equal to the host mirrors, and the materialized keys (on a copy after the
    steps) against the float64 current-frame keys."""
    B, D, P = 2, 16, 40
    dt = torch.float32 if cdt == torch.float32 else cdt
    full = sequence(B, P + sum(steps), HQ, H, D, gate, dt, seed=3 * HQ + len(steps))
    ref_o = naive_path_attention(*f64(full))
    cache = prefill(full, P, cdt)
    states, _ = run_steps(full, cache, P, steps, CFG, window, ref_o, TOL_O[cdt])
    big, kept = kinds_of([_state(prefill(full, P, cdt))] + states)
    assert big >= 2 and kept >= 2, (big, kept, states)
    t = P + sum(steps)
    kr = current_frame_keys(*f64((full[1][:, :t], full[3][:, :t], full[4][:, :t])))
    twin = copy.deepcopy(cache)
    assert rel(twin.k[:, :t], kr) < TOL_K[cdt]
    f1, fp = twin.old_rows
    assert twin.frame == t and (f1 == 0 or fp == t)         # reading k put every row in the current frame


def test_two_levels_equal_one_level():
    """Twin fp32 caches, one frame level and two: step by step the outputs agree to the float64 tolerance, and so do
    the materialized keys at the end."""
    B, HQ, H, D, P = 2, 2, 2, 16, 40
    steps = (1, 2, 1, 3, 1, 1, 2, 4, 1, 1, 3, 2, 1, 1, 4, 1, 2, 1, 3, 1)
    full = sequence(B, P + sum(steps), HQ, H, D, True, torch.float32, seed=5)
    one, two = prefill(full, P, torch.float32), prefill(full, P, torch.float32)
    t = P
    for tn in steps:
        xs = cut(full, t, t + tn)
        o1 = path_decode_triton(*xs, one, config=dict(CFG, decode_frame_bound=0), window=3)
        o2 = path_decode_triton(*xs, two, config=CFG, window=3)
        t += tn
        assert rel(o2, o1) < TOL_O[torch.float32], (t, rel(o2, o1))
    assert one.old_rows[0] == 0 and two.old_rows[0] > 0
    assert rel(two.k[:, :t], one.k[:, :t]) < 1e-6


def test_a_wrong_frame_map_is_detected():
    """Can-fail control: once old rows sit in an older frame, replacing the frame map by the identity moves the next
    output far beyond the tolerance (the map is what carries the queries to the old rows)."""
    B, HQ, H, D, P = 1, 2, 2, 16, 40
    full = sequence(B, P + 40, HQ, H, D, True, torch.float32, seed=9)
    ref_o = naive_path_attention(*f64(full))
    cache = prefill(full, P, torch.float32)
    t = until_mapped(full, cache, P, P + 39)
    good = copy.deepcopy(cache)
    cache.frame_map().copy_(torch.eye(D).expand_as(cache.frame_map()))
    o_bad = path_decode_triton(*cut(full, t, t + 1), cache, config=CFG, window=4)
    o_good = path_decode_triton(*cut(full, t, t + 1), good, config=CFG, window=4)
    ref = ref_o[:, t:t + 1]
    assert rel(o_good, ref) < TOL_O[torch.float32]
    assert rel(o_bad, ref) > 100 * TOL_O[torch.float32]


def test_reference_backend_continues_a_two_level_cache():
    """A cache the Triton step left with old rows in an older frame and pending rows, continued by the reference
    backend through the public API: it reads current-frame keys (materialize applies the map) and matches."""
    B, HQ, H, D, P = 1, 2, 2, 16, 40
    full = sequence(B, P + 30, HQ, H, D, True, torch.float32, seed=13)
    ref_o = naive_path_attention(*f64(full))
    cache = prefill(full, P, torch.float32)
    t = until_mapped(full, cache, P, P + 27, pending=True)
    o = pathtune.path_attention_decode(*cut(full, t, t + 3), cache, backend="reference")
    assert rel(o, ref_o[:, t:t + 3]) < 1e-6
    assert cache.old_rows == (0, t + 3)     # the reference step declared every row current


def test_state_pickle_and_set_state():
    """The two-level state survives pickling (the frame map and the head-major gate copy too: the next steps agree);
    set_state checks its order and needs the frame map for a mapped frame; a cache pickled with the one-level state
    (length, F) and without the gate copy loads with no old rows and rebuilds the copy."""
    B, HQ, H, D, P = 1, 2, 2, 16, 40
    full = sequence(B, P + 30, HQ, H, D, True, torch.float32, seed=17)
    cache = prefill(full, P, torch.float32)
    t = until_mapped(full, cache, P, P + 27)
    back = pickle.loads(pickle.dumps(cache))
    assert back.state_tensor.tolist() == cache.state_tensor.tolist() and back.old_rows == cache.old_rows
    assert torch.equal(back.k[:, :t], cache.k[:, :t])
    assert torch.equal(back.gate_heads()[:, :, :t], cache.gate_heads()[:, :, :t])
    xs = cut(full, t, t + 2)
    assert torch.equal(path_decode_triton(*xs, back, config=CFG, window=4),
                       path_decode_triton(*xs, cache, config=CFG, window=4))
    fresh = prefill(full, P, torch.float32)
    with pytest.raises(ValueError, match="old <= old_frame <= frame"):
        fresh.set_state(P, P, old=32, old_frame=16)
    with pytest.raises(ValueError, match="frame map"):
        fresh.set_state(P, P, old=16, old_frame=32)
    fresh.frame_map()
    fresh.set_state(P, P, old=16, old_frame=32)
    assert fresh.state_tensor.tolist() == [P, P, 16, 32] and "old=16" in repr(fresh)
    state = fresh.__getstate__()
    for name in ("_old", "_old_frame", "_phi", "_ch", "_ch_rows"):
        state.pop(name)
    state["_state"] = torch.tensor([P, P], dtype=torch.int32)
    old = PaTHKVCache.__new__(PaTHKVCache)
    old.__setstate__(state)
    assert old.state_tensor.tolist() == [P, P, 0, P] and old.old_rows == (0, P)
    assert torch.equal(old.gate_heads()[:, :, :P], old.c[:, :P].transpose(1, 2))


def test_frame_bound_params_and_errors():
    """The knob reaches the decode step through the decode pass's params (the spec's default 0: one level); the
    step refuses it above head dim 128 with a message that says what to use."""
    params = resolve("triton", "decode", {"decode_frame_bound": 2048}, (64, 64))
    assert isinstance(params, decode_mod.TritonDecodeParams) and params.decode_frame_bound == 2048
    assert decode_mod.decode_params(TritonParams(), 64, 64).decode_frame_bound == 0
    assert not hasattr(resolve("triton", "fwd", None, (64, 64)), "decode_frame_bound")
    B, HQ, H, D = 1, 2, 2, 192
    full = sequence(B, 9, HQ, H, D, False, torch.float32, seed=1)
    cache = prefill(full, 8, torch.float32)
    with pytest.raises(ValueError, match="decode_frame_bound 0"):
        path_decode_triton(*cut(full, 8, 9), cache, config=CFG)


@pytest.mark.parametrize("T,tokens,window,bound", [(32768, 1, 16, 4096), (32768, 16, 32, 2048), (8192, 4, 16, 1024)])
def test_frame_plan_weights_follow_the_flush_rule(T, tokens, window, bound):
    """The bench's two-level plan (``frame_plan``) against the flush rule itself, run on a cache's host mirrors
    (``advanced``, no kernel) over many flush cycles from a fresh cache: the share of big flushes is the plan's big
    weight, and the mean count of recent rows at a small flush is the one the plan's small state leaves (within the
    spread of where a big flush leaves the old rows, one alignment)."""
    from pathtune.tuning.decode_bench import flush_cycle, frame_plan

    align = 512
    plan = frame_plan(T, tokens, window, bound, align)
    assert len(plan) == 2 and abs(sum(w for w, _ in plan) - 1) < 1e-12
    (w_small, small), (w_big, big) = plan
    for states in (small, big):       # every state is one set_state accepts, the last one flushes
        for length, frame, old, old_frame in states:
            assert 0 <= old <= old_frame <= frame <= length == T and old % align == 0
        assert states[-1][0] - states[-1][1] + tokens > window
    assert T + tokens - big[-1][2] > bound >= T + tokens - small[-1][2]
    c = len(flush_cycle(window, tokens)) * tokens
    cycles = 40 * bound // c
    cap = T + cycles * c + 1
    meta = torch.empty(1, cap, 1, 16, device="meta")
    cache = PaTHKVCache(meta, meta, None, T, 1)
    smalls, bigs = [], 0
    for _ in range(cycles):
        f1_before = cache.old_rows[0]
        for _ in flush_cycle(window, tokens):
            cache.advanced(tokens, window=window, frame_bound=bound, frame_align=align)
        if cache.old_rows[0] != f1_before or cache.old_rows[1] == cache.frame:
            bigs += 1
        else:
            smalls.append(cache.frame - cache.old_rows[0])
    assert cache.length == T + cycles * c
    assert abs(bigs / (bigs + len(smalls)) - w_big) < 0.15 * w_big, (bigs, len(smalls), w_big)
    assert abs(sum(smalls) / len(smalls) - (T + tokens - small[-1][2])) <= align + c


def test_frame_plan_one_level_and_short_caches():
    """One frame level, or a cache too short for old rows: one part, every flush rotating every row."""
    from pathtune.tuning.decode_bench import flush_cycle, frame_plan

    for bound, T in ((0, 32768), (4096, 2048)):
        plan = frame_plan(T, 1, 16, bound, 512)
        assert len(plan) == 1 and plan[0][0] == 1.0
        assert [st[1] for st in plan[0][1]] == [T - p for p in flush_cycle(16, 1)]
        assert all(st[2] == 0 for st in plan[0][1])


def test_decode_bench_callable_weights_the_two_flushes(monkeypatch):
    """pathtune_callable with two frame levels: a small and a big flush cycle as weighted parts, each run from its
    states (old rows in an older frame), the big one leaving every row in the current frame."""
    from pathtune.tuning.decode_bench import _median_ms, frame_plan, pathtune_callable, weighted_parts

    B, HQ, H, D, P = 1, 2, 2, 32, 200
    full = sequence(B, P + 1, HQ, H, D, False, torch.float32, seed=21)
    cache = prefill(full, P, torch.float32, static_cap=P + 1)
    cfg = dict(CFG, decode_pending_window=4, decode_frame_bound=64)
    run = pathtune_callable(cache, cut(full, P, P + 1), cfg)
    plan = frame_plan(P, 1, 4, 64, ALIGN)
    assert len(run.parts) == 2 and [w for _, w in run.parts] == [w for w, _ in plan]
    assert [part.steps for part, _ in run.parts] == [5, 5]
    run.parts[0][0]()
    assert cache.old_rows[0] == plan[0][1][-1][2] and cache.frame == P + 1      # a small flush kept the old rows
    run.parts[1][0]()
    assert cache.old_rows == (P + 1 - (P + 1) % ALIGN, P + 1)                    # a big one rotated every row
    import triton.testing

    def leaf(ms, steps):
        def fn():
            return None
        fn.ms, fn.steps = ms, steps
        return fn
    monkeypatch.setattr(triton.testing, "do_bench", lambda fn, **kw: fn.ms)
    both = weighted_parts([(leaf(4.0, 2), 0.25), (leaf(3.0, 1), 0.75)])
    assert both.steps == 3 and _median_ms(both) == 0.25 * 4.0 / 2 + 0.75 * 3.0


# ---- GPU ---------------------------------------------------------------------------------------------------

GPU_CFG = dict(decode_block_n=128, decode_splits=4, decode_num_warps=4, decode_frame_bound=1024)


@pytest.mark.gpu
@pytest.mark.parametrize("D,H,HQ,TN", [(64, 4, 4, 16), (128, 2, 8, 16), (128, 4, 4, 1)])
def test_gpu_two_levels_vs_float64(D, H, HQ, TN):
    """bf16 cache of 2000 prompt keys, two frame levels with the bound 1024 (the real alignment, 512): steps that
    cross big and small flushes, every output against the exact step (float64 keys never rounded) within 1e-2 or
    1.1x the error of the bf16 per-token-rounding reference step (which drifts to ~1.2e-2 over these steps at D128;
    on the H200 the kernel stayed within 3.6e-3 / 5.6e-3 at the bound 1024 as at 0), the keys at the end against
    the exact current-frame keys, the device state equal to the host mirrors."""
    from pathtune.runtime.reference import path_attention_decode
    from test_triton_decode import _EXACT, assert_keys, make, prefilled

    B, T0 = 2, 2000
    steps = 80 if TN == 16 else 140
    tri, ref_cache = prefilled(B, T0, HQ, H, D, D, True, torch.bfloat16)
    exact = _EXACT[id(ref_cache)][1]
    states = [_state(tri)]
    for _ in range(steps):
        xs = make(B, TN, HQ, H, D, D, True, dtype=torch.bfloat16)
        o = path_decode_triton(*xs, tri, config=GPU_CFG)
        ref, ox = path_attention_decode(*f64(xs), ref_cache), path_attention_decode(*f64(xs), exact)
        assert rel(o, ox) < max(1e-2, 1.1 * rel(ref, ox)), (rel(o, ox), rel(ref, ox))
        assert tri.state_tensor.tolist() == list(_state(tri))
        states.append(_state(tri))
    big, kept = kinds_of(states)
    assert big >= 1 and kept >= 2, (big, kept)
    assert_keys(tri, ref_cache, tri.length, 3e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("D,H,HQ,TN", [(64, 4, 4, 16), (128, 2, 8, 1)])
def test_gpu_two_levels_captured_steps_bitwise(D, H, HQ, TN):
    """One step with two frame levels captured and replayed across small and big flushes (decided on the device)
    equals the eager steps on a twin cache bitwise: outputs, keys, device state."""
    gen = torch.Generator(device="cuda").manual_seed(D + TN)
    B, P = 2, 2000
    n = 80 if TN == 16 else 1200      # two big flushes and the small ones between them
    full = sequence(B, P + 1, HQ, H, D, True, torch.bfloat16, seed=D)
    cache = prefill(full, P, torch.bfloat16, static_cap=P + (n + 1) * TN)
    twin = copy.deepcopy(cache)

    def fresh():
        return [torch.randn(B, TN, HQ, D, device="cuda", generator=gen).bfloat16(),
                torch.randn(B, TN, H, D, device="cuda", generator=gen).bfloat16(),
                torch.randn(B, TN, H, D, device="cuda", generator=gen).bfloat16(),
                torch.nn.functional.normalize(torch.randn(B, TN, H, D, device="cuda", generator=gen), dim=-1),
                torch.rand(B, TN, H, device="cuda", generator=gen) * 0.5 + 1.5,
                torch.nn.functional.logsigmoid(torch.randn(B, TN, HQ, device="cuda", generator=gen) + 3)]
    static = fresh()
    warm = copy.deepcopy(cache)
    pathtune.path_attention_decode(*static, warm, backend="triton", config=GPU_CFG)
    cache.frame_map()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = pathtune.path_attention_decode(*static, cache, backend="triton", config=GPU_CFG)
    states = [_state(twin)]
    for _ in range(n):
        xs = fresh()
        for dst, src in zip(static, xs):
            dst.copy_(src)
        graph.replay()
        eager = pathtune.path_attention_decode(*xs, twin, backend="triton", config=GPU_CFG)
        states.append(_state(twin))
        assert torch.equal(out, eager)
    big, kept = kinds_of(states)
    assert big >= 2 and kept >= 2, (big, kept)
    assert cache.state_tensor.tolist() == twin.state_tensor.tolist()
    m = twin.length
    assert cache.length == m and torch.equal(cache.k[:, :m], twin.k[:, :m])
