"""PaTHAttention and PaTHCache: projections + path_attention, conv state, prefill/decode == full
forward, greedy generation with the cache == re-running the sequence, GQA / FoX, torch.compile."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pathtune import PaTHAttention, PaTHCache, path_attention
from pathtune.runtime.layer import causal_short_conv
from repo_scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = [  # (num_heads, num_kv_heads, use_forget_gate, use_qk_norm)
    pytest.param(4, 4, False, False, id="mha"),
    pytest.param(4, 2, False, True, id="gqa-qknorm"),
    pytest.param(4, 1, True, False, id="mqa-fox"),
    pytest.param(4, 2, True, True, id="gqa-fox-qknorm"),
]


def layer(HQ=4, H=2, gate=True, qk=False, dtype=torch.float64, **kw):
    kw.setdefault("backend", "reference")
    return PaTHAttention(32, HQ, num_kv_heads=H, head_dim=8, use_forget_gate=gate, use_qk_norm=qk, w_rank=4,
                         dtype=dtype, **kw)


def lm_module():
    return load_script("examples/lm_generate.py")


def test_forward_is_path_attention_of_the_projections():
    m = layer(gate=True, qk=True)
    x = torch.randn(2, 13, 32, dtype=torch.float64)
    q, k, v, w, beta, g, _ = m.project(x)
    assert q.shape == (2, 13, 4, 8) and k.shape == (2, 13, 2, 8) and w.dtype == beta.dtype == g.dtype == torch.float32
    torch.testing.assert_close(w.norm(dim=-1), torch.ones(2, 13, 2))
    assert bool((beta > 0).all() and (beta <= 2).all() and (g < 0).all())
    o = path_attention(q, k, v, w, beta, g, backend="reference")
    torch.testing.assert_close(m(x), m.o_proj(o.reshape(2, 13, 32)), rtol=0, atol=0)
    # the projections really feed it: another beta changes the output
    o2 = path_attention(q, k, v, w, beta * 0.5, g, backend="reference")
    assert (m.o_proj(o2.reshape(2, 13, 32)) - m(x)).abs().max() > 1e-3


def test_beta_stays_in_the_spec_interval():
    m = layer()
    with torch.no_grad():
        m.beta_proj.bias.fill_(-1e4)        # sigmoid underflows to 0 in float32
    beta = m.project(torch.randn(1, 5, 32, dtype=torch.float64))[4]
    assert bool((beta > 0).all())
    with torch.no_grad():
        m.beta_proj.bias.fill_(1e4)
    assert bool((m.project(torch.randn(1, 5, 32, dtype=torch.float64))[4] == 2).all())


def test_short_conv_state_and_boundaries():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 11, 6, generator=gen, dtype=torch.float64)
    weight = torch.randn(6, 4, generator=gen, dtype=torch.float64)
    full, state = causal_short_conv(x, weight)
    # definition: out[t] = sum_i weight[:, K-1-i] x[t-i]
    want = sum(weight[:, 3 - i] * torch.nn.functional.pad(x, (0, 0, i, 0))[:, :11] for i in range(4))
    torch.testing.assert_close(full, want)
    torch.testing.assert_close(state, x[:, -3:])
    parts, s = [], None
    for a, b in ((0, 5), (5, 6), (6, 8), (8, 11)):        # chunks incl. one shorter than K-1
        out, s = causal_short_conv(x[:, a:b], weight, s)
        parts.append(out)
    torch.testing.assert_close(torch.cat(parts, 1), full)
    torch.testing.assert_close(s, state)
    # packed sequences do not see each other
    packed = torch.cat([x[0, :4], x[1, :7]])[None]
    out, _ = causal_short_conv(packed, weight, cu_seqlens=torch.tensor([0, 4, 11]))
    torch.testing.assert_close(out[0, :4], causal_short_conv(x[:1, :4], weight)[0][0])
    torch.testing.assert_close(out[0, 4:], causal_short_conv(x[1:, :7], weight)[0][0])


def test_packed_sequences_equal_separate_calls():
    m = layer(gate=True)
    a, b = torch.randn(1, 6, 32, dtype=torch.float64), torch.randn(1, 9, 32, dtype=torch.float64)
    packed = m(torch.cat([a, b], 1), cu_seqlens=torch.tensor([0, 6, 15]))
    torch.testing.assert_close(packed, torch.cat([m(a), m(b)], 1))


@pytest.mark.parametrize("HQ, H, gate, qk", VARIANTS)
def test_prefill_then_decode_equals_full_forward(HQ, H, gate, qk):
    m = layer(HQ, H, gate, qk)
    x = torch.randn(2, 17, 32, dtype=torch.float64)
    with torch.no_grad():
        full = m(x)
        cache = PaTHCache()
        outs = [m(x[:, :7], cache=cache)]
        assert cache.seq_len(0) == 7 and cache[0].conv.shape == (2, 2, H * 8)   # [B, conv_size - 1, H*D]
        for a, b in ((7, 8), (8, 11), (11, 12), (12, 17)):   # one- and multi-token steps
            outs.append(m(x[:, a:b], cache=cache))
    assert cache.seq_len() == 17
    # w is normalised in float32, so rounding there bounds the agreement
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-5, atol=1e-6)


def test_cache_state_matters_and_is_checked():
    m = layer()
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    with torch.no_grad():
        cache = PaTHCache()
        m(x[:, :8], cache=cache)
        step = m(x[:, 8:], cache=cache)
        fresh = m(x[:, 8:], cache=PaTHCache())                 # no history: a different answer
        assert (step - fresh).abs().max() > 1e-3
        cache2 = PaTHCache()
        m(x[:, :8], cache=cache2)
        cache2[0].conv.zero_()                                  # a lost conv state changes w, hence o
        assert (m(x[:, 8:], cache=cache2) - step).abs().max() > 1e-6
        with pytest.raises(ValueError, match="batch size 1 but the cache was filled with batch size 2"):
            m(x[:1, 8:], cache=cache)
    with pytest.raises(ValueError, match="cache with packed sequences"):
        m(x[:1], cache=PaTHCache(), cu_seqlens=torch.tensor([0, 4, 9]))


def test_layers_sharing_a_cache_slot_are_refused():
    """Two layers with the same layer_idx on one cache would read and extend each other's keys (a wrong
    generation, no error): the second one is refused with the fix; distinct indices work, a slot whose
    layer is gone or a reset cache can be taken again."""
    a, b = layer(), layer()
    x = torch.randn(1, 6, 32, dtype=torch.float64)
    with torch.no_grad():
        cache = PaTHCache()
        a(x, cache=cache)
        with pytest.raises(ValueError, match=r"slot layer_idx=0 already holds the state of another layer.*"
                                             r"its own layer_idx"):
            b(x, cache=cache)
        assert cache.seq_len(0) == 6                            # the refused call changed nothing
        c = layer(layer_idx=1)
        c(x, cache=cache)
        assert sorted(cache) == [0, 1]
        cache.reset()
        b(x, cache=cache)                                       # a reset cache has no owners
        del b
        import gc
        gc.collect()
        cache2 = PaTHCache()
        d = layer()
        d(x, cache=cache2)
        del d
        gc.collect()
        layer()(x[:, :1], cache=cache2)                         # the slot's layer is gone: taken over


def test_empty_input_is_a_clear_error():
    m = layer()
    for shape in ((1, 0, 32), (0, 4, 32)):
        with pytest.raises(ValueError, match=r"hidden_states has no tokens"):
            m(torch.zeros(shape, dtype=torch.float64))


def test_constructor_errors_name_the_argument():
    with pytest.raises(ValueError, match=r"num_heads \(4\) must be a multiple of num_kv_heads \(3\)"):
        PaTHAttention(32, 4, num_kv_heads=3)
    with pytest.raises(ValueError, match=r"hidden_size \(30\) is not a multiple of num_heads \(4\); pass head_dim"):
        PaTHAttention(30, 4)
    with pytest.raises(ValueError, match="backend must be one of"):
        PaTHAttention(32, 4, backend="cuda")
    with pytest.raises(ValueError, match="w_rank must be a positive int"):
        PaTHAttention(32, 4, w_rank=0)
    with pytest.raises(ValueError, match=r"hidden_states must be \[B, T, 32\]"):
        PaTHAttention(32, 4)(torch.randn(2, 5, 16))


def test_training_gradients_reach_every_parameter():
    m = layer(gate=True, qk=True, dtype=torch.float32)
    loss = m(torch.randn(2, 10, 32)).square().sum()
    loss.backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("gate", [False, True])
def test_greedy_generation_with_cache_equals_rerunning(gate):
    lm = lm_module()
    torch.manual_seed(5)
    model = lm.TinyLM(vocab=23, hidden=32, layers=3, heads=4, kv_heads=2, backend="reference", gate=gate).double()
    prompt = torch.randint(1, 23, (3, 6))
    cached = lm.generate(model, prompt, 7, use_cache=True)
    full = lm.generate(model, prompt, 7, use_cache=False)
    assert cached.shape == (3, 7)
    assert torch.equal(cached, full)
    assert len(set(cached.flatten().tolist())) > 1   # not a degenerate constant continuation


def test_greedy_generation_triton_interpreter(monkeypatch):
    """Full re-runs through the Triton kernels (interpreter) vs cached decoding: same tokens."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    lm = lm_module()
    torch.manual_seed(7)
    model = lm.TinyLM(vocab=19, hidden=64, layers=2, heads=2, kv_heads=1, backend="triton", gate=True)
    prompt = torch.randint(1, 19, (1, 5))
    cached = lm.generate(model, prompt, 3, use_cache=True)
    full = lm.generate(model, prompt, 3, use_cache=False)
    assert torch.equal(cached, full)


@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_compile_fullgraph_matches_eager(monkeypatch, backend):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    torch.manual_seed(3)
    m = PaTHAttention(64, 2, num_kv_heads=1, use_forget_gate=True, use_qk_norm=True, w_rank=8, backend=backend)
    x = torch.randn(1, 24, 64, requires_grad=True)

    def loss_fn(x):
        return m(x).square().sum()

    eager = loss_fn(x)
    g_eager = torch.autograd.grad(eager, [x, *m.parameters()])
    compiled = torch.compile(loss_fn, fullgraph=True, backend="aot_eager")
    comp = compiled(x)
    g_comp = torch.autograd.grad(comp, [x, *m.parameters()])
    torch.testing.assert_close(comp, eager)
    for a, b in zip(g_comp, g_eager):
        torch.testing.assert_close(a, b)


def test_example_runs_tiny():
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "lm_generate.py"), "--tiny", "--steps", "3",
                          "--device", "cpu", "--backend", "reference"], capture_output=True, text=True, timeout=300,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "train: 3 steps" in out.stdout and "cached generation equals uncached: True" in out.stdout
    assert "tok/s" in out.stdout


@pytest.mark.gpu
def test_gpu_layer_training_compile_and_generation():
    """On a GPU: compiled (inductor) training step == eager, and cached decoding tracks the full forward."""
    torch.manual_seed(11)
    m = PaTHAttention(256, 4, num_kv_heads=2, use_forget_gate=True, use_qk_norm=True, device="cuda",
                      dtype=torch.bfloat16)
    x = torch.randn(2, 300, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def loss_fn(x):
        return m(x).float().square().mean()

    eager = loss_fn(x)
    g_eager = torch.autograd.grad(eager, [x, *m.parameters()])
    compiled = torch.compile(loss_fn, fullgraph=True)
    comp = compiled(x)
    g_comp = torch.autograd.grad(comp, [x, *m.parameters()])
    torch.testing.assert_close(comp, eager, rtol=2e-2, atol=1e-3)
    for a, b in zip(g_comp, g_eager):
        assert ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12)).item() < 3e-2
    with torch.no_grad():
        xs = x.detach()
        full = m(xs).float()
        cache = PaTHCache()
        parts = [m(xs[:, :250], cache=cache)]
        for t in range(250, 300, 10):
            parts.append(m(xs[:, t:t + 10], cache=cache))
        inc = torch.cat(parts, 1).float()
    assert ((inc - full).norm() / full.norm()).item() < 2e-2
