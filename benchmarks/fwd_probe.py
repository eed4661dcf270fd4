"""Forward probe (GPU): where one PaTH(-FoX) forward spends its time, beside SDPA flash and fla.

    python benchmarks/fwd_probe.py [--head-dims 64,128] [--seq-lens 2048,4096,16384] [--gates 1,0]
                                   [--config heuristic|auto|JSON] [--variants JSON-list] [--no-fla]
                                   [--candidates FILE[,FILE]]

For every (D, T, gate) at B*T = 32768 tokens (H = 16 at D <= 64, else 8), bf16, in ONE process:
  - SDPA flash and fla's ``parallel_path_attn`` forward (fla when importable);
  - the public API ``pathtune.path_attention`` (backend "triton", the dispatcher's plan for ``auto``
    when ``--config auto``), wall time per call as users see it (``do_bench`` medians, host included);
  - the launcher ``path_attention_fwd`` with explicit params (no dispatch), and each variant of
    ``--variants`` (knob changes on the base params);
  - the public call's host time per call (25 calls queued) and its replay from a CUDA graph (device
    time alone: api / graph is what the host adds);
  - with ``--candidates``, the public call (and its graph replay) with each candidate module's forward kernels
    (benchmarks/variants/: whichever of ``FORWARD_KERNELS`` it defines, swapped in together) in place of the
    shipped ones, and the ratio to the shipped call;
  - per-kernel device ms of one public call (torch profiler), host->device copies and syncs per call;
  - the forward's relative error against the float64 oracle on the first 2048 tokens of batch 0.
With ``--host``: instead, one small host-bound call (B = 1, T = 512, H = 8, D = 64, FoX; ``--host-shape B,T,H,D``
another shape, e.g. 16,2048,16,64 for a training step at B * T = 32K): the public
call's wall time next to SDPA's, its replay from a CUDA graph (GPU time only), and the top functions
of a cProfile of 200 calls; ``--launch-candidate FILE`` (a benchmarks/variants/ module whose ``in_place()`` puts a
repeat-launcher class in ``launch._RepeatLaunch``'s place, ``kernel_variants.repeat_launcher_in_place``) times that
call and a forward + backward at the same shape with it in place, beside the shipped launcher.
JSON lines to stdout and to $OUT/fwd_probe.json (rewritten after every row).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import time

import torch
import triton
from kernel_variants import candidate_kernels, swapped  # benchmarks/ (this script's folder) is on sys.path

OUT = os.environ.get("OUT", "/tmp")
ROWS: list[dict] = []


# the forward launcher's kernels (codegen/triton/forward.py names) a candidate module may replace, and the UT stage's
# launcher function and M's type (a candidate that changes what the stage stores, e.g. variants/ut_m_float32.py)
FORWARD_KERNELS = ("ut_fused_kernel", "superchunk_transport_kernel", "scan_intra_kernel", "scan_inter_kernel",
                   "ut_fused", "ut_state_m_dtype")


def forward_candidate(file: str) -> dict:
    """{name: kernel} of the ``FORWARD_KERNELS`` that candidate module ``file`` defines (at least one)."""
    found = candidate_kernels(file, FORWARD_KERNELS)
    if not found:
        raise SystemExit(f"{file} defines none of {', '.join(FORWARD_KERNELS)}: not a forward candidate")
    return found


def host_ms(fn, calls: int = 25) -> float:
    """Host time per call (ms): the CPU returns before the GPU finishes when nothing syncs, so queued calls time
    the host alone until the launch queue fills (``calls`` stay below)."""
    torch.cuda.synchronize()
    h0 = time.perf_counter()
    for _ in range(calls):
        fn()
    out = (time.perf_counter() - h0) / calls * 1e3
    torch.cuda.synchronize()
    return out


def emit(row: dict) -> None:
    print(json.dumps(row), flush=True)
    ROWS.append(row)
    with open(os.path.join(OUT, "fwd_probe.json"), "w") as f:
        json.dump(ROWS, f, indent=1)


def bench(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def graph_of(fn):
    """``fn`` captured into a CUDA graph (warmed up on a side stream first); returns its replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def kernel_profile(fn) -> dict:
    """Device ms per kernel name of one call, plus memcpy / sync counts seen by the profiler."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kernels, copies, syncs = [], 0, 0
    for e in prof.key_averages():
        if "Memcpy HtoD" in e.key or e.key.startswith("cudaMemcpy"):
            copies += e.count if e.key.startswith("cudaMemcpy") else 0
        if "Synchronize" in e.key:
            syncs += e.count
        if e.device_time_total > 0 and not e.key.startswith("cuda"):
            kernels.append((e.key[:48], round(e.device_time_total / 1000, 4), e.count))
    kernels.sort(key=lambda r: -r[1])
    return dict(kernels=kernels[:16], device_ms=round(sum(k[1] for k in kernels), 4),
                host_copies=copies, syncs=syncs)


def host_profile(shape=(1, 512, 8, 64), launch_candidate: str | None = None) -> None:
    """Where a small call's wall time goes (host-bound): wall vs graph replay vs SDPA, and cProfile.  With
    ``launch_candidate`` (a benchmarks/variants/ module with an ``in_place()`` context that swaps the repeat
    launcher of ``compiled``): the forward's and a forward + backward's wall and host time per call, shipped
    and with the candidate in place, in the same process (``launch_*`` fields)."""
    import cProfile
    import io
    import pstats

    import pathtune
    from pathtune.tuning.baselines import sdpa_callable
    from pathtune.tuning.bench import make_inputs

    B, T, H, D = shape
    q, k, v, w, beta, g = make_inputs(B, T, H, H, D, D, True, device="cuda", seed=0)

    def api():
        return pathtune.path_attention(q, k, v, w, beta, g)

    row: dict = dict(kind="host", B=B, T=T, H=H, D=D)
    with torch.no_grad():
        row["sdpa_flash"] = bench(sdpa_callable(q, k, v, "flash"))
        row["api"] = bench(api)
        n = 200
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            api()
        row["api_host_ms"] = (time.perf_counter() - t0) / n * 1e3
        torch.cuda.synchronize()
        row["graph_replay"] = bench(graph_of(api))
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(n):
            api()
        prof.disable()
        torch.cuda.synchronize()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(25)
        row["cprofile"] = buf.getvalue()[-6000:]
    if launch_candidate:
        row.update(launch_rows(api, (q, k, v, w, beta, g), launch_candidate))
    emit(row)


def launch_rows(api, inputs, path: str, rounds: int = 5) -> dict:
    """Wall (do_bench) and host time per call (25 queued) of the forward ``api`` and of a forward + backward on
    ``inputs``, with the shipped repeat launcher and with candidate module ``path``'s ``in_place()``: medians over
    ``rounds`` rounds in alternating order (and each round's value, ``*_rounds``)."""
    from kernel_variants import load_candidate

    import pathtune

    in_place = load_candidate(f"{path}:in_place", "in_place")
    leaves = [x.detach().requires_grad_() if x is not None else None for x in inputs]
    wrt = [x for x in leaves if x is not None]

    def train():
        return torch.autograd.grad(pathtune.path_attention(*leaves).sum(), wrt)

    arms = {"shipped": contextlib.nullcontext, "candidate": in_place}
    for ctx in arms.values():     # every kernel compiled and every launch key prepared before the timing
        with ctx():
            api()
            train()
    times: dict = {}
    for r in range(rounds):       # shipped and candidate alternate which goes first, round by round
        for label in (("shipped", "candidate") if r % 2 == 0 else ("candidate", "shipped")):
            with arms[label]():
                for what, fn in (("fwd", api), ("fwd_bwd", train)):
                    with torch.no_grad() if what == "fwd" else contextlib.nullcontext():
                        times.setdefault(f"launch_{label}_{what}_ms", []).append(bench(fn))
                        times.setdefault(f"launch_{label}_{what}_host_ms", []).append(host_ms(fn))
    out = {k: statistics.median(v) for k, v in times.items()}
    out.update({f"{k}_rounds": v for k, v in times.items()})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--seq-lens", default="2048,4096,16384")
    ap.add_argument("--gates", default="1,0")
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--config", default="heuristic")
    ap.add_argument("--variants", default="[]", help="JSON list of knob-change dicts timed on the launcher")
    ap.add_argument("--no-fla", action="store_true")
    ap.add_argument("--candidates", default="",
                    help="FILE[,FILE]: also time the public call with each module's forward kernels swapped in")
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--host", action="store_true", help="only the small host-bound call (see above)")
    ap.add_argument("--launch-candidate", default=None,
                    help="FILE (with --host): a benchmarks/variants/ repeat-launcher module timed beside the shipped")
    ap.add_argument("--host-shape", default="1,512,8,64",
                    help="B,T,H,D of the --host call (e.g. 16,2048,16,64: a training step at B*T = 32K)")
    args = ap.parse_args()
    if args.host:
        shape = tuple(int(x) for x in args.host_shape.split(",") if x.strip().isdigit())
        if len(shape) != 4:
            raise SystemExit(f"--host-shape {args.host_shape!r}: give B,T,H,D as four integers, e.g. 1,512,8,64")
        host_profile(shape, launch_candidate=args.launch_candidate)
        return

    import pathtune
    from pathtune.codegen._knobs import resolve
    from pathtune.codegen.triton.forward import path_attention_fwd
    from pathtune.runtime.dispatch import get_dispatcher
    from pathtune.runtime.reference import naive_path_attention
    from pathtune.tuning.baselines import fla_path_callable, sdpa_callable
    from pathtune.tuning.bench import make_inputs

    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    variants = json.loads(args.variants)
    from pathtune.codegen.triton import forward as fwd_mod
    candidates = [(f, forward_candidate(f)) for f in args.candidates.split(",") if f]
    for D in [int(x) for x in args.head_dims.split(",")]:
        H = 16 if D <= 64 else 8
        for T in [int(x) for x in args.seq_lens.split(",")]:
            B = max(1, args.tokens // T)
            for gate in [bool(int(x)) for x in args.gates.split(",")]:
                t0 = time.time()
                q, k, v, w, beta, g = make_inputs(B, T, H, H, D, D, gate, device="cuda", seed=0)
                scale = D ** -0.5
                row: dict = dict(D=D, T=T, B=B, H=H, gate=gate)
                sdpa = sdpa_callable(q, k, v, "flash")
                row["sdpa_flash"] = bench(sdpa) if sdpa else None
                fla = None if args.no_fla else fla_path_callable(q, k, v, w, beta, g)
                row["fla"] = bench(fla) if fla else None
                # the forward's params class (TritonFwdParams: its own knobs too, e.g. gate_bias for --variants)
                if args.config == "auto":
                    backend = "auto"
                    base = resolve("triton", "fwd", None, (D, D))
                    # the config the public call runs (what the dispatcher picks): kernel_flops counts its work
                    plan = get_dispatcher().plan(q.device, D, D, H, H, "bfloat16", gate, T, B, False)
                    row["config"] = json.loads(plan.params_json)
                    row["dispatch"] = plan.describe()
                elif args.config == "heuristic":
                    backend, base = "triton", resolve("triton", "fwd", None, (D, D))
                else:
                    backend, base = "triton", resolve("triton", "fwd", json.loads(args.config), (D, D))
                if "config" not in row:
                    row["config"] = json.loads(base.to_json())

                def api():
                    return pathtune.path_attention(q, k, v, w, beta, g, scale=scale, backend=backend)

                with torch.no_grad():
                    row["api"] = bench(api)
                    row["api_host_ms"] = host_ms(api)
                    # the same call replayed from a CUDA graph: device time with no host work between
                    # launches; api / graph > 1 is what the host adds to a call
                    row["graph"] = bench(graph_of(api))
                    row["candidates"] = []
                    for file, kernels in candidates:   # the same call with the candidate's kernels patched in
                        cand = dict(file=os.path.basename(file), kernels=sorted(kernels))
                        try:
                            with contextlib.ExitStack() as stack:
                                for name, kernel in kernels.items():
                                    stack.enter_context(swapped(fwd_mod, name, kernel))
                                cand["api"] = bench(api)
                                cand["api_host_ms"] = host_ms(api)
                                cand["graph"] = bench(graph_of(api))
                            cand["api/shipped"] = round(cand["api"] / row["api"], 3)
                            cand["graph/shipped"] = round(cand["graph"] / row["graph"], 3)
                        except Exception as exc:   # a candidate that fails to build or launch is a result too
                            cand["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                        row["candidates"].append(cand)
                    n = min(T, 2048)
                    small = [x[:1, :n] if x is not None else None for x in (q, k, v, w, beta, g)]
                    ref = naive_path_attention(*[x[:, :, :2].double() if x is not None else None for x in small],
                                               scale=scale)
                    ref = ref[0] if isinstance(ref, tuple) else ref

                    def o_err(p) -> float:
                        o = path_attention_fwd(*small, scale=scale, cu_seqlens=None, params=p)[0][:, :, :2]
                        return ((o.double() - ref).norm() / ref.norm()).item()

                    def launcher(p):
                        return lambda: path_attention_fwd(q, k, v, w, beta, g, scale=scale, cu_seqlens=None,
                                                          params=p)

                    row["launcher"] = bench(launcher(base))
                    row["o_err"] = o_err(base)
                    row["variants"] = []
                    for change in variants:
                        try:
                            p = dataclasses.replace(base, **change)
                            ms = bench(launcher(p))
                            prof = kernel_profile(launcher(p)) if not args.no_profile else {}
                            row["variants"].append(dict(change=change, ms=round(ms, 4), o_err=o_err(p),
                                                        kernels=prof.get("kernels", [])[:8]))
                        except Exception as exc:  # a variant that does not compile / fit
                            row["variants"].append(dict(change=change, error=f"{type(exc).__name__}: {str(exc)[:160]}"))
                    if not args.no_profile:
                        row["profile"] = kernel_profile(api)
                row["api/graph"] = round(row["api"] / row["graph"], 3)
                for key in ("api", "launcher"):
                    if row.get("sdpa_flash"):
                        row[f"{key}/sdpa"] = round(row[key] / row["sdpa_flash"], 3)
                    if row.get("fla"):
                        row[f"fla/{key}"] = round(row["fla"] / row[key], 3)
                row["secs"] = round(time.time() - t0, 1)
                emit(row)


if __name__ == "__main__":
    main()
