"""Decoding as users call it: static-capacity caches with the length on the device, the prepared hot path of
``path_attention_decode``, CUDA-graph capture of a decode step, and the layering of the decode modules.

CPU: the Triton kernels run in the interpreter (tests/conftest.py) at tiny shapes; every result is checked
against the float64 reference decode (relative Frobenius error per tensor) on random inputs with
beta in [1.5, 2) and real gate decay. GPU (``-m gpu``): a captured step equals the eager step, a captured
model generation equals eager generation and a full recompute.
"""
from __future__ import annotations

import ast
import copy
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import pathtune
from pathtune import PaTHAttention, PaTHCache
from pathtune.codegen.kv_cache import CacheFullError, PaTHKVCache
from pathtune.runtime import decode as decode_mod
from pathtune.runtime.reference.recurrent import path_attention_decode as ref_decode
from pathtune.runtime.reference.recurrent import path_attention_prefill as ref_prefill

ROOT = Path(__file__).resolve().parents[1]
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def make(B, T, HQ, H, D, gate, dtype=torch.float32, wdtype=torch.float32, device=DEV, gen=None):
    """Random step inputs: q/k/v in dtype, unit w, beta in [1.5, 2), log-sigmoid gates (w/beta/g in wdtype)."""
    def r(*s):
        return torch.randn(*s, device=device, generator=gen)
    q, k, v = r(B, T, HQ, D).to(dtype), r(B, T, H, D).to(dtype), r(B, T, H, D).to(dtype)
    w = F.normalize(r(B, T, H, D), dim=-1).to(wdtype)
    beta = (torch.rand(B, T, H, device=device, generator=gen) * 0.5 + 1.5).to(wdtype)
    g = F.logsigmoid(r(B, T, HQ) + 3.0).to(wdtype) if gate else None
    return q, k, v, w, beta, g


def f64(xs):
    return [None if x is None else x.double() for x in xs]


def both_prefilled(B, T0, HQ, H, D, gate, cap, cdt=torch.float32, static=True):
    """(kernel cache, float64 reference cache) holding the same prompt (keys stored in cdt)."""
    ref = ref_prefill(*f64(make(B, T0, HQ, H, D, gate)), cache_dtype=cdt, max_len=cap)[1]
    tri = PaTHKVCache(ref.k.clone(), ref.v.clone(), None if ref.c is None else ref.c.float(), T0, HQ, static=static)
    return tri, ref


# ---- the cache type ----------------------------------------------------------------------------------------

def test_length_lives_on_the_device_and_the_host_mirror_follows():
    cache = PaTHKVCache.empty(2, 2, 32, 32, 4, max_len=40, gated=True, static=True, device=DEV)
    assert cache.length == 0 and cache.length_tensor.dtype == torch.int32
    assert cache.length_tensor.device == cache.k.device
    cache.length = 7
    assert int(cache.length_tensor) == 7
    cache.advanced(3)
    assert cache.length == 10 and int(cache.length_tensor) == 7   # advanced() records what a kernel did
    cache.length_tensor.fill_(12)       # what replays of a captured step do: only the device moves
    cache._len = None                   # the state a capture leaves
    assert cache.length == 12 and cache.sync_length() == 12 and cache._len == 12
    cache.length_tensor.fill_(45)       # a replay past the capacity
    cache._len = None
    with pytest.raises(CacheFullError, match="overflowed during CUDA-graph replay.*max_len=40"):
        _ = cache.length
    copied = copy.deepcopy(cache)
    assert copied.length_tensor is not cache.length_tensor and copied.static


def test_static_cache_refuses_to_grow_with_one_line_error_growable_grows():
    static = PaTHKVCache.empty(1, 1, 32, 32, max_len=8, static=True, device=DEV)
    static.length = 6
    with pytest.raises(CacheFullError) as e:
        static.reserve(3)
    msg = str(e.value)
    assert "\n" not in msg and "max_len=8" in msg and "max_len >= 9" in msg
    k_ptr = static.k.data_ptr()
    static.reserve(2)
    assert static.k.data_ptr() == k_ptr and static.max_len == 8
    grow = PaTHKVCache.empty(1, 1, 32, 32, max_len=8, device=DEV)
    grow.length = 6
    grow.reserve(3)
    assert grow.max_len == 16 and grow.length == 6


# ---- the Triton step on a static cache, through the public API ---------------------------------------------

@pytest.mark.parametrize("HQ, H, gate, tokens, cdt", [
    (2, 2, True, (1, 1, 4), torch.float32),         # MHA: one-row path, then a 4-token step
    (4, 2, False, (1, 16), torch.bfloat16),         # GQA, ungated, a 16-token step
    (4, 1, True, (4, 1), torch.bfloat16),           # MQA gated
])
def test_static_cache_decode_matches_reference(HQ, H, gate, tokens, cdt):
    """Capacity well above the length (empty splits at first, the grid fixed by the capacity), steps of 1, 4
    and 16 tokens: every output and the rotated key cache match the float64 reference; the device length
    and the host mirror advance together."""
    B, D, T0, cap = 2, 32, 21, 80
    tri, ref = both_prefilled(B, T0, HQ, H, D, gate, cap, cdt)
    exact = copy.deepcopy(ref)              # the same stored keys, stepped without rounding
    exact.k, exact.v = exact.k.double(), exact.v.double()
    k_ptr = tri.k.data_ptr()
    for tn in tokens:
        xs = make(B, tn, HQ, H, D, gate, dtype=cdt)
        o = pathtune.path_attention_decode(*xs, tri, backend="triton", config={"decode_splits": 4,
                                                                                "decode_block_n": 64})
        r = ref_decode(*f64(xs), ref)
        ref_decode(*f64(xs), exact)
        assert rel(o, r) < (3e-5 if cdt == torch.float32 else 1.5e-2), tn
        n = ref.length
        # lazy rotation rounds a key once per flush, the reference once per token: against the exact keys,
        # within the tolerance or the per-token-rounding reference's own error
        err, ref_err = rel(tri.k[:, :n], exact.k[:, :n]), rel(ref.k[:, :n], exact.k[:, :n])
        assert err < max(3e-6 if cdt == torch.float32 else 3e-3, 1.1 * ref_err), (err, ref_err)
        assert tri.length == n and int(tri.length_tensor) == n
    assert tri.k.data_ptr() == k_ptr and tri.max_len == cap


def test_splits_merge_in_the_one_launch_and_leave_the_counters_at_zero(spy_launches):
    """Four splits (one 16-row tile each of the 64-row capacity; the last owns no frame tile, only the pending
    block), GQA 2, gated, steps of 1, 3 and 3 tokens with a 3-token window (the second step flushes): one
    ``decode_kernel`` launch per step, whose last split to arrive merges o and lse, both equal to the float64
    reference token by token; the arrival counters are back at zero after every step."""
    from pathtune.codegen.triton import decode as dec
    from pathtune.codegen.triton import path_decode_triton
    from pathtune.runtime.reference.recurrent import path_attention_decode_step

    grids = spy_launches(dec, "decode_kernel")
    B, HQ, H, D, T0, cap = 2, 4, 2, 16, 45, 64
    tri, ref = both_prefilled(B, T0, HQ, H, D, True, cap)
    assert tri.arrival_counters.shape == (B * H + 1,) and tri.arrival_counters.dtype == torch.int32
    for i, tn in enumerate((1, 3, 3)):
        xs = make(B, tn, HQ, H, D, True)
        o, lse = path_decode_triton(*xs, tri, config=dict(decode_splits=4, decode_block_n=16), window=3,
                                    return_lse=True)
        for t in range(tn):
            r_o, r_lse = path_attention_decode_step(*[None if x is None else x[:, t] for x in f64(xs)], ref,
                                                    return_lse=True)
            assert rel(o[:, t], r_o) < 3e-5 and rel(lse[:, t], r_lse) < 1e-6, (tn, t)
        assert grids == [(B * H, 4)] * (i + 1)
        assert not bool(tri.arrival_counters.any())
        assert tri.length == ref.length and int(tri.length_tensor) == ref.length
    assert tri.frame == int(tri.frame_tensor) == T0 + 4     # the second step flushed


def test_low_precision_w_beta_g_are_read_in_their_dtype():
    """w / beta / g in bfloat16 are converted in the kernel's registers: the result equals the call with
    their float32 copies exactly (the conversion is exact), and matches the float64 reference."""
    B, HQ, H, D = 2, 2, 2, 32
    tri, ref = both_prefilled(B, 12, HQ, H, D, True, 20, torch.bfloat16)
    twin = copy.deepcopy(tri)
    q, k, v, w, beta, g = make(B, 1, HQ, H, D, True, dtype=torch.bfloat16, wdtype=torch.bfloat16)
    o16 = pathtune.path_attention_decode(q, k, v, w, beta, g, tri, backend="triton")
    o32 = pathtune.path_attention_decode(q, k, v, w.float(), beta.float(), g.float(), twin, backend="triton")
    assert torch.equal(o16, o32) and torch.equal(tri.k, twin.k) and torch.equal(tri.c, twin.c)
    r = ref_decode(*f64((q, k, v, w, beta, g)), ref)
    assert rel(o16, r) < 1.5e-2


def test_eager_step_past_a_static_capacity_is_a_clear_error():
    tri, _ = both_prefilled(1, 10, 2, 2, 32, True, 12)
    pathtune.path_attention_decode(*make(1, 2, 2, 2, 32, True), tri, backend="triton")
    with pytest.raises(CacheFullError, match=r"12 tokens \+ 1 new > max_len=12"):
        pathtune.path_attention_decode(*make(1, 1, 2, 2, 32, True), tri, backend="triton")
    assert tri.length == 12


def test_replay_past_the_capacity_drops_rows_and_is_reported():
    """With the host length unknown (after a capture) a static cache is guarded on the device: the kernel
    writes no row past the capacity, and the next length read raises."""
    tri, _ = both_prefilled(1, 11, 2, 2, 32, False, 12)
    tri._len = None
    pathtune.path_attention_decode(*make(1, 3, 2, 2, 32, False), tri, backend="triton")
    assert int(tri.length_tensor) == 14
    with pytest.raises(CacheFullError, match="overflowed"):
        _ = tri.length


# ---- the prepared hot path -------------------------------------------------------------------------------

def test_checks_run_once_per_call_key(monkeypatch):
    """Spec validation, cache checks and dispatch run on the first call of a key only; a new shape or a new
    length bucket prepares again; a bad call still gets its error."""
    calls = []
    real = decode_mod.validate_inputs
    monkeypatch.setattr(decode_mod, "validate_inputs", lambda *a, **kw: (calls.append(1), real(*a, **kw))[1])
    pathtune.runtime.dispatch.clear_cache()
    tri, ref = both_prefilled(1, 5, 2, 2, 32, True, 64)
    for _ in range(3):
        xs = make(1, 1, 2, 2, 32, True)
        o = pathtune.path_attention_decode(*xs, tri, backend="triton")
        assert rel(o, ref_decode(*f64(xs), ref)) < 3e-5
    assert len(calls) == 1
    xs = make(1, 2, 2, 2, 32, True)          # two tokens: another key
    pathtune.path_attention_decode(*xs, tri, backend="triton")
    ref_decode(*f64(xs), ref)
    assert len(calls) == 2
    xs = make(1, 12, 2, 2, 32, True)         # 10 + 12 keys: the next length bucket
    pathtune.path_attention_decode(*xs, tri, backend="triton")
    assert len(calls) == 3
    bad = list(make(1, 1, 2, 2, 32, True))
    bad[3] = bad[3][..., :16]                # w of another head dim
    with pytest.raises(ValueError, match="w"):
        pathtune.path_attention_decode(*bad, tri, backend="triton")
    with pytest.raises(ValueError, match="gated"):
        pathtune.path_attention_decode(*make(1, 1, 2, 2, 32, False), tri, backend="triton")


def test_value_checks_still_run_per_call_on_cpu():
    """CPU inputs are value-checked on every call (not only the first of a key)."""
    cache = PaTHKVCache.empty(1, 2, 32, 32, 2, max_len=8, device="cpu")
    xs = list(make(1, 1, 2, 2, 32, False, device="cpu"))
    pathtune.path_attention_decode(*xs, cache, backend="reference")
    pathtune.path_attention_decode(*xs, cache, backend="reference")
    xs[4] = xs[4] + 1.0                      # beta past 2
    with pytest.raises(ValueError, match="beta must lie in"):
        pathtune.path_attention_decode(*xs, cache, backend="reference")


# ---- the layer with a static PaTHCache -------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_layer_static_cache_equals_full_forward(backend):
    torch.manual_seed(2)
    dt = torch.float64 if backend == "reference" else torch.float32
    m = PaTHAttention(64, 2, num_kv_heads=1, use_forget_gate=True, use_qk_norm=True, w_rank=8, backend=backend,
                      dtype=dt, device=DEV)
    x = torch.randn(2, 15, 64, dtype=dt, device=DEV)
    oracle = copy.deepcopy(m).double()       # the same weights, float64 reference attention
    oracle.backend = "reference"
    with torch.no_grad():
        full = oracle(x.double())
        cache = PaTHCache(max_len=32)
        outs = [m(x[:, :9], cache=cache)]
        kv, conv = cache[0].kv, cache[0].conv
        assert kv.static and kv.max_len == 32
        ptrs = (kv.k.data_ptr(), conv.data_ptr())
        for a, b in ((9, 10), (10, 14), (14, 15)):
            outs.append(m(x[:, a:b], cache=cache))
        assert (kv.k.data_ptr(), cache[0].conv.data_ptr()) == ptrs   # nothing reallocated: capturable
        assert cache.seq_len() == 15
    assert rel(torch.cat(outs, 1), full) < (1e-6 if dt == torch.float64 else 2e-3)   # w is normalised in fp32
    with pytest.raises(ValueError, match="PaTHCache.max_len=8. holds at most 8"):
        m(x, cache=PaTHCache(max_len=8))
    with pytest.raises(ValueError, match="max_len must be a positive int"):
        PaTHCache(max_len=0)


# ---- the generation benchmark and the decode probe (their code paths, on the CPU) ---------------------------

def test_rope_baseline_cache_is_right_and_bench_cells_are_complete():
    """The RoPE + SDPA baseline of examples/lm_generate.py: cached greedy generation (static KV cache) equals
    re-running the sequence; bench_generate fills every cell with a tokens/s and the ratio to RoPE."""
    from repo_scripts import load_script

    lm = load_script("examples/lm_generate.py")
    torch.manual_seed(6)
    model = lm.TinyLM(vocab=29, hidden=32, layers=2, heads=4, kv_heads=2, attention="rope").double()
    prompt = torch.randint(1, 29, (3, 9))
    cached = lm.generate(model, prompt, 6, use_cache=True, max_len=20)
    assert torch.equal(cached, lm.generate(model, prompt, 6, use_cache=False))
    cells = lm.bench_generate(kinds=("fox", "rope"), batches=(1, 2), prompts=(12,), modes=("eager",), gen=2,
                              hidden=32, layers=2, heads=2, vocab=29, dtype=torch.float64, device="cpu",
                              backend="reference", log=lambda line: None)
    assert len(cells) == 4 and all(c["tokens_per_s"] > 0 and c["vs_rope"] > 0 for c in cells)
    assert {c["kind"] for c in cells} == {"fox", "rope"}


def test_decode_probe_cpu_smoke(tmp_path):
    """benchmarks/decode_probe.py end to end at tiny shapes (the Triton kernels in the interpreter, no CUDA
    graphs): every section runs, the correctness checks are within bf16 tolerance, a candidate decode
    kernel (--candidate-decode) is timed beside the shipped one, --repeats times each row again, and the host
    profile times a candidate step class (--candidate-step) after checking its outputs against the shipped."""
    import json
    import subprocess
    import sys

    out = tmp_path / "probe.json"
    candidate = tmp_path / "decode_same.py"     # the shipped kernel rebuilt as a variant: same launch arguments
    candidate.write_text("from kernel_variants import load_variant, module_source\n"
                         "import pathtune.codegen.triton.decode as decode\n"
                         "decode_kernel = load_variant(module_source(decode), 'decode_kernel', 'decode_same')\n")
    step = tmp_path / "decode_step_same.py"     # the shipped step class rebuilt as a variant
    step.write_text("from kernel_variants import load_variant, module_source\n"
                    "import pathtune.codegen.triton.decode as decode\n"
                    "TritonDecodeStep = load_variant(module_source(decode), 'TritonDecodeStep', 'decode_step_same')\n")
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "decode_probe.py"), "--cpu-smoke",
                          "--budget-s", "600", "--candidate-decode", str(candidate), "--repeats", "2",
                          "--candidate-step", str(step),
                          "--out", str(out)],
                         capture_output=True, text=True, timeout=900,
                         cwd=ROOT, env={**__import__("os").environ, "TRITON_INTERPRET": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    d = json.loads(out.read_text())
    assert not d["skipped"] and not d.get("errors"), (d["skipped"], d.get("errors"))
    checks = d["checks"]["decode_vs_recompute"]
    assert len(checks) == 8 and all(c["o"] < 2e-2 and c["k"] < 1e-2 for c in checks), checks
    assert {c["prefill"] for c in checks} == {"reference", "api"}
    assert len(d["steps"]) == 4 and all("pathtune_ms" in r and "sdpa_ms" in r for r in d["steps"])
    assert all("fox_x_path" in r for r in d["steps"] if r["gate"])
    flushed = [r for r in d["steps"] if "flush_net_ms" in r]     # the lazy step's flush step, timed too
    assert flushed and all(r["flush_net_ms"] > 0 and r["amortized_ms"] > 0 for r in flushed), flushed
    assert all(r["candidate_flush_net_ms"] > 0 and r["candidate_amortized_ms"] > 0 for r in flushed), flushed
    for r in flushed:     # --repeats 2: the row's ratio and one more round, and their median
        rounds = r["x_sdpa_amortized_rounds"]
        assert len(rounds) == 2 and rounds[0] == r["x_sdpa_amortized"] and all(x > 0 for x in rounds), r
        assert r["x_sdpa_amortized_median"] == sum(rounds) / 2
    hp = d["host_profile"]    # the host-time section: loop, cProfile rows, the Triton launch alone
    assert len(hp) == 2 and all(r["wall_us_per_step"] > 0 and r["jit_launch_us"] > 0 and r["top_own_us_per_step"]
                                for r in hp), hp
    assert all(r["candidate_o_equal"] and r["candidate_wall_us_per_step"] > 0 for r in hp), hp   # --candidate-step
    # both loops step over the same cache lengths (the candidate's timing is comparable)
    assert all(r["candidate_loop_start_len"] == r["loop_start_len"] == r["cache_len"] + 1 for r in hp), hp
    one = [r for r in d["steps"] if r["tokens"] == 1]      # the tensor-core layout candidate: same outputs
    assert one and all(r["tc_layout_o_vs_rowwise"] < 1e-2 and r["tc_layout_net_ms"] > 0 for r in one), one
    assert len(d["profiles"]) == 2 and len(d["generate"]) == 6   # 3 attentions x 2 batches, eager


# ---- layering --------------------------------------------------------------------------------------------

def _imports(path: Path) -> set[str]:
    """Every module a file imports (top level and inside functions), relative imports resolved."""
    pkg = {"specs": "pathtune.specs", "codegen": "pathtune.codegen", "runtime": "pathtune.runtime",
           "tuning": "pathtune.tuning"}
    parts = path.relative_to(ROOT).with_suffix("").parts
    here = [pkg[parts[0]], *parts[1:-1]]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(here[:len(here) - node.level + 1])
                mod = f"{base}.{node.module}" if node.module else base
                out.add(mod)
                if not node.module:
                    out.update(f"{base}.{a.name}" for a in node.names)
            else:
                out.add(node.module)
    return out


def test_decode_modules_import_downward_only():
    """codegen imports neither runtime nor tuning (the KV cache type lives in codegen/kv_cache.py); no cycle
    runtime cache -> decode -> decode_dispatch -> cache; tuning/decode_tvm does not import decode_bench."""
    for path in sorted((ROOT / "codegen").rglob("*.py")):
        if path.name in ("gpu_check.py", "stage_probes.py", "build_gpu_check.py"):
            continue   # dev scripts that compare against the reference (issue: move them out of the package)
        bad = {m for m in _imports(path) if m.startswith(("pathtune.runtime", "pathtune.tuning"))}
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}"
    assert not {m for m in _imports(ROOT / "runtime" / "decode_dispatch.py") if m.endswith(".cache")}
    assert not {m for m in _imports(ROOT / "runtime" / "decode.py") if m.endswith((".cache", ".layer"))}
    assert "pathtune.tuning.decode_bench" not in _imports(ROOT / "tuning" / "decode_tvm.py")
    from pathtune.codegen.tvm.build_decode_bench import BENCH_SHAPES
    from pathtune.tuning.decode_bench import SHAPES
    assert BENCH_SHAPES == SHAPES


def test_public_names_stay_importable():
    from pathtune.runtime.decode import PaTHKVCache as a
    from pathtune.runtime.reference import PaTHKVCache as b
    from pathtune.runtime.reference.recurrent import PaTHKVCache as c
    assert pathtune.PaTHKVCache is a is b is c is PaTHKVCache


# ---- GPU: CUDA graphs ------------------------------------------------------------------------------------

def _capture(fn):
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


@pytest.mark.gpu
@pytest.mark.parametrize("D, H, HQ, gate, TN", [(64, 16, 16, False, 1), (128, 8, 8, True, 1), (128, 2, 8, True, 4)])
def test_gpu_captured_decode_step_equals_eager(D, H, HQ, gate, TN):
    """One public decode call captured in a CUDA graph, replayed 5 times with new inputs copied into its static
    buffers, equals the same 5 eager calls on a twin cache (outputs and key caches), and the float64 reference."""
    gen = torch.Generator(device="cuda").manual_seed(D + TN)
    B, T0, cap = 4, 3000, 3100
    tri, ref = both_prefilled(B, T0, HQ, H, D, gate, cap, torch.bfloat16)
    twin = copy.deepcopy(tri)
    static = make(B, TN, HQ, H, D, gate, dtype=torch.bfloat16, gen=gen)
    warm = copy.deepcopy(tri)
    pathtune.path_attention_decode(*static, warm, backend="auto")            # compile + prepare outside capture
    graph, out = _capture(lambda: pathtune.path_attention_decode(*static, tri, backend="auto"))
    assert tri.length_tensor.item() == T0                                     # capture runs nothing
    for _ in range(5):
        xs = make(B, TN, HQ, H, D, gate, dtype=torch.bfloat16, gen=gen)
        for dst, src in zip(static, xs):
            if dst is not None:
                dst.copy_(src)
        graph.replay()
        eager = pathtune.path_attention_decode(*xs, twin, backend="auto")
        r = ref_decode(*f64(xs), ref)
        assert torch.equal(out, eager)
        assert rel(out, r) < 2e-2
    n = T0 + 5 * TN
    assert tri.length == n == twin.length
    assert torch.equal(tri.k[:, :n], twin.k[:, :n]) and torch.equal(tri.v[:, :n], twin.v[:, :n])


@pytest.mark.gpu
@pytest.mark.parametrize("gate", [False, True])
def test_gpu_captured_model_generation_equals_eager_and_recompute(gate):
    """A small multi-layer LM (examples/lm_generate.py): greedy generation with the whole model's decode step
    captured in one CUDA graph equals eager cached generation, and the cached logits track a full recompute."""
    from repo_scripts import load_script

    lm = load_script("examples/lm_generate.py")
    torch.manual_seed(4)
    model = lm.TinyLM(vocab=64, hidden=256, layers=3, heads=4, kv_heads=2, gate=gate).cuda().to(torch.bfloat16)
    model.eval()
    prompt = torch.randint(1, 64, (2, 300), device="cuda")
    eager = lm.generate(model, prompt, 24, use_cache=True, max_len=400)
    graphed = lm.generate(model, prompt, 24, use_cache=True, max_len=400, cuda_graph=True)
    assert torch.equal(eager, graphed)
    rel_err = lm.cached_vs_full_logits(model, prompt, eager)
    assert rel_err < 3e-2


def test_a_pickled_cache_keeps_or_regains_its_arrival_counters():
    """A cache survives pickling with its state; one pickled without arrival counters (an older version) gets
    zeroed ones back, so the Triton step can run on it."""
    import pickle

    from pathtune.codegen.kv_cache import PaTHKVCache

    cache = PaTHKVCache.empty(2, 3, 8, 8, 6, max_len=32, gated=True, dtype=torch.float32,
                              gate_dtype=torch.float32, device="cpu")
    cache.length = 5
    back = pickle.loads(pickle.dumps(cache))
    assert back.length == 5 and back.arrival_counters.tolist() == [0] * 7
    old = cache.__getstate__()
    del old["_count"]
    bare = PaTHKVCache.__new__(PaTHKVCache)
    bare.__setstate__(old)
    assert bare.arrival_counters.dtype == torch.int32 and bare.arrival_counters.tolist() == [0] * 7
