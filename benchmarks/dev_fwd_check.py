"""GPU session script: forward correctness vs the float64 oracle, then forward timings against
SDPA (flash, cuDNN) and fla's parallel_path_attn in the same run.  Writes JSON to $OUT.

    python benchmarks/dev_fwd_check.py
"""
from __future__ import annotations

import json
import os
import sys
import time

import torch
import triton

from pathtune.codegen.triton.forward import path_attention_fwd
from pathtune.codegen.triton.params import TritonParams
from pathtune.runtime.reference import naive_path_attention
from pathtune.tuning.baselines import fla_path_callable, sdpa_callable

OUT = os.environ.get("OUT", "/tmp")
dev = "cuda"


def inputs(B, T, HQ, H, D, DV, gate, dtype=torch.bfloat16, seed=0):
    gen = torch.Generator(device=dev).manual_seed(seed)
    q = torch.randn(B, T, HQ, D, device=dev, generator=gen).to(dtype)
    k = torch.randn(B, T, H, D, device=dev, generator=gen).to(dtype)
    v = torch.randn(B, T, H, DV, device=dev, generator=gen).to(dtype)
    w = torch.nn.functional.normalize(torch.randn(B, T, H, D, device=dev, generator=gen), dim=-1)
    beta = torch.rand(B, T, H, device=dev, generator=gen) * 0.5 + 1.5
    g = torch.log(torch.rand(B, T, HQ, device=dev, generator=gen) * 0.05 + 0.95) if gate else None
    return q, k, v, w, beta, g


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def check(results):
    cases = [
        (1, 1000, 2, 2, 64, 64, False, TritonParams(superchunk_size=256)),
        (1, 1000, 2, 2, 64, 64, True, TritonParams(superchunk_size=256)),
        (2, 777, 4, 2, 128, 128, True, TritonParams(superchunk_size=256, num_warps=8)),
        (1, 2048, 2, 1, 64, 64, True, TritonParams(superchunk_size=512, scan_precision="bf16")),
        (1, 2048, 2, 1, 64, 64, True, TritonParams(superchunk_size=512, transition_precision="tf32")),
        (1, 2048, 2, 1, 64, 32, True, TritonParams(superchunk_size=512, chunk_size=32, block_n=128)),
    ]
    for B, T, HQ, H, D, DV, gate, p in cases:
        q, k, v, w, beta, g = inputs(B, T, HQ, H, D, DV, gate)
        ref, ref_lse = naive_path_attention(q.double(), k.double(), v.double(), w.double(), beta.double(),
                                            None if g is None else g.double(), return_lse=True)
        o, lse, _ = path_attention_fwd(q, k, v, w, beta, g, scale=D ** -0.5, cu_seqlens=None, params=p)
        r = dict(kind="check", B=B, T=T, HQ=HQ, H=H, D=D, DV=DV, gate=gate, params=p.to_json(),
                 o_err=rel(o, ref), lse_err=rel(lse, ref_lse), o_bf16_floor=rel(ref.to(torch.bfloat16), ref),
                 nan=bool(torch.isnan(o).any()))
        print(r, flush=True)
        results.append(r)


def bench(results):
    configs = {
        "C64_S1024_N64_w4": TritonParams(superchunk_size=1024, block_n=64, num_warps=4, num_stages=2),
        "C64_S1024_N128_w4": TritonParams(superchunk_size=1024, block_n=128, num_warps=4, num_stages=2),
        "C64_S2048_N64_w4s3": TritonParams(superchunk_size=2048, block_n=64, num_warps=4, num_stages=3),
        "C128_S2048_N64_w8": TritonParams(chunk_size=128, superchunk_size=2048, block_n=64, num_warps=8),
        "C128_S2048_N128_w8": TritonParams(chunk_size=128, superchunk_size=2048, block_n=128, num_warps=8),
    }
    for D, H in ((64, 16), (128, 8)):
        for T in (4096, 16384):
            B = 32768 // T
            for gate in (False, True):
                q, k, v, w, beta, g = inputs(B, T, H, H, D, D, gate)
                row = dict(kind="fwd", D=D, T=T, B=B, H=H, gate=gate)
                if not gate:
                    for name in ("flash", "cudnn"):
                        fn = sdpa_callable(q, k, v, name)
                        row[f"sdpa_{name}"] = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") if fn else None
                fn = fla_path_callable(q, k, v, w, beta, g)
                row["fla"] = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") if fn else None
                for name, p in configs.items():
                    if D == 128 and p.chunk_size == 128:
                        continue
                    try:
                        fn = lambda: path_attention_fwd(q, k, v, w, beta, g, scale=D ** -0.5, cu_seqlens=None, params=p)
                        fn()
                        row[name] = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
                    except Exception as exc:
                        row[name] = f"{type(exc).__name__}: {str(exc)[:200]}"
                print(row, flush=True)
                results.append(row)


if __name__ == "__main__":
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    res = []
    t0 = time.time()
    try:
        check(res)
    except Exception as exc:
        import traceback
        traceback.print_exc()
    print(f"check done {time.time()-t0:.0f}s", flush=True)
    if "--no-bench" not in sys.argv:
        bench(res)
    json.dump(res, open(os.path.join(OUT, "fwd.json"), "w"), indent=1)
