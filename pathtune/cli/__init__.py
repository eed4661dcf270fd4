"""The ``pathtune`` command (also ``python -m pathtune``): every subcommand lives in this package.

This module holds ``spec``, ``env`` and ``demo``; ``db``, ``bench``, ``tvm_bench`` and ``tune`` the others,
each registered below with its ``register(app)``. Commands import their heavy dependencies (torch,
Optuna, SQLAlchemy) inside the command functions, so that ``pathtune spec ...`` stays fast. The CLI
is the top layer: it may import every other part of pathtune, and nothing imports it.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, NoReturn, Optional

import typer
from rich.console import Console
from rich.table import Table

from pathtune.specs import KnobSpace, Spec, SpecError, load_spec

app = typer.Typer(
    name="pathtune",
    help="Compiler-driven kernel autotuner for PaTH attention.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)
spec_app = typer.Typer(help="Show, validate and describe the declarative PaTH spec.", no_args_is_help=True)
app.add_typer(spec_app, name="spec")

console = Console()
err_console = Console(stderr=True)


def _fail(message: str) -> NoReturn:
    err_console.print(message, style="red", markup=False, highlight=False)
    raise typer.Exit(1)


def _load(file: Optional[Path]) -> Spec:
    try:
        return load_spec(file)
    except SpecError as e:
        _fail(str(e))


# ---------------------------------------------------------------------------------------------------
# pathtune env

def _fmt_bytes(n: Optional[int]) -> Optional[str]:
    return None if n is None else f"{n / 2**30:.1f} GiB"


@app.command("env")
def env_cmd(as_json: bool = typer.Option(False, "--json", help="Print JSON (machine-readable).")) -> None:
    """GPU, driver, CUDA, ptxas and library versions, and the env key tuning results are stored under."""
    from pathtune import _env
    from pathtune.fingerprint import collect_env, env_hash, env_key

    info = collect_env()
    key = env_key(info)
    settings = {var.name: var.raw() for var in _env.ALL}
    if as_json:
        print(json.dumps({"env": info, "env_key": key, "env_hash": env_hash(info), "settings": settings,
                          "problems": _env.problems()}, indent=2, sort_keys=True))
        return
    table = Table(title="pathtune env", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    for name, value in info.items():
        if name == "gpu_memory_bytes":
            name, value = "gpu_memory", _fmt_bytes(value)
        table.add_row(name, "-" if value is None else str(value))
    table.add_row("env_hash", env_hash(info))
    console.print(table)
    console.print(f"hard keys: {', '.join(k for k in key['hard'])}; soft keys: {', '.join(key['soft'])}",
                  highlight=False)
    set_vars = {k: v for k, v in settings.items() if v is not None}
    console.print("PATHTUNE_* set: " + (", ".join(f"{k}={v}" for k, v in set_vars.items()) or "none (see ENVs.md)"),
                  highlight=False, markup=False)
    for problem in _env.problems():
        console.print(f"problem: {problem}", style="red", highlight=False, markup=False)
    if info["gpu_name"] is None:
        console.print("No CUDA GPU visible: the reference backend runs; Triton kernels, tuning and benchmarks "
                      "need an NVIDIA GPU.", style="yellow")


# ---------------------------------------------------------------------------------------------------
# pathtune spec ...

FileArg = typer.Argument(None, help="Spec YAML (default: the packaged path_attention.yaml).",
                         show_default=False)


def _domain_str(values: Any) -> str:
    return ", ".join(repr(v) if isinstance(v, str) else str(v) for v in values)


@spec_app.command("show")
def spec_show(file: Optional[Path] = FileArg,
              as_json: bool = typer.Option(False, "--json", help="Print the validated spec as JSON.")) -> None:
    """Tensors, stages, knobs (domains, defaults), constraints, the spec hash and each pass's hash."""
    spec = _load(file)
    if as_json:
        print(json.dumps(spec.model_dump(mode="json"), indent=2))
        return
    console.print(f"[bold]{spec.name}[/bold] v{spec.version}   source: {spec.source}", highlight=False)
    console.print(f"spec hash: {spec.hash}", highlight=False)
    # what a pass's records carry: the spec less what only other passes read (Spec.pass_hash)
    for pass_, h in spec.pass_hashes.items():
        console.print(f"  {pass_ + ' hash:':<13} {h}", highlight=False)
    console.print(spec.description, highlight=False, markup=False)

    dims = Table(title="dims")
    for col in ("symbol", "domain", "description"):
        dims.add_column(col)
    for name, d in spec.dims.items():
        dims.add_row(name, _domain_str(d.domain) if d.domain else "any", d.description)
    for rule in spec.dim_rules:
        dims.add_row("", rule.expr, rule.message)
    console.print(dims)

    tensors = Table(title="tensors")
    for col in ("name", "role", "shape", "dtypes", "notes"):
        tensors.add_column(col)
    for name, t in spec.tensors.items():
        if t.same_dtype_as:
            dtypes = f"= {t.same_dtype_as}.dtype"
        else:
            dtypes = ", ".join(t.dtypes) + (f", or {t.or_dtype_of}.dtype" if t.or_dtype_of else "")
        label = name + (" (optional)" if t.optional else "")
        extras = [f"in {t.interval}" if t.interval else "", "unit-norm" if t.unit_norm else ""]
        notes = "; ".join(x for x in [*extras, *(r.message for r in t.requires), t.notes] if x)
        tensors.add_row(label, t.role, "[" + ", ".join(t.shape) + "]", dtypes, notes)
    console.print(tensors)

    stages = Table(title="stages")
    for col in ("name", "kind", "settings", "description"):
        stages.add_column(col)
    for name, s in spec.stages.items():
        fields = {k: v for k, v in s.model_dump().items() if k not in ("kind", "variants")}
        variants = [f"variant {n} ({', '.join(v.passes)})" for n, v in s.variants.items()]
        settings = "\n".join([*(f"{k} = {v}" for k, v in {**fields, **s.doc}.items()), *variants])
        stages.add_row(name, s.kind, settings, s.description)
    console.print(stages)

    knobs = Table(title="knobs")
    for col in ("knob", "type", "domain", "default", "role", "passes"):
        knobs.add_column(col)
    for name, k in spec.knobs.items():
        knobs.add_row(name, k.type, _domain_str(k.domain), _domain_str([k.default]), k.role,
                      ", ".join(spec.knob_passes(name)))
    console.print(knobs)

    constraints = Table(title="constraints")
    for col in ("expression", "applies to", "message"):
        constraints.add_column(col)
    for rule in spec.constraints:
        passes = [p for p in spec.passes if rule in spec.constraints_for(p)]
        constraints.add_row(rule.expr, ", ".join(passes), rule.message)
    console.print(constraints)

    passes = Table(title="passes")
    for col in ("pass", "knobs", "configs", "description"):
        passes.add_column(col)
    for name, p in spec.passes.items():
        passes.add_row(name, ", ".join(p.knobs), f"{KnobSpace(spec, name).size} before constraints", p.description)
    console.print(passes)

    if spec.backends:
        backends = Table(title="backends")
        for col in ("backend", "own knobs", "untuned config by max(D, DV)"):
            backends.add_column(col)
        for name, b in spec.backends.items():
            own = "\n".join(f"{k} ({', '.join(v.passes)}): {_domain_str(v.domain)}, default {v.default}"
                            for k, v in b.knobs.items())
            rows = "\n".join(f"{'<= ' + str(r.up_to) if r.up_to else 'larger'}: "
                              + ", ".join(f"{k}={v}" for k, v in r.knobs.items()) for r in b.head_dim_defaults)
            backends.add_row(name, own, rows)
        console.print(backends)

    n = spec.numerics
    console.print(f"numerics: float32 for {', '.join(n.float32)}; scan operands: knob {n.scan_precision_knob}; "
                  f"beta clip: {n.beta_clip.rule} with eps = knob {n.beta_clip.eps_knob} "
                  f"(reference clips: {n.beta_clip.reference_clips})", highlight=False)
    tolerances = ", ".join(f"{k} {v:g}" for k, v in n.accuracy.tolerances.items())
    console.print(f"accuracy gate ({n.accuracy.metric} vs {n.accuracy.reference} reference): {tolerances}",
                  highlight=False)


@spec_app.command("validate")
def spec_validate(file: Path = typer.Argument(..., help="Spec YAML to check.")) -> None:
    """Exit 0 and print 'valid', or exit 1 with every problem (file, field path, what is allowed)."""
    spec = _load(file)
    console.print(f"{file}: valid ({spec.name} v{spec.version}, hash {spec.hash[:16]})", highlight=False,
                  markup=False)


@spec_app.command("schema")
def spec_schema() -> None:
    """Print the JSON Schema of the spec format."""
    print(json.dumps(Spec.json_schema(), indent=2))


# ---------------------------------------------------------------------------------------------------
# pathtune demo

@app.command("demo")
def demo(
    backend: str = typer.Option("auto", help="auto, reference, triton or tvm."),
    seq_len: int = typer.Option(320, "--seq-len", min=1, help="Tokens per sequence."),
    batch: int = typer.Option(2, min=1),
    heads_q: int = typer.Option(4, "--heads-q", min=1),
    heads_kv: int = typer.Option(2, "--heads-kv", min=1),
    head_dim: int = typer.Option(64, "--head-dim", min=1),
    dtype: Optional[str] = typer.Option(None, help="q/k/v dtype; default bfloat16 on a GPU, float32 on the CPU."),
    seed: int = typer.Option(0),
) -> None:
    """Run PaTH-FoX attention on random inputs with the best backend here; check it against float64."""
    import torch
    import torch.nn.functional as F

    from pathtune.runtime.api import path_attention, resolve_backend
    from pathtune.runtime.reference import naive_path_attention

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype_name = dtype or ("bfloat16" if device.type == "cuda" else "float32")
    torch_dtype = getattr(torch, dtype_name, None)
    if not isinstance(torch_dtype, torch.dtype) or not torch_dtype.is_floating_point:
        _fail(f"--dtype {dtype_name!r} is not a floating dtype; use bfloat16, float16, float32 or float64")
    try:
        chosen, reason = resolve_backend(backend, device)
    except ValueError as e:
        _fail(str(e))

    gen = torch.Generator().manual_seed(seed)
    B, T, HQ, H, D = batch, seq_len, heads_q, heads_kv, head_dim
    shape_kv = (B, T, H, D)
    q = torch.randn(B, T, HQ, D, generator=gen, dtype=torch.float64)
    k = torch.randn(shape_kv, generator=gen, dtype=torch.float64)
    v = torch.randn(shape_kv, generator=gen, dtype=torch.float64)
    w = F.normalize(torch.randn(shape_kv, generator=gen, dtype=torch.float64), dim=-1)
    beta = 1.5 + 0.5 * torch.rand(B, T, H, generator=gen, dtype=torch.float64)        # the hard regime, [1.5, 2)
    g = F.logsigmoid(4.0 + torch.randn(B, T, HQ, generator=gen, dtype=torch.float64))  # forget gates ~0.98

    inputs = [x.to(device) for x in (q, k, v)]
    inputs = [x.to(torch_dtype) for x in inputs] + [x.to(device, torch.float32) for x in (w, beta, g)]
    console.print(f"PaTH-FoX attention: B={B} T={T} HQ={HQ} H={H} D=DV={D}, q/k/v {dtype_name}, "
                  f"w/beta/g float32, beta in [1.5, 2), on {device}", highlight=False)
    console.print(f"backend: {chosen} ({reason})", highlight=False)
    try:
        start = time.perf_counter()
        o = path_attention(*inputs, backend=chosen)
        if device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
    except (ValueError, NotImplementedError) as e:
        _fail(f"path_attention failed: {e}")

    ref = naive_path_attention(q, k, v, w, beta, g)
    err = ((o.double().cpu() - ref).norm() / ref.norm()).item()
    tol = load_spec().numerics.accuracy.tolerances["o"]
    ok = err <= tol
    console.print(f"relative Frobenius error of o vs the float64 naive reference: {err:.2e} "
                  f"(gate {tol:g}) -> " + ("[green]PASS[/green]" if ok else "[red]FAIL[/red]"), highlight=False)
    console.print(f"time: {elapsed * 1e3:.1f} ms (first call; includes compilation for kernel backends)",
                  highlight=False)
    if device.type != "cuda":
        console.print("No CUDA GPU here, so this ran the PyTorch reference backend (the blockwise algorithm the "
                      "kernels implement). The Triton kernels (backend='triton'), tuning and benchmarks need an "
                      "NVIDIA GPU.", style="yellow")
    elif chosen == "reference":
        console.print("A GPU is present but the Triton backend is not available yet, so the reference ran on it.",
                      style="yellow")
    if not ok:
        raise typer.Exit(1)


# ---------------------------------------------------------------------------------------------------
# the other commands, one module each in this package (importing one loads typer and rich only):
# db.py: query [overhead], db upgrade|gc|path|dump, export, import, plot; bench.py: bench;
# tvm_bench.py: bench-build-tvm; tune.py: tune [build|ingest]

from . import bench, db, tune, tvm_bench  # noqa: E402

db.register(app)
bench.register(app)
tvm_bench.register(app)
tune.register(app)


def main() -> None:
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
