"""GPU session script (run 2): fwd+bwd correctness vs float64, per-kernel profile, timings and
peak memory against SDPA and fla measured in the same run.  Writes JSON to $OUT.

    python benchmarks/dev_gpu_run2.py [STEP ...]      (check profile bench nan quick sweep ranges ...)
    python benchmarks/dev_gpu_run2.py ranges          # fwd+bwd per backward range budget, same run
"""
from __future__ import annotations

import itertools
import json
import os
import sys
import time
import traceback

import torch
import triton

from pathtune.codegen._knobs import resolve
from pathtune.codegen.triton import path_attention_triton
from pathtune.runtime.reference import naive_path_attention
from pathtune.tuning.baselines import fla_path_callable, sdpa_callable
from pathtune.tuning.bench import make_inputs

OUT = os.environ.get("OUT", "/tmp")
dev = "cuda"
RES = []


def emit(r):
    print(json.dumps(r), flush=True)
    RES.append(r)
    # written as it goes: a step cut by a timeout keeps its finished rows
    json.dump(RES, open(os.path.join(OUT, "run_" + "_".join(sys.argv[1:]) + ".json"), "w"), indent=1)


def inputs(B, T, HQ, H, D, DV, gate, dtype=torch.bfloat16, seed=0, beta_lo=1.5, beta_hi=2.0):
    q, k, v, w, beta, g = make_inputs(B, T, HQ, H, D, DV, gate, device=dev, seed=seed, dtype=dtype)
    if (beta_lo, beta_hi) != (1.5, 2.0):
        beta = torch.rand_like(beta) * (beta_hi - beta_lo) + beta_lo
    return q, k, v, w, beta, g


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def check(only_d=None):
    cases = [
        (1, 1000, 2, 2, 64, 64, True, None, dict(superchunk_size=256)),
        (2, 777, 4, 2, 128, 128, True, None, None),
        (1, 3000, 2, 2, 128, 128, True, None,
         dict(superchunk_size=512, num_stages=1, bwd_num_stages=1, transition_precision="tf32")),
        (1, 2048, 2, 1, 64, 64, False, None, dict(superchunk_size=512)),
        (1, 2048, 2, 2, 64, 64, True, None, dict(superchunk_size=512, num_warps=8, bwd_num_warps=8)),
        (1, 1500, 2, 2, 64, 64, True, [0, 100, 101, 900, 1500], dict(superchunk_size=256)),
        (1, 1024, 2, 2, 32, 32, True, None, dict(superchunk_size=256)),
        (1, 1024, 2, 2, 96, 64, True, None, None),
    ]
    for B, T, HQ, H, D, DV, gate, cu, kw in cases:
        if only_d and D != only_d:
            continue
        try:
            q, k, v, w, beta, g = inputs(B, T, HQ, H, D, DV, gate)
            cu_t = torch.tensor(cu, device=dev) if cu else None
            leaves = ([x.double().requires_grad_() for x in (q, k, v, w, beta)]
                      + ([g.double().requires_grad_()] if gate else []))
            ref = naive_path_attention(*leaves[:5], leaves[5] if gate else None, cu_seqlens=cu_t)
            do = torch.randn_like(ref).to(torch.bfloat16)
            rg = torch.autograd.grad(ref, leaves, do.double())
            xs = ([x.detach().clone().requires_grad_() for x in (q, k, v, w, beta)]
                  + ([g.detach().clone().requires_grad_()] if gate else []))
            o, _ = path_attention_triton(*xs[:5], xs[5] if gate else None, cu_seqlens=cu_t, config=kw)
            tg = torch.autograd.grad(o, xs, do)
            names = ["dq", "dk", "dv", "dw", "dbeta", "dg"]
            emit(dict(kind="check", shape=[B, T, HQ, H, D, DV], gate=gate, varlen=bool(cu), cfg=kw,
                      o=rel(o, ref), o_floor=rel(ref.to(torch.bfloat16), ref),
                      **{n: rel(a, b) for n, a, b in zip(names, tg, rg)},
                      nan=bool(torch.isnan(o).any() or any(torch.isnan(t).any() for t in tg))))
        except Exception as exc:
            emit(dict(kind="check", shape=[B, T, HQ, H, D, DV], error=f"{type(exc).__name__}: {str(exc)[:300]}"))
            traceback.print_exc()


def nan_long():
    for clip in (None, 0.0078125):
        try:
            q, k, v, w, beta, g = inputs(1, 65536, 4, 4, 64, 64, True, beta_lo=2.0, beta_hi=2.0)
            xs = [x.requires_grad_() for x in (q, k, v, w, beta, g)]
            o, lse = path_attention_triton(*xs, config=dict(superchunk_size=2048, beta_clip_eps=clip))
            o.float().square().mean().backward()
            bad = [n for n, x in zip("qkvwbg", xs) if not torch.isfinite(x.grad).all()]
            emit(dict(kind="nan_long", T=65536, beta=2.0, clip=clip, o_finite=bool(torch.isfinite(o).all()),
                      nonfinite_grads=bad))
        except Exception as exc:
            emit(dict(kind="nan_long", clip=clip, error=f"{type(exc).__name__}: {str(exc)[:300]}"))


def bench(quick, only_d=None, cases=None):
    configs = {"default": None}
    shapes = [(64, 16, 4096), (64, 16, 16384), (128, 8, 4096), (128, 8, 16384)]
    todo = cases or [(D, H, T, gate) for D, H, T in shapes for gate in (False, True)]
    for D, H, T, gate in todo:
        if only_d and D != only_d:
            continue
        B = 32768 // T
        if True:
            q, k, v, w, beta, g = inputs(B, T, H, H, D, D, gate)
            row = dict(kind="bench", D=D, T=T, B=B, H=H, gate=gate)
            if not gate:
                for name in ("flash", "cudnn"):
                    for bw in (False, True):
                        fn = sdpa_callable(q, k, v, name, backward=bw)
                        row[f"sdpa_{name}_{'fb' if bw else 'f'}"] = (
                            triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") if fn else None)
            for bw in (False, True):
                fn = fla_path_callable(q, k, v, w, beta, g, backward=bw)
                row[f"fla_{'fb' if bw else 'f'}"] = (
                    triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") if fn else None)
            for name, cfg in configs.items():
                for bw in (False, True):
                    xs = [x.detach().requires_grad_(bw) for x in (q, k, v, w, beta)]
                    gg = g.detach().requires_grad_(bw) if g is not None else None
                    do = torch.randn_like(q)

                    def run():
                        o, _ = path_attention_triton(*xs, gg, config=cfg)
                        if bw:
                            torch.autograd.grad(o, xs + ([gg] if gg is not None else []), do)
                    try:
                        run()
                        torch.cuda.synchronize()
                        row[f"{name}_{'fb' if bw else 'f'}"] = triton.testing.do_bench(run, warmup=25, rep=100,
                                                                                        return_mode="median")
                        if bw and name == "default":
                            torch.cuda.synchronize()
                            torch.cuda.reset_peak_memory_stats()
                            base = torch.cuda.memory_allocated()
                            run()
                            torch.cuda.synchronize()
                            row["default_extra_peak_GiB"] = (torch.cuda.max_memory_allocated() - base) / 2**30
                    except Exception as exc:
                        row[f"{name}_{'fb' if bw else 'f'}"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            emit(row)
            if quick:
                return


def _shipped_bwd_config(D: int, gate: bool, T: int = 4096):
    """The fastest config of the newest shipped bwd tune for (D, gate) at seq bucket T (None: none)."""
    import glob

    from pathtune.perf_db._shipped import shipped_dir

    files = sorted(glob.glob(str(shipped_dir() / "*-bwd-tune.json")))
    if not files:
        return None
    best = None
    for r in json.load(open(files[-1]))["records"]:
        w, m = r["workload"], r["measurement"]
        if (w["head_dim"], w["use_gate"], w["seq_bucket"]) != (D, gate, T) or m.get("status") != "ok":
            continue
        if best is None or m["median_ms"] < best[0]:
            best = (m["median_ms"], r["config"])
    return None if best is None else best[1]


def range_budgets(budgets=None, shapes=((64, 16, 4096), (128, 8, 4096), (64, 16, 16384), (128, 8, 16384)),
                  tokens=32768):
    """fwd+bwd time and extra peak per backward range budget (the knob bwd_range_budget_mib: MiB, 0 = one range;
    RANGES_BUDGETS overrides the list), all on the same inputs in one process: gated, bf16, B*T = tokens, at
    the shipped bwd tune's config of the key (T 4K bucket; the heuristic one when RANGES_CONFIG=heuristic).
    Budgets take turns twice per shape, so drift hits them alike; each budget's gradients are compared with
    the first budget's (max relative difference over the six)."""
    import pathtune.codegen.triton.backward as tb

    budgets = budgets or os.environ.get("RANGES_BUDGETS", "256,128,512,0").split(",")
    heuristic = os.environ.get("RANGES_CONFIG") == "heuristic"
    for D, H, T in shapes:
        B = tokens // T
        q, k, v, w, beta, g = inputs(B, T, H, H, D, D, True)
        xs = [x.detach().requires_grad_() for x in (q, k, v, w, beta, g)]
        do = torch.randn_like(q)
        cfg = None if heuristic else _shipped_bwd_config(D, True)
        row = dict(kind="ranges", D=D, T=T, B=B, H=H, gate=True, config=cfg or "heuristic")
        ref = None
        for rep in range(2):
            for spec_ in budgets:
                p = resolve("triton", "bwd", {**(cfg or {}), "bwd_range_budget_mib": int(spec_)}, (D, D))

                def run():
                    o, _ = path_attention_triton(*xs, config=p)
                    return torch.autograd.grad(o, xs, do)
                try:
                    grads = run()
                    torch.cuda.synchronize()
                    if ref is None:
                        ref = grads
                    elif rep == 0:
                        row[f"grad_diff_{spec_}"] = max(
                            ((a.float() - b.float()).norm() / b.float().norm()).item()
                            for a, b in zip(grads, ref))
                    grads = None
                    ms = triton.testing.do_bench(run, warmup=50, rep=500, return_mode="median")
                    row.setdefault(f"fb_ms_{spec_}", []).append(ms)
                    if rep == 0:
                        torch.cuda.reset_peak_memory_stats()
                        base = torch.cuda.memory_allocated()
                        run()
                        torch.cuda.synchronize()
                        row[f"extra_peak_GiB_{spec_}"] = (torch.cuda.max_memory_allocated() - base) / 2**30
                        tabs = tb.state_tables(B, T, None, p, q.device)
                        row[f"ranges_{spec_}"] = tb._range_count(tabs, B * T, H, H, D, p)
                except Exception as exc:
                    row[f"fb_ms_{spec_}"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        emit(row)
        xs = q = k = v = w = beta = g = do = ref = None   # free this case's tensors before the next one's
        torch.cuda.empty_cache()


def kernel_times(fn, warm: int = 2, top: int | None = None) -> list[tuple[str, float, int]]:
    """(kernel name, device ms, launches) of one call of fn, slowest first (the ``top`` slowest; None: all),
    profiled after ``warm`` calls."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    with prof(activities=[ProfilerActivity.CUDA]) as p:
        fn()
        torch.cuda.synchronize()
    rows = [(e.key[:48], round(e.device_time_total / 1000, 3), e.count) for e in p.key_averages()
            if e.device_time_total > 0]
    rows.sort(key=lambda r: -r[1])
    return rows[:top]


SWEEP = [
    None, dict(block_m=64), dict(inter_num_warps=4), dict(block_n=128), dict(superchunk_size=2048),
    dict(superchunk_size=512), dict(bwd_block_n=128), dict(ut_grad_precision="tf32x3"),
]


GATE_PRODUCTS = [None, dict(bwd_gate_bias="product"), dict(bwd_gate_sums="product"),
                 dict(bwd_gate_bias="product", bwd_gate_sums="product")]


def sweep(D=64, H=16, T=16384, gate=True, changes=None, shipped=False):
    """Per-kernel profile of fwd+bwd for one-knob changes from the heuristic default (``shipped``: from the
    newest shipped bwd tune's config of the key at T 4K)."""
    import dataclasses

    B = 32768 // T
    q, k, v, w, beta, g = inputs(B, T, H, H, D, D, gate)
    xs = [x.requires_grad_() for x in (q, k, v, w, beta)] + ([g.requires_grad_()] if gate else [])
    do = torch.randn_like(q)
    base = _shipped_bwd_config(D, gate) if shipped else None
    # the backward's params class: it keeps the knobs only the backward declares (dk / dv's tile, the range budget)
    base = resolve("triton", "bwd", base, (D, D))
    for change in (SWEEP if changes is None else changes):
        cfg = base if shipped else None
        if change is not None:
            cfg = dataclasses.replace(base, **change)
        try:
            def fwd():
                return path_attention_triton(*xs[:5], xs[5] if gate else None, config=cfg)[0]

            def fb():
                torch.autograd.grad(fwd(), xs, do)
            t0 = time.time()
            fwd()
            torch.cuda.synchronize()
            tf = triton.testing.do_bench(fwd, warmup=10, rep=50, return_mode="median")
            tfb = triton.testing.do_bench(fb, warmup=5, rep=30, return_mode="median")
            rows = kernel_times(fb)
            emit(dict(kind="sweep", D=D, T=T, B=B, H=H, gate=gate, change=change, f=tf, fb=tfb,
                      secs=round(time.time() - t0, 1), kernels=rows[:24]))
        except Exception as exc:
            emit(dict(kind="sweep", D=D, T=T, change=change, error=f"{type(exc).__name__}: {str(exc)[:300]}"))


def profile(T=16384, gates=(True,)):
    """Device ms per kernel of one fwd+bwd (heuristic config); PROFILE_GATES=both adds PaTH (no gate)
    next to PaTH-FoX, to see where the gate's backward cost goes."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof
    if os.environ.get("PROFILE_GATES") == "both":
        gates = (True, False)
    for (D, H), gate in itertools.product(((64, 16), (128, 8)), gates):
        B = 32768 // T
        q, k, v, w, beta, g = inputs(B, T, H, H, D, D, gate)
        xs = [x.requires_grad_() for x in (q, k, v, w, beta)] + ([g.requires_grad_()] if gate else [])
        do = torch.randn_like(q)
        for _ in range(2):
            o, _ = path_attention_triton(*xs[:5], xs[5] if gate else None)
            torch.autograd.grad(o, xs, do)
        torch.cuda.synchronize()
        with prof(activities=[ProfilerActivity.CUDA]) as p:
            o, _ = path_attention_triton(*xs[:5], xs[5] if gate else None)
            torch.autograd.grad(o, xs, do)
            torch.cuda.synchronize()
        rows = []
        for e in p.key_averages():
            if e.device_time_total > 0:
                rows.append((e.key[:40], round(e.device_time_total / 1000, 3), e.count))
        rows.sort(key=lambda r: -r[1])
        emit(dict(kind="profile", D=D, T=T, B=B, H=H, gate=gate, kernels=rows[:14]))


if __name__ == "__main__":
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    t0 = time.time()
    steps = sys.argv[1:] or ["check", "profile", "bench", "nan"]
    for step in steps:
        try:
            {"check": check, "profile": profile, "profile4k": lambda: profile(4096),
             "profile2k": lambda: profile(2048), "bench": lambda: bench(False),
             "quick": lambda: bench(True),
             "nan": nan_long, "sweep": sweep, "ranges": range_budgets, "sweep4k": lambda: sweep(T=4096, changes=[None]),
             "sweep128": lambda: sweep(D=128, H=8),
             # the FoX gate's work in the backward on tensor cores (dk / dv's key offsets: bwd_gate_bias; the walk's
             # sums of dS: bwd_gate_sums) against the elementwise forms, at the shipped bwd configs, PaTH beside
             "gateprod": lambda: [sweep(D=D, H=H, T=T, gate=gt, shipped=True, changes=ch) for D, H, T, gt, ch in (
                 (128, 8, 4096, True, GATE_PRODUCTS), (128, 8, 4096, False, [None]),
                 (64, 16, 16384, True, GATE_PRODUCTS), (64, 16, 16384, False, [None]))],
             # D = 128 backward knobs (its kernels spill at 4 warps: compile_check bwd_intra 4.4 KB, dkv 3.0 KB)
             "bwd128": lambda: sweep(D=128, H=8, T=4096, changes=[
                 None, dict(bwd_num_warps=8), dict(bwd_num_warps=8, bwd_num_stages=2), dict(superchunk_size=512),
                 dict(bwd_block_n=32), dict(superchunk_size=2048)]),
             "bench_rest": lambda: bench(False, cases=[(64, 16, 16384, True), (128, 8, 4096, False),
                                                      (128, 8, 4096, True), (128, 8, 16384, False),
                                                      (128, 8, 16384, True)]),
             "check128": lambda: check(128), "bench128": lambda: bench(False, 128),
             # super-chunk size at the shipped bwd configs: fwd and fwd+bwd per kernel, to tell the backward's
             # share (a backward with its own super-chunk size runs the forward's kernels at 1024)
             "bwdsc": lambda: [sweep(D=D, H=H, T=T, gate=gt, shipped=True, changes=ch) for D, H, T, gt, ch in (
                 (128, 8, 4096, True, [None, dict(superchunk_size=512), dict(superchunk_size=256)]),
                 (128, 8, 4096, False, [None, dict(superchunk_size=512)]),
                 (64, 16, 4096, True, [None, dict(superchunk_size=512), dict(superchunk_size=256)]),
                 (128, 8, 16384, True, [None, dict(superchunk_size=512)]))]}[step]()
        except Exception:
            traceback.print_exc()
        print(f"== {step} done at {time.time()-t0:.0f}s", flush=True)
        # one file per invocation (a second invocation must not overwrite the first one's results)
        json.dump(RES, open(os.path.join(OUT, "run_" + "_".join(steps) + ".json"), "w"), indent=1)
