"""The TVM column of ``pathtune bench``: forward module sets built here, run on a GPU host without the compiler.

Build host (apache-tvm 0.27 + nvcc, no GPU): ``pathtune bench-build-tvm --head-dim 64,128 --out build/tvm_bench``
writes, per (head dim, gate) of the bench's shapes (``inputs.HEADS_FOR_DIM`` heads, bf16),
``OUT/<set id>/{ut,transport,scan}.so`` (+ their build metadata), ``OUT/tvm_runtime/`` (the two runtime
libraries of the wheel that built them) and ``OUT/manifest.json`` (dims, knobs, TVM source hash, arch).

GPU host (torch, triton, ``tvm_ffi``): ``pathtune bench --backends triton,tvm --tvm-modules OUT`` opens the
folder (``TVMBenchModules.open``), checks up front that every row has a current set (``require``), and times
each row's forward (``measure_row``): accuracy vs the float64 oracle first, then the do_bench median of the
whole forward and of each kernel alone (``tvm_stages``); then (``profile_row``) both forwards' kernel device
times from torch.profiler (``tvm_profile``, ``triton_stages``), which is where the TVM / Triton gap is.
"""
from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

__all__ = ["TVMBenchError", "TVMBenchModules", "TVMModuleSet", "bench_dims", "build_bench_modules", "fwd_config",
           "measure_row", "profile_row", "device_kernel_ms", "folder_bytes", "set_id"]

MANIFEST = "manifest.json"
FORMAT = "pathtune-tvm-bench"
DTYPE = "bfloat16"


class TVMBenchError(RuntimeError):
    """The TVM column cannot run (no folder, no runtime, a missing or stale module set): says what to fix."""


def build_command(head_dims: Sequence[int], gates: Sequence[bool], folder: Any) -> str:
    gate = "both" if len(set(gates)) == 2 else ("on" if gates[0] else "off")
    return (f"pathtune bench-build-tvm --head-dim {','.join(map(str, sorted(set(head_dims))))} --gate {gate} "
            f"--out {folder}")


def bench_dims(head_dim: int, gated: bool) -> Any:
    """KernelDims of a bench row: the bench's heads for this head dim, MHA, bf16."""
    from pathtune.codegen.tvm.params import KernelDims

    from .inputs import HEADS_FOR_DIM

    H = HEADS_FOR_DIM.get(head_dim, max(1, 1024 // head_dim))
    return KernelDims(H=H, HQ=H, D=head_dim, DV=head_dim, dtype=DTYPE, gated=gated)


def set_id(dims: Any) -> str:
    heads = f"H{dims.H}" if dims.H == dims.HQ else f"H{dims.H}-HQ{dims.HQ}"
    return f"fwd-D{dims.D}-{heads}-{dims.dtype}-{'fox' if dims.gated else 'path'}"


def fwd_config(knobs: Optional[Mapping[str, Any]], dims: Any) -> dict:
    """The spec's fwd Config with ``knobs`` over its defaults (the form the tuner keys TVM records by);
    ValueError naming every knob that is not a valid fwd knob value for these dims."""
    from pathtune.specs import Config, KnobSpace, load_spec

    space = KnobSpace(load_spec(), "fwd")
    values = {**space.default().to_dict(), **dict(knobs or {})}
    try:
        config = Config(values)
    except (TypeError, ValueError) as e:
        raise ValueError(f"--config is not a valid fwd config: {e}") from None
    problems = space.validate(config, {"D": dims.D, "DV": dims.DV})
    if problems:
        raise ValueError("--config is not a valid fwd config of the spec: " + "; ".join(problems))
    return config.to_dict()


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())


# ---------------------------------------------------------------------------------------------------
# build host

def build_bench_modules(dims_list: Sequence[Any], knobs: Optional[Mapping[str, Any]], out: Path, *,
                        arch: str = "sm_90", command: str = "", log: Callable[[str], None] = print) -> dict:
    """Build the forward modules of every dims in ``dims_list`` with ``knobs`` into ``out`` (see module doc).

    Sets already in ``out`` for other dims are kept if built from the same TVM sources for the same arch (stale
    ones are dropped: the manifest's source hash must hold for every set); a set whose build fails is recorded with its
    ``build_error`` (the bench reports it as that row's failure). Returns the manifest."""
    import tvm

    from pathtune.codegen.tvm.build import build_kernels, source_hash
    from pathtune.codegen.tvm.runtime import copy_runtime_libs
    from pathtune.specs import load_spec

    from .measure import classify_exception

    configs = [fwd_config(knobs, dims) for dims in dims_list]      # a bad --config fails before anything is written
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    old = _read_manifest(out) if (out / MANIFEST).exists() else {}
    src = source_hash()
    sets = {}
    for entry in old.get("sets", []):
        if old.get("arch") == arch and old.get("source_hash") == src:
            sets[entry["id"]] = entry
        else:
            shutil.rmtree(out / entry["id"], ignore_errors=True)
            log(f"[build] {entry['id']}: dropped (built from other TVM sources or for another arch)")
    for dims, config in zip(dims_list, configs):
        sid = set_id(dims)
        entry = dict(id=sid, dims=dims.key(), config=config, knobs=dict(knobs or {}))
        t0 = time.time()
        try:
            paths = build_kernels("fwd", config, dims, arch=arch, log=log)
        except Exception as exc:  # noqa: BLE001 -- recorded: the bench shows it as the row's failure
            status, message = classify_exception(exc)
            sets[sid] = dict(entry, build_error=message, status=status)
            log(f"[build] {sid}: FAILED {message[:300]}")
            continue
        dst = out / sid
        shutil.rmtree(dst, ignore_errors=True)
        dst.mkdir(parents=True)
        for name, p in paths.items():
            shutil.copy2(p, dst / f"{name}.so")
            shutil.copy2(Path(p).with_suffix(".json"), dst / f"{name}.json")
        sets[sid] = dict(entry, kernels={n: f"{sid}/{n}.so" for n in paths})
        log(f"[build] {sid}: {time.time() - t0:.1f} s")
    copy_runtime_libs(out / "tvm_runtime")
    manifest = dict(format=FORMAT, version=1, arch=arch, tvm=str(tvm.__version__),
                    spec_hash=load_spec().pass_hash("fwd"), source_hash=src, command=command,
                    sets=sorted(sets.values(), key=lambda s: s["id"]))
    tmp = out / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    tmp.replace(out / MANIFEST)
    return manifest


def _read_manifest(folder: Path) -> dict:
    try:
        doc = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError) as e:
        raise TVMBenchError(f"cannot read {folder / MANIFEST} ({e}); rebuild the folder with "
                            f"`pathtune bench-build-tvm --out {folder}`") from None
    if doc.get("format") != FORMAT:
        raise TVMBenchError(f"{folder / MANIFEST} is not a bench module folder (format {doc.get('format')!r}, want "
                            f"{FORMAT!r}; gpu_check bundles are not): build one with `pathtune bench-build-tvm --out "
                            f"{folder}`")
    return doc


# ---------------------------------------------------------------------------------------------------
# GPU host

@dataclass
class TVMModuleSet:
    """One built forward (ut -> transport -> scan) for one dims; ``kernels`` are callables (loaded modules,
    or emulated kernels in the CPU tests)."""

    id: str
    dims: Any                      # KernelDims
    config: dict                   # the spec fwd Config it was built with (what perf_db records)
    kernels: Mapping[str, Callable]
    where: str = ""
    params: Any = field(init=False)

    def __post_init__(self):
        from pathtune.codegen._knobs import resolve
        from pathtune.codegen.tvm.runtime import TVMForward, _gate_placement

        self.params = resolve("tvm", "fwd", self.config, (self.dims.D, self.dims.DV))
        self._gate_placement = _gate_placement()
        self._forward = TVMForward(self.kernels, self.dims, self.params, self._gate_placement)

    def forward(self, q, k, v, w, beta, g, kernels: Optional[Mapping[str, Callable]] = None):
        """(o, lse) as ``path_attention_tvm`` computes them (runtime.TVMForward: the host code of codegen/tvm/host.py
        around the kernels), resolved once here so the timed call holds no lookups."""
        fwd = self._forward if kernels is None else type(self._forward)(kernels, self.dims, self.params,
                                                                        self._gate_placement)
        return fwd(q, k, v, w, beta, g)

    def stage_ms(self, xs: Sequence[Any], timer: Callable[[Callable[[], Any]], float]) -> dict[str, float]:
        """Each kernel of one forward on ``xs`` timed alone (its launch replayed on the arguments the host code
        gave it); kernels the host skips (transport when every sequence fits one super-chunk) are absent."""
        seen: dict[str, tuple] = {}

        def spy(name):
            def call(*args):
                seen[name] = args
                return self.kernels[name](*args)
            return call

        self.forward(*xs, kernels={n: spy(n) for n in self.kernels})
        return {name: timer(lambda name=name: self.kernels[name](*seen[name])) for name in self.kernels if name in seen}


class TVMBenchModules:
    """A folder from ``build_bench_modules``, opened with only the TVM runtime."""

    def __init__(self, folder: Path, manifest: dict):
        self.folder = Path(folder)
        self.manifest = manifest
        self.sets = {s["id"]: s for s in manifest.get("sets", [])}
        self._loaded: dict[str, TVMModuleSet] = {}

    @classmethod
    def open(cls, folder: Any, runtime_dir: Optional[Any] = None) -> "TVMBenchModules":
        folder = Path(folder)
        if not (folder / MANIFEST).exists():
            raise TVMBenchError(f"--tvm-modules {folder}: no {MANIFEST} there. Build the module sets on a host with "
                                f"apache-tvm and nvcc (`pathtune bench-build-tvm --head-dim 64,128 --out {folder}`) "
                                "and carry the folder to the GPU host")
        mods = cls(folder, _read_manifest(folder))
        mods._load_runtime(runtime_dir)
        return mods

    def _load_runtime(self, runtime_dir: Optional[Any]) -> None:
        try:
            import tvm_ffi  # noqa: F401
        except ImportError as e:
            raise TVMBenchError(f"--backends tvm needs the TVM runtime, but `import tvm_ffi` failed ({e}). Install "
                                "the apache-tvm-ffi==0.1.14.post1 wheel (GPU host: pip install --no-deps "
                                ".whl/apache_tvm_ffi-*.whl; else pip install 'pathtune[tvm]')") from None
        from pathtune.codegen.tvm.runtime import RUNTIME_LIBS, load_tvm_runtime

        try:
            load_tvm_runtime(runtime_dir, near=self.folder)
        except (FileNotFoundError, OSError) as e:
            raise TVMBenchError(f"--backends tvm: cannot load the TVM runtime libraries ({e}). They are "
                                f"{' and '.join(RUNTIME_LIBS)} (in {self.folder / 'tvm_runtime'}, written by "
                                "bench-build-tvm) and need the NVIDIA driver's libcuda.so.1 (run on the GPU "
                                "host)") from None

    def require(self, head_dims: Sequence[int], gates: Sequence[bool], device: Any = None) -> None:
        """Every row's set is in the folder, built from this pathtune's TVM sources for this GPU's arch."""
        from pathtune.codegen.tvm.build import source_hash

        want = [set_id(bench_dims(D, gate)) for D in head_dims for gate in gates]
        missing = [s for s in want if s not in self.sets]
        if missing:
            raise TVMBenchError(f"--tvm-modules {self.folder} has no module set for {', '.join(missing)} (it has: "
                                f"{', '.join(sorted(self.sets)) or 'none'}). Build them on a host with apache-tvm: "
                                f"{build_command(head_dims, gates, self.folder)}")
        built, here = self.manifest.get("source_hash"), source_hash()
        if built != here:
            raise TVMBenchError(f"--tvm-modules {self.folder} was built from other TVM kernel sources (source hash "
                                f"{built}, this pathtune's: {here}): rebuild it from this checkout with "
                                f"{build_command(head_dims, gates, self.folder)}")
        arch = self.manifest.get("arch")
        import torch

        if getattr(device, "type", str(device)) == "cuda" and torch.cuda.is_available():   # (no GPU: bench says so)
            major, minor = torch.cuda.get_device_capability()
            if arch != f"sm_{major}{minor}":
                raise TVMBenchError(f"--tvm-modules {self.folder} holds {arch} machine code, this GPU is "
                                    f"sm_{major}{minor}: rebuild with --arch sm_{major}{minor}")

    def load(self, head_dim: int, gated: bool) -> TVMModuleSet:
        """The row's set, loaded (RuntimeError with the build error for a set that failed to build)."""
        from pathtune.codegen.tvm.params import KernelDims

        sid = set_id(bench_dims(head_dim, gated))
        if sid not in self._loaded:
            entry = self.sets[sid]
            if entry.get("build_error"):
                raise RuntimeError(f"module set {sid} did not build: {entry['build_error']}")
            dims = KernelDims(**entry["dims"])
            self._loaded[sid] = TVMModuleSet(sid, dims, entry["config"], self._kernels(entry, dims),
                                             where=f"modules {self.folder / sid}")
        return self._loaded[sid]

    def _kernels(self, entry: dict, dims: Any) -> Mapping[str, Callable]:
        """kernel name -> callable of a set (the exported modules through the TVM runtime)."""
        from pathtune.codegen.tvm.runtime import load_kernels

        return load_kernels({n: self.folder / p for n, p in entry["kernels"].items()})

    def config_for(self, head_dim: int, gated: bool) -> Optional[dict]:
        entry = self.sets.get(set_id(bench_dims(head_dim, gated)))
        return None if entry is None else entry.get("config")

    def build_status(self, head_dim: int, gated: bool) -> Optional[str]:
        """The perf_db status of a set that failed to build (None when it built)."""
        entry = self.sets.get(set_id(bench_dims(head_dim, gated))) or {}
        return entry.get("status") if entry.get("build_error") else None


# ---------------------------------------------------------------------------------------------------
# one row

def measure_row(row: Any, xs: Sequence[Any], modules: Any, *, timer: Callable[[Callable[[], Any]], float],
                check_len: int = 1024) -> None:
    """The TVM forward of one bench row (inputs ``xs``): accuracy gate, time, per-stage times; fills
    ``row.times["tvm_f"]``, ``row.errors["tvm_o"]``, ``row.tvm_stages``, ``row.configs["tvm"]``,
    ``row.statuses["tvm"]``, or on any failure ``row.failures["tvm"]`` (never raises)."""
    import torch

    from pathtune.specs import load_spec

    from .measure import classify_exception, gate_tokens, oracle_errors, oracle_kv_heads

    row.configs["tvm"] = modules.config_for(row.head_dim, row.gate)
    try:
        mset = modules.load(row.head_dim, row.gate)
        row.dispatch["tvm"] = mset.where
        n = min(xs[0].shape[1], gate_tokens(mset.params.superchunk_size, xs[0].shape[1], check_len))
        head = [None if x is None else x[:1, :n] for x in xs]
        err = oracle_errors(lambda *a: mset.forward(*a)[0], head, backward=False,
                            heads=oracle_kv_heads(xs[1].shape[2], 2), seed=1)["o"]
        row.errors["tvm_o"] = err
        tol = load_spec().numerics.accuracy.tolerances.get("o")
        if not math.isfinite(err) or (tol is not None and err > tol):
            row.statuses["tvm"] = "wrong"
            row.failures["tvm"] = f"accuracy gate: o error {err:.3g} vs the float64 oracle > {tol:g}"
            return
        with torch.no_grad():
            row.times["tvm_f"] = timer(lambda: mset.forward(*xs))
            row.tvm_stages = mset.stage_ms(xs, timer)
        row.tvm_stages["host"] = max(0.0, row.times["tvm_f"] - sum(row.tvm_stages.values()))
        row.statuses["tvm"] = "ok"
    except Exception as exc:  # noqa: BLE001 -- a failing module is the row's recorded status, not a crash
        status, message = classify_exception(exc)
        row.statuses["tvm"] = modules.build_status(row.head_dim, row.gate) or status
        row.failures["tvm"] = message[:300]


def profile_row(row: Any, xs: Sequence[Any], modules: Any, triton_fn: Optional[Callable[[], Any]]) -> None:
    """Device ms per kernel of one TVM forward (``row.tvm_profile``) and one Triton forward (``triton_stages``)
    of a row, from torch.profiler: kernel time without launch overhead, the same measure for both. Run after
    all timings (the profiler must not be live while do_bench measures). Diagnostic: errors are noted."""
    tvm_fn = None if "tvm" in row.failures else (lambda: modules.load(row.head_dim, row.gate).forward(*xs))
    fns = {"tvm_profile": tvm_fn, "triton_stages": triton_fn}
    for name, fn in fns.items():
        if fn is None:
            continue
        try:
            setattr(row, name, device_kernel_ms(fn))
        except Exception as exc:  # noqa: BLE001 -- the breakdown explains the times; they stand without it
            setattr(row, name, {"error": f"{type(exc).__name__}: {str(exc)[:200]}"})


def device_kernel_ms(fn: Callable[[], Any], reps: int = 5) -> dict[str, float]:
    """Device ms per kernel name of one ``fn()`` (torch.profiler, mean over ``reps`` calls after a warm-up)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad():
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                fn()
            torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        if e.device_time_total > 0:
            out[e.key[:60]] = round(e.device_time_total / 1000 / reps, 4)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))
