"""The candidate kernels that GPU probes time (benchmarks/variants/)
compute what the shipped kernels do, checked in Triton's interpreter, so a probe's timing is of a
correct candidate."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("interpreter tests (TRITON_INTERPRET=1)", allow_module_level=True)

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def _inputs(seed, B, T, HQ, H, D, gate):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, HQ, D, generator=g).to(torch.bfloat16)
    k = torch.randn(B, T, H, D, generator=g).to(torch.bfloat16)
    v = torch.randn(B, T, H, D, generator=g).to(torch.bfloat16)
    w = F.normalize(torch.randn(B, T, H, D, generator=g), dim=-1)
    beta = 1.5 + 0.5 * torch.rand(B, T, H, generator=g)
    gg = torch.log(0.95 + 0.05 * torch.rand(B, T, HQ, generator=g)) if gate else None
    return q, k, v, w, beta, gg


@pytest.mark.parametrize("variant", ["ut_sub8"])
@pytest.mark.parametrize("D,out_dtype,up,lens", [
    (64, torch.bfloat16, "tf32x3", None),
    (64, torch.float16, "tf32", None),
    (48, torch.float32, "tf32x3", (70, 1, 57)),
    (128, torch.bfloat16, "fp16x3", None),
], ids=["D64-bf16-tf32x3", "D64-fp16-tf32", "D48-fp32-varlen", "D128-bf16-fp16x3"])
def test_ut_candidates_equal_shipped(D, out_dtype, up, lens, variant):
    """The UT-stage candidates of benchmarks/variants/ (ut_sub8: 8-row diagonal blocks) give the shipped
    ut_fused_kernel's U, K~, M and w copy: as close to a float64
    evaluation of the same formulas, and close to the shipped outputs.  Chunks of 64 (the default), a
    partial last chunk, varlen sequences whose chunks end mid-half; w unit-norm, beta in [1.5, 2)."""
    import importlib

    from ut_probe import ut_reference
    candidate = getattr(importlib.import_module(f"variants.{variant}"), variant)

    from pathtune.codegen.triton import forward as fwd
    from pathtune.codegen.triton._layout import build_tables
    from pathtune.codegen.triton.params import TritonParams

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
    got = candidate(k, w, beta, tables, H, D, C, p, out_dtype=out_dtype, write_w=True)
    # float64 reference per sequence, chunked from each sequence's start (w rounded as the kernels take it)
    w_in = w.to(out_dtype).float() if out_dtype != torch.float32 else w
    refs = {"u": [], "kt": [], "m": []}
    for s0, s1 in zip(cu[:-1].tolist(), cu[1:].tolist()):
        n = s1 - s0
        pad = (-n) % C
        wp = F.pad(w_in[s0:s1], (0, 0, 0, 0, 0, pad))
        kp = F.pad(k[s0:s1].float(), (0, 0, 0, 0, 0, pad))
        bp = F.pad(beta[s0:s1], (0, 0, 0, pad))
        U, Kt, M = ut_reference(wp, kp, bp, C)
        for name, x in zip(("u", "kt", "m"), (U, Kt, M)):
            refs[name].append(x[:n])
    for i, name in enumerate(("u", "kt", "m")):
        ref = torch.cat(refs[name])
        e_new, e_old, e_pair = rel(got[i], ref), rel(shipped[i], ref), rel(got[i], shipped[i])
        print(f"{name}: {variant} {e_new:.2e} shipped {e_old:.2e} {variant}-vs-shipped {e_pair:.2e}")
        assert e_new < 1.5 * e_old + 1e-6, (name, e_new, e_old)
        assert e_pair < 1e-2 if out_dtype != torch.float32 else e_pair < 1e-4, (name, e_pair)
    assert torch.equal(got[3], shipped[3])


@pytest.mark.parametrize("HQ,H,gate,cdt,steps,window", [
    (2, 2, True, torch.bfloat16, (1,) * 11, 3),           # MHA one token: the row path, 3 flushes
    (4, 2, False, torch.bfloat16, (4, 4, 4, 4, 4), 6),    # GQA, 4 tokens a step
    (4, 2, True, torch.float16, (16, 4, 16, 4), 16),      # 16-token steps; the 4-token steps flush
    (2, 1, True, torch.bfloat16, (1, 4, 1, 16, 2, 1), 4),  # MQA, mixed step sizes
    (2, 2, True, torch.float32, (1, 3, 1, 1, 2, 5, 1), 4),  # fp32: tight bounds
], ids=["mha-1tok", "gqa-4tok", "gqa-16tok", "mqa-mixed", "fp32-mixed"])
def test_decode_wy_walk_candidate_vs_float64(HQ, H, gate, cdt, steps, window):
    """The decode candidate of benchmarks/variants/decode_wy_walk.py (the pending walk in compact WY form, T kept
    beside the window) through ``path_decode_triton``: steps of several sizes crossing several flushes, every
    output against the float64 naive attention of the whole sequence and the keys (pending rows materialized)
    against the float64 current-frame keys, with the shipped kernel's tolerances; the T buffer is the candidate's."""
    from variants.decode_wy_walk import install

    from pathtune.codegen.triton import path_decode_triton
    from pathtune.runtime.reference import naive_path_attention
    from pathtune.runtime.reference.recurrent import current_frame_keys
    from test_decode_lazy import CFG, TOL_K, TOL_O, cut, f64, prefill, sequence

    B, D, P = 2, 16, 21
    dt = torch.float32 if cdt == torch.float32 else cdt
    full = sequence(B, P + sum(steps), HQ, H, D, gate, dt, seed=HQ + len(steps))
    ref_o = naive_path_attention(*f64(full))
    cache = prefill(full, P, cdt)
    t, frames, pending = P, [], []
    with install():
        for tn in steps:
            pending.append(cache.length - cache.frame)
            o = path_decode_triton(*cut(full, t, t + tn), cache, config=CFG, window=window)
            t += tn
            assert rel(o, ref_o[:, t - tn:t]) < TOL_O[cdt], (t, rel(o, ref_o[:, t - tn:t]))
            frames.append(cache.frame)
            kr = current_frame_keys(*f64((full[1][:, :t], full[3][:, :t], full[4][:, :t])))
            if cache.frame == cache.length:       # a flush: the stored keys themselves are current
                assert rel(cache.k_buffer[:, :t], kr) < TOL_K[cdt], (t, rel(cache.k_buffer[:, :t], kr))
    assert max(pending) > 1 and len(set(frames)) >= 3, (pending, frames)   # T columns carried, several flushes
    assert any(key[0] == "pending_T" for key in cache._work)
    kr = current_frame_keys(*f64((full[1][:, :t], full[3][:, :t], full[4][:, :t])))
    assert rel(cache.k[:, :t], kr) < TOL_K[cdt]
