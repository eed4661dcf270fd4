"""The call key of ``path_attention_decode``'s prepared hot path: a call reuses a prepared step only when every
input the step was prepared for is the same (tensor metadata, the cache's layout, backend, config, scale,
length bucket, PATHTUNE_CHECK_INPUTS); the cache's layout key follows every replacement of its buffers.

CPU: the Triton kernels run in the interpreter (tests/conftest.py) at tiny shapes.
"""
from __future__ import annotations

import copy
import pickle

import pytest
import torch
import torch.nn.functional as F

import pathtune
from pathtune.codegen.kv_cache import PaTHKVCache
from pathtune.runtime import decode as decode_mod
from pathtune.runtime import dispatch
from pathtune.specs.workload import seq_bucket

B, HQ, H, D = 1, 2, 2, 32


def make(T=1, gate=True, dtype=torch.float32):
    q, k, v = (torch.randn(B, T, n, D, dtype=dtype) for n in (HQ, H, H))
    w = F.normalize(torch.randn(B, T, H, D), dim=-1)
    beta = torch.rand(B, T, H) * 0.5 + 1.5
    g = F.logsigmoid(torch.randn(B, T, HQ) + 3.0) if gate else None
    return [q, k, v, w, beta, g]


def cache_of(length=5, gate=True, cap=64):
    cache = PaTHKVCache.empty(B, H, D, D, HQ, max_len=cap, gated=gate)
    cache.k_buffer[:, :length] = torch.randn(B, length, H, D)
    cache.v[:, :length] = torch.randn(B, length, H, D)
    if gate:
        cache.c[:, :length] = torch.cumsum(F.logsigmoid(torch.randn(B, length, HQ) + 3.0), 1)
    cache.length = length
    return cache


@pytest.fixture
def prepares(monkeypatch):
    """The number of prepared steps so far (each call of runtime.decode._prepare)."""
    calls = []
    real = decode_mod._prepare
    monkeypatch.setattr(decode_mod, "_prepare", lambda *a, **kw: (calls.append(1), real(*a, **kw))[1])
    dispatch.clear_cache()
    return lambda: len(calls)


def decode(xs, cache, backend="triton", **kw):
    return pathtune.path_attention_decode(*xs, cache, backend=backend, **kw)


def test_the_cache_layout_key_follows_its_buffers():
    cache = cache_of()
    key = cache.layout_key()
    assert cache.layout_key() == key == cache_of(length=3, cap=32).layout_key()   # length, capacity: not layout
    assert cache_of(gate=False).layout_key() != key
    cache.reserve(100)                                   # growth: new buffers, same layout
    assert cache.max_len >= 105 and cache.layout_key() == key
    for change in (lambda c: setattr(c, "c", c.c.double()), lambda c: setattr(c, "v", c.v.half()),
                   lambda c: setattr(c, "k", c.k_buffer.transpose(2, 3).contiguous().transpose(2, 3)),
                   lambda c: setattr(c, "num_q_heads", 4), lambda c: setattr(c, "c", None)):
        other = copy.deepcopy(cache)
        assert other.layout_key() == key
        change(other)
        assert other.layout_key() != key
    a, b = cache_of(), cache_of()
    b.v = b.v.to(torch.float16)
    b.v = b.v.float()                                    # back to a's layout: the same key again
    assert a.layout_key() == b.layout_key()


def test_pickled_cache_keeps_its_format_and_recomputes_its_layout_key():
    cache = cache_of()
    cache.layout_key()
    state = cache.__getstate__()
    assert {"_k", "v", "c", "num_q_heads", "_count"} <= set(state) and "_layout" not in state
    back = pickle.loads(pickle.dumps(cache))
    assert back._layout is None and back.layout_key() == cache.layout_key()
    assert torch.equal(back.v, cache.v) and back.num_q_heads == HQ
    old = {s: val for s, val in state.items() if s != "_count"}   # a state of a version without counters
    restored = PaTHKVCache.__new__(PaTHKVCache)
    restored.__setstate__(old)
    assert restored.layout_key() == cache.layout_key() and restored.arrival_counters.shape == (B * H + 1,)


def test_a_replaced_cache_buffer_never_reuses_a_step_prepared_for_the_old_one(prepares):
    """The Triton step needs k/v in bf16/fp16/fp32 and a float32 gate cumsum; a stale step would launch on a
    cache that breaks those. Each replacement prepares again and gets the checks' error."""
    cache = cache_of()
    decode(make(), cache)
    decode(make(), cache)
    assert prepares() == 1 and cache._layout is not None

    def used_twin():                         # a copy that has run a step (its layout key is computed)
        twin = copy.deepcopy(cache)
        decode(make(), twin)
        return twin

    twin = used_twin()
    twin.c = twin.c.double()
    with pytest.raises(ValueError, match="gate cumsum in float32"):
        decode(make(), twin)
    twin = used_twin()
    twin.v = twin.v.double()
    with pytest.raises(ValueError, match="bfloat16, float16 or float32"):
        decode(make(), twin)
    twin = used_twin()
    twin.num_q_heads = 1
    with pytest.raises(ValueError, match="do not match the cache"):
        decode(make(), twin)
    twin = used_twin()
    twin.k = twin.k.double()
    with pytest.raises(ValueError, match="bfloat16, float16 or float32"):
        decode(make(), twin)
    loaded = pickle.loads(pickle.dumps(used_twin()))
    decode(make(), loaded)
    loaded.c = loaded.c.double()
    with pytest.raises(ValueError, match="gate cumsum in float32"):
        decode(make(), loaded)
    n = prepares()
    decode(make(), cache)                    # the original layout: still prepared
    assert prepares() == n


def test_every_tensor_property_is_part_of_the_call_key(prepares):
    """A call that differs from a prepared one in any tensor's shape, dtype or contiguity (or the gate's
    presence) prepares its own step."""
    cache = cache_of(length=70, cap=128)      # every call below stays in the length bucket 128
    decode(make(), cache)
    assert prepares() == 1

    def noncontig(t):                         # the same values with every stride doubled
        return torch.empty_strided(t.shape, tuple(2 * s for s in t.stride()), dtype=t.dtype).copy_(t)

    for i in range(6):
        for how in ("dtype", "layout"):
            xs = make()
            x = xs[i]
            if how == "dtype":
                xs[i] = x.double() if i >= 3 else x.half()
            else:
                xs[i] = noncontig(x)
                assert not xs[i].is_contiguous() and xs[i].shape == x.shape
            n = prepares()
            try:
                decode(xs, cache)
            except ValueError:
                pass                         # a mix the checks refuse: still a prepare, never a reuse
            assert prepares() == n + 1, (i, how)
            decode(make(), cache)            # the original key: no new prepare
            assert prepares() == n + 1, (i, how)
    n = prepares()
    with pytest.raises(ValueError, match="gated"):
        decode(make(gate=False), cache)
    assert prepares() == n + 1
    decode(make(T=2), cache)                 # another shape
    assert prepares() == n + 2


def test_backend_config_scale_and_check_flag_are_part_of_the_call_key(prepares, monkeypatch):
    cache = cache_of()
    decode(make(), cache)
    base = prepares()
    decode(make(), cache, scale=0.5)
    decode(make(), cache, config={"decode_pending_window": 0})
    monkeypatch.setenv("PATHTUNE_CHECK_INPUTS", "1")
    decode(make(), cache)
    monkeypatch.delenv("PATHTUNE_CHECK_INPUTS")
    assert prepares() == base + 3
    decode(make(), cache, scale=0.5)
    decode(make(), cache, config={"decode_pending_window": 0})
    decode(make(), cache)
    assert prepares() == base + 3
    decode(make(), cache, backend="reference")
    assert prepares() == base + 4


def test_the_call_key_follows_the_length_bucket():
    """Two cache lengths share a call key iff seq_bucket(length + T_new) is the same."""
    cache = cache_of()
    xs = make()
    seen = {}
    for n in [*range(1, 1100), 4095, 4096, 4097, 8192, 8193, 2 ** 20, 2 ** 20 + 1]:
        cache._hint = n - 1
        key = decode_mod._call_key(*xs, cache, None, "triton", None)
        seen.setdefault(key, set()).add(seq_bucket(n))
    buckets = [b for bs in seen.values() for b in bs]
    assert all(len(bs) == 1 for bs in seen.values()) and len(buckets) == len(set(buckets))


def test_growth_keeps_the_prepared_step(prepares):
    """Growing a cache replaces its buffers without changing its layout: the prepared step is reused, and the
    result still matches the reference decode."""
    from pathtune.runtime.reference.recurrent import path_attention_decode as ref_decode

    cache = cache_of(length=4, cap=6)
    ref = copy.deepcopy(cache)
    for _ in range(4):                       # 4 + 4 tokens: grows past 6 once (one bucket: 16)
        xs = make()
        o = decode(xs, cache)
        r = ref_decode(*xs, ref, gate_placement="inside_scale")
        assert float((o - r).norm() / r.norm()) < 1e-4
    assert cache.max_len >= 8 and prepares() == 1


def test_workspace_parts_are_aligned_disjoint_and_kept():
    cache = cache_of()
    parts = cache.workspace_parts(("t", 5), (5, 5, 5 * 64))
    assert [p.numel() for p in parts] == [5, 5, 320] and all(p.dtype == torch.float32 for p in parts)
    assert all(p.data_ptr() % 16 == 0 for p in parts)
    ends = [(p.data_ptr(), p.data_ptr() + 4 * p.numel()) for p in parts]
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(ends, ends[1:]))
    assert all(a is b for a, b in zip(cache.workspace_parts(("t", 5), (5, 5, 320)), parts))
