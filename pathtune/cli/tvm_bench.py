"""`pathtune bench-build-tvm` (registered on the main CLI by pathtune/cli/__init__.py; logic in
tuning/tvm_bench.py): the TVM forward modules `pathtune bench --backends tvm --tvm-modules DIR` runs, built
where the TVM compiler is."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console


def register(app: typer.Typer) -> None:
    @app.command("bench-build-tvm")
    def bench_build_tvm(
        head_dim: str = typer.Option("64,128", help="Head dims, comma-separated (heads as `pathtune bench`)."),
        gate: str = typer.Option("both", help="FoX gate: off, on or both."),
        config: Optional[str] = typer.Option(None, help="fwd knob values as JSON over the spec defaults "
                                             "(default: the spec defaults, the TVM backend's untuned config)."),
        out: Path = typer.Option(Path("build/tvm_bench"), "--out", help="Folder to write (sets for other "
                                 "shapes already there are kept)."),
        arch: str = typer.Option("sm_90", help="GPU architecture of the machine code."),
    ) -> None:
        """Build the TVM forward modules `pathtune bench --backends tvm --tvm-modules OUT` runs (needs apache-tvm
        and nvcc, no GPU); carry OUT to the GPU host."""
        import importlib.util

        from pathtune.tuning.bench import command_line
        from pathtune.tuning.tvm_bench import TVMBenchError, bench_dims, build_bench_modules, folder_bytes

        from .bench import _ints

        console = Console()
        gates = {"off": (False,), "on": (True,), "both": (False, True)}.get(gate)
        if gates is None:
            raise typer.BadParameter(f"--gate must be off, on or both, got {gate!r}")
        try:
            knobs = json.loads(config) if config else None
        except json.JSONDecodeError as e:
            raise typer.BadParameter(f"--config must be JSON knob values: {e}") from None
        if knobs is not None and not isinstance(knobs, dict):
            raise typer.BadParameter("--config must be a JSON object of knob values")
        if importlib.util.find_spec("tvm") is None:
            console.print("[red]bench-build-tvm compiles the TVM kernels: it needs apache-tvm 0.27 and nvcc "
                          "(pip install 'pathtune[tvm]'); run it on a build host and carry the folder[/red]")
            raise typer.Exit(1)
        dims = [bench_dims(d, g) for d in _ints(head_dim, "--head-dim") for g in gates]
        try:
            manifest = build_bench_modules(dims, knobs, out, arch=arch, command=command_line(),
                                           log=lambda s: console.print(s, highlight=False, markup=False))
        except ValueError as e:
            raise typer.BadParameter(str(e)) from None
        except TVMBenchError as e:                  # --out holds something else (e.g. a gpu_check bundle)
            console.print(f"[red]{e}[/red]")
            raise typer.Exit(1) from None
        failed = [s["id"] for s in manifest["sets"] if s.get("build_error")]
        console.print(f"{len(manifest['sets'])} module sets in {out} ({folder_bytes(out) / 2**20:.1f} MiB, "
                      f"TVM source hash {manifest['source_hash']})")
        if failed:
            console.print(f"[red]{len(failed)} sets did not build: {', '.join(failed)} (recorded in the manifest; "
                          "the bench reports them as those rows' failures)[/red]")
            raise typer.Exit(1)
