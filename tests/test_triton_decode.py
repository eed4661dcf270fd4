"""The fused Triton decode step (codegen/triton/decode.py) against the float64 reference decode.

On the CPU the kernels run in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1), with
tiny shapes; the interpreter's fp32 -> bf16 conversion truncates, so the kernel rounds on the bits
there, and the stored bf16 keys equal the reference's (fp64 math, rounded to bf16) up to rare ties.
Metric: relative Frobenius error ||out - ref|| / ||ref||; inputs are fresh random tensors with
beta in [1.5, 2) and real gate decay (log-sigmoid gates).

Key caches: the kernel rotates lazily (a key is rounded to the cache dtype once per flush, and once when
``cache.k`` materializes pending rows), the reference once per token.  So keys are checked against the
exact ones (the reference decode on a float64 twin of the same prefilled cache): within TOL_K, or within the
error the per-token-rounding reference itself has (10 % slack), whichever is larger (``assert_keys``).
"""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import pathtune
from pathtune.codegen.triton import TritonParams, path_decode_triton, path_prefill_triton
from pathtune.codegen.triton.decode import decode_layout
from pathtune.runtime.reference import naive_path_attention
from pathtune.runtime.reference.recurrent import (
    PaTHKVCache,
    current_frame_keys,
    path_attention_decode,
    path_attention_prefill,
)

DEV = "cuda" if torch.cuda.is_available() else "cpu"
# relative Frobenius tolerances by cache dtype (o: output, k: the rotated key cache)
TOL_O = {torch.float32: 2e-5, torch.bfloat16: 1.2e-2, torch.float16: 2e-3}
TOL_K = {torch.float32: 2e-6, torch.bfloat16: 2e-3, torch.float16: 2e-4}


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def make(B, T, HQ, H, D, DV, gate, dtype=torch.float32, device=DEV):
    """Fresh random step inputs: q/k/v in dtype, unit w, beta in [1.5, 2), log-sigmoid gates (fp32)."""
    q = torch.randn(B, T, HQ, D, device=device).to(dtype)
    k = torch.randn(B, T, H, D, device=device).to(dtype)
    v = torch.randn(B, T, H, DV, device=device).to(dtype)
    w = F.normalize(torch.randn(B, T, H, D, device=device), dim=-1)
    beta = torch.rand(B, T, H, device=device) * 0.5 + 1.5
    g = F.logsigmoid(torch.randn(B, T, HQ, device=device) + 3.0) if gate else None
    return q, k, v, w, beta, g


def f64(xs):
    return [None if x is None else x.double() for x in xs]


_EXACT: dict = {}   # id(reference cache) -> (that cache, its float64 twin), stepped together by step_both


def track_exact(ref_cache):
    """Keep a float64 twin of ``ref_cache`` (same stored keys) that ``step_both`` steps alongside it."""
    exact = copy.deepcopy(ref_cache)
    exact.k, exact.v = exact.k.double(), exact.v.double()
    if exact.c is not None:
        exact.c = exact.c.double()
    _EXACT[id(ref_cache)] = (ref_cache, exact)
    return ref_cache


def prefilled(B, T0, HQ, H, D, DV, gate, cdt):
    """(triton cache, reference cache): the float64 reference prefill, keys/values stored in cdt;
    the Triton copy keeps the gate cumsum in float32, the reference copy in float64."""
    ref_cache = path_attention_prefill(*f64(make(B, T0, HQ, H, D, DV, gate)), cache_dtype=cdt)[1]
    tri = copy.deepcopy(ref_cache)
    if tri.c is not None:
        tri.c = tri.c.float()
    return tri, track_exact(ref_cache)


def step_both(tri, ref_cache, inputs, **kw):
    o = path_decode_triton(*inputs, tri, **kw)
    ref = path_attention_decode(*f64(inputs), ref_cache)
    if id(ref_cache) in _EXACT:
        path_attention_decode(*f64(inputs), _EXACT[id(ref_cache)][1])
    return o, ref


def assert_keys(tri, ref_cache, n, tol):
    """The kernel's current-frame keys (``tri.k`` materializes pending rows) against the exact keys: within
    ``tol`` or within 1.1x the per-token-rounding reference's own error."""
    exact = _EXACT[id(ref_cache)][1].k[:, :n]
    err, ref_err = rel(tri.k[:, :n], exact), rel(ref_cache.k[:, :n], exact)
    assert err < max(tol, 1.1 * ref_err), (err, ref_err)


CASES = [
    # HQ, H, D, DV, T_new, gate, cache dtype, splits, block_n
    (2, 2, 16, 16, 1, True, torch.float32, 1, 16),      # MHA single token: row-reduction path, one split
    (2, 2, 32, 32, 1, True, torch.bfloat16, 2, 16),     # the same gated, bf16, split-K
    (2, 2, 32, 16, 1, False, torch.bfloat16, 4, 16),    # D != DV, ungated, bf16, ragged split-K
    (4, 2, 16, 32, 1, True, torch.bfloat16, 2, 16),     # GQA (tensor-core path), D != DV
    (4, 1, 16, 16, 3, True, torch.float32, 3, 16),      # multi-token step, GQA 4
    (2, 2, 16, 16, 4, False, torch.bfloat16, 4, 16),    # multi-token, MHA, bf16
    (2, 2, 16, 16, 4, True, torch.bfloat16, 2, 16),     # multi-token, MHA, gated, bf16
    (6, 2, 32, 16, 2, True, torch.float16, 2, 64),      # G = 3 (not a power of two), fp16, one tile
]


@pytest.mark.parametrize("HQ,H,D,DV,TN,gate,cdt,splits,block_n", CASES)
def test_step_matches_reference(HQ, H, D, DV, TN, gate, cdt, splits, block_n):
    B, T0 = 2, 37  # 37 + TN cache rows: the last 16-row tile is ragged
    tri, ref_cache = prefilled(B, T0, HQ, H, D, DV, gate, cdt)
    inputs = make(B, TN, HQ, H, D, DV, gate, dtype=torch.float32 if cdt == torch.float32 else cdt)
    o, ref = step_both(tri, ref_cache, inputs, config=dict(decode_splits=splits, decode_block_n=block_n))
    assert o.shape == (B, TN, HQ, DV) and o.dtype == inputs[0].dtype
    assert tri.length == ref_cache.length == T0 + TN
    assert rel(o, ref) < TOL_O[cdt], rel(o, ref)
    # the in-place update: every cached key rotated exactly as the reference rotates it
    n = tri.length
    assert_keys(tri, ref_cache, n, TOL_K[cdt])
    assert torch.equal(tri.v[:, :n], ref_cache.v[:, :n])
    if gate:
        assert rel(tri.c[:, :n], ref_cache.c[:, :n]) < 1e-6


@pytest.mark.parametrize("HQ,H", [(2, 2), (4, 2)])
def test_new_tokens_straddle_tiles_and_splits(HQ, H):
    """New rows 46, 47 | 48 fall in two tiles owned by two programs (one tile per split): each program
    writes and rotates its own new rows."""
    B, D, T0, TN = 1, 16, 46, 3
    tri, ref_cache = prefilled(B, T0, HQ, H, D, D, True, torch.float32)
    o, ref = step_both(tri, ref_cache, make(B, TN, HQ, H, D, D, True),
                       config=dict(decode_splits=16, decode_block_n=16))
    assert rel(o, ref) < TOL_O[torch.float32]
    assert_keys(tri, ref_cache, 49, TOL_K[torch.float32])
    assert rel(tri.c[:, :49], ref_cache.c[:, :49]) < 1e-6


@pytest.mark.parametrize("HQ,TN", [(2, 1), (4, 2)])
def test_64bit_row_offsets(monkeypatch, HQ, TN):
    """The 64-bit offset variant (caches of >= 2**31 elements per sequence), forced on a tiny cache."""
    from pathtune.codegen.triton import decode as dec

    monkeypatch.setattr(dec, "_OFF64_ELEMS", 0)
    tri, ref_cache = prefilled(1, 30, HQ, 2, 16, 16, True, torch.float32)
    o, ref = step_both(tri, ref_cache, make(1, TN, HQ, 2, 16, 16, True),
                       config=dict(decode_block_n=16, decode_splits=2))
    assert rel(o, ref) < TOL_O[torch.float32]
    assert_keys(tri, ref_cache, tri.length, TOL_K[torch.float32])


def test_empty_cache_grows_over_consecutive_steps():
    """From an empty cache (capacity 0): steps of 1, 3, 1, 2 tokens, checked after every step."""
    B, HQ, H, D, DV = 1, 4, 2, 16, 16
    tri = PaTHKVCache.empty(B, H, D, DV, HQ, max_len=0, gated=True, dtype=torch.bfloat16, device=DEV)
    ref_cache = track_exact(PaTHKVCache.empty(B, H, D, DV, HQ, max_len=0, gated=True, dtype=torch.bfloat16,
                                              gate_dtype=torch.float64, device=DEV))
    cfg = dict(decode_splits=2, decode_block_n=16)
    for TN in (1, 3, 1, 2, 1):
        inputs = make(B, TN, HQ, H, D, DV, True, dtype=torch.bfloat16)
        o, ref = step_both(tri, ref_cache, inputs, config=cfg)
        assert rel(o, ref) < TOL_O[torch.bfloat16]
        assert_keys(tri, ref_cache, tri.length, TOL_K[torch.bfloat16])
    assert tri.length == 8 and tri.max_len >= 8


def test_mha_single_token_consecutive_steps_fp32():
    """Many MHA single-token steps (row path) across tile and split boundaries stay at fp32 accuracy."""
    B, HQ, H, D = 2, 2, 2, 16
    tri, ref_cache = prefilled(B, 13, HQ, H, D, D, True, torch.float32)
    for _ in range(6):
        o, ref = step_both(tri, ref_cache, make(B, 1, HQ, H, D, D, True),
                           config=dict(decode_splits=8, decode_block_n=16))
        assert rel(o, ref) < TOL_O[torch.float32]
    assert_keys(tri, ref_cache, tri.length, 1e-5)


@pytest.mark.parametrize("stages", [1, 3])
@pytest.mark.parametrize("HQ,TN,cdt", [(2, 1, torch.float32), (2, 1, torch.bfloat16), (4, 2, torch.bfloat16)],
                         ids=["row-fp32", "row-bf16", "matrix-bf16"])
def test_pipelined_tile_loop_matches_reference(monkeypatch, spy_launches, stages, HQ, TN, cdt):
    """decode_num_stages pipelines the key-tile loop (tl.range(num_stages=)) of both paths: the one-row
    path (MHA, one token) and the tensor-core path (GQA, two tokens).  Several tiles per split, so the
    loop runs more iterations than stages; the result equals the float64 reference either way, and the
    launch carries STAGES (None for 1: the loop as written)."""
    from pathtune.codegen.triton import decode as dec

    launches = spy_launches(dec, "decode_kernel", lambda grid, kw: kw["STAGES"])
    B, H, D = 2, 2, 16
    tri, ref_cache = prefilled(B, 75, HQ, H, D, D, True, cdt)   # 75 + TN rows: 5 tiles of 16, 3 per split
    inputs = make(B, TN, HQ, H, D, D, True, dtype=torch.float32 if cdt == torch.float32 else cdt)
    o, ref = step_both(tri, ref_cache, inputs,
                       config=dict(decode_block_n=16, decode_splits=2, decode_num_stages=stages))
    assert launches == [None if stages == 1 else stages]
    assert rel(o, ref) < TOL_O[cdt], rel(o, ref)
    n = tri.length
    assert_keys(tri, ref_cache, n, TOL_K[cdt])


def test_decode_num_stages_is_validated():
    from pathtune.codegen.triton import TritonParams
    from pathtune.codegen.triton.decode import decode_loop_stages

    assert TritonParams().decode_num_stages == 1 and decode_loop_stages(TritonParams()) is None
    assert decode_loop_stages(TritonParams(decode_num_stages=4)) == 4
    with pytest.raises(ValueError, match="decode_num_stages must be >= 1"):
        TritonParams(decode_num_stages=0)


def test_layout_paths():
    """One token and one query head per kv head uses the row path; anything else the padded tile."""
    assert decode_layout(1, 1) == (True, 1)
    assert decode_layout(1, 4) == (False, 16)
    assert decode_layout(3, 4) == (False, 16)
    assert decode_layout(5, 4) == (False, 32)


def test_skipping_the_update_is_detected():
    """Can-fail control: attention over un-rotated keys (the step without its in-place update) is far
    from the reference, by much more than the kernel's error, so the checks above can fail."""
    B, HQ, H, D = 2, 4, 2, 16
    tri, ref_cache = prefilled(B, 40, HQ, H, D, D, True, torch.float32)
    stale = copy.deepcopy(tri)
    inputs = make(B, 2, HQ, H, D, D, True)
    o, ref = step_both(tri, ref_cache, inputs, config=dict(decode_splits=2, decode_block_n=16))
    q, k, v, w, beta, g = inputs
    o_stale = path_attention_decode(*f64((q, k, v, w, torch.zeros_like(beta), g)), stale)  # H_t = I
    assert rel(o, ref) < TOL_O[torch.float32]
    assert rel(o_stale, ref) > 0.05 > 100 * TOL_O[torch.float32]
    assert rel(stale.k[:, :40], ref_cache.k[:, :40]) > 0.05


def test_prefill_then_decode_equals_full_attention():
    """GPU-path prefill (Triton forward + current-frame keys) then Triton decode steps reproduce the
    float64 naive attention of the whole sequence; the prefill cache holds the current-frame keys."""
    B, HQ, H, D, DV, T0 = 2, 4, 2, 16, 32, 70   # two UT chunks of 64 (one partial) per sequence
    full = make(B, T0 + 5, HQ, H, D, DV, True)
    ref = naive_path_attention(*f64(full))
    cfg = dict(decode_splits=2, decode_block_n=16)
    o0, cache = path_prefill_triton(*[None if x is None else x[:, :T0] for x in full], config=cfg,
                                    cache_dtype=torch.float32)
    assert cache.length == T0 and cache.c.dtype == torch.float32
    keys = current_frame_keys(*f64((full[1][:, :T0], full[3][:, :T0], full[4][:, :T0])))
    assert rel(cache.k[:, :T0], keys) < 1e-5
    outs = [o0]
    for a, b in ((T0, T0 + 1), (T0 + 1, T0 + 4), (T0 + 4, T0 + 5)):
        outs.append(path_decode_triton(*[None if x is None else x[:, a:b] for x in full], cache, config=cfg))
    o = torch.cat(outs, dim=1)
    assert rel(o[:, :T0], ref[:, :T0]) < 1e-3     # the forward's fp16 scan operands
    assert rel(o[:, T0:], ref[:, T0:]) < 1e-4      # the decode steps run in fp32 on an fp32 cache


def test_beta_clip_knob_reaches_the_kernel():
    """beta_clip_eps clips beta inside the kernel: equal to the reference fed the clipped beta."""
    B, HQ, H, D = 1, 2, 2, 16
    tri, ref_cache = prefilled(B, 20, HQ, H, D, D, False, torch.float32)
    q, k, v, w, beta, g = make(B, 1, HQ, H, D, D, False)
    beta = torch.full_like(beta, 1.999)
    o = path_decode_triton(q, k, v, w, beta, g, tri, config=dict(beta_clip_eps=0.015625, decode_block_n=16))
    ref = path_attention_decode(*f64((q, k, v, w, beta.clamp(max=2 - 0.015625), g)), ref_cache)
    assert rel(o, ref) < TOL_O[torch.float32]


# ---- public API: pathtune.path_attention_prefill / path_attention_decode ----------------------------------

def test_public_api_reference_and_triton_agree():
    B, HQ, H, D, T0 = 1, 4, 2, 32, 20
    prompt = make(B, T0, HQ, H, D, D, True)
    o_ref, c_ref = pathtune.path_attention_prefill(*prompt, backend="reference")
    if DEV == "cpu":  # auto picks the reference for CPU tensors
        o_auto, _ = pathtune.path_attention_prefill(*prompt)
        assert torch.equal(o_auto, o_ref)
    o_tri, c_tri = pathtune.path_attention_prefill(*prompt, backend="triton")
    assert isinstance(c_tri, pathtune.PaTHKVCache)
    assert rel(o_tri, o_ref) < 1e-3
    step = make(B, 2, HQ, H, D, D, True)
    d_ref = pathtune.path_attention_decode(*step, c_ref, backend="reference")
    d_tri = pathtune.path_attention_decode(*step, c_tri, backend="triton", config=dict(decode_block_n=16))
    assert rel(d_tri, d_ref) < 1e-4
    assert c_ref.length == c_tri.length == T0 + 2


def _cache(gated=True, dtype=torch.float32):
    return PaTHKVCache.empty(1, 2, 16, 16, 4, max_len=4, gated=gated, dtype=dtype, device=DEV)


@pytest.mark.parametrize("dims,match", [
    ((4, 2, 32, 16), "D = 32 \\(cache has 16\\)"),
    ((2, 2, 16, 16), "HQ = 2 \\(cache has 4\\)"),
    ((4, 1, 16, 16), "H = 1 \\(cache has 2\\)"),
    ((4, 2, 16, 32), "DV = 32 \\(cache has 16\\)"),
])
def test_public_api_shape_errors(dims, match):
    """Consistent new tokens whose sizes differ from the cache's: the message names the size to fix."""
    HQ, H, D, DV = dims
    with pytest.raises(ValueError, match=match):
        pathtune.path_attention_decode(*make(1, 1, HQ, H, D, DV, True), _cache(), backend="triton")


def test_public_api_input_errors():
    step = make(1, 1, 4, 2, 16, 16, True)
    with pytest.raises(ValueError, match="cache is gated"):
        pathtune.path_attention_decode(*step[:5], None, _cache())
    with pytest.raises(ValueError, match="k.dtype"):
        pathtune.path_attention_decode(step[0], step[1].double(), *step[2:], _cache())
    with pytest.raises(ValueError, match="beta"):
        pathtune.path_attention_decode(*step[:4], step[4][:, :, :1], step[5], _cache())


def test_public_api_errors_gate_on_ungated_cache_and_bad_cache():
    step = make(1, 1, 4, 2, 16, 16, True)
    with pytest.raises(ValueError, match="without a gate"):
        pathtune.path_attention_decode(*step, _cache(gated=False))
    with pytest.raises(TypeError, match="PaTHKVCache"):
        pathtune.path_attention_decode(*step, {"k": None})
    with pytest.raises(ValueError, match="bfloat16, float16 or float32"):
        pathtune.path_attention_decode(*step, _cache(dtype=torch.float64), backend="triton")
    with pytest.raises(ValueError, match="backend must be one of"):
        pathtune.path_attention_decode(*step, _cache(), backend="cuda")


def test_public_api_tvm_needs_cuda():
    if DEV == "cuda":
        pytest.skip("CPU-only check")
    with pytest.raises(ValueError, match="backend 'tvm' needs CUDA"):
        pathtune.path_attention_decode(*make(1, 1, 4, 2, 16, 16, True), _cache(), backend="tvm")


# ---- sm_90 compilation (no GPU needed) ------------------------------------------------------------------

_CHILD = textwrap.dedent("""
    import json, os, sys
    assert "TRITON_INTERPRET" not in os.environ
    from pathtune.codegen.triton import TritonParams
    from pathtune.codegen.triton.compile_check import compile_kernel
    from pathtune.codegen.triton.decode import decode_compile_specs as decode_kernels
    from dataclasses import replace
    from pathtune.codegen.triton.decode import decode_params
    out = []
    for D in (64, 128):
        for stages, fb in ((1, 0), (3, 0), (1, 4096)):
            params = replace(decode_params(None, D, D), decode_num_stages=stages, decode_frame_bound=fb)
            for group, tokens in ((1, 1), (4, 4), (4, 16)):
                if stages > 1 and tokens == 16 or fb and tokens == 4:
                    continue
                for fn, sig, const, nw, ns in decode_kernels(params, D, D, group=group, tokens=tokens):
                    if stages > 1 and fn.fn.__name__ != "decode_kernel":
                        continue
                    r = compile_kernel(fn, sig, const, num_warps=nw, num_stages=ns, arch=90, aligned=True)
                    out.append(dict(D=D, stages=stages, fb=fb, group=group, tokens=tokens, name=r.name,
                                    shared=r.shared_bytes, regs=r.registers, spills=r.spill_bytes))
    print("RESULT " + json.dumps(out), flush=True)
""")


@pytest.mark.slow
def test_decode_kernels_compile_for_sm90():
    """The decode kernel compiles for sm_90 at the heuristic knobs for D = 64 and 128 (one token MHA; 4 and 16
    tokens GQA 4; every flush rotates in a second pass in compact WY form), also with
    its tile loop pipelined 3 deep (decode_num_stages=3; not the 16-token GQA kernel, whose 64 query rows of
    staged tiles exceed a block's shared memory at 3 stages); the hot single-token MHA
    launch of the heuristic config spills less than 768 B (0 B at D = 64, 676 B at D = 128 at 4 warps,
    in the flush's WY pass over 8192 / BD-row blocks; its key-tile loop spills nothing); shared
    memory fits an H200 block.
    Pipelining shows in the one-row path's shared memory (its loads are staged there; unpipelined it
    holds the WY pass's operands and reduction scratch).  Two frame levels (decode_frame_bound > 0) compile for
    one and 16 tokens and fit shared memory; their spills (offline: 0 / 160 B at D = 64, ~1.5 / 2.4 KB at D = 128,
    in the once-per-step frame-map products and the merging program's map update) are reported, not bounded."""
    ptxas = os.path.join(os.path.dirname(__import__("triton").__file__), "backends", "nvidia", "bin", "ptxas")
    if not os.path.exists(ptxas):
        pytest.skip("Triton's bundled ptxas is missing")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = json.loads(next(line for line in res.stdout.splitlines() if line.startswith("RESULT "))[7:])
    for r in rows:
        print(r)
        assert r["shared"] <= 232448, r
        hot = r["name"] == "decode_kernel" and r["tokens"] == 1 and r["group"] == 1 and not r["fb"]
        if hot and r["stages"] == TritonParams.heuristic(r["D"], r["D"]).decode_num_stages and r["spills"] is not None:
            assert r["spills"] < 768, r
    row = {(r["D"], r["stages"]): r["shared"] for r in rows
           if r["name"] == "decode_kernel" and r["tokens"] == 1 and r["group"] == 1 and not r["fb"]}
    assert {(r["D"], r["tokens"]) for r in rows if r["fb"]} == {(64, 1), (64, 16), (128, 1), (128, 16)}
    for D in (64, 128):
        assert row[(D, 3)] > row[(D, 1)] + 16384, row


# ---- GPU ---------------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("D,H,HQ,TN", [(64, 16, 16, 1), (128, 8, 8, 1), (128, 2, 8, 4)])
def test_gpu_long_cache_bf16(D, H, HQ, TN):
    """bf16 cache of 4096 keys on the GPU (default knobs) vs the float64 reference."""
    B, T0 = 2, 4096
    tri, ref_cache = prefilled(B, T0, HQ, H, D, D, True, torch.bfloat16)
    for _ in range(3):
        inputs = make(B, TN, HQ, H, D, D, True, dtype=torch.bfloat16)
        o, ref = step_both(tri, ref_cache, inputs)
        assert rel(o, ref) < 1e-2
    n = tri.length
    assert_keys(tri, ref_cache, n, 2e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("D,H,HQ,TN", [(128, 8, 8, 1), (64, 2, 8, 4)])
def test_gpu_pipelined_tile_loop(D, H, HQ, TN, stages):
    """decode_num_stages > 1 on the GPU (the interpreter ignores tl.range's num_stages): cp.async loads of
    later tiles in flight while a tile is processed, then the flush's second pass rotates the same rows in
    place; several tiles per split."""
    B, T0 = 2, 4096
    tri, ref_cache = prefilled(B, T0, HQ, H, D, D, True, torch.bfloat16)
    cfg = dict(decode_block_n=64, decode_num_warps=8, decode_splits=4, decode_num_stages=stages)
    for _ in range(2):
        o, ref = step_both(tri, ref_cache, make(B, TN, HQ, H, D, D, True, dtype=torch.bfloat16), config=cfg)
        assert rel(o, ref) < 1e-2
    n = tri.length
    assert_keys(tri, ref_cache, n, 2e-3)


@pytest.mark.gpu
def test_gpu_prefill_then_decode():
    B, HQ, H, D, T0 = 2, 8, 8, 64, 2000
    full = make(B, T0 + 3, HQ, H, D, D, True, dtype=torch.bfloat16)
    ref = naive_path_attention(*f64(full))
    o0, cache = path_prefill_triton(*[None if x is None else x[:, :T0] for x in full], cache_dtype=torch.float32)
    o1 = path_decode_triton(*[None if x is None else x[:, T0:] for x in full], cache)
    assert rel(o0, ref[:, :T0]) < 1e-2
    assert rel(o1, ref[:, T0:]) < 1e-2


# ---- pathtune bench --pass decode (CPU-checkable parts) --------------------------------------------------

def test_decode_bench_accuracy_gate_and_timed_callable():
    """The bench's accuracy gate runs the kernel against the reference; its timed callable keeps the key
    length fixed (cache.length is reset every call, the new token lands on the same row)."""
    from pathtune.tuning.decode_bench import accuracy, make_cache, make_step, pathtune_callable

    gen = torch.Generator(device=DEV).manual_seed(1)
    cache = make_cache(2, 40, 2, 32, True, device=DEV, gen=gen)
    step = make_step(2, 2, 32, True, device=DEV, gen=gen)
    cfg = dict(decode_block_n=16, decode_splits=2)
    err = accuracy(cache, step, cfg, prefix=24)
    assert err["o"] < 1.2e-2 and err["k"] < 2e-3
    assert cache.length == 40                       # the check ran on a copy
    run = pathtune_callable(cache, step, cfg)
    k0 = cache.k[:, :40].clone()
    run()
    run()
    assert cache.length == 41 and cache.max_len == 41
    assert rel(cache.k[:, :40], k0) > 1e-2            # keys keep rotating from call to call


def test_decode_bench_record_and_table(tmp_path):
    from pathtune.perf_db import PerfDB
    from pathtune.tuning.decode_bench import DecodeRow, format_decode_table, record_decode_rows

    url = f"sqlite:///{tmp_path / 'perf.sqlite3'}"
    knobs = dict(decode_block_n=128, decode_num_warps=4, decode_splits=4, beta_clip_eps="off")
    ok = DecodeRow(64, 16, 4096, 8, False, times={"pathtune": 0.03, "sdpa_flash": 0.02, "fla": 0.2},
                   errors={"o": 3e-3, "k": 1e-4}, params=knobs)
    broken = DecodeRow(128, 8, 4096, 8, False, failures={"pathtune": "OutOfResources: shared memory"},
                       params=knobs)
    assert record_decode_rows([ok, broken], url, "pathtune bench --pass decode (test)") == 2
    with PerfDB(url) as db:
        rows = db.overhead(by="head_dim")
        assert [(r["head_dim"], r["pass"]) for r in rows] == [(64, "decode")]
        assert abs(rows[0]["ratio"] - 1.5) < 1e-9
        assert [r["status"] for r in db.query(head_dim=128)] == ["crash"]
    assert format_decode_table([ok, broken]).row_count == 2
    # --sweep: one measurement per swept config
    swept = DecodeRow(64, 16, 32768, 8, True, times={"pathtune": 0.1, "sdpa_flash": 0.08}, params=knobs,
                      sweep=[{"config": dict(knobs, decode_splits=s), "ms": 0.1 * s, "error": ""} for s in (1, 2)]
                      + [{"config": dict(knobs, decode_block_n=512), "ms": None, "error": "OutOfResources"}])
    assert record_decode_rows([swept], url, "pathtune bench --pass decode --sweep (test)") == 3


def test_decode_bench_sweep_space():
    from pathtune.tuning.decode_bench import sweep_configs

    cfgs = sweep_configs(64, 64)
    assert len(cfgs) == 4 * 3 * 5 * 4 and all(c["beta_clip_eps"] == "off" for c in cfgs)
    assert {c["decode_num_stages"] for c in cfgs} == {1, 2, 3, 4}


def test_decode_bench_sweep_knobs_restrict_and_are_checked():
    from pathtune.tuning.decode_bench import check_sweep_knobs, sweep_configs

    only = {"decode_block_n": [128, 256], "decode_splits": [2, 4, 8], "decode_num_stages": 1}
    cfgs = sweep_configs(64, 64, only)
    assert len(cfgs) == 2 * 3 * 3          # decode_num_warps: its whole domain (3 values)
    assert {(c["decode_block_n"], c["decode_splits"], c["decode_num_stages"]) for c in cfgs} == {
        (b, s, 1) for b in (128, 256) for s in (2, 4, 8)}
    # a precision knob is swept where named (each config passes the sweep's accuracy check), else at its default
    windows = sweep_configs(64, 64, {**only, "decode_num_warps": [4], "decode_pending_window": [16, 32]})
    assert sorted(c["decode_pending_window"] for c in windows) == [16] * 6 + [32] * 6
    assert {c["decode_pending_window"] for c in cfgs} == {16}
    for bad, msg in [({"decode_splits": [3]}, r"decode_splits values \[3\] are not in its domain"),
                     ({"decode_pending_window": [7]}, r"decode_pending_window values \[7\] are not in its domain"),
                     ({"block_n": [64]}, "'block_n' is not a decode knob the sweep can take"),
                     ({"decode_splits": []}, "decode_splits values"),
                     ([4, 8], "must be a JSON object")]:
        with pytest.raises(ValueError, match=msg) as err:
            check_sweep_knobs(bad)
        assert "\n" not in str(err.value)


def test_decode_bench_runs_end_to_end_with_a_stub_timer(monkeypatch):
    """run_decode_bench's control flow (accuracy gate, timing, --sweep, baselines that are unavailable here)
    with the timer replaced by one call of the timed function."""
    from pathtune.tuning import decode_bench as db

    calls = []

    def once(fn):
        fn()
        calls.append(1)
        return 1.0 + len(calls)
    monkeypatch.setattr(db, "_median_ms", once)
    monkeypatch.setattr(db, "sweep_configs",
                        lambda D, DV, only=None: [dict(decode_block_n=16, decode_splits=s) for s in (1, 2)])
    rows = db.run_decode_bench(((2, 32),), (20,), (True,), batch=1, config=dict(decode_block_n=16),
                               baselines=("fla",), device=DEV, sweep=True, log=lambda s: None)
    (row,) = rows
    assert not row.failures.get("pathtune"), row.failures
    assert row.errors["o"] < 1.2e-2
    # the config timed before the sweep (here the given one) is a candidate too: faster than both swept ones, it
    # stays the row's config, and it is among the entries --record stores
    from pathtune.codegen.triton.decode import decode_params

    given = db.knob_values(decode_params(dict(decode_block_n=16), 32, 32))
    assert [e["ms"] for e in row.sweep] == [2.0, 3.0, 4.0] and row.sweep[0]["config"] == given
    assert row.times["pathtune"] == row.times["pathtune_default"] == 2.0 and row.params == given
    if DEV == "cpu":
        assert row.times["fla"] is None and "fla" in row.failures
    # a faster swept config wins, and a swept config equal to the timed one is not listed twice
    calls.clear()
    monkeypatch.setattr(db, "_median_ms", lambda fn: (fn(), calls.append(1), 10.0 - len(calls))[2])
    monkeypatch.setattr(db, "sweep_configs", lambda D, DV, only=None: [dict(given, decode_splits=s) for s in (1, 4)])
    (row,) = db.run_decode_bench(((2, 32),), (20,), (True,), batch=1, config=dict(decode_block_n=16),
                                 baselines=(), device=DEV, sweep=True, log=lambda s: None)
    assert given["decode_splits"] == 4 and [e["ms"] for e in row.sweep] == [8.0, 7.0]
    assert row.times["pathtune"] == 7.0 and row.times["pathtune_default"] == 9.0 and row.params == given


def test_decode_bench_step_is_the_shared_input_maker():
    """The bench's new tokens are tuning.inputs.make_inputs drawn from the generator that filled the cache
    (HQ = H, DV = D, T = tokens); make_inputs takes a seed or a generator, exactly one."""
    from pathtune.tuning.decode_bench import make_step
    from pathtune.tuning.inputs import make_inputs

    step = make_step(2, 3, 16, True, device=DEV, gen=torch.Generator(device=DEV).manual_seed(5), tokens=4)
    same = make_inputs(2, 4, 3, 3, 16, 16, True, device=DEV, seed=5)
    assert all(torch.equal(a, b) for a, b in zip(step, same)) and step[0].shape == (2, 4, 3, 16)
    for kw in ({}, {"seed": 1, "generator": torch.Generator(device=DEV)}):
        with pytest.raises(ValueError, match="a seed or a generator"):
            make_inputs(1, 2, 1, 1, 16, 16, False, device=DEV, **kw)


def test_decode_bench_times_and_records_each_token_count(monkeypatch, tmp_path):
    """--new-tokens 1,4: one row per count, each call decoding that many tokens (accuracy-checked), SDPA over
    the same queries, fla for one token only; recorded under each count's query bucket, which the dispatcher's
    lookup serves to calls of that bucket only."""
    from pathtune.perf_db import PerfDB
    from pathtune.runtime.environment import collect_env
    from pathtune.specs import Workload
    from pathtune.tuning import decode_bench as db

    monkeypatch.setattr(db, "_median_ms", lambda fn: (fn(), 1.0)[1])
    seen = []
    real = db.pathtune_callable
    monkeypatch.setattr(db, "pathtune_callable", lambda cache, step, config, **kw: seen.append(step[0].shape[1])
                        or real(cache, step, config, **kw))
    rows = db.run_decode_bench(((2, 32),), (20,), (True,), batch=1, config=dict(decode_block_n=16),
                               tokens=(1, 4), baselines=("fla",), device=DEV, log=lambda s: None)
    assert [(r.tokens, bool(r.failures.get("pathtune"))) for r in rows] == [(1, False), (4, False)], rows[1].failures
    assert seen == [1, 4] and rows[1].errors["o"] < 1.2e-2
    assert "fla" not in rows[1].times and "fla" in rows[0].times     # fla's step decodes one token
    url = f"sqlite:///{tmp_path / 'perf.sqlite3'}"
    assert db.record_decode_rows(rows, url, "pathtune bench --pass decode --new-tokens 1,4 (test)") == 2
    with PerfDB(url) as pdb:
        assert sorted(r["query_bucket"] for r in pdb.query(pass_="decode")) == [1, 4]
        four = Workload(32, 32, 2, 2, "bfloat16", True, "decode", 32, batch_bucket=1, query_bucket=4)
        assert pdb.best(collect_env(), "decode", four, backend="triton")["config"]["decode_block_n"] == 16


@pytest.mark.parametrize("G", [1, 2])
def test_outside_scale_gate_and_lse(G):
    """The FoX-kernel gate placement (scale * S + c_i - c_j) and the returned log-sum-exp."""
    from pathtune.runtime.reference.recurrent import path_attention_decode_step

    B, H, D = 2, 2, 16
    HQ = G * H
    tri, ref_cache = prefilled(B, 21, HQ, H, D, D, True, torch.float32)
    same_cache = copy.deepcopy(ref_cache)
    q, k, v, w, beta, g = make(B, 1, HQ, H, D, D, True)
    g = g * 8  # strong decay, so the two placements differ clearly
    o, lse = path_decode_triton(q, k, v, w, beta, g, tri, config=dict(decode_block_n=16, decode_splits=2),
                                gate_placement="outside_scale", return_lse=True)
    ref, ref_lse = path_attention_decode_step(*f64((q, k, v, w, beta, g)), ref_cache, gate_placement="outside_scale",
                                              return_lse=True)
    assert rel(o, ref) < TOL_O[torch.float32] and rel(lse, ref_lse) < 1e-6
    inside = path_attention_decode(*f64((q, k, v, w, beta, g)), same_cache)  # default: inside_scale
    assert rel(inside[:, 0], ref) > 100 * TOL_O[torch.float32]   # so the placement really reached the kernel


def test_bench_cli_decode_pass_options():
    from typer.testing import CliRunner

    from pathtune.cli import app

    runner = CliRunner()
    bad = runner.invoke(app, ["bench", "--pass", "prefill"], env={"COLUMNS": "200"})
    assert bad.exit_code != 0 and "--pass must be fwd or decode" in bad.output
    for args, msg in [(["--pass", "fwd", "--sweep-knobs", '{"decode_splits": [4]}'],
                       "--sweep-knobs is for --pass decode"),
                      (["--pass", "decode", "--sweep-knobs", "{splits: 4}"], "--sweep-knobs: Expecting property name"),
                      (["--pass", "decode", "--sweep-knobs", '{"decode_splits": [3]}'], "are not in its domain"),
                      (["--pass", "fwd", "--new-tokens", "4"], "--new-tokens is for --pass decode"),
                      (["--pass", "decode", "--new-tokens", "1,0"], "--new-tokens must be integers >= 1"),
                      (["--pass", "decode", "--new-tokens", "4", "--backends", "tvm"], "one token per call")]:
        res = runner.invoke(app, ["bench", *args], env={"COLUMNS": "300"})
        assert res.exit_code != 0 and msg in res.output, res.output
    if not torch.cuda.is_available():
        res = runner.invoke(app, ["bench", "--pass", "decode", "--gate", "off"], env={"COLUMNS": "200"})
        assert res.exit_code == 1 and "needs a CUDA GPU" in res.output





# ----------------------------------------------------------------------------- candidate kernels (benchmarks/variants)

def test_flush_part_timing_proxies_leave_out_one_part_each(monkeypatch):
    """benchmarks/variants/decode_flush_parts.py (timing-only proxies of a flush step without its pending-row
    rotation, without the WY back substitution, without the frame rows' rounds) in the launcher's place: a step that
    does not flush equals the shipped kernel's; the flushing step's keys differ from the shipped kernel's in the rows
    the left-out part rotates (pending rows; every rotated row; the frame rows but not the pending ones)."""
    import pathtune.codegen.triton.decode as dec
    from repo_scripts import load_benchmark_script

    cand = load_benchmark_script(monkeypatch, "benchmarks/variants/decode_flush_parts.py")
    B, HQ, H, D, T0, TN = 1, 4, 2, 32, 100, 2
    gen = torch.Generator().manual_seed(5)
    prompt = [torch.randn(B, T0, HQ if i == 0 else H, D, generator=gen) for i in range(3)]
    w = F.normalize(torch.randn(B, T0, H, D, generator=gen), dim=-1)
    beta = torch.rand(B, T0, H, generator=gen) * 0.5 + 1.5
    g = F.logsigmoid(torch.randn(B, T0, HQ, generator=gen) + 3.0)
    ref = path_attention_prefill(*[x.double() for x in (*prompt, w, beta, g)], max_len=T0 + 2 * TN)[1]
    steps = [[x[:, :TN].clone() for x in (*prompt, w, beta, g)] for _ in range(2)]
    cfg = dict(decode_splits=2, decode_block_n=16)
    outs = {}
    for name, kernel in (("shipped", dec.decode_kernel), ("no_pending", cand.decode_kernel_flush_no_pending),
                         ("no_wy", cand.decode_kernel_flush_no_wy), ("no_rounds", cand.decode_kernel_flush_no_rounds)):
        cache = PaTHKVCache(ref.k.float(), ref.v.float(), ref.c.float(), T0, HQ)
        with monkeypatch.context() as m:
            m.setattr(dec, "decode_kernel", kernel)
            first = path_decode_triton(*steps[0], cache, config=cfg, window=TN)      # no flush
            path_decode_triton(*steps[1], cache, config=cfg, window=TN)              # flushes
        outs[name] = (first, cache.k_buffer[:, :T0 + 2 * TN].clone())
    frame, pending = slice(0, T0), slice(T0, T0 + 2 * TN)
    base = outs["shipped"][1]
    for name in ("no_pending", "no_wy", "no_rounds"):
        assert torch.equal(outs[name][0], outs["shipped"][0]), name
    assert torch.equal(outs["no_pending"][1][:, frame], base[:, frame])
    assert not torch.equal(outs["no_pending"][1][:, pending], base[:, pending])
    assert not torch.equal(outs["no_wy"][1][:, frame], base[:, frame])
    assert not torch.equal(outs["no_rounds"][1][:, frame], base[:, frame])
    assert torch.equal(outs["no_rounds"][1][:, pending], base[:, pending])
