"""`pathtune bench` (registered on the main CLI by pathtune/cli/__init__.py; logic in tuning/bench.py)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import NoReturn, Optional

import typer
from rich.console import Console

from ._output import table_console


def _ints(text: str, what: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise typer.BadParameter(f"{what} must be comma-separated integers, got {text!r}") from None


def register(app: typer.Typer) -> None:
    @app.command("bench")
    def bench(
        head_dim: str = typer.Option("64,128", help="Head dims, comma-separated."),
        seq_len: Optional[str] = typer.Option(
            None, help="Sequence lengths, comma-separated (default 4096,16384; --pass decode: cache lengths "
                       "4096,32768)."),
        tokens: int = typer.Option(32768, help="B*T per point (batch = tokens // seq_len)."),
        gate: str = typer.Option("both", help="FoX gate: off, on or both."),
        config: Optional[str] = typer.Option(None, help="Knob values as JSON, or 'tuned': the public "
                                             "pathtune.path_attention(backend='auto') per shape, host work "
                                             "included, with what its dispatch picks (perf_db, shipped "
                                             "records, pack) (default: built-in heuristic)."),
        baselines: str = typer.Option("sdpa,fla", help="Baselines measured in the same run: sdpa, fla."),
        forward_only: bool = typer.Option(False, "--forward-only", help="Skip forward+backward timings."),
        rounds: Optional[int] = typer.Option(
            None, "--rounds", help="Timing rounds per point (default 3): every callable of a point once per "
                                   "round, the rounds interleaved, the median kept (a transient slowdown moves one "
                                   "sample, not the ratios). --pass fwd only."),
        memory: bool = typer.Option(False, "--memory", help="Also measure each forward+backward call's extra peak "
                                    "memory (pathtune, SDPA, fla; GiB above what was allocated before it). --pass "
                                    "fwd only."),
        out: Optional[Path] = typer.Option(None, "--json", help="Write the rows as JSON here."),
        record: bool = typer.Option(False, "--record", help="Store the measurements in perf_db."),
        db: Optional[str] = typer.Option(None, "--db", envvar="PATHTUNE_DB_URL", help="perf_db URL."),
        pass_: str = typer.Option("fwd", "--pass", help="fwd (forward and forward+backward) or decode "
                                  "(one decoding step over a KV cache; tuning/decode_bench.py)."),
        batch: int = typer.Option(8, help="--pass decode: batch size."),
        new_tokens: str = typer.Option("1", "--new-tokens", help="--pass decode: new tokens per call, comma-separated "
                                       "(each count is its own decode key, e.g. 1,4,16)."),
        sweep: bool = typer.Option(False, "--sweep", help="--pass decode: also time every decode knob config "
                                   "(spec domains) and report the fastest (all recorded with --record)."),
        sweep_knobs: Optional[str] = typer.Option(
            None, "--sweep-knobs", help="--pass decode: sweep only these knob values, JSON {knob: \\[values]} (each "
                                        "in its spec domain), e.g. '{\"decode_splits\": [4, 8]}'; implies --sweep. "
                                        "Precision knobs (decode_pending_window) are swept only when named."),
        backends: str = typer.Option("triton", "--backends", help="pathtune backends to time: triton, tvm "
                                     "(comma-separated; tvm runs the forward from prebuilt modules, see "
                                     "--tvm-modules)."),
        graph: bool = typer.Option(False, "--graph", help="--pass decode: time pathtune's calls and SDPA as CUDA-graph "
                                   "replays (their GPU time without host work: the pick for graph-captured decoding "
                                   "and for short caches, where an eager call is host-bound); fla stays eager."),
        tvm_modules: Optional[Path] = typer.Option(None, "--tvm-modules", help="Folder of TVM modules built for the "
                                                   "bench shapes (pathtune bench-build-tvm), for GPU hosts without the "
                                                   "TVM compiler."),
    ) -> None:
        """Time pathtune against SDPA (flash, cuDNN) and fla's PaTH kernel in the same run (needs a GPU)."""

        from pathtune.tuning.bench import CLI_ROUNDS, command_line, format_table, record_rows, run_bench

        console = table_console(Console(), 240)    # the bench tables have up to 17 columns
        gates = {"off": (False,), "on": (True,), "both": (False, True)}.get(gate)
        if gates is None:
            raise typer.BadParameter(f"--gate must be off, on or both, got {gate!r}")
        if pass_ not in ("fwd", "decode"):
            raise typer.BadParameter(f"--pass must be fwd or decode, got {pass_!r}")
        if config == "tuned" and pass_ == "decode":
            raise typer.BadParameter("--config tuned is for --pass fwd; the decode bench takes JSON knobs")
        try:
            cfg = config if config == "tuned" else (json.loads(config) if config else None)
        except json.JSONDecodeError as e:
            raise typer.BadParameter(f"--config must be JSON knob values or 'tuned': {e}") from None
        only = None
        if sweep_knobs is not None:
            if pass_ != "decode":
                raise typer.BadParameter("--sweep-knobs is for --pass decode")
            from pathtune.tuning.decode_bench import check_sweep_knobs

            try:
                only = check_sweep_knobs(json.loads(sweep_knobs))
            except (json.JSONDecodeError, ValueError) as e:
                raise typer.BadParameter(f"--sweep-knobs: {e}") from None
            sweep = True
        token_counts = _ints(new_tokens, "--new-tokens")
        if token_counts != (1,) and pass_ != "decode":
            raise typer.BadParameter("--new-tokens is for --pass decode")
        if not token_counts or min(token_counts) < 1:
            raise typer.BadParameter(f"--new-tokens must be integers >= 1, got {new_tokens!r}")
        if rounds is not None and pass_ != "fwd":
            raise typer.BadParameter("--rounds is for --pass fwd (the decode bench times each step once)")
        if rounds is not None and rounds < 1:
            raise typer.BadParameter(f"--rounds must be an integer >= 1, got {rounds}")
        if memory and (pass_ != "fwd" or forward_only):
            raise typer.BadParameter("--memory measures forward+backward calls: use it with --pass fwd and without "
                                     "--forward-only")
        if "tvm" in backends and max(token_counts) > 1:
            raise typer.BadParameter("--backends tvm times one token per call: use --new-tokens 1")
        if graph and pass_ != "decode":
            raise typer.BadParameter("--graph is for --pass decode (the fwd bench times eager calls in rounds)")
        if graph and "tvm" in backends:
            raise typer.BadParameter("--graph times the Triton decode step: use --backends triton")
        if record:
            _check_record_db(db)
        if pass_ == "decode":
            _decode(console, _ints(head_dim, "--head-dim"), _ints(seq_len or "4096,32768", "--seq-len"), gates,
                    batch, cfg, tuple(b.strip() for b in baselines.split(",")), out, record, db, sweep,
                    _parse_backends(backends, tvm_modules, "decode"), tvm_modules, only, token_counts, graph)
            return
        seq_len = seq_len or "4096,16384"
        fwd_backends = _parse_backends(backends, tvm_modules, "fwd")
        _run_and_report(
            console,
            lambda on_row: run_bench(_ints(head_dim, "--head-dim"), _ints(seq_len, "--seq-len"), gates,
                                     tokens=tokens, config=cfg,
                                     baselines=tuple(b.strip() for b in baselines.split(",")),
                                     backward=not forward_only, backends=fwd_backends, tvm_modules=tvm_modules,
                                     rounds=CLI_ROUNDS if rounds is None else rounds,
                                     memory=memory,
                                     log=lambda s: console.print(s, style="dim"), on_row=on_row),
            format_table, out,
            record and (lambda rows, run_id: record_rows(rows, db, cfg, command_line(), run_id=run_id)))


def _decode(console, head_dims, cache_lens, gates, batch, cfg, baselines, out, record, db, sweep,
            backends=("triton",), tvm_modules=None, sweep_knobs=None, new_tokens=(1,), graph=False) -> None:
    """`pathtune bench --pass decode` (logic in tuning/decode_bench.py; the TVM step: tuning/decode_tvm.py)."""

    from pathtune.tuning.bench import HEADS_FOR_DIM, command_line
    from pathtune.tuning.decode_bench import format_decode_table, record_decode_rows, run_decode_bench

    if batch < 1:
        raise typer.BadParameter(f"--batch must be >= 1, got {batch}")
    tvm_sets = None
    if "tvm" in backends:
        from pathtune.tuning.decode_tvm import load_sets

        try:
            tvm_sets, stale = load_sets(tvm_modules)
        except ValueError as e:
            raise typer.BadParameter(str(e)) from None
        if stale:
            console.print(f"skipped {len(stale)} TVM module sets built from other kernel sources: "
                          f"{', '.join(stale)}", style="yellow")
    shapes = tuple((HEADS_FOR_DIM.get(d, max(1, 1024 // d)), d) for d in head_dims)
    _run_and_report(
        console,
        lambda on_row: run_decode_bench(shapes, cache_lens, gates, batch=batch, config=cfg, tokens=new_tokens,
                                        baselines=baselines,
                                        sweep=sweep, sweep_knobs=sweep_knobs, backends=backends, tvm_sets=tvm_sets,
                                        graph=graph, log=lambda s: console.print(s, style="dim"), on_row=on_row),
        format_decode_table, out,
        record and (lambda rows, run_id: record_decode_rows(rows, db, command_line(), run_id=run_id)))


def _run_and_report(console, run, format_rows, out, record) -> None:
    """Run a benchmark (``run(on_row)``), print its table, write its rows as JSON (``out``) and store them
    (``record(rows, run_id)``: returns how many measurements it stored; or a false value).  Each row is
    written and stored as soon as it is measured, all into one perf_db run, so a bench that is interrupted
    (Ctrl-C, a time limit) keeps every row it finished; rows not handed over one by one are stored at the end."""
    from dataclasses import asdict

    from sqlalchemy.exc import SQLAlchemyError

    from pathtune.perf_db import PerfDBError, new_run_id

    done, stored, count = [], set(), [0]     # rows so far, ids of the rows stored, measurements stored
    run_id = new_run_id()

    def store(rows) -> None:
        try:
            count[0] += record(rows, run_id)
        except (PerfDBError, SQLAlchemyError, OSError) as e:
            kept = f"; the rows are in {out}" if out else ""
            _fail(f"could not record the measurements: {str(e).splitlines()[0]}{kept}")
        stored.update(id(r) for r in rows)

    def on_row(row) -> None:
        done.append(row)
        if out:
            out.write_text(json.dumps([asdict(r) for r in done], indent=1))
        if record:
            store([row])

    try:
        rows = run(on_row)
    except RuntimeError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(1) from None
    console.print(format_rows(rows))
    if out:
        out.write_text(json.dumps([asdict(r) for r in rows], indent=1))
        console.print(f"wrote {out}")
    if record:
        rest = [r for r in rows if id(r) not in stored]
        if rest:
            store(rest)
        console.print(f"recorded {count[0]} measurements in perf_db")


def _check_record_db(db: Optional[str]) -> None:
    """--record: a database that cannot take the measurements is a one-line error before any GPU time is
    spent (nothing is created here)."""
    from pathtune.perf_db import PerfDBError
    from pathtune.perf_db._engine import write_problem

    try:
        problem = write_problem(db)
    except PerfDBError as e:        # a URL that is not one
        problem = str(e)
    if problem is not None:
        _fail(f"--record: {problem}")


def _fail(message: str) -> NoReturn:
    Console(stderr=True).print(message, style="red", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(1)


_BUILD_HINT = {"fwd": "pathtune bench-build-tvm --head-dim 64,128 --out build/tvm_bench",
               "decode": "python -m pathtune.codegen.tvm.build_decode_bench --out build/tvm_decode_bench"}


def _parse_backends(text: str, tvm_modules: Optional[Path], pass_: str) -> tuple[str, ...]:
    """--backends: triton and/or tvm; tvm needs --tvm-modules (GPU hosts have no TVM compiler: the modules
    are built on a host with apache-tvm and nvcc, by the command in ``_BUILD_HINT``)."""
    from pathtune.tuning.bench import BACKENDS

    names = tuple(dict.fromkeys(b.strip() for b in text.split(",") if b.strip()))
    bad = [b for b in names if b not in BACKENDS]
    if bad or not names:
        raise typer.BadParameter(f"--backends takes triton and/or tvm (comma-separated), got {text!r}")
    if "tvm" in names and tvm_modules is None:
        raise typer.BadParameter(f"--backends tvm times prebuilt TVM modules: pass --tvm-modules DIR, built with "
                                 f"`{_BUILD_HINT[pass_]}`")
    if tvm_modules is not None and "tvm" not in names:
        raise typer.BadParameter("--tvm-modules is only read with --backends ...,tvm")
    return names
