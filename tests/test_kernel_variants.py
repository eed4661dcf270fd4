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
