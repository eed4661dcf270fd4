"""`pathtune bench`: time pathtune's kernels against SDPA (flash, cuDNN) and fla in one run.

For each (head dim, sequence length, gate) it builds fresh random inputs (bf16 q/k/v, fp32
unit-norm w, beta ~ U(1.5, 2), FoX gate log U(0.95, 1)), checks the output against the float64
oracle on a short prefix (so a wrong config never gets a time), then takes
``triton.testing.do_bench`` medians of the forward and of forward+backward for pathtune and every
available baseline, all in the same process.  With ``rounds`` > 1 every callable of a row is timed once
per round, the rounds interleaved (pathtune, SDPA, fla, then again), and the row keeps the median over
rounds (``BenchRow.rounds`` has each round's): a transient slowdown of the GPU during one callable's
timing moves one sample of it, not the row's ratios.  With ``memory`` each forward+backward callable then
runs once more alone for its extra peak memory (``BenchRow.memory_gib``: ``torch.cuda.max_memory_allocated``
during the call minus ``memory_allocated`` before it, inputs and upstream gradient already allocated: the
outputs, what autograd saves, the backward's buffers and the returned gradients).  Rows go to a table, a JSON
file and, optionally, perf_db (pass ``fwd`` = forward time, pass ``bwd`` = forward+backward time; baseline = SDPA flash
of the same pass and shapes).

``backends`` adds the TVM forward (``tvm``, from prebuilt module sets: tuning/tvm_bench.py), timed
after every row's Triton and baseline times (so a TVM kernel that breaks the CUDA context costs only
TVM rows), with its own accuracy gate, per-kernel do_bench times (``tvm_stages``) and, last, both
forwards' per-kernel device times from the profiler (``tvm_profile``, ``triton_stages``).
"""
from __future__ import annotations

import contextlib
import json
import shlex
import statistics
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional

import torch

from .inputs import HEADS_FOR_DIM, TOKENS, make_inputs

__all__ = ["BenchRow", "run_bench", "record_rows", "format_table", "command_line", "make_inputs", "HEADS_FOR_DIM",
           "TOKENS", "BACKENDS"]


@dataclass
class BenchRow:
    head_dim: int
    seq_len: int
    batch: int
    heads: int
    gate: bool
    times: dict[str, Optional[float]] = field(default_factory=dict)
    errors: dict[str, float] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)
    configs: dict[str, dict] = field(default_factory=dict)      # "f"/"fb" -> knobs run (config="tuned")
    dispatch: dict[str, str] = field(default_factory=dict)      # "f"/"fb" -> where the runtime found them
    statuses: dict[str, str] = field(default_factory=dict)      # "tvm" -> perf_db status of its forward
    tvm_stages: dict[str, float] = field(default_factory=dict)  # TVM kernel (ut, transport, scan, host) -> ms
    tvm_profile: dict[str, Any] = field(default_factory=dict)    # TVM forward kernel -> device ms (profiler)
    triton_stages: dict[str, Any] = field(default_factory=dict)  # Triton forward kernel -> device ms (profiler)
    ratios: dict[str, float] = field(default_factory=dict)      # "tvm_f/pathtune_f", "tvm_f/sdpa_flash_f"
    rounds: dict[str, list[float]] = field(default_factory=dict)  # times key -> each round's do_bench median
    memory_gib: dict[str, float] = field(default_factory=dict)  # "<callable>_fb" -> extra peak GiB of one call

    def ratio(self, num: str, den: str) -> Optional[float]:
        a, b = self.times.get(num), self.times.get(den)
        return a / b if a and b else None


def _median_ms(fn: Callable[[], Any]) -> float:
    import triton

    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


# timing rounds per point of `pathtune bench` (run_bench's own default stays one)
CLI_ROUNDS = 3


def bench_method(rounds: int) -> str:
    """How a bench time was taken (perf_db's ``bench_method``)."""
    one = "triton.testing.do_bench median"
    return one if rounds == 1 else f"median of {rounds} interleaved rounds of {one}s"


def _failure(exc: Exception) -> str:
    """How a row records a callable that raised: its exception type and the start of its message."""
    return f"{type(exc).__name__}: {str(exc)[:300]}"


def _time_rounds(row: "BenchRow", timed: dict[str, tuple[Callable[[], Any], Callable[[], Any], str]],
                 rounds: int) -> None:
    """Time each callable of ``timed`` (times key -> (fn, context factory, failure key)) once per round, in
    order, for ``rounds`` rounds; ``row.times[key]`` = the median over rounds, ``row.rounds[key]`` = each
    round's.  A callable that raises is recorded in ``row.failures`` under its failure key (the first
    error of that key) and not timed again; it gets no time, the other callables keep theirs."""
    samples: dict[str, list[float]] = {key: [] for key in timed}
    broken: set[str] = set()
    for _ in range(rounds):
        for key, (fn, context, failure_key) in timed.items():
            if key in broken:
                continue
            try:
                with context():
                    samples[key].append(_median_ms(fn))
            except Exception as exc:
                broken.add(key)
                row.failures.setdefault(failure_key, _failure(exc))
    for key, got in samples.items():
        if got and key not in broken:
            row.times[key] = statistics.median(got)
            row.rounds[key] = got


def extra_peak_gib(fn: Callable[[], Any], context=contextlib.nullcontext, mem=None) -> float:
    """GiB one call of ``fn`` (under ``context()``) allocates above what was allocated before it, at its
    peak (``mem``: the torch.cuda memory API, replaceable in tests).  The call runs after a synchronize, with
    the peak statistics reset; its outputs are not kept."""
    mem = torch.cuda if mem is None else mem
    mem.synchronize()
    mem.reset_peak_memory_stats()
    base = mem.memory_allocated()
    with context():
        fn()
    mem.synchronize()
    return (mem.max_memory_allocated() - base) / 2 ** 30


def _measure_memory(row: "BenchRow", timed: dict, mem=None) -> None:
    """``row.memory_gib`` for every forward+backward callable of ``timed`` that was timed (one call each)."""
    for key, (fn, context, failure_key) in timed.items():
        if not key.endswith("_fb") or key not in row.times:
            continue
        try:
            row.memory_gib[key] = extra_peak_gib(fn, context, mem)
        except Exception as exc:
            row.failures.setdefault(failure_key, _failure(exc))


def _pathtune_callable(q, k, v, w, beta, g, config, backward: bool):
    """One pathtune call (with ``backward``, forward + ``autograd.grad``).  ``config="tuned"``: the public
    ``pathtune.path_attention(backend="auto")``, host work and dispatch included, as a user calls it; any other
    config: ``path_attention_triton`` at that config (a study of the kernels at given knobs)."""
    from pathtune.codegen.triton import path_attention_triton
    from pathtune.runtime.api import path_attention

    xs = [x.detach().requires_grad_(backward) for x in (q, k, v, w, beta)]
    gg = None if g is None else g.detach().requires_grad_(backward)
    do = torch.randn_like(q[..., : v.shape[-1]])

    def call():
        if config == "tuned":
            return path_attention(*xs, gg, backend="auto")
        return path_attention_triton(*xs, gg, config=config)[0]

    def run():
        o = call()
        if backward:
            torch.autograd.grad(o, xs + ([gg] if gg is not None else []), do)
        return o

    return run


def _accuracy(q, k, v, w, beta, g, config, check_len: int = 1024, backward: bool = False) -> dict[str, float]:
    """Relative errors vs the float64 oracle on batch 0's first tokens: ``check_len``, or two
    super-chunks of the config when the row spans several (so the inter-super-chunk kernels are
    checked), on the first and last kv heads (the tuner's gate: ``measure.gate_tokens``).
    ``o`` only, or with ``backward`` o and every gradient (dq, dk, dv, dw, dbeta, dg)."""
    from pathtune.codegen.triton import path_attention_triton

    from .measure import gate_tokens, oracle_errors, oracle_kv_heads, triton_params

    params = triton_params(config or {}, q.shape[-1], v.shape[-1], "bwd" if backward else "fwd")
    n = min(q.shape[1], gate_tokens(params.superchunk_size, q.shape[1], check_len))
    sl = (slice(0, 1), slice(0, n))
    args = [x[sl] for x in (q, k, v, w, beta)] + [None if g is None else g[sl]]
    return oracle_errors(lambda *xs: path_attention_triton(*xs, config=config)[0], args, backward=backward,
                         heads=oracle_kv_heads(k.shape[2], 2), seed=1)


def _tuned(row: BenchRow, device: torch.device, backward: bool) -> dict:
    """The Triton params the runtime's dispatch (perf_db, shipped records, pack, heuristic) picks
    for this row's shape: what ``pathtune.path_attention(backend="auto")`` would run."""
    from pathtune.runtime.dispatch import get_dispatcher

    plan = get_dispatcher().plan(device, row.head_dim, row.head_dim, row.heads, row.heads, "bfloat16", row.gate,
                                 row.seq_len, row.batch, False, grad=backward)
    row.dispatch["fb" if backward else "f"] = plan.describe()
    return json.loads(plan.bwd_params_json if backward else plan.params_json)


BACKENDS = ("triton", "tvm")


def run_bench(head_dims=(64, 128), seq_lens=(4096, 16384), gates=(False, True), *, tokens: int = TOKENS,
              config=None, baselines=("sdpa", "fla"), backward: bool = True, device: str = "cuda",
              seed: int = 0, backends=("triton",), tvm_modules=None, rounds: int = 1, memory: bool = False,
              log: Callable[[str], None] = print,
              on_row: Optional[Callable[[BenchRow], None]] = None) -> list[BenchRow]:
    """Measure every (D, T, gate) point; see the module docstring. ``tvm_modules``: the folder of
    TVM module sets (or an opened ``tvm_bench.TVMBenchModules``), needed when ``backends`` has tvm.
    ``rounds``: interleaved timing rounds per row (the median kept; the TVM column is timed once).
    ``memory``: the extra peak memory of each forward+backward callable (needs ``backward``).
    ``on_row``: called with each row as soon as it is measured (so an interrupted bench keeps what it
    measured); not with the TVM backend, whose column is timed after every row."""
    from .baselines import fla_path_callable, keep_triton_toolchain, sdpa_callable

    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be an integer >= 1, got {rounds!r}")
    if memory and not backward:
        raise ValueError("memory measures forward+backward calls: run with backward=True")
    unknown = [b for b in backends if b not in BACKENDS]
    if unknown:
        raise ValueError(f"unknown backends {unknown}: choose from {', '.join(BACKENDS)}")
    tvm = _open_tvm(tvm_modules, head_dims, gates, device) if "tvm" in backends else None
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("pathtune bench needs a CUDA GPU (torch.cuda.is_available() is False)")
    rows = []
    gates = tuple(sorted(set(gates)))    # ungated first: a gated row takes its SDPA times from it
    for D in head_dims:
        H = HEADS_FOR_DIM.get(D, max(1, 1024 // D))
        for T in seq_lens:
            B = max(1, tokens // T)
            for gate in gates:
                row = BenchRow(D, T, B, H, gate)
                q, k, v, w, beta, g = make_inputs(B, T, H, H, D, D, gate, device=device, seed=seed)
                passes = [("f", False)] + ([("fb", True)] if backward else [])
                timed = _triton_row(row, (q, k, v, w, beta, g), config, passes) if "triton" in backends else {}
                for tag, bw in passes:
                    # SDPA has no gate: once per shape, on the ungated row unless only gated rows run
                    if "sdpa" in baselines and (not gate or False not in gates):
                        for kind in ("flash", "cudnn"):
                            fn = sdpa_callable(q, k, v, kind, backward=bw)
                            if fn is None:
                                row.times[f"sdpa_{kind}_{tag}"] = None
                            else:
                                timed[f"sdpa_{kind}_{tag}"] = (fn, contextlib.nullcontext, f"sdpa_{kind}_{tag}")
                    if "fla" in baselines:
                        with keep_triton_toolchain():
                            fn = fla_path_callable(q, k, v, w, beta, g, backward=bw)
                        if fn is None:
                            row.times[f"fla_{tag}"] = None
                        else:
                            timed[f"fla_{tag}"] = (fn, keep_triton_toolchain, f"fla_{tag}")
                _time_rounds(row, timed, rounds)
                if memory:
                    _measure_memory(row, timed)
                # SDPA has no gate: a gated row compares against the ungated SDPA of the same shape (measured first)
                if gate:
                    twin = next((r for r in rows if not r.gate and (r.head_dim, r.seq_len) == (D, T)), None)
                    for mine, theirs in ((row.times, twin.times), (row.memory_gib, twin.memory_gib)) if twin else ():
                        for key, val in theirs.items():
                            if key.startswith("sdpa_"):
                                mine.setdefault(key, val)
                rows.append(row)
                log(json.dumps(asdict(row)))
                if on_row is not None and tvm is None:
                    on_row(row)
    if tvm is not None:
        _tvm_column(rows, tvm, config, backends, device, seed, log)
    return rows


def _triton_row(row: BenchRow, xs: tuple, config, passes: list) -> dict:
    """pathtune-Triton's accuracy of one row and its callables to time ({times key: (fn, context, failure
    key)}); a failing config is a recorded status (``row.failures["pathtune"]``), not a crash."""
    try:
        cfgs = {tag: config for tag, _ in passes}
        if config == "tuned":
            cfgs = row.configs = {tag: _tuned(row, xs[0].device, bw) for tag, bw in passes}
        row.errors.update(_accuracy(*xs, cfgs["f"]))
        if "fb" in cfgs:   # the gradients of what fwd+bwd runs (its own config when tuned)
            row.errors.update({name: err for name, err in _accuracy(*xs, cfgs["fb"], backward=True).items()
                               if name != "o"})
        return {f"pathtune_{tag}": (_pathtune_callable(*xs, config, bw), contextlib.nullcontext, "pathtune")
                for tag, bw in passes}
    except Exception as exc:
        row.failures["pathtune"] = _failure(exc)
        return {}


def _open_tvm(tvm_modules, head_dims, gates, device):
    """The TVM module sets, checked before any GPU work (TVMBenchError says what to build or install)."""
    from .tvm_bench import TVMBenchError, TVMBenchModules

    if tvm_modules is None:
        raise TVMBenchError("--backends tvm needs --tvm-modules FOLDER: module sets built on a host with apache-tvm "
                            "(pathtune bench-build-tvm --head-dim 64,128 --out build/tvm_bench)")
    mods = tvm_modules if hasattr(tvm_modules, "load") else TVMBenchModules.open(tvm_modules)
    mods.require(head_dims, gates, torch.device(device))
    return mods


def _tvm_column(rows: list[BenchRow], tvm, config, backends, device: str, seed: int, log) -> None:
    """Every row's TVM forward (tvm_bench.measure_row) on the row's inputs, after all other timings; then,
    on CUDA, both forwards' per-kernel device times (tvm_bench.profile_row: the profiler comes last)."""
    from .tvm_bench import measure_row, profile_row

    def inputs(row):
        return make_inputs(row.batch, row.seq_len, row.heads, row.heads, row.head_dim, row.head_dim, row.gate,
                           device=device, seed=seed)

    for row in rows:
        measure_row(row, inputs(row), tvm, timer=_median_ms)
        for num, den in (("tvm_f", "pathtune_f"), ("tvm_f", "sdpa_flash_f")):
            if row.ratio(num, den) is not None:
                row.ratios[f"{num}/{den}"] = row.ratio(num, den)
        log(json.dumps(dict(tvm=True, head_dim=row.head_dim, seq_len=row.seq_len, gate=row.gate,
                            ms=row.times.get("tvm_f"), o_err=row.errors.get("tvm_o"), stages=row.tvm_stages,
                            ratios=row.ratios, failure=row.failures.get("tvm"))))
        if device == "cuda":
            torch.cuda.empty_cache()
    if device != "cuda":
        return
    for row in rows:
        xs = inputs(row)
        triton_fn = None
        if "triton" in backends and "pathtune" not in row.failures:
            triton_fn = _pathtune_callable(*xs, row.configs.get("f", config), False)
        profile_row(row, xs, tvm, triton_fn)
        log(json.dumps(dict(profile=True, head_dim=row.head_dim, seq_len=row.seq_len, gate=row.gate,
                            tvm=row.tvm_profile, triton=row.triton_stages)))
        del xs, triton_fn
        torch.cuda.empty_cache()


def record_rows(rows: list[BenchRow], db_url: Optional[str], config, command: str,
                run_id: Optional[str] = None) -> int:
    """Store pathtune's times in perf_db with SDPA flash of the same run as the baseline; the TVM forward
    (backend "tvm", keyed like the tuner's TVM records: the spec fwd Config its modules were built with and
    the TVM source hash, which ``tvm_bench`` checked the modules against).  ``run_id``: add to that run
    (started if new) instead of a fresh one (a bench recording row by row)."""
    from pathtune.codegen._knobs import resolve
    from pathtune.codegen.triton import source_hash
    from pathtune.fingerprint import collect_env
    from pathtune.perf_db import KernelKey, Measurement, PerfDB
    from pathtune.runtime.dispatch import pass_config
    from pathtune.specs import Workload, load_spec

    from .measure import over_tolerance

    spec = load_spec()
    tolerances = dict(spec.numerics.accuracy.tolerances)
    env = collect_env()
    n = 0
    with PerfDB(db_url) as db:
        run_id = db.start_run(command=command, notes="pathtune bench", run_id=run_id)
        for row in rows:
            for tag, pass_ in (("f", "fwd"), ("fb", "bwd")):
                used = row.configs.get(tag, config)
                if used == "tuned":    # dispatch failed before it named a config: nothing to key a row by
                    continue
                params = resolve("triton", pass_, used, (row.head_dim, row.head_dim))   # as the bench ran it
                cfg = pass_config(pass_, params)     # the pass's knobs only, as the tuner records them
                t = row.times.get(f"pathtune_{tag}")
                failed = row.failures.get("pathtune")
                if t is None and not failed:
                    continue
                wl = Workload(head_dim=row.head_dim, head_dim_v=row.head_dim, heads_q=row.heads,
                              heads_kv=row.heads, dtype="bfloat16", use_gate=row.gate, pass_=pass_,
                              seq_bucket=row.seq_len, batch_bucket=row.batch)
                kernel = KernelKey(pass_=pass_, backend="triton", spec_hash=spec.pass_hash(pass_),
                                   source_hash=source_hash(pass_))
                own = {k: e for k, e in row.errors.items() if not k.startswith("tvm_")}   # tvm_o: _record_tvm
                # the tuner's gate: a row over the spec's tolerances is recorded "wrong", never served
                over = over_tolerance({k: e for k, e in own.items() if tag == "fb" or k == "o"}, tolerances)
                if t is not None and over:
                    meas = Measurement(status="wrong", errors=own, message="; ".join(over), command=command)
                elif t is not None:
                    meas = Measurement(status="ok", median_ms=t,
                                       bench_method=bench_method(len(row.rounds.get(f"pathtune_{tag}", ())) or 1),
                                       errors=own, baseline_ms=row.times.get(f"sdpa_flash_{tag}"),
                                       baseline_name="sdpa_flash", command=command)
                else:
                    meas = Measurement(status="crash", message=failed, command=command)
                db.record(env, kernel, wl, cfg, meas, run_id=run_id, on_conflict="skip")
                n += 1
            if _record_tvm(db, env, spec, row, command, run_id):
                n += 1
    return n


def _record_tvm(db, env, spec, row: BenchRow, command: str, run_id) -> bool:
    """One TVM forward measurement of a row (ok with its time, or its failure status); False if none ran."""
    from pathtune.codegen.tvm.build import source_hash
    from pathtune.perf_db import KernelKey, Measurement
    from pathtune.specs import Config, Workload

    status, cfg = row.statuses.get("tvm"), row.configs.get("tvm")
    if status is None or cfg is None:
        return False
    wl = Workload(head_dim=row.head_dim, head_dim_v=row.head_dim, heads_q=row.heads, heads_kv=row.heads,
                  dtype="bfloat16", use_gate=row.gate, pass_="fwd", seq_bucket=row.seq_len, batch_bucket=row.batch)
    kernel = KernelKey(pass_="fwd", backend="tvm", spec_hash=spec.pass_hash("fwd"), source_hash=source_hash())
    errors = {"o": row.errors["tvm_o"]} if "tvm_o" in row.errors else None
    if status == "ok":
        meas = Measurement(status="ok", median_ms=row.times["tvm_f"], bench_method="triton.testing.do_bench median",
                           errors=errors, baseline_ms=row.times.get("sdpa_flash_f"), baseline_name="sdpa_flash",
                           command=command)
    else:
        meas = Measurement(status=status, errors=errors, message=row.failures.get("tvm"), command=command)
    db.record(env, kernel, wl, Config(cfg), meas, run_id=run_id, on_conflict="skip")
    return True


def format_table(rows: list[BenchRow]):
    from rich.table import Table

    table = Table(title="PaTH attention, ms (do_bench median); ratios vs SDPA flash and fla of this run")
    tvm = any("tvm" in r.statuses for r in rows)
    mem = any(r.memory_gib for r in rows)
    cols = ["D", "T", "BxH", "gate", "sdpa flash f", "fla f", "pathtune f", "/flash", "fla/ours",
            "sdpa flash f+b", "fla f+b", "pathtune f+b", "/flash", "fla/ours", "o err", "max grad err"]
    mem_keys = ("pathtune_fb", "sdpa_flash_fb", "fla_fb")
    for col in cols + (["extra GiB ours", "flash", "fla"] if mem else []) + (["tvm f", "tvm/ours", "tvm o err"]
                                                                              if tvm else []):
        table.add_column(col, justify="right")

    def f(x):
        return "-" if x is None else f"{x:.2f}"
    for r in rows:
        extra = [("-" if key not in r.memory_gib else f"{r.memory_gib[key]:.2f}") for key in mem_keys] if mem else []
        if tvm:   # a failed TVM row says so (the reason is in the JSON's failures)
            extra += [f(r.times.get("tvm_f")) if "tvm" not in r.failures else r.statuses.get("tvm", "failed"),
                     f(r.ratio("tvm_f", "pathtune_f")),
                     "-" if "tvm_o" not in r.errors else f"{r.errors['tvm_o']:.1e}"]
        table.add_row(str(r.head_dim), str(r.seq_len), f"{r.batch}x{r.heads}", "FoX" if r.gate else "-",
                      f(r.times.get("sdpa_flash_f")), f(r.times.get("fla_f")), f(r.times.get("pathtune_f")),
                      f(r.ratio("pathtune_f", "sdpa_flash_f")), f(r.ratio("fla_f", "pathtune_f")),
                      f(r.times.get("sdpa_flash_fb")), f(r.times.get("fla_fb")), f(r.times.get("pathtune_fb")),
                      f(r.ratio("pathtune_fb", "sdpa_flash_fb")), f(r.ratio("fla_fb", "pathtune_fb")),
                      "-" if "o" not in r.errors else f"{r.errors['o']:.1e}",
                      _max_grad_error(r.errors), *extra)
    return table


def _max_grad_error(errors: dict[str, float]) -> str:
    worst = max((e for name, e in errors.items() if name.startswith("d")), default=None)
    return "-" if worst is None else f"{worst:.1e}"


def command_line() -> str:
    return " ".join(shlex.quote(a) for a in ["pathtune", *sys.argv[1:]])
