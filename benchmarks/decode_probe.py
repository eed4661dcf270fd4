"""Decoding as users call it, in one GPU run: the public decode step against SDPA, its profile, its CUDA-graph
time, multi-token steps, generation tokens/s against a RoPE + SDPA model, and the correctness checks.

    python benchmarks/decode_probe.py --out $OUT/decode_probe.json            # < 4 minutes on one H200
    python benchmarks/decode_probe.py --out probe.json --quick                # smaller, for a first look

Sections of the JSON (every number from this process, bf16, random inputs: beta in [1.5, 2), unit w,
g = logsigmoid of random values, so real gate decay):

* ``steps``: per (D, H, cache length, PaTH / PaTH-FoX, new tokens 1 / 4 / 16) at B = 8 --
  ``pathtune_ms``: ``triton.testing.do_bench`` median of ``pathtune.path_attention_decode(..., backend=BACKEND)``
  on a static cache whose length is reset to the cache length before every call (``reset_ms``: the reset alone,
  one tiny fill kernel; ``pathtune_net_ms`` = the difference); ``sdpa_ms``: ``F.scaled_dot_product_attention``
  of the same number of queries over the same cached keys (lower-right causal among the new tokens);
  ``loop_ms``: wall time per [reset, call] of 200 back-to-back ones (the host cost a generation loop pays);
  ``graph_ms`` / ``sdpa_graph_ms``: do_bench of a CUDA graph holding [reset, step] / the SDPA call;
  ``x_sdpa`` = pathtune_net_ms / sdpa_ms, ``fox_x_path`` = PaTH-FoX / PaTH of the same row.
  One-token rows also time the step on the tensor-core layout (``tc_layout_net_ms``, its output against the
  row-reduction layout's ``tc_layout_o_vs_rowwise``, ``tc_layout_x_rowwise``): a layout candidate.
  The Triton step rotates lazily (codegen/triton/decode.py): the reset leaves nothing pending, so
  ``pathtune_ms`` times a step that does not flush; ``flush_net_ms`` times the step that flushes (the
  reset leaves ``window`` tokens pending, ``flush_reset_ms`` subtracted); ``every`` = steps per flush cycle
  (floor(window / tokens) + 1) and ``amortized_ms`` = ((every - 1) * pathtune_net_ms + flush_net_ms) / every,
  ``x_sdpa_amortized`` = amortized_ms / sdpa_ms.  With two frame levels (the step's ``decode_frame_bound``,
  ``frame_bound``) the plain step runs with old rows in an older frame and both kinds of flush are timed
  (``flush_parts``: state, weight and time of the small and the big flush, ``tuning.decode_bench.frame_plan``);
  ``flush_net_ms`` is the first (small) one and ``amortized_ms`` their weighted mean over the cycles.
* ``profiles``: one single-token step under torch.profiler (20 steps): kernel launches per step, GPU time per
  step, wall time per step, and the kernels by name.
* ``checks``: (a) decode vs a full recompute: a prompt of 1000 tokens prefilled by the float64 reference
  (stored in bf16; ``prefill: reference``) or by the public ``path_attention_prefill`` (D 64; ``prefill: api``),
  then public decode calls of 1, 4 and 16 tokens; each call's output vs the float64 naive attention over the
  whole sequence, and the key cache vs the float64 current-frame keys (relative Frobenius error per tensor); (b) a
  captured step replayed on new inputs equals the eager step on a twin cache (bitwise; max abs difference).
* ``generate``: ``examples/lm_generate.py`` ``bench_generate`` cells (PaTH, PaTH-FoX, RoPE + SDPA; batch 1 and 8;
  prompt 4096 and 32768; eager and graph), tokens/s and the ratio to RoPE.

``--budget-s`` (default 225) bounds the run: sections not reached in time are listed under ``skipped``.
``--old-decode FILE`` (an older ``codegen/triton/decode.py``): each steps row with a flush also times the plain
and the flush step with that file's decode kernel in the same process (``old_pathtune_net_ms``,
``old_flush_net_ms``, ``old_amortized_ms``); it is launched as this tree's ``decode_kernel`` (same arguments:
a file whose step merges its splits in the same launch).  ``--candidate-decode FILE`` (a benchmarks/variants/
module that defines ``decode_kernel`` with this tree's launch arguments; ``FILE:NAME`` another kernel of it,
several comma-separated): the same, as ``candidate_*`` (``candidate2_*``, ...) fields.  ``--config JSON``: every
steps row runs these decode knobs (the rest heuristic) instead of the dispatcher's pick, e.g. PaTH and PaTH-FoX
at one config (``config`` in the output).  ``--candidate-step FILE`` (a benchmarks/variants/ module defining a
``TritonDecodeStep`` with the shipped one's constructor): the host profile also times the public call with that
step class in the launcher's place (``candidate_host_us_per_step``, ``candidate_wall_us_per_step``), after three
steps of each on twin caches (``candidate_o_equal``: bitwise).
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.util
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
SHAPES = ((64, 16), (128, 8))          # (D, H)
CACHE_LENS = (4096, 32768)
TOKENS = (1, 4, 16)
BATCH = 8
CHECK_PROMPT, CHECK_BATCH, CAPTURE_LEN = 1000, 2, 3000
LOOP_N, PROFILE_N = 200, 20
REPEATS = 1      # --repeats: rounds of (step, flush step, SDPA) per row, the median ratio quoted
DEV, BACKEND, GRAPHS = "cuda", "auto", True
STEP_CONFIG = None     # --config: the decode knobs every step of the steps section runs (None: the dispatcher's)
CANDIDATE_STEP = None  # --candidate-step: a TritonDecodeStep class the host profile times in the shipped one's place


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def inputs(B, T, HQ, H, D, gate, *, gen, dtype=torch.bfloat16):
    """q/k/v in dtype; unit w, beta in [1.5, 2), g = logsigmoid(randn + 3) (float32)."""
    dev = DEV
    q, k, v = (torch.randn(B, T, h, D, device=dev, generator=gen).to(dtype) for h in (HQ, H, H))
    w = F.normalize(torch.randn(B, T, H, D, device=dev, generator=gen), dim=-1)
    beta = 1.5 + 0.5 * torch.rand(B, T, H, device=dev, generator=gen)
    g = F.logsigmoid(torch.randn(B, T, HQ, device=dev, generator=gen) + 3.0) if gate else None
    return q, k, v, w, beta, g


def random_cache(B, T, H, D, gate, cap, *, gen):
    """A static bf16 cache of length T (capacity cap): random keys/values, the cumsum of real log gates."""
    from pathtune import PaTHKVCache

    c = PaTHKVCache.empty(B, H, D, D, H, max_len=cap, gated=gate, dtype=torch.bfloat16, device=DEV, static=True)
    c.k[:, :T] = torch.randn(B, T, H, D, device=DEV, generator=gen).to(torch.bfloat16)
    c.v[:, :T] = torch.randn(B, T, H, D, device=DEV, generator=gen).to(torch.bfloat16)
    if gate:
        c.c[:, :T] = torch.cumsum(F.logsigmoid(torch.randn(B, T, H, device=DEV, generator=gen) + 3.0), dim=1)
    c.length = T
    return c


def sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


def do_bench(fn) -> float:
    if DEV != "cuda":   # the CPU smoke run: one timed call
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    import triton

    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def sdpa_fn(cache, T, q):
    """SDPA of q [B, TN, H, D] over the cache's first T + TN keys (lower-right causal for TN > 1)."""
    TN = q.shape[1]
    n = T + TN
    qt = q.transpose(1, 2)
    k = cache.k[:, :n].transpose(1, 2)
    v = cache.v[:, :n].transpose(1, 2)
    mask = None
    if TN > 1:
        from torch.nn.attention.bias import causal_lower_right

        mask = causal_lower_right(TN, n)

    def run():
        return F.scaled_dot_product_attention(qt, k, v, attn_mask=mask)
    return run


def capture(fn):
    if not GRAPHS:
        raise RuntimeError("CUDA graphs need a GPU")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


@contextlib.contextmanager
def one_row_on_tensor_cores():
    """Inside: a decode step with one query row per program (one token, one query head per kv head) runs the
    tensor-core layout (R = 16 rows, 15 masked) instead of the row-reduction one -- a layout candidate; the
    prepared steps and the dispatcher's decode plans are rebuilt on entry and on exit."""
    import pathtune.codegen.triton.decode as dec
    from pathtune.runtime import dispatch

    real = dec.decode_layout

    def forced(T_new: int, G: int):
        return (False, dec.padded_dim(1)) if T_new * G == 1 else real(T_new, G)

    def rebuild() -> None:
        dec._step_cached.cache_clear()
        (dispatch._DISPATCHER or dispatch.get_dispatcher()).decode_plans.clear()

    dec.decode_layout = forced
    rebuild()
    try:
        yield
    finally:
        dec.decode_layout = real
        rebuild()


# (field prefix, decode kernel) timed beside this tree's: --old-decode ("old"), --candidate-decode ("candidate")
ALT_DECODES: list = []


def load_old_decode(path: str):
    """``decode_kernel`` of an older ``codegen/triton/decode.py`` (``git show REV:codegen/triton/decode.py``)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from kernel_variants import load_variant, repo_path

    return load_variant(repo_path(path).read_text(), "decode_kernel", "old_decode")


def load_candidate_decode(path: str):
    """The kernel ``NAME`` (default ``decode_kernel``) of a candidate module ``FILE[:NAME]`` in benchmarks/variants/
    (one that builds it from this tree's decode.py, e.g. by text replacements with ``kernel_variants.load_variant``,
    and takes its launch arguments)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from kernel_variants import load_candidate

    return load_candidate(path, "decode_kernel")


def amortized(step_ms: float, flush_ms: list, weights: list, every: int) -> float:
    """The amortized step of flush cycles of ``every`` steps whose last step takes ``flush_ms[i]`` in a share
    ``weights[i]`` of the cycles (one frame level: one kind of flush)."""
    return sum(wt * ((every - 1) * step_ms + ms) / every for wt, ms in zip(weights, flush_ms))


def time_alternative(row: dict, prefix: str, context, reset_step, flushes: list, every: int) -> None:
    """The row's plain and flush steps again inside ``context`` (another decode kernel in place):
    ``<prefix>_pathtune_net_ms``, ``<prefix>_flush_net_ms`` (the first kind of flush) and ``<prefix>_amortized_ms``.
    ``flushes``: [(flush step, its reset's ms, weight)]."""
    with context:
        for flush_step, _, _ in flushes:
            flush_step()
        reset_step()
        sync()
        row[f"{prefix}_pathtune_net_ms"] = do_bench(reset_step) - row["reset_ms"]
        flush_ms = [do_bench(flush_step) - reset_ms for flush_step, reset_ms, _ in flushes]
    row[f"{prefix}_flush_net_ms"] = flush_ms[0]
    row[f"{prefix}_amortized_ms"] = amortized(row[f"{prefix}_pathtune_net_ms"], flush_ms,
                                              [wt for _, _, wt in flushes], every)


def repeat_rounds(row: dict, reset_step, flushes: list, sdpa_run) -> None:
    """REPEATS - 1 more rounds of the row's plain step, flush step and SDPA, timed one after the other so that
    each round's ratio compares times taken moments apart; the row keeps every round's amortized / SDPA
    ratio (its own first) and their median, which a verdict on a short step (host jitter moves a 50 us step
    by tens of us between timings) should quote."""
    ratios = [row["x_sdpa_amortized"]]
    for _ in range(REPEATS - 1):
        step = do_bench(reset_step) - row["reset_ms"]
        flush_ms = [do_bench(flush_step) - reset_ms for flush_step, reset_ms, _ in flushes]
        sdpa = do_bench(sdpa_run)
        ratios.append(amortized(step, flush_ms, [wt for _, _, wt in flushes], row["every"]) / sdpa)
    row["x_sdpa_amortized_rounds"] = ratios
    row["x_sdpa_amortized_median"] = statistics.median(ratios)


def time_steps(out: dict, budget) -> None:
    import pathtune
    from pathtune.codegen.triton.decode import FRAME_ALIGN
    from pathtune.tuning.decode_bench import frame_plan

    rows, sdpa_cache = [], {}
    for D, H in SHAPES:
        for T in CACHE_LENS:
            for gate in (False, True):
                gen = torch.Generator(device=DEV).manual_seed(D * 7 + T + gate)
                cap = T + max(TOKENS) + 8
                cache = random_cache(BATCH, T, H, D, gate, cap, gen=gen)
                for TN in TOKENS:
                    if budget.out():
                        out["skipped"].append(f"steps D{D} T{T} gate={gate} TN={TN}")
                        continue
                    row = dict(D=D, H=H, HQ=H, B=BATCH, cache_len=T, gate=gate, tokens=TN)
                    try:
                        xs = inputs(BATCH, TN, H, H, D, gate, gen=gen)

                        def step(xs=xs, cache=cache):
                            return pathtune.path_attention_decode(*xs, cache, backend=BACKEND, config=STEP_CONFIG)

                        W, FB = step_frames(xs, cache, D)
                        # two frame levels: the plain step in the state of a small flush's cycle (old rows in an
                        # older frame: the frame map in use), the flushes of both kinds (tuning.decode_bench.frame_plan)
                        plan = frame_plan(T, TN, W, FB, FRAME_ALIGN) if FB > 0 else None
                        if plan is not None:
                            cache.frame_map()

                        def reset(cache=cache, T=T, plan=plan):
                            if plan is None:
                                cache.length = T
                            else:
                                cache.set_state(*plan[0][1][0])

                        def reset_step():
                            reset()
                            return step()

                        reset_step()
                        sync()
                        row["pathtune_ms"] = do_bench(reset_step)
                        row["reset_ms"] = do_bench(reset)
                        row["pathtune_net_ms"] = row["pathtune_ms"] - row["reset_ms"]
                        if TN == 1:   # the one-row step on the tensor-core layout, same state and inputs
                            o_row = reset_step().clone()
                            with one_row_on_tensor_cores():
                                row["tc_layout_o_vs_rowwise"] = rel(reset_step(), o_row)
                                sync()
                                row["tc_layout_net_ms"] = do_bench(reset_step) - row["reset_ms"]
                            row["tc_layout_x_rowwise"] = row["tc_layout_net_ms"] / row["pathtune_net_ms"]
                        if W > 0 and cache._pw is not None:   # the lazy step: time the flush step too
                            parts = ([(1.0, [(T, T - W, 0, T - W)])] if plan is None else plan)
                            flushes, flush_ms = [], []
                            for weight, states in parts:

                                def reset_flush(cache=cache, st=states[-1]):
                                    cache.set_state(*st)

                                def flush_step(reset_flush=reset_flush):
                                    reset_flush()
                                    return step()
                                flush_step()
                                sync()
                                reset_ms = do_bench(reset_flush)
                                flush_ms.append(do_bench(flush_step) - reset_ms)
                                flushes.append((flush_step, reset_ms, weight))
                            row["window"] = W
                            row["flush_reset_ms"] = flushes[0][1]
                            row["flush_net_ms"] = flush_ms[0]
                            every = W // TN + 1
                            row["every"] = every
                            if plan is not None:
                                row["frame_bound"] = FB
                                row["flush_parts"] = [dict(state=list(states[-1]), weight=wt, net_ms=ms)
                                                      for (wt, states), ms in zip(plan, flush_ms)]
                            row["amortized_ms"] = amortized(row["pathtune_net_ms"], flush_ms,
                                                            [wt for _, _, wt in flushes], every)
                            for prefix, kernel in ALT_DECODES:   # the same steps with another decode kernel
                                from kernel_variants import swapped  # on sys.path: the loaders put it there

                                import pathtune.codegen.triton.decode as decode_mod

                                time_alternative(row, prefix, swapped(decode_mod, "decode_kernel", kernel),
                                                 reset_step, flushes, every)
                        reset()
                        sync()
                        t0 = time.perf_counter()
                        for _ in range(LOOP_N):
                            reset_step()
                        sync()
                        row["loop_ms"] = (time.perf_counter() - t0) / LOOP_N * 1e3
                        if GRAPHS:
                            graph, _ = capture(reset_step)
                            row["graph_ms"] = do_bench(graph.replay)
                            del graph
                        reset()
                        cache.sync_length()
                        skey = (D, H, T, TN)
                        if skey not in sdpa_cache:
                            run = sdpa_fn(cache, T, xs[0])
                            run()
                            sgraph = capture(run)[0] if GRAPHS else None
                            sdpa_cache[skey] = (do_bench(run), do_bench(sgraph.replay) if GRAPHS else None)
                            del sgraph
                        row["sdpa_ms"], row["sdpa_graph_ms"] = sdpa_cache[skey]
                        row["x_sdpa"] = row["pathtune_net_ms"] / row["sdpa_ms"]
                        if "amortized_ms" in row:
                            row["x_sdpa_amortized"] = row["amortized_ms"] / row["sdpa_ms"]
                            row["flush_x_sdpa"] = row["flush_net_ms"] / row["sdpa_ms"]
                            if REPEATS > 1:
                                repeat_rounds(row, reset_step, flushes, sdpa_fn(cache, T, xs[0]))
                        if GRAPHS:
                            row["graph_x_sdpa_graph"] = row["graph_ms"] / row["sdpa_graph_ms"]
                    except Exception as exc:  # noqa: BLE001 - record and go on
                        row["error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
                        traceback.print_exc()
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                del cache
                if DEV == "cuda":
                    torch.cuda.empty_cache()
    for r in rows:
        if r["gate"] and "pathtune_net_ms" in r:
            base = next((p for p in rows if not p["gate"] and "pathtune_net_ms" in p and
                         (p["D"], p["cache_len"], p["tokens"]) == (r["D"], r["cache_len"], r["tokens"])), None)
            if base is not None:
                r["fox_x_path"] = r["pathtune_net_ms"] / base["pathtune_net_ms"]
                if "amortized_ms" in r and "amortized_ms" in base:
                    r["fox_x_path_amortized"] = r["amortized_ms"] / base["amortized_ms"]
    out["steps"] = rows


def step_frames(xs, cache, D: int) -> tuple[int, int]:
    """(pending window, frame bound) of the config the public step runs for these inputs (``--config``'s, else its
    decode plan: a swept record's, else the heuristic's): the flush steps and the cycle follow them."""
    from pathtune.codegen.triton.decode import decode_params
    from pathtune.runtime.decode_dispatch import decode_plan

    if STEP_CONFIG is not None:
        params = decode_params(STEP_CONFIG, D, D)
    else:
        plan = decode_plan(xs[0], xs[1], xs[2], xs[5], cache)
        ok = plan.backend == "triton" and plan.triton_params is not None
        params = decode_params(plan.triton_params if ok else None, D, D)
    return params.decode_pending_window, params.decode_frame_bound


def _cases(out: dict, budget, section: str, seed, lens=(None,)):
    """(D, H, T, gate, generator) of every shape, cache length of ``lens`` (None: a section without one) and gate a
    section runs, the generator seeded with ``seed(D, T, gate)``; a case not reached within the time budget is
    listed in ``out["skipped"]`` instead."""
    for D, H in SHAPES:
        for T in lens:
            for gate in (False, True):
                if budget.out():
                    out["skipped"].append(f"{section} D{D}" + ("" if T is None else f" T{T}") + f" gate={gate}")
                    continue
                yield D, H, T, gate, torch.Generator(device=DEV).manual_seed(seed(D, T, gate))


def profile_steps(out: dict, budget) -> None:
    from torch.profiler import ProfilerActivity, profile

    import pathtune

    prof_rows = []
    for D, H, T, gate, gen in _cases(out, budget, "profile", lambda D, T, gate: D + T + gate, CACHE_LENS):
        n = PROFILE_N
        cache = random_cache(BATCH, T, H, D, gate, T + n + 8, gen=gen)
        xs = inputs(BATCH, 1, H, H, D, gate, gen=gen)
        pathtune.path_attention_decode(*xs, cache, backend=BACKEND)
        cache.length = T
        sync()
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEV == "cuda" else [])
        with profile(activities=acts) as prof:
            t0 = time.perf_counter()
            for _ in range(n):
                pathtune.path_attention_decode(*xs, cache, backend=BACKEND)
            sync()
            wall = (time.perf_counter() - t0) / n
        kernels: dict[str, list] = {}
        gpu_us = 0.0
        for e in prof.events():
            if str(getattr(e, "device_type", "")).endswith("CUDA") and getattr(e, "device_time_total", 0) > 0:
                k = kernels.setdefault(e.name, [0, 0.0])
                k[0] += 1
                k[1] += e.device_time_total
                gpu_us += e.device_time_total
        launches = sum(c for c, _ in kernels.values())
        row = dict(D=D, H=H, B=BATCH, cache_len=T, gate=gate, steps=n,
                   launches_per_step=launches / n, gpu_us_per_step=gpu_us / n,
                   wall_us_per_step_profiled=wall * 1e6,
                   kernels={name: dict(count=c, us_per_step=t / n) for name, (c, t) in kernels.items()})
        cache.length = T
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            pathtune.path_attention_decode(*xs, cache, backend=BACKEND)
        sync()
        row["wall_us_per_step"] = (time.perf_counter() - t0) / n * 1e6
        prof_rows.append(row)
        print(json.dumps(row), flush=True)
        del cache
    out["profiles"] = prof_rows


HOST_STEPS, HOST_CACHE = 300, 4096    # eager steps per profiled row, their cache length


def host_profile(out: dict, budget) -> None:
    """Where an eager one-token step's host time goes (cache HOST_CACHE, B = 8): the public call in a loop without
    syncs (``wall_us_per_step``: host-bound when above the kernel's time), the same step under cProfile
    (the 25 functions of most own time, us per step), the step's Triton launch alone through the JIT
    (``jit_launch_us``: ``decode_kernel[grid](...)`` with the captured arguments) and through the compiled
    kernel's launcher (``direct_launch_us``: ``CompiledKernel.run`` with the arguments bound once)."""
    import cProfile
    import pstats

    import pathtune
    import pathtune.codegen.triton.decode as decode_mod

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from kernel_variants import Capture

    rows = []
    for D, H, T, gate, gen in _cases(out, budget, "hostprofile", lambda D, T, gate: D + gate + 11, (HOST_CACHE,)):
        n = HOST_STEPS
        # room for every step below: the warm-up, two loops of the public call, the JIT launches, the direct ones,
        # the candidate step's loop
        cache = random_cache(BATCH, T, H, D, gate, T + 4 * n + 8, gen=gen)
        # the candidate's loop starts from this cache as it is now: both loops time steps over the same lengths
        start = copy.deepcopy(cache) if CANDIDATE_STEP is not None else None
        xs = inputs(BATCH, 1, H, H, D, gate, gen=gen)
        with Capture(decode_mod, "decode_kernel") as cap:
            pathtune.path_attention_decode(*xs, cache, backend=BACKEND)
        sync()
        loop_len = int(cache.length)
        t0 = time.perf_counter()
        for _ in range(n):
            pathtune.path_attention_decode(*xs, cache, backend=BACKEND)
        host = (time.perf_counter() - t0) / n
        sync()
        wall = (time.perf_counter() - t0) / n
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(n):
            pathtune.path_attention_decode(*xs, cache, backend=BACKEND)
        prof.disable()
        sync()
        st = pstats.Stats(prof)
        top = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:25]
        row = dict(D=D, H=H, B=BATCH, cache_len=T, gate=gate, steps=n, loop_start_len=loop_len,
                   host_us_per_step=host * 1e6,
                   wall_us_per_step=wall * 1e6,
                   top_own_us_per_step=[dict(fn=f"{Path(f).name}:{line}({name})", calls_per_step=cc / n,
                                             own_us=tt / n * 1e6, cum_us=ct / n * 1e6)
                                        for (f, line, name), (cc, _nc, tt, ct, _callers) in top])
        grid, args, kw = cap.calls[0]
        kern = decode_mod.decode_kernel
        launch = kern[grid]
        ck = launch(*args, **kw)     # the compiled kernel of these arguments (the JIT's return value)
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            launch(*args, **kw)
        row["jit_launch_us"] = (time.perf_counter() - t0) / n * 1e6
        sync()
        try:   # Triton 3.6's launch path, by hand: the compiled kernel and the arguments bound once
            from triton.runtime.driver import driver

            dev = driver.active.get_current_device()
            stream = driver.active.get_current_stream(dev)
            kernel_cache, _kk, _t, _b, binder = kern.device_caches[dev]
            vals = tuple(binder(*args, **kw)[0].values())
            g = tuple(grid) + (1,) * (3 - len(grid))
            ck.run(*g, stream, ck.function, ck.packed_metadata, None, None, None, *vals)
            sync()
            t0 = time.perf_counter()
            for _ in range(n):
                ck.run(*g, stream, ck.function, ck.packed_metadata, None, None, None, *vals)
            row["direct_launch_us"] = (time.perf_counter() - t0) / n * 1e6
            row["compiled_variants"] = len(kernel_cache)
        except Exception as exc:  # noqa: BLE001 - another Triton's internals: keep the rest
            row["direct_launch_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        sync()
        if CANDIDATE_STEP is not None:
            candidate_host(row, xs, start, D, H, T, gate, gen, n)
            del start
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "top_own_us_per_step"}), flush=True)
        del cache
    out["host_profile"] = rows


@contextlib.contextmanager
def step_class(cls):
    """Decode steps of class ``cls`` in place of codegen/triton/decode.py's (every prepared step forgotten on the
    way in and out)."""
    import pathtune.codegen.triton.decode as decode_mod
    from pathtune.runtime import dispatch

    shipped = decode_mod.TritonDecodeStep
    decode_mod.TritonDecodeStep = cls
    decode_mod._step_cached.cache_clear()
    dispatch.clear_cache()
    try:
        yield
    finally:
        decode_mod.TritonDecodeStep = shipped
        decode_mod._step_cached.cache_clear()
        dispatch.clear_cache()


def candidate_host(row: dict, xs, cache, D: int, H: int, T: int, gate: bool, gen, n: int) -> None:
    """The host profile row's public-call loop again with ``CANDIDATE_STEP`` in place, on ``cache`` as the shipped
    loop found it (the same lengths step for step): host and wall time per step, after three steps of the shipped
    and the candidate step on twin caches compared bitwise."""
    import pathtune

    twin = random_cache(BATCH, T, H, D, gate, T + 8, gen=gen)
    other = copy.deepcopy(twin)
    steps = [inputs(BATCH, 1, H, H, D, gate, gen=gen) for _ in range(3)]
    ref = [pathtune.path_attention_decode(*x, twin, backend=BACKEND) for x in steps]
    with step_class(CANDIDATE_STEP):
        got = [pathtune.path_attention_decode(*x, other, backend=BACKEND) for x in steps]
        row["candidate_o_equal"] = all(torch.equal(a, b) for a, b in zip(ref, got))
        pathtune.path_attention_decode(*xs, cache, backend=BACKEND)     # the step prepared, the kernel kept
        sync()
        row["candidate_loop_start_len"] = int(cache.length)
        t0 = time.perf_counter()
        for _ in range(n):
            pathtune.path_attention_decode(*xs, cache, backend=BACKEND)
        row["candidate_host_us_per_step"] = (time.perf_counter() - t0) / n * 1e6
        sync()
        row["candidate_wall_us_per_step"] = (time.perf_counter() - t0) / n * 1e6
    del twin, other


def correctness(out: dict, budget) -> None:
    import pathtune
    from pathtune.runtime.reference import naive_path_attention
    from pathtune.runtime.reference.recurrent import current_frame_keys, path_attention_prefill

    checks = {"decode_vs_recompute": [], "captured_vs_eager": []}
    P = CHECK_PROMPT
    for D, H, _T, gate, gen in _cases(out, budget, "checks", lambda D, T, gate: 100 + D + gate):
        B = CHECK_BATCH
        total = P + sum(TOKENS)
        full = inputs(B, total, H, H, D, gate, gen=gen)
        f64 = [None if x is None else x.double() for x in full]
        try:
            ref_o = naive_path_attention(*f64)
            _, ref_cache = path_attention_prefill(*[None if x is None else x[:, :P] for x in f64],
                                                  max_len=total + 8, cache_dtype=torch.bfloat16)
            from pathtune import PaTHKVCache

            caches = {"reference": PaTHKVCache(ref_cache.k.clone(), ref_cache.v.clone(),
                                               None if ref_cache.c is None else ref_cache.c.float(), P, H,
                                               static=True)}
            if D == SHAPES[0][0]:   # also the public prefill (its kernels are the generation section's)
                caches["api"] = pathtune.path_attention_prefill(
                    *[None if x is None else x[:, :P] for x in full], max_len=total + 8, static=True,
                    backend=BACKEND)[1]
            for prefill, cache in caches.items():
                t = P
                for TN in TOKENS:
                    xs = [None if x is None else x[:, t:t + TN] for x in full]
                    o = pathtune.path_attention_decode(*xs, cache, backend=BACKEND)
                    t += TN
                    kr = current_frame_keys(f64[1][:, :t], f64[3][:, :t], f64[4][:, :t])
                    checks["decode_vs_recompute"].append(dict(
                        D=D, H=H, gate=gate, prefill=prefill, prompt=P, tokens=TN, o=rel(o, ref_o[:, t - TN:t]),
                        k=rel(cache.k[:, :t], kr)))
        except Exception as exc:  # noqa: BLE001
            checks["decode_vs_recompute"].append(dict(D=D, H=H, gate=gate, error=f"{type(exc).__name__}: {exc}"))
            traceback.print_exc()
        # captured == eager
        try:
            for TN in ((1, 4) if GRAPHS else ()):
                c0 = random_cache(4, CAPTURE_LEN, H, D, gate, CAPTURE_LEN + 100, gen=gen)
                twin = copy.deepcopy(c0)
                static = inputs(4, TN, H, H, D, gate, gen=gen)
                warm = copy.deepcopy(c0)
                pathtune.path_attention_decode(*static, warm, backend=BACKEND)
                del warm
                graph, gout = capture(
                    lambda c=c0, xs=static: pathtune.path_attention_decode(*xs, c, backend=BACKEND))
                worst, equal = 0.0, True
                for _ in range(5):
                    xs = inputs(4, TN, H, H, D, gate, gen=gen)
                    for dst, src in zip(static, xs):
                        if dst is not None:
                            dst.copy_(src)
                    graph.replay()
                    eo = pathtune.path_attention_decode(*xs, twin, backend=BACKEND)
                    equal &= bool(torch.equal(gout, eo))
                    worst = max(worst, float((gout.float() - eo.float()).abs().max()))
                n = twin.length
                checks["captured_vs_eager"].append(dict(
                    D=D, H=H, gate=gate, tokens=TN, steps=5, o_equal=equal, o_max_abs_diff=worst,
                    length_device=c0.length, length_eager=n,
                    k_equal=bool(torch.equal(c0.k[:, :n], twin.k[:, :n]))))
                del graph, c0, twin
        except Exception as exc:  # noqa: BLE001
            checks["captured_vs_eager"].append(dict(D=D, H=H, gate=gate, error=f"{type(exc).__name__}: {exc}"))
            traceback.print_exc()
        if DEV == "cuda":
            torch.cuda.empty_cache()
    out["checks"] = checks
    print(json.dumps(checks), flush=True)


def generation(out: dict, budget, quick: bool) -> None:
    if budget.out():
        out["skipped"].append("generate")
        return
    spec = importlib.util.spec_from_file_location("lm_generate", ROOT / "examples" / "lm_generate.py")
    lm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lm)
    prompts = (4096,) if quick else (4096, 32768)
    kw = {}
    if DEV != "cuda":   # the CPU smoke run: a tiny model, eager, the kernels in Triton's interpreter
        prompts, kw = (24,), dict(modes=("eager",), hidden=64, layers=2, heads=2, vocab=50, gen=2, device="cpu",
                                 dtype=torch.float32, backend="triton", batches=(1, 2))
    cells = out["generate"] = []

    def log(line: str) -> None:
        print(line, flush=True)
        cells.append(json.loads(line))
        budget.save(out)

    final = lm.bench_generate(**{"batches": (1, 8), "prompts": prompts, "modes": ("eager", "graph"), "gen": 32,
                                 "log": log, "should_stop": budget.out, **kw})
    out["generate"] = final


class Budget:
    def __init__(self, seconds: float, path: str) -> None:
        self.end = time.perf_counter() + seconds
        self.path = path

    def out(self) -> bool:
        return time.perf_counter() > self.end

    def save(self, out: dict) -> None:
        Path(self.path).write_text(json.dumps(out, indent=1))   # partial results survive a timeout


def smoke_config() -> None:
    """Tiny shapes on the CPU with the Triton kernels in the interpreter (TRITON_INTERPRET=1), no CUDA graphs:
    exercises every section's code for a CPU test; the numbers mean nothing."""
    global SHAPES, CACHE_LENS, TOKENS, BATCH, CHECK_PROMPT, CHECK_BATCH, DEV, BACKEND, GRAPHS, LOOP_N, PROFILE_N
    global HOST_STEPS, HOST_CACHE
    SHAPES, CACHE_LENS, TOKENS, BATCH, LOOP_N, PROFILE_N = ((32, 2),), (40,), (1, 4), 2, 2, 2
    HOST_STEPS, HOST_CACHE = 2, 40
    CHECK_PROMPT, CHECK_BATCH = 20, 1
    DEV, BACKEND, GRAPHS = "cpu", "triton", False


def main(argv=None) -> int:
    global SHAPES, CACHE_LENS, REPEATS, TOKENS, STEP_CONFIG, CANDIDATE_STEP
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON result file")
    ap.add_argument("--budget-s", type=float, default=225.0, help="stop starting new sections after this long")
    ap.add_argument("--quick", action="store_true", help="cache 4096 only, D 64 only, generation at 4K only")
    ap.add_argument("--skip", default="", help="comma list of sections to skip: steps,profiles,hostprofile,checks,"
                    "generate")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny CPU run under TRITON_INTERPRET=1 (tests)")
    ap.add_argument("--repeats", type=int, default=1, help="rounds of (step, flush step, SDPA) timed one after the "
                    "other per row: the median amortized / SDPA ratio (x_sdpa_amortized_median) for short steps")
    ap.add_argument("--tokens", default=None, help="comma list of new-token counts the steps section times "
                    f"(default {','.join(map(str, TOKENS))})")
    ap.add_argument("--old-decode", default=None, help="an older codegen/triton/decode.py: its decode kernel's "
                    "plain and flush steps timed beside this tree's in the steps section (old_* fields)")
    ap.add_argument("--candidate-decode", default=None, help="FILE[:NAME][,FILE[:NAME]...]: benchmarks/variants/ "
                    "modules defining a kernel NAME (default decode_kernel) with this tree's launch arguments: its "
                    "steps timed beside this tree's (candidate_* fields; candidate2_*, ... for the next ones)")
    ap.add_argument("--candidate-step", default=None, help="FILE: a benchmarks/variants/ module defining a "
                    "TritonDecodeStep: the host profile times the public call with it in place (candidate_* fields)")
    ap.add_argument("--config", default=None, help="JSON decode knobs the steps section runs every row at (e.g. "
                    "'{\"decode_splits\": 2}'; the rest heuristic) instead of the dispatcher's pick: kernels compared "
                    "at one config")
    args = ap.parse_args(argv)
    if args.config:
        try:
            STEP_CONFIG = json.loads(args.config)
        except json.JSONDecodeError as exc:
            ap.error(f"--config takes a JSON object of decode knobs: {exc}")
        if not isinstance(STEP_CONFIG, dict):
            ap.error(f"--config takes a JSON object of decode knobs, got {args.config!r}")
    if args.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {args.repeats}")
    REPEATS = args.repeats
    if args.tokens:
        try:
            TOKENS = tuple(int(t) for t in args.tokens.split(","))
        except ValueError:
            ap.error(f"--tokens takes a comma list of positive integers, got {args.tokens!r}")
        if not TOKENS or min(TOKENS) < 1:
            ap.error(f"--tokens takes a comma list of positive integers, got {args.tokens!r}")
    if args.old_decode:
        ALT_DECODES.append(("old", load_old_decode(args.old_decode)))
    for i, path in enumerate(p for p in (args.candidate_decode or "").split(",") if p):
        ALT_DECODES.append((f"candidate{i + 1 if i else ''}", load_candidate_decode(path)))
    if args.candidate_step:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from kernel_variants import load_candidate

        CANDIDATE_STEP = load_candidate(args.candidate_step, "TritonDecodeStep")
    if args.cpu_smoke:
        smoke_config()
    elif not torch.cuda.is_available():
        ap.error("needs a CUDA GPU")
    if args.quick:
        SHAPES, CACHE_LENS = SHAPES[:1], CACHE_LENS[:1]
    skip = {s for s in args.skip.split(",") if s}
    import triton

    import pathtune

    t0 = time.perf_counter()
    budget = Budget(args.budget_s, args.out)
    out = {"gpu": torch.cuda.get_device_name() if DEV == "cuda" else "cpu (smoke run)",
           "torch": torch.__version__, "triton": triton.__version__,
           "python": sys.version.split()[0], "pathtune": pathtune.__version__, "batch": BATCH, "skipped": []}
    if STEP_CONFIG is not None:
        out["config"] = STEP_CONFIG
    sections = [("checks", lambda: correctness(out, budget)), ("steps", lambda: time_steps(out, budget)),
                ("profiles", lambda: profile_steps(out, budget)), ("hostprofile", lambda: host_profile(out, budget)),
                ("generate", lambda: generation(out, budget, args.quick))]
    for name, fn in sections:
        if name in skip:
            out["skipped"].append(name)
            continue
        t = time.perf_counter()
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - keep what the other sections measured
            out.setdefault("errors", {})[name] = f"{type(exc).__name__}: {str(exc)[:600]}"
            traceback.print_exc()
        out.setdefault("section_s", {})[name] = round(time.perf_counter() - t, 1)
        budget.save(out)
    out["total_s"] = round(time.perf_counter() - t0, 1)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out} ({out['total_s']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
