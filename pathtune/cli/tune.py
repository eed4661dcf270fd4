"""``pathtune tune`` (local), ``pathtune tune build`` and ``pathtune tune ingest`` (split flow).

Registered on the main CLI by pathtune/cli/__init__.py (``register(app)``). Importing this module loads typer
and rich only; Optuna, SQLAlchemy and torch load when a command runs.
"""
from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any, List, NoReturn, Optional

import typer
from rich.console import Console
from rich.table import Table

from ._output import table_console

__all__ = ["register", "tune_app"]

console = Console()
err = Console(stderr=True)

tune_app = typer.Typer(help="Tune kernel knobs with Optuna (accuracy-gated, results in perf_db).",
                       invoke_without_command=True, no_args_is_help=False)


def _fail(message: str, code: int = 1) -> NoReturn:
    err.print(message, style="red", markup=False, highlight=False)
    raise typer.Exit(code)


def _note(message: str) -> None:
    err.print(message, style="yellow", markup=False, highlight=False)


def _ints(text: str, what: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        _fail(f"{what} must be comma-separated integers, got {text!r}")


def _strs(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _command() -> str:
    return shlex.join(["pathtune", *sys.argv[1:]])


# Options shared by `tune` and `tune build` ------------------------------------------------------------

HEAD_DIM = typer.Option("64,128", "--head-dim", help="Head dims D (= DV), comma-separated.")
DTYPE = typer.Option("bfloat16", "--dtype", help="q/k/v dtypes, comma-separated.")
PASSES = typer.Option("fwd,bwd,decode", "--pass", help="Passes: fwd, bwd (timed as forward+backward), decode.")
BACKEND = typer.Option("triton", "--backend", help="Backends: triton, tvm (forward; split flow).")
BUCKETS = typer.Option("1024,2048,4096,8192,16384", "--buckets",
                       help="Sequence-length buckets (powers of two); each is timed at B*T = --tokens.")
GATE = typer.Option(True, "--gate/--no-gate", help="FoX forget gate on (PaTH-FoX, default) or off (PaTH).")
BOTH_GATES = typer.Option(False, "--both-gates", help="Tune the PaTH-FoX and the PaTH keys in one run (their seeded "
                                                      "configs compile in one wave); overrides --gate / --no-gate.")
HEADS = typer.Option(None, "--heads", help="Query heads (default 16 for D <= 64, else 8).")
HEADS_KV = typer.Option(None, "--heads-kv", help="Key/value heads (default: = --heads).")
TOKENS = typer.Option(32768, "--tokens", help="B*T of the timed shape (batch = tokens // bucket).")
BUDGET = typer.Option("40", "--budget",
                      help="Wall time for all keys (10m, 90s, 1h), COMPLETE trials per key's study (40), or both "
                           "(10m,40). The default, --seed-config's and the warm start's configs are measured "
                           "whatever the budget.")
STORAGE = typer.Option(None, "--storage",
                       help="Database URL of the Optuna studies and of perf_db (default: perf_db's URL, "
                            "PATHTUNE_DB_URL or the per-user SQLite file). Several workers: PostgreSQL.")
DB = typer.Option(None, "--db", help="perf_db URL when it differs from --storage.", show_default=False)
SEED = typer.Option(0, "--seed", help="TPE sampler seed (and of the random inputs).")
WORKER = typer.Option(0, "--worker", help="Worker index: workers of one study use distinct values "
                                          "(the sampler seed is seed + 1000 * worker).")
CHECK_LEN = typer.Option(1024, "--check-len", help="Tokens of the accuracy gate's one sequence (the workload's heads); "
                         "at least two super-chunks of the config when the timed shape spans several.")
TOL = typer.Option(None, "--tol", help="Override a gate tolerance, e.g. --tol o=2e-3 (default: the spec's).")
MEASURE_WITH = typer.Option(None, "--measure-with", hidden=True,
                            help="Tests: module:function or file.py:function replacing the measurement.")
HEARTBEAT = typer.Option(30, "--heartbeat", hidden=True, help="Optuna heartbeat interval, seconds.")
SPEC = typer.Option(None, "--spec", help="Spec YAML whose knobs are searched (default: the packaged one).",
                    show_default=False)
COMPILE_WORKERS = typer.Option(None, "--compile-workers", min=0,
                               help="Child processes that compile a batch of candidates at once before they are "
                                    "measured one by one (default: CPU cores - 2 on a CUDA host, at most 16; 0 "
                                    "compiles in the measuring process).", show_default=False)
MEMORY_KNOBS = typer.Option(False, "--memory-knobs",
                            help="Also search the spec's memory knobs (bwd_forward_state keep: the backward reads "
                                 "the forward's state instead of recomputing it, 8 D + 4 C bytes per token and key "
                                 "head held from forward to backward). Off: they stay at the spec's default.")
STARTUP = typer.Option(8, "--startup-trials", help="Random TPE startup trials per study (after the default).")
NEIGHBOURS = typer.Option(12, "--seed-neighbours", min=0,
                          help="Each study also gets (once, before its random start-up trials; a resumed study "
                               "too) up to this many configs one schedule knob (tile, warps, stages, chunk size) "
                               "away from the previous kernels' winner (the warm start's first config, "
                               "--seed-retired), else from the default.")
REFINE = typer.Option(0, "--refine", min=0, metavar="N",
                      help="After a new study's seeded configs (default, --seed-config, warm start), also measure "
                           "up to N configs that recombine what they changed from the default: the fastest one's "
                           "changes undone one at a time, then the unions of two faster-than-default configs' "
                           "changes. Measured like the seeds, whatever the budget; once per study. 0: off.")
CONFIRM = typer.Option(0, "--confirm", min=0, metavar="N",
                       help="After each key's study, re-time its N fastest configs in --confirm-rounds interleaved "
                            "rounds on fresh inputs (gate included), each round recorded as a run of its own: a "
                            "config that lost to host jitter in its one timing gets more draws, and a note per key "
                            "shows every draw and whether the winner moved. 0: off.")
CONFIRM_ROUNDS = typer.Option(3, "--confirm-rounds", min=1, metavar="R", help="Rounds of --confirm.")
RETIRED = typer.Option(3, "--seed-retired", min=0, metavar="K",
                       help="Warm start: a new study also measures, right after the default (in its first batch), "
                            "the K fastest distinct configs that perf_db and the shipped results hold for the same "
                            "key under older kernel sources (same GPU env, spec, pass, backend and workload), "
                            "newest source first; configs that no longer validate are dropped with a note. "
                            "A key with none under the current spec takes those of earlier specs (knobs added "
                            "since at the key's defaults). 0: off.")
OTHER_GPUS = typer.Option(2, "--seed-other-gpus", min=0, metavar="K",
                          help="A new study also measures first up to K configs that won the same key on other "
                               "GPUs under the current kernels and spec (perf_db and the shipped results; each "
                               "GPU's fastest first, newest GPU first), re-validated here: a GPU without records "
                               "of its own starts from its neighbours' tuned configs. 0: off.")
SEED_CONFIG = typer.Option(None, "--seed-config", metavar="JSON",
                           help="Knob values to try first in every study whose pass has them, applied on the key's "
                                "default: a JSON object or list of objects, e.g. '[{\"ut_precision\": \"tf32\"}]' "
                                "(repeatable; checked against the spec's domains, each config still passes the "
                                "accuracy gate).", show_default=False)


def _seed_configs(texts: Optional[List[str]], spec: Any) -> list:
    """The --seed-config values checked against ``spec`` (a loaded Spec)."""
    from pathtune.tuning.space import check_seed_configs

    out: list = []
    for text in texts or []:
        try:
            out += check_seed_configs(spec, json.loads(text))
        except json.JSONDecodeError as e:
            _fail(f"--seed-config is not JSON ({e.msg} at character {e.pos}): {text!r}")
        except ValueError as e:
            _fail(f"--seed-config: {e}")
    return out


def _keys(head_dim: str, dtype: str, pass_: str, backend: str, buckets: str, gate: bool, heads: Optional[int],
          heads_kv: Optional[int], tokens: int) -> list:
    from pathtune.tuning.space import plan_keys

    try:
        return plan_keys(_ints(head_dim, "--head-dim"), _strs(dtype), _strs(pass_), _strs(backend),
                         _ints(buckets, "--buckets"), gate=gate, heads=heads, heads_kv=heads_kv, tokens=tokens)
    except ValueError as e:
        _fail(str(e))


def _options(storage: Optional[str], db: Optional[str], budget: str, seed: int, worker: int, resume: bool,
             measure_with: Optional[str], check_len: int, tol: Optional[List[str]], heartbeat: Optional[int],
             startup_trials: int, results_out: Optional[Path] = None, env_info: Optional[dict] = None,
             spec: Optional[Path] = None, compile_workers: Optional[int] = 0, seed_neighbours: int = 0,
             seed_retired: int = 0, seed_config: Optional[List[str]] = None, memory_knobs: bool = False,
             seed_other_gpus: int = 0, refine: int = 0, confirm: int = 0, confirm_rounds: int = 3) -> Any:
    from pathtune.perf_db import resolve_url
    from pathtune.specs import SpecError, load_spec
    from pathtune.tuning.measure import load_measure_fn
    from pathtune.tuning.tuner import TuneOptions, is_sqlite, parse_budget

    try:
        parsed = parse_budget(budget)
        measure_fn = load_measure_fn(measure_with)
    except ValueError as e:
        _fail(str(e))
    url, _ = resolve_url(storage)
    url_str = url.render_as_string(hide_password=False)
    try:
        loaded = load_spec(spec)
    except SpecError as e:
        _fail(str(e))
    tolerances = dict(loaded.numerics.accuracy.tolerances)
    for item in tol or []:
        name, _, value = item.partition("=")
        try:
            tolerances[name.strip()] = float(value)
        except ValueError:
            _fail(f"--tol wants NAME=VALUE (e.g. o=2e-3), got {item!r}")
    if is_sqlite(url_str):
        _note("SQLite storage: run ONE worker on it (Optuna's RDBStorage docs: never share SQLite between parallel "
              "workers); use a PostgreSQL URL (--storage postgresql+psycopg://...) for several")
    return TuneOptions(storage=url_str, db_url=db, budget=parsed, seed=seed, worker=worker, resume=resume,
                       measure_fn=measure_fn,
                       task_defaults={"check_len": check_len, "tolerances": tolerances},
                       heartbeat=heartbeat, startup_trials=startup_trials, command=_command(),
                       results_out=results_out, env_info=env_info, spec_path=spec,
                       compile_workers=compile_workers or 0, seed_neighbours=seed_neighbours,
                       seed_retired=seed_retired, seed_configs=_seed_configs(seed_config, loaded),
                       memory_knobs=memory_knobs, seed_other_gpus=seed_other_gpus, refine=refine,
                       confirm=confirm, confirm_rounds=confirm_rounds)


def _filter_keys(keys: list, *, local: bool) -> list:
    from pathtune.tuning.measure import decode_available

    out = []
    for key in keys:
        if key.pass_ == "decode" and not decode_available():
            _note(f"skip {key.label}: the fused Triton decode kernel is not available in this pathtune yet")
            continue
        if key.backend == "tvm" and key.pass_ != "fwd":
            _note(f"skip {key.label}: the TVM backend implements the forward pass only")
            continue
        out.append(key)
    if local and any(k.backend == "tvm" for k in out):
        import importlib.util

        import torch

        if importlib.util.find_spec("tvm") is None or not torch.cuda.is_available():
            _fail("--backend tvm tunes locally only on a GPU host with apache-tvm installed "
                  "(pip install 'pathtune[tvm]'); otherwise use the split flow: `pathtune tune build --backend tvm` "
                  "on a host with TVM, run the bundle on the GPU host, then `pathtune tune ingest`")
    if not out:
        _fail("nothing to tune (every key was skipped)")
    return out


# "vs previous" above this flags a key in the report (noise between runs of one config stays under it)
SLOWER_THAN_PREVIOUS = 1.05


def _report(results: list, json_path: Optional[Path]) -> None:
    from pathtune.tuning.tuner import fmt_ms

    table = Table(title="pathtune tune: default vs tuned (ms, from perf_db)")
    table.add_column("key", overflow="fold")
    for col in ("trials", "measured", "default ms", "tuned ms", "speedup", "tuned / SDPA", "vs previous"):
        table.add_column(col, no_wrap=True)      # numbers stay whole on a narrow terminal; the key folds
    lines, slower = [], []
    for r in results:
        sp = f"{r.speedup:.2f}x" if r.speedup else "-"
        vs = f"{r.best_ms / r.baseline_ms:.2f}x" if r.best_ms and r.baseline_ms else "-"
        prev = f"{r.vs_previous:.2f}x" if r.vs_previous else "-"
        default = fmt_ms(r.default_ms) if r.default_status in (None, "ok") else r.default_status
        table.add_row(r.key.label, str(r.trials), str(r.measured), default, fmt_ms(r.best_ms), sp, vs, prev)
        if r.best_config:
            lines.append(f"{r.key.label}: " + " ".join(f"{k}={v}" for k, v in r.best_config.items()))
        if r.vs_previous and r.vs_previous > SLOWER_THAN_PREVIOUS:
            slower.append(f"{r.key.label}: tuned {fmt_ms(r.best_ms)} ms, {r.vs_previous:.2f}x the "
                          f"{fmt_ms(r.previous_ms)} ms measured under kernel source {r.previous_source[:10]}")
    out = table_console(console, 150)
    out.print(table)
    if lines:
        out.print("best configs:\n  " + "\n  ".join(lines), highlight=False, markup=False)
    if slower:
        out.print("slower than the previous kernels' best on this GPU (a kernel edit that cost time, or a budget "
                  "that missed the previous winner: resume with more trials, or --seed-config it):\n  "
                  + "\n  ".join(slower), highlight=False, markup=False)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps([r.to_dict() for r in results], indent=1) + "\n")
        console.print(f"wrote {json_path}", highlight=False)


def _refuse_options_before(ctx: typer.Context) -> None:
    """`pathtune tune OPTIONS build ...` would drop OPTIONS (the subcommands take their own): a one-line error."""
    def on_command_line(name: str) -> bool:     # by name: typer's Context may come from its own copy of click
        source = ctx.get_parameter_source(name)
        return getattr(source, "name", None) == "COMMANDLINE"

    given = [p.opts[0] for p in ctx.command.params if p.name and on_command_line(p.name)]
    if given:
        sub = ctx.invoked_subcommand
        _fail(f"{', '.join(given)} before `{sub}` would be ignored: give them after it, as options of "
              f"`pathtune tune {sub}` (see `pathtune tune {sub} --help`)")


@tune_app.callback()
def tune(
    ctx: typer.Context,
    head_dim: str = HEAD_DIM, dtype: str = DTYPE, pass_: str = PASSES, backend: str = BACKEND,
    buckets: str = BUCKETS, gate: bool = GATE, heads: Optional[int] = HEADS, heads_kv: Optional[int] = HEADS_KV,
    tokens: int = TOKENS, budget: str = BUDGET, storage: Optional[str] = STORAGE, db: Optional[str] = DB,
    resume: bool = typer.Option(False, "--resume", help="Continue the studies (after Ctrl-C, a killed worker, or to "
                                                        "join other workers: every worker of a study passes it)."),
    seed: int = SEED, worker: int = WORKER, check_len: int = CHECK_LEN, tol: Optional[List[str]] = TOL,
    results_out: Optional[Path] = typer.Option(None, "--results-out",
                                               help="Also write every measurement of this process to a results file "
                                                    "(perf_db/RESULTS_FORMAT.md), rewritten after each trial."),
    report_json: Optional[Path] = typer.Option(None, "--report-json", help="Write the per-key summary as JSON."),
    measure_with: Optional[str] = MEASURE_WITH, heartbeat: int = HEARTBEAT, startup_trials: int = STARTUP,
    spec: Optional[Path] = SPEC, compile_workers: Optional[int] = COMPILE_WORKERS,
    seed_neighbours: int = NEIGHBOURS, seed_retired: int = RETIRED, seed_config: Optional[List[str]] = SEED_CONFIG,
    both_gates: bool = BOTH_GATES, memory_knobs: bool = MEMORY_KNOBS, seed_other_gpus: int = OTHER_GPUS,
    refine: int = REFINE, confirm: int = CONFIRM, confirm_rounds: int = CONFIRM_ROUNDS,
) -> None:
    """Tune every (pass, backend, head dim, dtype, length bucket) key on this GPU host (an Optuna study per key).

    Every candidate is checked against the float64 reference on fresh inputs first; failures are
    recorded with their status and never win. Measured configs are looked up in perf_db, never re-run.
    Subcommands `build` / `ingest` split proposing+compiling (no GPU) from measuring (GPU, no DB).
    """
    if ctx.invoked_subcommand is not None:
        _refuse_options_before(ctx)
        return
    from pathtune.tuning.progress import TuneProgress
    from pathtune.tuning.tuner import StudyExistsError, Tuner

    keys = [k for g in ((True, False) if both_gates else (gate,))
            for k in _keys(head_dim, dtype, pass_, backend, buckets, g, heads, heads_kv, tokens)]
    keys = _filter_keys(keys, local=True)
    if measure_with is None:
        import os

        import torch

        if compile_workers is None and torch.cuda.is_available():
            from pathtune.tuning.prepare import default_workers

            compile_workers = default_workers()
        if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
            _fail("no CUDA GPU here: tune on a GPU host, or use the split flow (`pathtune tune build` here, the "
                  "bundle runner on the GPU host). TRITON_INTERPRET=1 runs the kernels in Triton's CPU interpreter "
                  "(tiny shapes only: for tests)")
    opts = _options(storage, db, budget, seed, worker, resume, measure_with, check_len, tol, heartbeat,
                    startup_trials, results_out, spec=spec, compile_workers=compile_workers,
                    seed_neighbours=seed_neighbours, seed_retired=seed_retired, seed_config=seed_config,
                    memory_knobs=memory_knobs, seed_other_gpus=seed_other_gpus, refine=refine, confirm=confirm,
                    confirm_rounds=confirm_rounds)
    tuner = Tuner(keys, opts)
    console.print(f"pathtune tune: {len(keys)} keys, budget {opts.budget}, storage {tuner.db.display_url}, "
                  f"gpu {tuner.env_info.get('gpu_name') or 'none (CPU: Triton interpreter)'}, "
                  f"compile workers {tuner.preparer.workers if tuner.preparer else 0}", highlight=False)
    results: list = []
    code = 0
    try:
        prog_console = err if err.is_terminal else Console(stderr=True, width=240)
        with TuneProgress(len(keys), opts.budget.seconds, console=prog_console) as progress:
            tuner.progress = progress
            results = tuner.run()
    except KeyboardInterrupt:
        _note("interrupted: the running trial was abandoned (flagged; `--resume` re-queues it); everything measured "
              "so far is in perf_db")
        code = 130
    except StudyExistsError as e:
        tuner.close()
        _fail(str(e))
    if results:
        _report(results, report_json)
    if tuner.stop_requested and code == 0:
        _note("stopped after Ctrl-C; continue with the same command plus --resume")
    if tuner.fatal:
        _note(f"stopped: {tuner.fatal}. A candidate that left the GPU unusable is recorded as crash; continue in a "
              "fresh process with --resume")
        code = 3
    tuner.close()
    if code:
        raise typer.Exit(code)


@tune_app.command("build")
def build(
    out: Path = typer.Option(..., "--out", help="Bundle folder to write."),
    gpu_env: Path = typer.Option(..., "--gpu-env", help="`pathtune env --json > env.json` run on the GPU host that "
                                                        "will measure (its env keys the studies and perf_db)."),
    batch: int = typer.Option(8, "--batch", min=1, help="New candidates per key in this bundle."),
    precompile: bool = typer.Option(True, "--precompile/--no-precompile",
                                    help="Compile Triton kernels for sm_90 here and pre-fail configs over the "
                                         "shared-memory limit (TVM modules are always built)."),
    head_dim: str = HEAD_DIM, dtype: str = DTYPE, pass_: str = PASSES, backend: str = BACKEND,
    buckets: str = BUCKETS, gate: bool = GATE, heads: Optional[int] = HEADS, heads_kv: Optional[int] = HEADS_KV,
    tokens: int = TOKENS, storage: Optional[str] = STORAGE, db: Optional[str] = DB, seed: int = SEED,
    check_len: int = CHECK_LEN, tol: Optional[List[str]] = TOL, startup_trials: int = STARTUP,
    spec: Optional[Path] = SPEC, seed_neighbours: int = NEIGHBOURS, seed_retired: int = RETIRED,
    seed_config: Optional[List[str]] = SEED_CONFIG, memory_knobs: bool = MEMORY_KNOBS,
    seed_other_gpus: int = OTHER_GPUS,
) -> None:
    """Propose (Optuna ask) and compile a batch of candidates per key into a self-contained bundle for a GPU host."""
    from pathtune.tuning.bundle import build_bundle
    from pathtune.tuning.tuner import Tuner

    try:
        data = json.loads(gpu_env.read_text())
    except (OSError, json.JSONDecodeError) as e:
        _fail(f"--gpu-env {gpu_env}: {e}")
    env_info = data.get("env", data) if isinstance(data, dict) else None
    if not isinstance(env_info, dict) or "gpu_name" not in env_info:
        _fail(f"--gpu-env {gpu_env} is not `pathtune env --json` output")
    keys = _filter_keys(_keys(head_dim, dtype, pass_, backend, buckets, gate, heads, heads_kv, tokens), local=False)
    opts = _options(storage, db, "1", seed, 0, True, None, check_len, tol, None, startup_trials, env_info=env_info,
                    spec=spec, seed_neighbours=seed_neighbours, seed_retired=seed_retired, seed_config=seed_config,
                    memory_knobs=memory_knobs, seed_other_gpus=seed_other_gpus)
    tuner = Tuner(keys, opts)
    tuner.on_note = _note
    try:
        doc = build_bundle(tuner, out, batch, precompile=precompile,
                           log=lambda s: console.print(s, highlight=False, markup=False))
    finally:
        tuner.close()
    n = len(doc["tasks"])
    console.print(f"wrote {out}/bundle.json: {n} candidates ({doc['answered_from_perf_db']} proposals answered from "
                  f"perf_db). On the GPU host: `bash {out}/run.sh results.json` (or python -m pathtune.tuning.runner "
                  f"{out} --out results.json), then here: pathtune tune ingest results.json", highlight=False)


@tune_app.command("ingest")
def ingest(
    results: List[Path] = typer.Argument(..., exists=True, dir_okay=False, readable=True,
                                         help="Results files written by the bundle runner."),
    storage: Optional[str] = STORAGE, db: Optional[str] = DB,
) -> None:
    """Store bundle results in perf_db and tell the waiting Optuna trials their values."""
    from pathtune.perf_db import PerfDBError, resolve_url
    from pathtune.perf_db._engine import sqlite_file
    from pathtune.tuning.bundle import ingest_results

    try:
        url, _ = resolve_url(storage)
    except PerfDBError as e:
        _fail(str(e))
    path = sqlite_file(url)
    if path is not None and not path.exists():
        _fail(f"no tuning database at {path}: ingest into the one `pathtune tune build` proposed from "
              "(the same --storage)")
    try:
        counts = ingest_results(results, url.render_as_string(hide_password=False), db,
                                log=lambda s: _note(s))
    except PerfDBError as e:
        _fail(str(e))
    console.print(f"ingested {counts['records']} records ({counts['added']} new in perf_db); told {counts['told']} "
                  f"waiting trials", highlight=False)
    console.print(json.dumps(counts), highlight=False, markup=False)


def register(app: typer.Typer) -> None:
    app.add_typer(tune_app, name="tune")
