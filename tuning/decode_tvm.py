"""The TVM decode step in `pathtune bench --pass decode --backends triton,tvm --tvm-modules DIR`.

The GPU host has the TVM runtime (tvm_ffi + two runtime libraries) but no TVM compiler, so the modules come
prebuilt: `python -m pathtune.codegen.tvm.build_decode_bench --out DIR` builds one set (decode + decode_merge)
per bench shape, FoX gate and layout, and DIR/manifest.json lists them. For each bench row every set built
for the row's shape is checked like the Triton step (one step on a copy of batch 0 vs the float64 reference,
decode_bench.accuracy) and timed like it (do_bench median of the eager call with the cache length reset each
call), running ``TVMDecode`` -- what runtime/decode.py runs when the dispatcher picks TVM. The fastest accurate
set is the row's ``tvm`` time; with --record every set is a perf_db measurement (pass decode, backend tvm) whose
config is the spec's decode knobs plus the TVM-local layout knobs (codegen/tvm/params.py), under the TVM kernel
source hash (codegen/tvm/build.py).
"""
from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

__all__ = ["TVMSet", "load_sets", "record_config", "time_tvm"]

_BUILD_HINT = "build them with `python -m pathtune.codegen.tvm.build_decode_bench --out {dir}` (apache-tvm + nvcc)"


@dataclass(frozen=True)
class TVMSet:
    """One prebuilt decode module set: its manifest id, knobs, the dims it was compiled for, kernel paths."""

    id: str
    knobs: Mapping[str, Any]
    dims: Any                      # codegen.tvm.params.KernelDims
    paths: Mapping[str, Path]
    runtime_dir: Optional[Path]

    def fits(self, heads: int, head_dim: int, gate: bool, dtype: str = "bfloat16") -> bool:
        d = self.dims
        return (d.H, d.HQ, d.D, d.DV, d.gated, d.dtype) == (heads, heads, head_dim, head_dim, gate, dtype)


def load_sets(folder) -> tuple[list[TVMSet], list[str]]:
    """The decode sets of a module folder built from the current kernel sources, and the ids skipped as
    stale (built from other sources: their times would be recorded under the wrong source hash).
    Raises ValueError saying what to do when the folder cannot be used."""
    from pathtune.codegen.tvm.build import source_hash
    from pathtune.codegen.tvm.params import KernelDims

    folder = Path(folder)
    manifest = folder / "manifest.json"
    if not manifest.is_file():
        raise ValueError(f"--tvm-modules {folder}: no manifest.json there; " + _BUILD_HINT.format(dir=folder))
    if importlib.util.find_spec("tvm_ffi") is None:
        raise ValueError("--backends tvm needs the TVM runtime: pip install the apache-tvm-ffi wheel "
                         "(pathtune[tvm] pins it; the GPU host's .whl/ has it)")
    src = source_hash()
    sets, stale = [], []
    for e in json.loads(manifest.read_text()).get("sets", []):
        if e.get("pass_") != "decode" or e.get("build_error") or not e.get("kernels"):
            continue
        paths = {n: folder / p for n, p in e["kernels"].items()}
        built_from = {json.loads(p.with_suffix(".json").read_text()).get("src") for p in paths.values()}
        if built_from != {src}:
            stale.append(e["id"])
            continue
        runtime = folder / "tvm_runtime"
        sets.append(TVMSet(e["id"], dict(e["knobs"]), KernelDims(**e["dims"]), paths,
                           runtime if runtime.is_dir() else None))
    if not sets:
        why = f" ({len(stale)} built from other kernel sources)" if stale else ""
        raise ValueError(f"--tvm-modules {folder}: no decode module set built from the current TVM kernel sources"
                         f"{why}; " + _BUILD_HINT.format(dir=folder))
    return sets, stale


def record_config(knobs: Mapping[str, Any]) -> dict:
    """The full config a TVM decode record stores: every spec decode knob (the spec default where the set does
    not say; decode_num_stages is not read by the TVM step) plus every TVM-local decode knob (0 = auto)."""
    from pathtune.specs import KnobSpace, load_spec

    spec = load_spec()
    space = KnobSpace(spec, "decode")
    out = space.default().to_dict()
    out.update({k: v for k, v in knobs.items() if k in space.knobs})
    local = spec.backend_knobs("tvm", "decode")
    out.update({k: int(knobs.get(k, knob.default)) for k, knob in local.items()})
    return out


def load_step(s: TVMSet):
    """The TVM decode step of a set (TVMDecode over its loaded modules)."""
    from pathtune.codegen._knobs import resolve
    from pathtune.codegen.tvm.runtime import TVMDecode, load_kernels

    params = resolve("tvm", "decode", s.knobs, (s.dims.D, s.dims.DV))
    return TVMDecode(load_kernels(s.paths, s.runtime_dir), s.dims, params)


def time_tvm(row, cache, step, sets, keys0, *, median_ms: Callable, log: Callable[[str], None],
             accuracy: Callable[..., dict], limit: float, loader: Callable[[TVMSet], Any] = load_step) -> None:
    """Check and time every set built for ``row``'s shape (entries in ``row.tvm_sweep``); the fastest accurate
    one becomes ``row.times["tvm"]`` and ``row.tvm_params``; none: ``row.failures["tvm"]`` says why.

    ``accuracy(cache, step, None, decode=fn) -> {"o": rel. error, ...}`` and ``limit`` (the largest accepted
    error of o): the bench's float64 check (decode_bench.accuracy, ACCURACY_LIMIT), passed in by the bench."""
    fitting = [s for s in sets if s.fits(row.heads, row.head_dim, row.gate)]
    if not fitting:
        row.failures["tvm"] = f"no TVM module set built for H{row.heads} D{row.head_dim} gate={row.gate}"
        return
    tokens = [None if x is None else x[:, 0] for x in step]
    best = None
    for s in fitting:
        cache.k.copy_(keys0)      # every set starts from the same keys (timed calls shrink them along w_t)
        cache.length = row.cache_len
        entry = {"set": s.id, "config": record_config(s.knobs), "ms": None, "error": "", "errors": {}}
        try:
            tvm = loader(s)

            def one(xs, sub, tvm=tvm):
                return tvm(*[None if x is None else x[:, 0] for x in xs], sub)[0][:, None]

            entry["errors"] = accuracy(cache, step, None, decode=one)
            if not entry["errors"]["o"] < limit:
                raise RuntimeError(f"accuracy check failed: o error {entry['errors']['o']:.3g} >= {limit}")
            T = row.cache_len

            def run(tvm=tvm):
                cache.length = T  # fixed key length: the new token is written at row T every call
                return tvm(*tokens, cache)

            entry["ms"] = median_ms(run)
        except Exception as exc:  # a failing set is a recorded status, not a crash
            entry["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        row.tvm_sweep.append(entry)
        log(f"  tvm {s.id}: {entry['ms'] if entry['ms'] is not None else entry['error']}")
        if entry["ms"] is not None and (best is None or entry["ms"] < best["ms"]):
            best = entry
    cache.k.copy_(keys0)
    cache.length = row.cache_len
    if best is None:
        row.failures["tvm"] = next(e["error"] for e in row.tvm_sweep if e["error"])
        return
    row.times["tvm"] = best["ms"]
    row.tvm_params = dict(best["config"], set=best["set"])
