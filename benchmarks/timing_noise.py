"""Does one fwd+bwd's time depend on the trial?  The public call, repeated in trials of fresh allocations.

    python benchmarks/timing_noise.py [--cells 64:2048:0,64:2048:1,64:4096:0,128:4096:0] [--trials 6]
                                      [--oracle] [--kernels] [--host [--host-stacks]]
                                      [--gc on|off|alternate]

Tune trials of one config can differ by up to ~20 % at D64 while each trial's p20-p80 stays within 1 % (the time
moves between trials, not inside one; benchmarks/NOTES.md, Records).  This times ``pathtune.path_attention``
(``backend="auto"``, what the records serve; set ``PATHTUNE_DB_URL=`` for the shipped records alone) forward +
backward at B * T = 32768 in ``--trials`` trials per cell (D:T:gate), each one as the tuner's trial is made:

* a pad tensor of a random size (0-64 MiB, random 512-byte offset) allocated first, so that the trial's inputs
  and the call's buffers land at other addresses than the trial before's;
* fresh inputs of the same seed (the same values every trial, as the tuner's);
* with ``--gc off`` (or ``alternate``: every other trial) the cyclic garbage collector is off inside the timed
  loop, as ``timeit`` times;
* with ``--oracle``, every other trial runs the tuner's accuracy gate first (the float64 naive reference,
  forward and backward, of two kv heads at T 2048), the rest do not;
* ``triton.testing.do_bench`` p20 / median / p80 (warmup 25, rep 100: the tuner's), nvidia-smi's SM clock, power,
  temperature and active throttle reasons just before and after it, then with ``--kernels``
  the device ms per kernel of one profiled call, to tell which kernel moves; with ``--host`` the host's ms per
  call with the GPU kept busy ahead of it, and the CPU operators and driver calls it spends them in.

Rows (JSON lines, and $OUT/timing_noise.json as it goes): one per trial, then one per cell with the spread
(max / min of the medians).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import sys
import time

import torch
import triton
from dev_gpu_run2 import kernel_times  # benchmarks/ is on sys.path when run as a script

from pathtune import path_attention
from pathtune.tuning.bench import make_inputs

OUT = os.environ.get("OUT", "/tmp")
ROWS: list[dict] = []
TOKENS = 32768


def emit(row: dict) -> None:
    print(json.dumps(row), flush=True)
    ROWS.append(row)
    with open(os.path.join(OUT, "timing_noise.json"), "w") as f:
        json.dump(ROWS, f, indent=1)


def parse_cells(text: str) -> list[tuple[int, int, bool]]:
    """``D:T:gate`` items (gate 0 / 1), comma-separated."""
    cells = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        parts = item.split(":")
        if len(parts) != 3 or not all(p.isdigit() for p in parts) or parts[2] not in ("0", "1"):
            raise SystemExit(f"--cells: {item!r} is not D:T:gate (e.g. 64:2048:0)")
        cells.append((int(parts[0]), int(parts[1]), parts[2] == "1"))
    return cells


def heads_for(D: int) -> int:
    """The bench's heads: 16 at D <= 64, 8 above."""
    return 16 if D <= 64 else 8


def fwd_bwd(D: int, T: int, gate: bool, seed: int = 7):
    """One fwd+bwd of the public call at (D, T, gate), B * T = 32768, on fresh inputs of ``seed``."""
    H = heads_for(D)
    xs = make_inputs(TOKENS // T, T, H, H, D, D, gate, device="cuda", seed=seed, dtype=torch.bfloat16)
    live = [x.detach().requires_grad_(True) if x is not None else None for x in xs]
    leaves = [x for x in live if x is not None]
    do = torch.randn_like(xs[0])

    def fn():
        o = path_attention(*live, backend="auto")
        return torch.autograd.grad(o, leaves, do)
    return fn


def accuracy_gate(D: int, gate: bool) -> None:
    """What the tuner runs before it times: the float64 oracle, forward and backward, two kv heads at T 2048."""
    from pathtune.tuning.measure import oracle_by_kv_head

    H = heads_for(D)
    xs = list(make_inputs(1, 2048, H, H, D, D, gate, device="cuda", seed=3, dtype=torch.bfloat16))
    do = torch.randn_like(xs[0])
    oracle_by_kv_head(xs, [0, H - 1], do)
    torch.cuda.synchronize()


def gpu_state() -> dict:
    """SM clock (MHz), power (W), temperature (C) and active throttle reasons of the first GPU nvidia-smi lists
    ({} without nvidia-smi): run with one visible GPU."""
    import subprocess

    query = "clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active"
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout.strip().splitlines()[0].split(", ")
        return dict(sm_mhz=out[0], watts=out[1], temp_c=out[2], throttle=out[3])
    except (OSError, IndexError, subprocess.SubprocessError):
        return {}


def host_ms(fn, calls: int = 4) -> float:
    """Host ms per call of fn with the GPU kept busy ahead of it (a sleep kernel queued first), so that no call
    waits for the device: what the host alone spends on a call (launches, Python, autograd, allocations)."""
    torch.cuda.synchronize()
    torch.cuda._sleep(int(3e9))          # ~1.5 s of GPU time at 1.98 GHz: longer than the calls' host time
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    out = (time.perf_counter() - t0) / calls * 1e3
    torch.cuda.synchronize()
    return round(out, 3)


def host_ops(fn, stacks: bool = False) -> dict:
    """Where one call's host time goes (the GPU kept busy ahead of it): the CPU operators and driver calls with the
    most self time, and the launches' count and total; with ``stacks`` also the Python frames (five innermost)
    under which the most self time was spent."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    torch.cuda._sleep(int(3e9))
    with profile(activities=[ProfilerActivity.CPU], with_stack=stacks) as p:
        fn()
    torch.cuda.synchronize()
    ev = p.key_averages()
    launches = [e for e in ev if "LaunchKernel" in e.key]
    top = sorted(ev, key=lambda e: -e.self_cpu_time_total)[:14]
    out = dict(launch_calls=sum(e.count for e in launches),
               launch_ms=round(sum(e.self_cpu_time_total for e in launches) / 1000, 3),
               top_self_ms=[(e.key[:48], round(e.self_cpu_time_total / 1000, 3), e.count) for e in top])
    if stacks:
        by_stack = sorted(p.key_averages(group_by_stack_n=5), key=lambda e: -e.self_cpu_time_total)[:25]
        out["top_stacks"] = [(e.key[:48], round(e.self_cpu_time_total / 1000, 3), e.count, list(e.stack)[:5])
                             for e in by_stack]
    return out


def trial(D: int, T: int, gate: bool, index: int, oracle: bool, kernels: bool, rng: random.Random,
          host: bool = False, stacks: bool = False, gc_off: bool = False) -> dict:
    pad_bytes = rng.randrange(0, 64 << 20, 512)
    pad = torch.empty(max(pad_bytes, 512), dtype=torch.uint8, device="cuda")
    if oracle:
        accuracy_gate(D, gate)
    fn = fwd_bwd(D, T, gate)
    fn()
    torch.cuda.synchronize()
    before = gpu_state()
    if gc_off:            # as timeit times: no cyclic garbage collection inside the timed loop
        gc.collect()
        gc.disable()
    try:
        p20, med, p80 = triton.testing.do_bench(fn, warmup=25, rep=100, quantiles=[0.2, 0.5, 0.8])
    finally:
        gc.enable()
    row = dict(kind="trial", D=D, T=T, gate=gate, trial=index, after_oracle=oracle, gc_off=gc_off,
               pad_bytes=pad_bytes, ms=round(med, 4), p20=round(p20, 4), p80=round(p80, 4), gpu_before=before,
               gpu_after=gpu_state())
    if kernels:
        row["kernels"] = kernel_times(fn, warm=0, top=16)
    if host:
        row["host_ms"] = host_ms(fn)
        row["host_ops"] = host_ops(fn, stacks)
    del fn, pad
    torch.cuda.empty_cache()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cells", default="64:2048:0,64:2048:1,64:4096:0,128:4096:0")
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--oracle", action="store_true", help="every other trial runs the tuner's accuracy gate first")
    ap.add_argument("--kernels", action="store_true", help="per-kernel device ms of one profiled call per trial")
    ap.add_argument("--host", action="store_true",
                    help="host ms per call with the GPU busy ahead of it, and where it goes (CPU profile)")
    ap.add_argument("--host-stacks", action="store_true",
                    help="with --host: also the Python frames of the host time (each cell's first trial)")
    ap.add_argument("--gc", choices=("on", "off", "alternate"), default="on",
                    help="Python's garbage collector inside the timed loop: on (as users run), off (as timeit times), "
                         "or off in every other trial")
    ap.add_argument("--seed", type=int, default=0, help="seed of the pads' sizes")
    a = ap.parse_args()
    if a.trials < 2:
        raise SystemExit("--trials: at least 2 (a spread needs two trials)")
    cells = parse_cells(a.cells)
    if not torch.cuda.is_available():
        raise SystemExit("timing_noise.py times GPU calls: no CUDA device here")
    rng = random.Random(a.seed)
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    for D, T, gate in cells:
        rows = []
        for i in range(a.trials):
            row = trial(D, T, gate, i, a.oracle and i % 2 == 1, a.kernels, rng, a.host, a.host_stacks and i == 0,
                        a.gc == "off" or (a.gc == "alternate" and i % 2 == 1))
            emit(row)
            rows.append(row)
        meds = [r["ms"] for r in rows]
        emit(dict(kind="cell", D=D, T=T, gate=gate, trials=len(rows), min_ms=min(meds), max_ms=max(meds),
                  median_ms=round(statistics.median(meds), 4), spread=round(max(meds) / min(meds), 4)))


if __name__ == "__main__":
    sys.exit(main())
