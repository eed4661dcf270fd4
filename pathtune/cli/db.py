"""The perf_db commands of ``pathtune``: query, query overhead, db upgrade|gc|path|dump, export, import, plot.

``register(app)`` adds them to the main Typer app (pathtune/cli/__init__.py). Importing this module loads
typer and rich only; SQLAlchemy and the rest of perf_db load when a command runs.
"""
from __future__ import annotations

import csv
import functools
import io
import json
import re
import sys
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Iterator, NoReturn, Optional, Sequence

import typer
from rich.console import Console
from rich.table import Table

__all__ = ["register", "query_app", "db_app", "plot_app"]

console = Console()
err_console = Console(stderr=True)


class Format(str, Enum):
    table = "table"
    json = "json"
    csv = "csv"


class OnConflict(str, Enum):
    error = "error"
    skip = "skip"


class Order(str, Enum):
    workload = "workload"
    newest = "newest"
    oldest = "oldest"
    fastest = "fastest"


DB_HELP = "Database URL (default: PATHTUNE_DB_URL, else sqlite:///<user data dir>/perf.sqlite3)."
FORMAT_HELP = "Output: table, json or csv."


def _db_opt() -> Any:
    return typer.Option(None, "--db", help=DB_HELP, show_default=False)


def _fmt_opt() -> Any:
    return typer.Option(Format.table, "--format", "-f", help=FORMAT_HELP, case_sensitive=False)


def _fail(message: str) -> NoReturn:
    err_console.print(message, style="red", markup=False, highlight=False, soft_wrap=True)  # one line
    raise typer.Exit(1)


def _note(message: str) -> None:
    err_console.print(message, style="yellow", markup=False, highlight=False, soft_wrap=True)


def _guard(fn: Callable[[], Any], perf: Any = None) -> Any:
    """Run ``fn``; turn perf_db and database errors into a red one-line message and exit 1. ``perf``: the
    database ``fn`` uses, whose lock timeouts are reported as such (with the wait of a read-only reader,
    or of a writer)."""
    from sqlalchemy.exc import SQLAlchemyError

    from pathtune.perf_db._engine import (
        READ_COMMAND_LOCK_WAIT_MS,
        SQLITE_BUSY_TIMEOUT_MS,
        damage_hint,
        is_lock_error,
        locked_message,
    )
    from pathtune.perf_db._errors import PerfDBError

    try:
        return fn()
    except PerfDBError as e:
        _fail(str(e))
    except SQLAlchemyError as e:
        if perf is not None and is_lock_error(e):
            wait = READ_COMMAND_LOCK_WAIT_MS if perf.read_only else SQLITE_BUSY_TIMEOUT_MS
            _fail(locked_message(perf.display_url, wait))
        text = str(getattr(e, "orig", None) or e).splitlines()[0]
        _fail(f"database error: {damage_hint(text)}")


def _current_keys() -> Any:
    """What counts as current here: the dispatcher's rule (the spec hash and each backend's kernel source
    hash of the pass), so that export, query, overhead and gc agree with what the runtime serves."""
    from pathtune.provenance import current_keys

    return current_keys


def _open(db: Optional[str]) -> Any:
    """The database a command that writes uses: created and migrated if need be, given the shipped files."""
    from pathtune.perf_db._store import PerfDB

    return _guard(lambda: PerfDB.open_default(db, current_keys=_current_keys()))


@contextmanager
def _open_read(db: Optional[str], *, shipped: bool = True) -> Iterator[Any]:
    """The database a read command uses: opened so that nothing in it changes (perf_db/_readonly.py), a
    mistyped path refused, with the shipped results it lacks (unless not ``shipped``); closed on exit."""
    from pathtune.perf_db._store import PerfDB

    perf = _guard(lambda: PerfDB.open_read(db, shipped=shipped, current_keys=_current_keys()))
    try:
        for line in perf.read_notes:
            _note(line)
        yield perf
    finally:
        perf.close()


# ---------------------------------------------------------------------------------------------------
# output

def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (dict, list)):
        if isinstance(value, dict):
            return " ".join(f"{k}={v}" for k, v in value.items())
        return "; ".join(map(str, value))
    return str(value)


def _csv_value(value: Any) -> Any:
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return "" if value is None else value


def emit(rows: Sequence[dict[str, Any]], fmt: Format, columns: Sequence[tuple[str, Callable[[dict], Any]]],
         title: str, empty: str, narrow: bool = False) -> None:
    """Print rows as a rich table, JSON (a list of the full row dicts) or CSV (every key, nested as JSON).
    ``narrow``: a table without borders (for columns chosen to fit 80 terminal columns); long cells fold."""
    if fmt == Format.json:
        print(json.dumps(list(rows), indent=2, default=str))
    elif fmt == Format.csv:
        if rows:
            keys = list(dict.fromkeys(k for r in rows for k in r))
            buf = io.StringIO()
            writer = csv.DictWriter(buf, fieldnames=keys, lineterminator="\n")
            writer.writeheader()
            for r in rows:
                writer.writerow({k: _csv_value(r.get(k)) for k in keys})
            sys.stdout.write(buf.getvalue())
    else:
        if rows:
            table = (Table(title=title, box=None, pad_edge=False, header_style="bold") if narrow
                     else Table(title=title))
            for header, _ in columns:
                table.add_column(header, overflow="fold")
            for r in rows:
                table.add_row(*(_cell(fn(r)) for _, fn in columns))
            console.print(table)
    if not rows:
        _note(empty)


def _ms(v: Optional[float]) -> Optional[str]:
    return None if v is None else f"{v:.4f}"


def _length(seq: int, tokens: Optional[int]) -> Any:
    """The length bucket, and for a decode key of several tokens per call their bucket after a '+'
    ("32768+16": a cache of up to 32768 keys, up to 16 new tokens per call)."""
    return seq if not tokens or tokens == 1 else f"{seq}+{tokens}"


QUERY_COLUMNS: list[tuple[str, Callable[[dict], Any]]] = [
    ("id", lambda r: r["id"]),
    ("gpu", lambda r: r["gpu"]),
    ("pass", lambda r: r["pass"]),
    ("backend", lambda r: r["backend"]),
    ("D/DV", lambda r: f"{r['head_dim']}/{r['head_dim_v']}"),
    ("HQ/H", lambda r: f"{r['heads_q']}/{r['heads_kv']}"),
    ("dtype", lambda r: r["dtype"]),
    ("gate", lambda r: r["use_gate"]),
    ("T<=", lambda r: r["seq_bucket"]),
    ("B<=", lambda r: r["batch_bucket"]),
    ("tokens<=", lambda r: r.get("query_bucket", 1)),
    ("status", lambda r: r["status"] + (" (stale)" if r.get("stale") else "")),
    ("median ms", lambda r: _ms(r["median_ms"])),
    ("p20-p80", lambda r: None if r["p20_ms"] is None else f"{r['p20_ms']:.4f}-{r['p80_ms']:.4f}"
     if r["p80_ms"] is not None else None),
    ("baseline ms", lambda r: _ms(r["baseline_ms"])),
    ("ratio", lambda r: None if r["ratio"] is None else f"{r['ratio']:.3f}"),
    ("max err", lambda r: r["max_rel_err"]),
    ("config", lambda r: r["config"]),
    ("run", lambda r: r["run_id"]),
]

def _short_gpu(name: Optional[str]) -> Optional[str]:
    """The GPU's name for the narrow tables: without the vendor and the memory's size and type words
    ("NVIDIA H100 80GB HBM3" -> "H100"; a form factor such as "PCIe" stays); --wide shows the full name."""
    words = (name or "").split()
    if not words:
        return name
    words = words[1:] if words[0] == "NVIDIA" and len(words) > 1 else words
    kept = [w for w in words if not _MEMORY_WORD.fullmatch(w)]
    return " ".join(kept or words)


_MEMORY_WORD = re.compile(r"\d+GB|HBM\w*|GDDR\w*", re.IGNORECASE)


def _dims(r: dict) -> str:
    return str(r["head_dim"]) if r["head_dim"] == r["head_dim_v"] else f"{r['head_dim']}/{r['head_dim_v']}"


# the table without --wide: the columns that tell rows apart and their times (80 terminal columns hold it)
QUERY_NARROW: list[tuple[str, Callable[[dict], Any]]] = [
    ("id", lambda r: r["id"]),
    ("gpu", lambda r: _short_gpu(r["gpu"])),
    ("pass", lambda r: r["pass"]),
    ("backend", lambda r: r["backend"]),
    ("D", _dims),
    ("gate", lambda r: r["use_gate"]),
    ("T<=", lambda r: _length(r["seq_bucket"], r.get("query_bucket"))),
    ("status", lambda r: r["status"] + (" (stale)" if r.get("stale") else "")),
    ("median ms", lambda r: _ms(r["median_ms"])),
    ("ratio", lambda r: None if r["ratio"] is None else f"{r['ratio']:.3f}"),
]

OVERHEAD_COLUMNS: list[tuple[str, Callable[[dict], Any]]] = [
    ("gpu", lambda r: r["gpu"]),
    ("pass", lambda r: r["pass"]),
    ("head_dim", lambda r: r["head_dim"] if r["head_dim"] == r["head_dim_v"] else f"{r['head_dim']}/{r['head_dim_v']}"),
    ("HQ/H", lambda r: f"{r['heads_q']}/{r['heads_kv']}"),
    ("dtype", lambda r: r["dtype"]),
    ("gate", lambda r: r["use_gate"]),
    ("seq_len<=", lambda r: r["seq_len"]),
    ("batch<=", lambda r: r["batch"]),
    ("tokens<=", lambda r: r.get("tokens", 1)),
    ("backend", lambda r: r["backend"]),
    ("pathtune ms", lambda r: _ms(r["pathtune_ms"])),
    ("sdpa ms", lambda r: _ms(r["sdpa_ms"])),
    ("ratio", lambda r: f"{r['ratio']:.2f}x"),
]
OVERHEAD_NARROW: list[tuple[str, Callable[[dict], Any]]] = [
    ("gpu", lambda r: _short_gpu(r["gpu"])),
    ("pass", lambda r: r["pass"]),
    ("D", _dims),
    ("HQ/H", lambda r: f"{r['heads_q']}/{r['heads_kv']}"),
    ("gate", lambda r: r["use_gate"]),
    ("T<=", lambda r: _length(r["seq_len"], r.get("tokens"))),
    ("B<=", lambda r: r["batch"]),
    ("backend", lambda r: r["backend"]),
    ("pathtune ms", lambda r: _ms(r["pathtune_ms"])),
    ("sdpa ms", lambda r: _ms(r["sdpa_ms"])),
    ("ratio", lambda r: f"{r['ratio']:.2f}x"),
]
WIDE_HELP = "Table: every column (config, run, ...); it may be wider than the terminal."


def _filters_text(**filters: Any) -> str:
    given = {k: (v.value if isinstance(v, Enum) else v) for k, v in filters.items() if v is not None}
    return ", ".join(f"{k}={v}" for k, v in given.items()) or "none"


# ---------------------------------------------------------------------------------------------------
# pathtune query [overhead]

query_app = typer.Typer(help="Browse tuning results (perf_db).", invoke_without_command=True,
                        no_args_is_help=False)


@query_app.callback(invoke_without_command=True)
def query_cmd(
    ctx: typer.Context,
    gpu: Optional[str] = typer.Option(None, help="GPU name substring, case-insensitive (e.g. H200)."),
    head_dim: Optional[int] = typer.Option(None, "--head-dim", help="Head dim D of q/k."),
    pass_: Optional[str] = typer.Option(None, "--pass", help="fwd, bwd or decode."),
    backend: Optional[str] = typer.Option(None, help="triton, tvm, sdpa, fla or reference."),
    dtype: Optional[str] = typer.Option(None, help="q/k/v dtype, e.g. bfloat16."),
    status: Optional[str] = typer.Option(None, help="ok, compile_error, out_of_resources, wrong, crash, timeout."),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", help="Length bucket (power of two)."),
    run: Optional[str] = typer.Option(None, "--run", help="Only this run_id."),
    study: Optional[str] = typer.Option(None, "--study", help="Only this Optuna study."),
    env_hash: Optional[str] = typer.Option(None, "--env-hash", help="Environment hash (prefix; see pathtune env)."),
    current: bool = typer.Option(False, "--current", help="Hide stale results (older spec / source)."),
    limit: Optional[int] = typer.Option(None, min=1, help="At most this many rows."),
    order: Order = typer.Option(Order.workload, "--order", help="workload, newest, oldest or fastest."),
    wide: bool = typer.Option(False, "--wide", help=WIDE_HELP),
    fmt: Format = _fmt_opt(),
    db: Optional[str] = _db_opt(),
) -> None:
    """List measurements matching every filter. Subcommand: overhead."""
    if ctx.invoked_subcommand is not None:
        # options given before the subcommand ("pathtune query --db X overhead") carry over to it
        ctx.obj = {"db": db, "gpu": gpu, "pass_": pass_, "fmt": fmt if fmt != Format.table else None, "wide": wide}
        return
    with _open_read(db) as perf:
        rows = _guard(lambda: perf.query(gpu=gpu, head_dim=head_dim, pass_=pass_, backend=backend, dtype=dtype,
                                         status=status, seq_bucket=seq_len, run_id=run, study_name=study,
                                         env_hash=env_hash, include_stale=not current, limit=limit,
                                         order=order.value), perf)
    filters = _filters_text(gpu=gpu, head_dim=head_dim, **{"pass": pass_}, backend=backend, dtype=dtype,
                            status=status, seq_len=seq_len, run=run, study=study, env_hash=env_hash)
    emit(rows, fmt, QUERY_COLUMNS if wide else QUERY_NARROW, f"perf_db measurements ({len(rows)})",
         f"no measurements match (filters: {filters}; db: {perf.display_url})", narrow=not wide)


@query_app.command("overhead")
def overhead_cmd(
    ctx: typer.Context,
    by: str = typer.Option("head_dim", "--by", help="Order and plot by: head_dim, head_dim_v, seq_len, dtype, "
                                                    "gqa_group, heads_q, batch, use_gate."),
    gpu: Optional[str] = typer.Option(None, help="GPU name substring, case-insensitive."),
    pass_: Optional[str] = typer.Option(None, "--pass", help="fwd, bwd or decode."),
    backend: Optional[str] = typer.Option(None, help="Only this pathtune backend (default: triton and tvm)."),
    stale: bool = typer.Option(False, "--stale", help="Include results of older spec / source versions."),
    wide: bool = typer.Option(False, "--wide", help=WIDE_HELP),
    fmt: Optional[Format] = typer.Option(None, "--format", "-f", help=FORMAT_HELP, case_sensitive=False),
    db: Optional[str] = _db_opt(),
) -> None:
    """pathtune vs SDPA measured in the same run, per GPU, head dim, pass, length bucket and backend.

    ratio = pathtune_ms / sdpa_ms (below 1: pathtune is faster). JSON: a list of row dicts.
    """
    parent = ctx.obj or {}
    db = db or parent.get("db")
    gpu = gpu or parent.get("gpu")
    pass_ = pass_ or parent.get("pass_")
    fmt = fmt or parent.get("fmt") or Format.table
    wide = wide or parent.get("wide", False)
    from pathtune.perf_db._keys import DISPATCH_BACKENDS

    backends = (backend,) if backend else DISPATCH_BACKENDS
    with _open_read(db) as perf:
        rows = _guard(lambda: perf.overhead(by=by, gpu=gpu, pass_=pass_, backends=backends, include_stale=stale),
                      perf)
    filters = _filters_text(gpu=gpu, **{"pass": pass_}, backend=backend)
    emit(rows, fmt, OVERHEAD_COLUMNS if wide else OVERHEAD_NARROW, f"pathtune vs SDPA (same run), by {by}",
         f"no measurements match: no ok {'/'.join(backends)} results with a same-run SDPA baseline "
         f"(filters: {filters}; db: {perf.display_url})", narrow=not wide)


# ---------------------------------------------------------------------------------------------------
# pathtune db upgrade | gc | path

db_app = typer.Typer(help="The results database: migrate, prune, locate, dump to a results file.",
                     no_args_is_help=True)


@db_app.command("upgrade")
def db_upgrade(db: Optional[str] = _db_opt()) -> None:
    """Create or migrate the perf_* tables (Alembic, version table perf_alembic_version); idempotent."""
    from pathtune.perf_db._models import VERSION_TABLE
    from pathtune.perf_db._store import PerfDB

    perf = _guard(lambda: PerfDB(db, auto_upgrade=False))
    before = _guard(perf.revision)
    after = _guard(perf.upgrade)
    state = "already at" if before == after else f"upgraded from {before or 'empty'} to"
    console.print(f"{perf.display_url}: {state} revision {after} (version table {VERSION_TABLE})",
                  highlight=False, markup=False)


@db_app.command("path")
def db_path(db: Optional[str] = _db_opt(), fmt: Format = _fmt_opt()) -> None:
    """Where the database is (URL, SQLite file), its schema revision and row counts (read-only)."""
    from pathtune.perf_db._engine import READ_COMMAND_LOCK_WAIT_MS, resolve_url, safe_url, sqlite_file
    from pathtune.perf_db._store import PerfDB

    url, is_default = _guard(lambda: resolve_url(db))
    info: dict[str, Any] = {"url": safe_url(url), "default": is_default, "file": None, "exists": None,
                            "revision": None, "counts": None}
    exists = True
    path = sqlite_file(url)
    if path is not None:
        exists = path.is_file()
        info.update(file=str(path), exists=exists)
    if exists:
        with _guard(lambda: PerfDB(url, read_only=True, lock_wait_ms=READ_COMMAND_LOCK_WAIT_MS)) as perf:
            info["revision"] = _guard(perf.revision, perf)
            if info["revision"]:
                info["counts"] = _guard(perf.counts, perf)
    if fmt == Format.json:
        print(json.dumps(info, indent=2))
        return
    if fmt == Format.csv:
        print("url,file,exists,revision")
        print(f"{info['url']},{info['file'] or ''},{info['exists']},{info['revision'] or ''}")
        return
    console.print(info["url"] + ("  (default)" if is_default else ""), highlight=False, markup=False)
    if info["file"]:
        console.print(f"file: {info['file']}" + ("" if exists else " (not created yet)"), highlight=False,
                      markup=False)
    if info["revision"]:
        counts = ", ".join(f"{k.removeprefix('perf_')} {v}" for k, v in info["counts"].items())
        console.print(f"schema revision {info['revision']}; rows: {counts}", highlight=False, markup=False)
    elif exists:
        console.print("no perf_db tables yet (pathtune db upgrade creates them)", highlight=False, markup=False)


@db_app.command("gc")
def db_gc(
    dry_run: bool = typer.Option(True, "--dry-run/--yes", help="--dry-run (default) only reports; --yes deletes."),
    fmt: Format = _fmt_opt(),
    db: Optional[str] = _db_opt(),
) -> None:
    """Prune results whose hard keys no longer match (spec / source hash; CUDA, ptxas, Triton or TVM
    version of this machine's GPU). Reports first; deletes only with --yes."""
    perf = _open(db)
    report = _guard(lambda: perf.gc(dry_run=dry_run), perf)
    if fmt == Format.json:
        print(json.dumps(report.to_dict(), indent=2, default=str))
        return
    if fmt == Format.csv:
        print("reason,measurements")
        for reason, n in sorted(report.reasons.items()):
            print(f"{reason},{n}")
        return
    if not report.total:
        console.print(f"nothing to prune in {perf.display_url}: every result matches the current keys",
                      highlight=False, markup=False)
        return
    verb = "would delete" if dry_run else "deleted"
    console.print(f"{verb} {report.total} measurements in {perf.display_url}:", highlight=False, markup=False)
    for reason, n in sorted(report.reasons.items()):
        console.print(f"  {n:6d}  {reason}", highlight=False, markup=False)
    orphans = ", ".join(f"{n} {t.removeprefix('perf_')}" for t, n in report.orphans.items() if n)
    if orphans:
        console.print(f"  and the rows left without measurements: {orphans}", highlight=False, markup=False)
    if dry_run:
        console.print("dry run: nothing deleted; run `pathtune db gc --yes` to delete", style="yellow")


def _check_source(perf: Any) -> None:
    """The database a dump reads is opened read-only (``_open_read(db, shipped=False)``): never migrated,
    never given the shipped files (they would end up in the dump), never created; so it must be at the
    schema revision this pathtune reads."""
    from pathtune.perf_db._engine import head_revision

    revision, head = _guard(perf.revision, perf), _guard(head_revision)
    if revision is None:
        _fail(f"{perf.display_url} has no perf_db tables: nothing to dump")
    if revision != head:
        _fail(f"{perf.display_url} is at perf_db schema revision {revision!r}, this pathtune reads {head!r}: run "
              f"`pathtune db upgrade --db {perf.display_url}` first (on a copy, if the file is not yours)")


@db_app.command("dump")
def db_dump(
    out: Path = typer.Option(..., "--out", "-o", help="Results file to write (JSON, RESULTS_FORMAT.md); refused "
                                                      "if it exists, unless --force."),
    backend: Optional[list[str]] = typer.Option(None, "--backend", help="triton, tvm, sdpa, fla, reference "
                                                                        "(repeatable or a comma list)."),
    pass_: Optional[list[str]] = typer.Option(None, "--pass", help="fwd, bwd, decode (repeatable or a comma list)."),
    head_dim: Optional[list[str]] = typer.Option(None, "--head-dim", help="Head dim D of q/k (repeatable or a "
                                                                          "comma list)."),
    gpu: Optional[str] = typer.Option(None, "--gpu", help="GPU name substring, case-insensitive (e.g. H200)."),
    run: Optional[list[str]] = typer.Option(None, "--run", help="run_id (repeatable or a comma list)."),
    status: Optional[list[str]] = typer.Option(None, "--status", help="ok, compile_error, out_of_resources, wrong, "
                                                                      "crash, timeout (default: all)."),
    current_only: bool = typer.Option(False, "--current-only", help="Only results of the kernel code here: spec "
                                      "and kernel source hashes as the runtime dispatcher computes them."),
    baselines: bool = typer.Option(True, "--baselines/--no-baselines",
                                   help="Also write the same-run SDPA measurements that ok kernels without a "
                                        "baseline_ms of their own are compared with."),
    force: bool = typer.Option(False, "--force", help="Replace --out if it exists."),
    fmt: Format = _fmt_opt(),
    db: Optional[str] = _db_opt(),
) -> None:
    """Write measurements of a database (e.g. a GPU session's SQLite file) as a results file.

    The format `pathtune tune --results-out` writes, `pathtune import` reads and perf_db/shipped/ holds.
    Records keep the stored env, kernel key, workload, config and measurement; runs[] the stored runs.
    Importing the file into a fresh database reproduces the same keys and times.
    Importing it into the database it came from adds nothing (every record "already present").
    Refused, nothing written: no measurement matches, a run has no command, --out exists (--force).
    """
    keys = _current_keys() if current_only else None

    if out.exists() and not force:   # before opening anything
        _fail(f"{out} exists; choose another --out, or pass --force to replace it")
    with _open_read(db, shipped=False) as perf:
        _check_source(perf)
        report = _guard(lambda: perf.dump_results(out, backend=backend, pass_=pass_, head_dim=head_dim, gpu=gpu,
                                                  run_id=run, status=status, current_only=current_only,
                                                  current_keys=keys, baselines=baselines, overwrite=force), perf)
    if fmt == Format.json:
        print(json.dumps(report.to_dict(), indent=2))
    elif fmt == Format.csv:
        print("path,records,runs,statuses,backends,passes")
        print(",".join([str(out), str(report.records), ";".join(report.runs)] +
                       [";".join(f"{k}={n}" for k, n in sorted(d.items()))
                        for d in (report.statuses, report.backends, report.passes)]))
    else:
        def counts(d: dict[str, int]) -> str:
            return ", ".join(f"{n} {k}" for k, n in sorted(d.items(), key=lambda kv: (-kv[1], kv[0])))

        console.print(f"wrote {out}: {report.records} records ({counts(report.statuses)}; {counts(report.backends)}; "
                      f"{counts(report.passes)}) of {', '.join(report.gpus)} from {len(report.runs)} run(s) of "
                      f"{perf.display_url}", highlight=False, markup=False)
        for run_id in report.runs:
            console.print(f"  run {run_id}", highlight=False, markup=False)
        if report.baselines_added:
            console.print(f"  with {report.baselines_added} same-run SDPA baseline measurement(s) (--no-baselines "
                          "leaves them out)", highlight=False, markup=False)
        if report.stale_left_out:
            console.print(f"  left out {report.stale_left_out} stale measurement(s) (--current-only)",
                          highlight=False, markup=False)
    for line in report.notes:
        _note(line)


# ---------------------------------------------------------------------------------------------------
# pathtune export / import

def export_cmd(
    gpu: str = typer.Option(..., "--gpu", help="GPU name (substring, case-insensitive) to export."),
    out: Path = typer.Option(..., "-o", "--output", help="Pack file to write (JSON)."),
    env_hash: Optional[str] = typer.Option(None, "--env-hash", help="Environment (prefix) when the GPU has several."),
    tvm_modules: Optional[list[Path]] = typer.Option(
        None, "--tvm-modules", help="Folder of prebuilt TVM modules (repeatable; e.g. a build_decode_bench bundle) to "
        "copy the modules of the pack's TVM decode entries from, into tvm_modules/ beside the pack, where the "
        "runtime finds them. Without them a TVM entry is skipped at runtime (the Triton step runs)."),
    force: bool = typer.Option(False, "--force", help="Replace an existing pack file."),
    fmt: Format = _fmt_opt(),
    db: Optional[str] = _db_opt(),
) -> None:
    """Write the tuned-config pack of one GPU (fastest current config per workload and backend, per-pass default)."""
    from pathtune.perf_db._pack import export_pack

    if gpu.strip() == "":
        _fail("--gpu is empty; give a GPU name or a part of one (pathtune query shows the recorded GPUs)")
    if out.is_dir():
        _fail(f"{out} is a folder; give the pack's file name, e.g. {out / 'pack.json'}")
    if out.exists() and not force:     # before opening anything
        _fail(f"{out} exists; choose another -o, or pass --force to replace it")
    for folder in tvm_modules or ():
        if not folder.is_dir():
            raise typer.BadParameter(f"--tvm-modules {folder} is not a folder")
    with _open_read(db) as perf:
        doc = _guard(lambda: export_pack(perf, gpu, out, env_hash=env_hash), perf)
        envs = _guard(perf.gpus, perf)
    meta = doc["_metadata"]
    summary = {"path": str(out), "gpu": meta["gpu_name"], "env_hash": meta["env_hash"],
               "entries": len(doc["entries"]), "default": {p: d["config"] for p, d in doc["default"].items()}}
    n_tvm = sum(1 for e in doc["entries"] if e["backend"] == "tvm" and e["pass"] == "decode")
    if tvm_modules and n_tvm:
        from pathtune.codegen.tvm.module_store import copy_pack_modules

        copied, missing = copy_pack_modules(doc, tvm_modules, out)
        summary.update(tvm_module_sets=[str(p) for p in copied], tvm_modules_missing=missing)
    if fmt == Format.json:
        print(json.dumps(summary, indent=2))
        return
    console.print(f"wrote {out}: {len(doc['entries'])} entries for {meta['gpu_name']} (cc {meta['cc']}, "
                  f"triton {meta['triton']}, spec {str(meta['spec_hash'])[:12]}, env {meta['env_hash'][:12]})",
                  highlight=False, markup=False)
    for pass_, d in doc["default"].items():
        console.print(f"  default {pass_}: {d['backend']} {_cell(d['config'])} (fastest on {d['wins']} of "
                      f"{d['workloads']} workloads)", highlight=False, markup=False)
    if "tvm_module_sets" in summary:
        console.print(f"  copied {len(summary['tvm_module_sets'])} TVM decode module sets to "
                      f"{Path(out).resolve().parent / 'tvm_modules'}", highlight=False, markup=False)
        for line in summary["tvm_modules_missing"]:
            _note(f"no prebuilt TVM modules for {line} in {', '.join(map(str, tvm_modules))}: that entry is "
                  "skipped at runtime (the Triton step runs); build them (python -m "
                  "pathtune.codegen.tvm.build_decode_bench) and export again")
    elif n_tvm:
        _note(f"{n_tvm} TVM decode entries: the runtime runs them only where their modules are found "
              "(PATHTUNE_TVM_MODULES, or export with --tvm-modules DIR to copy them beside the pack)")
    others = [e for e in envs if e["gpu"] == meta["gpu_name"] and e["env_hash"] != meta["env_hash"]]
    if others:
        _note(f"{len(others)} other environment(s) of {meta['gpu_name']} exist (older Triton/CUDA?); the newest was "
              "exported. Pick another with --env-hash (`pathtune query --gpu ... --format json` lists them).")


def import_cmd(
    files: list[Path] = typer.Argument(..., help="Results files written by a GPU host (RESULTS_FORMAT.md)."),
    on_conflict: OnConflict = typer.Option(OnConflict.error, "--on-conflict",
                                           help="A stored result with different content for the same key: error "
                                                "(default; nothing from that file is stored) or skip."),
    fmt: Format = _fmt_opt(),
    db: Optional[str] = _db_opt(),
) -> None:
    """Ingest results files into the database (idempotent: re-importing a file adds nothing)."""
    perf = _open(db)
    reports = []
    for path in files:
        report = _guard(functools.partial(perf.ingest, path, on_conflict=on_conflict.value), perf)
        reports.append(report.to_dict())
    if fmt == Format.json:
        print(json.dumps(reports, indent=2))
        return
    for r in reports:
        extra = f", {r['skipped']} conflicting kept as stored" if r["skipped"] else ""
        console.print(f"{r['name']}: {r['records']} records, {r['added']} added, {r['identical']} already present"
                      f"{extra}", highlight=False, markup=False)


# ---------------------------------------------------------------------------------------------------
# pathtune plot overhead | history

plot_app = typer.Typer(help="Plots (PNG, SVG or PDF; needs matplotlib, the plot extra of pathtune).",
                       no_args_is_help=True)


@plot_app.command("overhead")
def plot_overhead_cmd(
    out: Path = typer.Option(..., "-o", "--output", help="Image file: .png, .svg or .pdf."),
    by: str = typer.Option("head_dim", "--by", help="x axis: head_dim, seq_len, dtype, ..."),
    gpu: Optional[str] = typer.Option(None, help="GPU name substring."),
    pass_: Optional[str] = typer.Option(None, "--pass", help="fwd, bwd or decode."),
    db: Optional[str] = _db_opt(),
) -> None:
    """pathtune / SDPA time ratio against a workload dimension, one panel per GPU and pass."""
    from pathtune.perf_db._plot import plot_overhead

    with _open_read(db) as perf:
        rows = _guard(lambda: perf.overhead(by=by, gpu=gpu, pass_=pass_), perf)
    _guard(lambda: plot_overhead(rows, by, out))
    console.print(f"wrote {out} ({len(rows)} rows)", highlight=False, markup=False)


@plot_app.command("history")
def plot_history_cmd(
    out: Path = typer.Option(..., "-o", "--output", help="Image file: .png, .svg or .pdf."),
    study: Optional[str] = typer.Option(None, "--study", help="Optuna study name."),
    run: Optional[str] = typer.Option(None, "--run", help="run_id."),
    gpu: Optional[str] = typer.Option(None, help="GPU name substring."),
    head_dim: Optional[int] = typer.Option(None, "--head-dim"),
    pass_: Optional[str] = typer.Option(None, "--pass"),
    backend: Optional[str] = typer.Option(None),
    db: Optional[str] = _db_opt(),
) -> None:
    """Median time per trial and the best so far, per study (or run) and workload."""
    from pathtune.perf_db._plot import plot_history

    with _open_read(db) as perf:
        rows = _guard(lambda: perf.query(study_name=study, run_id=run, gpu=gpu, head_dim=head_dim, pass_=pass_,
                                         backend=backend, order="oldest"), perf)
    _guard(lambda: plot_history(rows, out))
    console.print(f"wrote {out} ({len(rows)} measurements)", highlight=False, markup=False)


def register(app: typer.Typer) -> None:
    """Add the perf_db commands to the ``pathtune`` app."""
    app.add_typer(query_app, name="query")
    app.add_typer(db_app, name="db")
    app.command("export")(export_cmd)
    app.command("import")(import_cmd)
    app.add_typer(plot_app, name="plot")
