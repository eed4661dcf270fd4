"""Train and evaluate PaTH, RoPE and PaTH-FoX on flip-flop language modelling in one command.

    python -m examples.flipflop --device cuda            # all three models, <= 14 min on one H200
    python -m examples.flipflop --tiny                   # CPU smoke run (reference backend), < 1 min
    python -m examples.flipflop --plot-from examples/flipflop/results.json   # plot only

Writes ``results.json`` after every phase (a crash in one model keeps the others) and a plot of the
training curves (matplotlib when importable; else use ``--plot-from`` on a machine that has it).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import shlex
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Optional

T_START = time.perf_counter()

if __name__ == "__main__" and not __package__:      # `python examples/flipflop/run.py ...`
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from examples.flipflop.run import main as _main
    sys.exit(_main())

import torch  # noqa: E402

from .data import SPLITS, expected_reads  # noqa: E402
from .metrics import reads_to_resolve  # noqa: E402
from .model import ATTENTIONS, FlipFlopLM, count_parameters, fla_available  # noqa: E402
from .train import (TrainConfig, evaluate, is_cuda_fault, measure_throughput_in_child,  # noqa: E402
                    tail_lines, train_model)

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results.json"
TINY_OUT = Path("/tmp/flipflop_tiny/results.json")
PAPER = {"path": ("0%", "0.0001%", "0%"), "rope": ("6.9%", "40.3%", "0.01%"), "path_fox": ("-", "-", "-")}
LABEL = {"path": "PaTH", "rope": "RoPE", "path_fox": "PaTH-FoX"}
EVAL_SPLITS = ("id", "sparse", "dense")
# share of a model's evaluation time per split (sparse holds most of the sequences)
EVAL_TIME_SHARE = {"id": 0.2, "sparse": 0.65, "dense": 0.15}


# ------------------------------------------------------------------------------------------ output

def write_json(obj: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def _first_line(text: str) -> str:
    return (text or "").strip().splitlines()[0] if (text or "").strip() else ""


def _pct(x: Optional[float]) -> str:
    if x is None:
        return "-"
    if x == 0:
        return "0%"
    return f"{100 * x:.2g}%" if x < 1e-3 else f"{100 * x:.3g}%"


def markdown_table(results: dict) -> str:
    """The README table: ours (with 95% Wilson upper bounds and read counts) beside the paper's."""
    rows = ["| model | ID FFL(0.8) | sparse FFL(0.98) | dense FFL(0.1) | paper (ID / sparse / dense) | steps | train tokens/s |",
            "|---|---|---|---|---|---|---|"]
    for name in ATTENTIONS:
        r = results.get(name)
        if not r or r.get("status") != "ok":
            continue
        cells = []
        for s in EVAL_SPLITS:
            ev = r["eval"][s]
            cells.append(f"{_pct(ev['error'])} ({ev['errors']}/{ev['reads']}, 95% CI ≤ {_pct(ev['ci95'][1])})")
        tps = r.get("tokens_per_s")
        tps_s = f"{tps / 1e6:.2f} M" if tps else "-"
        rows.append(f"| {LABEL[name]} | {' | '.join(cells)} | {' / '.join(PAPER[name])} | {r['train_steps']} | {tps_s} |")
    comp = results.get("meta", {}).get("throughput_comparison")
    if comp:
        rows += ["", f"Training tokens/s, same run, same model/batch ({comp['batch']} x {comp['seq_len']} tokens), "
                     f"fwd + bwd + AdamW, {comp['timed_steps']} timed steps:", "",
                 "| model | pathtune | fla parallel_path_attn | pathtune / fla |", "|---|---|---|---|"]
        for name in ("path", "path_fox"):
            a, b = comp.get(f"{name}/pathtune"), comp.get(f"{name}/fla")
            if a is None and b is None:
                continue

            def cell(x):
                if not x:
                    return "-"
                if "tokens_per_s" in x:
                    return f"{x['tokens_per_s'] / 1e6:.2f} M ({x['ms_per_step']:.1f} ms/step)"
                return x.get("skipped") or ("failed: " + _first_line(x["failed"]) if "failed" in x else "-")
            ratio = comp.get(f"{name}/pathtune_over_fla")
            rows.append(f"| {LABEL[name]} | {cell(a)} | {cell(b)} | {f'{ratio:.2f}x' if ratio else '-'} |")
    return "\n".join(rows)


def issue_checks(results: dict) -> dict:
    """The issue's pass criteria, on point estimates and on the 95% Wilson bounds (conservative)."""
    p, r = results.get("path", {}), results.get("rope", {})
    out: dict = {}
    if p.get("status") == "ok":
        out["path_sparse_below_0.1pct"] = p["sparse_error"] < 1e-3
        out["path_sparse_below_0.1pct_upper_bound"] = p["sparse_ci95"][1] < 1e-3
        out["path_id_below_1pct"] = p["id_error"] < 1e-2
        out["path_id_below_1pct_upper_bound"] = p["id_ci95"][1] < 1e-2
        if r.get("status") == "ok":
            out["path_sparse_10x_below_rope"] = 10 * p["sparse_error"] <= r["sparse_error"] and r["sparse_error"] > 0
            out["path_sparse_10x_below_rope_bounds"] = 10 * p["sparse_ci95"][1] < r["sparse_ci95"][0]
    return out


def plot_curves(results: dict, path: Path) -> Optional[Path]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not importable here: curves are in the JSON; plot them elsewhere with "
              "`python -m examples.flipflop --plot-from RESULTS.json`")
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name in ATTENTIONS:
        r = results.get(name)
        if not r or "curve" not in r:
            continue
        c = r["curve"]
        label = LABEL[name]
        if r.get("sparse_reads"):
            label += f" (sparse OOD {r['sparse_errors']}/{r['sparse_reads']} wrong)"
        mk = "." if len(c["step"]) < 20 else None
        axes[0].plot(c["step"], [max(v, 1e-9) for v in c["loss"]], label=label, marker=mk)
        axes[1].plot(c["step"], [max(e, 1e-6) for e in c["read_error"]], label=label, marker=mk)
    axes[0].set(xlabel="step", ylabel="train loss (read targets)", yscale="log", title="training loss")
    axes[1].set(xlabel="step", ylabel="train read error (floored at 1e-6)", yscale="log",
                title="read error on training batches, FFL(0.8)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    meta = results.get("meta", {})
    fig.suptitle(f"flip-flop LM, 1 layer, 2 heads, width 64 — {meta.get('gpu', '?')}", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------------------- progress

class Progress:
    """rich progress bars on a terminal; plain log lines otherwise (e.g. captured output)."""

    def __init__(self, enabled: bool = True):
        self._rich = None
        self._plain_every = {}
        try:
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress as RP, TextColumn,
                                       TimeElapsedColumn, TimeRemainingColumn)
            console = Console(stderr=True)
            if enabled and console.is_terminal:
                self._rich = RP(TextColumn("{task.description:<22}"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[info]}"),
                                console=console)
        except ImportError:
            pass
        self._task = None
        self._total = 0
        self._desc = ""
        self._last_print = 0.0

    def __enter__(self):
        if self._rich:
            self._rich.start()
        return self

    def __exit__(self, *exc):
        if self._rich:
            self._rich.stop()

    def start(self, desc: str, total: int) -> None:
        self._desc, self._total = desc, total
        self._last_print = 0.0
        if self._rich:
            self._task = self._rich.add_task(desc, total=total, info="")
        else:
            log(f"{desc}: 0/{total}")

    def update(self, done: int, info: str = "") -> None:
        if self._rich:
            self._rich.update(self._task, completed=done, **({"info": info} if info else {}))
        elif time.perf_counter() - self._last_print > 15 or done >= self._total:
            self._last_print = time.perf_counter()
            log(f"{self._desc}: {done}/{self._total} {info}")

    def finish(self, info: str = "") -> None:
        if self._rich and self._task is not None:
            self._rich.update(self._task, info=info)


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T_START:7.1f}s] {msg}", flush=True)


# ------------------------------------------------------------------------------------------- main

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m examples.flipflop", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--models", default=",".join(ATTENTIONS), help="comma list from path,rope,path_fox")
    p.add_argument("--steps", type=int, default=None, help="training steps per model (default 4000; tiny 24)")
    p.add_argument("--batch", type=int, default=None, help="sequences per step (default 256; tiny 8)")
    p.add_argument("--lr", type=float, default=None, help="peak learning rate (default 1e-3)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up steps (default 200; tiny 4)")
    p.add_argument("--seed", type=int, default=0, help="model init, training and eval data seed")
    p.add_argument("--budget-minutes", type=float, default=None,
                   help="wall-clock budget for the whole command (default 14; tiny 3)")
    p.add_argument("--id-seqs", type=int, default=None, help="ID FFL(0.8) eval sequences (default 16384)")
    p.add_argument("--sparse-seqs", type=int, default=None, help="sparse FFL(0.98) eval sequences (default 300000)")
    p.add_argument("--dense-seqs", type=int, default=None, help="dense FFL(0.1) eval sequences (default 4096)")
    p.add_argument("--eval-batch", type=int, default=None, help="eval sequences per forward (default 1024)")
    p.add_argument("--backend", default="auto", help="pathtune backend for the PaTH layers (auto/triton/reference)")
    p.add_argument("--no-fla-compare", action="store_true", help="skip the same-run pathtune vs fla tokens/s")
    p.add_argument("--bench-steps", type=int, default=30, help="timed steps per kernel in the tokens/s comparison")
    p.add_argument("--compare-on-cpu", action="store_true", help=argparse.SUPPRESS)   # tests: the comparison off CUDA
    p.add_argument("--tiny", action="store_true", help="CPU smoke mode: T=64, few steps, reference backend")
    p.add_argument("--out", type=Path, default=None, help=f"results JSON (default {DEFAULT_OUT}; tiny {TINY_OUT})")
    p.add_argument("--resume", action="store_true", help="keep models already 'ok' in --out and run the rest")
    p.add_argument("--plot-from", type=Path, default=None, help="only plot the curves of an existing results JSON")
    p.add_argument("--no-progress", action="store_true", help="plain log lines instead of progress bars")
    return p


def _command_line(argv: Optional[list]) -> str:
    if argv is not None:        # called in-process
        return shlex.join(["python", "-m", "examples.flipflop", *map(str, argv)])
    main_mod = sys.modules.get("__main__")
    spec = getattr(main_mod, "__spec__", None)
    head = ["python", "-m", spec.name.removesuffix(".__main__")] if spec is not None else ["python", sys.argv[0]]
    return shlex.join(head + sys.argv[1:])


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version
    out = {"python": platform.python_version(), "torch": torch.__version__}
    for dist in ("triton", "pathtune", "flash-linear-attention", "numpy"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = None
    return out


def _git_commit() -> Optional[str]:
    try:
        import subprocess
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=HERE, capture_output=True, text=True,
                              timeout=5).stdout.strip() or None
    except Exception:
        return None


def _measure_in_child(*args, **kw) -> tuple:
    """``measure_throughput_in_child``; a failure to start the child is that entry's failure too."""
    try:
        return measure_throughput_in_child(*args, **kw)
    except Exception as exc:
        return {"failed": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}, ""


_CALLS = 0


def main(argv: Optional[list] = None) -> int:
    global T_START, _CALLS
    if _CALLS:                 # the budget of a first call counts from the process start (imports included)
        T_START = time.perf_counter()
    _CALLS += 1
    args = build_parser().parse_args(argv)
    if args.plot_from:
        results = json.loads(args.plot_from.read_text())
        out = plot_curves(results, args.plot_from.with_name("training_curves.png"))
        print(markdown_table(results))
        if out:
            print(f"plot: {out}")
        return 0 if out else 1

    threads = torch.get_num_threads()
    if args.tiny:
        torch.set_num_threads(1)    # tiny tensors: extra threads only add contention on shared CPU hosts
    try:
        return _run(args, argv)
    finally:
        torch.set_num_threads(threads)


def _run(args: argparse.Namespace, argv: Optional[list]) -> int:
    tiny = args.tiny
    torch.set_float32_matmul_precision("high")     # TF32 for the few float32 matmuls on the GPU
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() and not tiny else "cpu"))
    backend = "reference" if tiny and args.backend == "auto" else args.backend
    cfg = TrainConfig()
    if tiny:
        cfg = replace(cfg, steps=24, batch=8, seq_len=64, warmup=4, log_every=4, steady_after=2)
    cfg = replace(cfg, **{k: v for k, v in (("steps", args.steps), ("batch", args.batch), ("lr", args.lr),
                                             ("warmup", args.warmup)) if v is not None})
    cfg = replace(cfg, warmup=min(cfg.warmup, max(1, cfg.steps // 10)), log_every=min(cfg.log_every, max(1, cfg.steps)))
    budget_s = 60 * (args.budget_minutes if args.budget_minutes is not None else (3.0 if tiny else 14.0))
    n_eval = {"id": args.id_seqs or (16 if tiny else 16384),
              "sparse": args.sparse_seqs or (32 if tiny else 300_000),
              "dense": args.dense_seqs or (8 if tiny else 4096)}
    eval_batch = args.eval_batch or (32 if tiny else 1024)
    out_path = args.out or (TINY_OUT if tiny else DEFAULT_OUT)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    bad = [m for m in models if m not in ATTENTIONS]
    if bad:
        raise SystemExit(f"unknown model(s) {bad}; choose from {ATTENTIONS}")
    splits = {s: replace(SPLITS[s], seq_len=cfg.seq_len) for s in ("train",) + EVAL_SPLITS}

    results: dict = {}
    old_meta: dict = {}
    if args.resume and out_path.exists():
        old = json.loads(out_path.read_text())
        old_meta = old.get("meta", {})
        results = {k: v for k, v in old.items() if k in ATTENTIONS and v.get("status") == "ok"}
        log(f"resume: keeping {sorted(results)} from {out_path}")
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({platform.processor() or platform.machine()})"
    seeds = {"model_init": args.seed, "train_data": args.seed + SPLITS["train"].seed_offset,
             **{f"{s}_data": args.seed + SPLITS[s].seed_offset for s in EVAL_SPLITS}}
    meta = {
        "command": _command_line(argv), "gpu": gpu, "device": str(device), "tiny": tiny, "backend": backend,
        "seed": args.seed, "seeds": seeds, "budget_seconds": budget_s, "train_config": cfg.to_dict(),
        "model": {"layers": 1, "heads": 2, "d_model": 64, "head_dim": 32, "mlp": "GELU 4x", "norm": "RMSNorm pre-norm",
                  "position": "PaTH or RoPE only (no absolute embedding)"},
        "data": {s: {"p_ignore": splits[s].p_ignore, "seq_len": splits[s].seq_len,
                     "expected_reads_per_seq": round(expected_reads(splits[s].seq_len, splits[s].p_ignore), 3),
                     **({"sequences_requested": n_eval[s]} if s in n_eval else {})} for s in splits},
        "eval_batch": eval_batch, "ci": "Wilson score, 95%",
        "reads_to_resolve_0.1pct": reads_to_resolve(1e-3), "versions": _versions(), "git_commit": _git_commit(),
        "started_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "complete": False,
    }
    if old_meta:   # models kept from earlier commands: record those commands too
        meta["previous_runs"] = old_meta.get("previous_runs", []) + [
            {k: old_meta.get(k) for k in ("command", "gpu", "started_utc", "finished_utc", "git_commit", "versions")}
            | {"models_kept": sorted(results)}]
        if "throughput_comparison" in old_meta:
            meta["throughput_comparison"] = old_meta["throughput_comparison"]
    results["meta"] = meta

    def save():
        meta["wall_seconds"] = round(time.perf_counter() - T_START, 1)
        ordered = {k: results[k] for k in ATTENTIONS if k in results}
        ordered["meta"] = meta
        write_json(ordered, out_path)

    save()
    log(f"device {gpu}; models {models}; budget {budget_s / 60:.1f} min; out {out_path}")
    log(f"sparse eval: {n_eval['sparse']} sequences ≈ {n_eval['sparse'] * expected_reads(cfg.seq_len, 0.98):.0f} "
        f"reads (0 errors resolve < 0.1% from {reads_to_resolve(1e-3)} reads)")
    do_bench = (not args.no_fla_compare and (device.type == "cuda" or args.compare_on_cpu)
                and any(m != "rope" for m in models))
    fla_ok, fla_why = fla_available() if do_bench else (False, "not attempted")
    bench_reserve = min(100.0, 0.12 * budget_s) if do_bench else 0.0
    deadline = T_START + budget_s - (3.0 if tiny else 15.0)      # JSON + plot at the end
    todo = [m for m in models if m not in results]
    inits: dict = {}   # initial weights per model, so the tokens/s runs start from the same state

    with Progress(enabled=not args.no_progress) as prog:
        for i, name in enumerate(todo):
            t_model = time.perf_counter()
            share = (deadline - bench_reserve - t_model) / (len(todo) - i)
            if share <= 5:
                results[name] = {"status": "skipped: budget exhausted"}
                save()
                continue
            rec: dict = {"status": "running", "attention": name}
            results[name] = rec
            try:
                torch.manual_seed(args.seed)
                model = FlipFlopLM(name, backend=backend).to(device)
                rec["parameters"] = count_parameters(model)
                rec["kernel"] = "torch SDPA (RoPE)" if name == "rope" else f"pathtune backend={backend}"
                init_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
                prog.start(f"train {LABEL[name]}", cfg.steps)
                tr = train_model(model, cfg, seed=args.seed, device=device, time_limit_s=0.8 * share,
                                 on_step=prog.update, split=splits["train"])
                rec.update({k: tr[k] for k in ("train_steps", "train_seconds", "tokens_per_s", "train_tokens",
                                               "stop_reason", "curve")})
                prog.finish(f"{tr['train_steps']} steps, {tr['train_seconds']:.0f}s")
                log(f"{LABEL[name]}: trained {tr['train_steps']} steps in {tr['train_seconds']:.1f}s "
                    f"({(tr['tokens_per_s'] or 0) / 1e6:.2f} M tok/s), stop: {tr['stop_reason']}")
                save()
                rec["eval"] = {}
                eval_end = max(time.perf_counter() + 5.0, t_model + share)
                for j, s in enumerate(EVAL_SPLITS):
                    # this split's share of what is left (time an earlier split did not use carries over)
                    left = sum(EVAL_TIME_SHARE[x] for x in EVAL_SPLITS[j:])
                    limit = max(2.0, (eval_end - time.perf_counter()) * EVAL_TIME_SHARE[s] / left)
                    prog.start(f"eval {LABEL[name]} {s}", n_eval[s])
                    ev = evaluate(model, splits[s], n_sequences=n_eval[s], batch=eval_batch, seed=args.seed,
                                  device=device, time_limit_s=limit, amp=cfg.amp, on_batch=prog.update)
                    rec["eval"][s] = ev
                    rec[f"{s}_error"], rec[f"{s}_reads"], rec[f"{s}_errors"] = ev["error"], ev["reads"], ev["errors"]
                    rec[f"{s}_sequences"], rec[f"{s}_ci95"] = ev["sequences"], ev["ci95"]
                    prog.finish(f"{ev['errors']}/{ev['reads']} errors")
                    log(f"{LABEL[name]} {s}: {ev['errors']} errors / {ev['reads']} reads "
                        f"({ev['sequences']} seqs) = {_pct(ev['error'])}, 95% CI [{_pct(ev['ci95'][0])}, "
                        f"{_pct(ev['ci95'][1])}] in {ev['seconds']:.1f}s"
                        + (" (time-truncated)" if ev["truncated_by_time"] else ""))
                    save()
                rec["status"] = "ok"
                rec["_init_state"] = init_state   # used by the tokens/s comparison, dropped before saving
            except Exception as exc:  # keep going: the other models' results must survive
                rec["status"] = f"failed: {type(exc).__name__}: {exc}"
                rec["traceback"] = traceback.format_exc()[-4000:]
                log(f"{LABEL[name]} FAILED: {type(exc).__name__}: {exc}")
            init = rec.pop("_init_state", None)
            if init is not None:
                inits[name] = init
            save()
            if device.type == "cuda":
                torch.cuda.empty_cache()

        # ---- same-run tokens/s: pathtune vs fla, same model, batch, data and optimiser; each
        # measurement in its own child process, so a CUDA fault (which poisons a process's CUDA
        # context) fails only its own entry. pathtune first: a hanging fla child cannot eat their time.
        if do_bench:
            comp: dict = {"batch": cfg.batch, "seq_len": cfg.seq_len, "timed_steps": args.bench_steps,
                          "fla_importable": fla_ok, **({"fla_import_error": fla_why} if not fla_ok else {})}
            meta["throughput_comparison"] = comp
            names = [m for m in models if m != "rope"]
            entries = [(n, "pathtune") for n in names] + [(n, "fla") for n in names if fla_ok]
            if not fla_ok:
                for n in names:
                    comp[f"{n}/fla"] = {"skipped": f"fla not importable ({fla_why})"}
            states: dict = {}
            reruns: list = []
            min_child_s = 30.0
            for i, (name, kernel) in enumerate(entries):
                key = f"{name}/{kernel}"
                left = deadline - time.perf_counter()
                if left < 20:
                    comp[key] = {"skipped": "budget exhausted"}
                    save()
                    continue
                # its fair share of what is left, but at least min_child_s when the budget has it
                timeout = min(left, max(left / (len(entries) - i), min_child_s))
                if name not in states:   # the same initial weights as the trained model
                    if name in inits:
                        states[name] = {k: v.detach().cpu() for k, v in inits[name].items()}
                    else:                 # --resume: rebuilt from the seed, as training built it
                        torch.manual_seed(args.seed)
                        states[name] = FlipFlopLM(name, backend=backend).state_dict()
                prog.start(f"tokens/s {LABEL[name]} {kernel}", 1)
                rec, err = _measure_in_child(states[name], name, cfg, kernel=kernel, seed=args.seed, device=device,
                                             steps=args.bench_steps, backend=backend, timeout_s=timeout)
                comp[key] = rec
                if "failed" in rec:
                    log(f"tokens/s {LABEL[name]} {kernel} FAILED (exit code {rec.get('exit_code')}): "
                        f"{_first_line(rec['failed'])}")
                    if kernel == "fla" and is_cuda_fault(rec, err):
                        reruns.append((name, kernel))
                else:
                    prog.update(1, f"{rec['tokens_per_s'] / 1e6:.2f} M tok/s")
                    log(f"tokens/s {LABEL[name]} {kernel}: {rec['tokens_per_s'] / 1e6:.2f} M "
                        f"({rec['ms_per_step']:.2f} ms/step)")
                save()
            # a fla CUDA fault: once more with synchronous launches, so the traceback names the kernel
            for j, (name, kernel) in enumerate(reruns):
                key = f"{name}/{kernel}"
                left = deadline - time.perf_counter()
                if left < 20:
                    comp[key]["blocking_rerun"] = {"skipped": "budget exhausted"}
                    save()
                    continue
                timeout = min(left, max(left / (len(reruns) - j), min_child_s))
                prog.start(f"rerun {LABEL[name]} {kernel} (blocking)", 1)
                rec, err = _measure_in_child(states[name], name, cfg, kernel=kernel, seed=args.seed, device=device,
                                             steps=args.bench_steps, backend=backend, timeout_s=timeout,
                                             env={"CUDA_LAUNCH_BLOCKING": "1"})
                comp[key]["blocking_rerun"] = {
                    "env": "CUDA_LAUNCH_BLOCKING=1", "exit_code": rec.get("exit_code", 0),
                    **({"failed": rec["failed"]} if "failed" in rec else
                       {"completed": True, "tokens_per_s": rec["tokens_per_s"]})}
                comp[key]["blocking_rerun_tail"] = tail_lines(err or rec.get("stderr_tail", ""))
                log(f"tokens/s {LABEL[name]} {kernel} rerun with CUDA_LAUNCH_BLOCKING=1: "
                    + (_first_line(rec["failed"]) if "failed" in rec else "completed without a fault")
                    + "".join(f"\n    {ln}" for ln in comp[key]["blocking_rerun_tail"].splitlines()[-12:]))
                save()
            for name in names:
                a, b = comp.get(f"{name}/pathtune", {}), comp.get(f"{name}/fla", {})
                if "tokens_per_s" in a and "tokens_per_s" in b:
                    comp[f"{name}/pathtune_over_fla"] = a["tokens_per_s"] / b["tokens_per_s"]
                for k in ("pathtune", "fla", "pathtune_over_fla"):     # per model, in this order
                    if f"{name}/{k}" in comp:
                        comp[f"{name}/{k}"] = comp.pop(f"{name}/{k}")
                if name in results and "tokens_per_s" in a:
                    results[name]["tokens_per_s_same_run"] = {k: comp.get(f"{name}/{k}", {}).get("tokens_per_s")
                                                              for k in ("pathtune", "fla")}
            save()

    meta["checks"] = issue_checks(results)
    meta["finished_utc"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    meta["complete"] = all(results.get(m, {}).get("status") == "ok" for m in models)
    save()
    plot = plot_curves(results, out_path.with_name("training_curves.png"))
    if plot:
        meta["plot"] = str(plot)
        save()
    print(markdown_table(results))
    if meta["checks"]:
        log("checks: " + ", ".join(f"{k}={v}" for k, v in meta["checks"].items()))
    log(f"results: {out_path}" + (f", plot: {plot}" if plot else ""))
    return 0 if meta["complete"] else 1


if __name__ == "__main__":
    sys.exit(main())
