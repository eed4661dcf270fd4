"""Find prebuilt TVM decode modules by what they were built for (no TVM import: runs on runtime-only hosts).

A *store* is any folder holding exported modules with their build metadata (``<kernel>.so`` next to
``<kernel>.json``, written by build.py): the compile cache (``<PATHTUNE_CACHE_DIR>/tvm/modules/<key>/``), a
bench bundle (``build/tvm_decode_bench/modules/<set>/``, build_decode_bench.py) or the folder
``pathtune export --tvm-modules`` writes beside a pack. Modules are matched on their metadata -- kernel,
decode knobs, workload dims, spec hash (the decode pass's, or the full spec hash of a module built before
per-pass hashes), kernel source hash (build.source_hash) and GPU arch -- never on
file names, so a module built from other kernel sources or for another GPU is never run.

    found = find_decode_modules(params, dims, "sm_90", store_roots())
    if found: kernels = runtime.load_kernels(found.paths, found.runtime_dir)
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Optional, Sequence

from .params import KernelDims, TVMParams
from .runtime import RUNTIME_LIBS

__all__ = ["ModuleSet", "store_roots", "find_decode_modules", "copy_decode_modules", "copy_pack_modules",
           "pack_decode_sets", "arch_of", "DECODE_KERNELS"]

DECODE_KERNELS = ("decode", "decode_merge")
_MAX_DEPTH = 3          # <root>/<key>/k.json (cache), <root>/modules/<set>/k.json (bundle)
_RUNTIME = "tvm_runtime"


@dataclass(frozen=True)
class ModuleSet:
    """The modules of one decode step: kernel name -> .so, and a folder with the TVM runtime libraries
    found in the store (None: runtime.load_tvm_runtime searches its usual places)."""

    paths: Mapping[str, Path]
    runtime_dir: Optional[Path]


def arch_of(compute_capability: Optional[str]) -> Optional[str]:
    """'9.0' -> 'sm_90' (the arch modules are built for); None for no GPU."""
    if not compute_capability:
        return None
    major, _, minor = str(compute_capability).partition(".")
    return f"sm_{major}{minor or '0'}"


def store_roots(pack_source: Optional[os.PathLike] = None) -> list[Path]:
    """Where to look, in order: PATHTUNE_TVM_MODULES, ``tvm_modules/`` beside a loaded pack, the compile cache."""
    from pathtune import _env

    roots = []
    given = _env.TVM_MODULES.get()
    if given is not None:
        roots.append(Path(given))
    if pack_source is not None and str(pack_source) not in ("", "<pack>", "<export>"):
        roots.append(Path(pack_source).resolve().parent / "tvm_modules")
    roots.append(_env.CACHE_DIR.get() / "tvm" / "modules")
    return [r for r in roots if r.is_dir()]


_INDEX: dict[tuple[str, int], list[tuple[dict, Path]]] = {}


def _index(root: Path) -> list[tuple[dict, Path]]:
    """(metadata, .so path) of every decode kernel module under ``root`` (cached per root and its mtime)."""
    key = (str(root.resolve()), root.stat().st_mtime_ns)
    hit = _INDEX.get(key)
    if hit is not None:
        return hit
    out = []
    base_depth = len(root.parts)
    for dirpath, dirnames, filenames in os.walk(root):
        if len(Path(dirpath).parts) - base_depth >= _MAX_DEPTH:
            dirnames[:] = []
        for name in DECODE_KERNELS:
            if f"{name}.json" in filenames and f"{name}.so" in filenames:
                try:
                    meta = json.loads((Path(dirpath) / f"{name}.json").read_text())
                except (OSError, ValueError):
                    continue
                if isinstance(meta, dict) and meta.get("kernel") == name:
                    out.append((meta, Path(dirpath) / f"{name}.so"))
    _INDEX[key] = out
    return out


def _wanted(params: TVMParams, dims: KernelDims, arch: str) -> dict:
    from pathtune.specs import load_spec

    from .build import source_hash

    return dict(pass_="decode", dims=dims.key(), arch=arch, src=source_hash(),
                spec=load_spec().hashes_of("decode"), knobs=params.decode_dict())


def _matches(meta: dict, want: dict) -> bool:
    if any(meta.get(k) != want[k] for k in ("pass_", "dims", "arch", "src")) or meta.get("spec") not in want["spec"]:
        return False
    stored = meta.get("params") or {}
    return all(stored.get(k) == v for k, v in want["knobs"].items())


def _runtime_dir(so: Path, root: Path) -> Optional[Path]:
    for d in [so.parent, *so.parent.parents]:
        cand = d / _RUNTIME
        if all((cand / lib).exists() for lib in RUNTIME_LIBS):
            return cand
        if d == root:
            break
    return None


def find_decode_modules(params: TVMParams, dims: KernelDims, arch: str, roots: Iterable[os.PathLike]
                        ) -> Optional[ModuleSet]:
    """The decode + decode_merge modules built for these knobs, dims and arch from the current kernel
    sources, from the first store that has both; None when no store has them."""
    want = _wanted(params, dims, arch)
    for root in map(Path, roots):
        if not root.is_dir():
            continue
        found: dict[str, Path] = {}
        for meta, so in _index(root):
            if meta["kernel"] not in found and _matches(meta, want):
                found[meta["kernel"]] = so
        if len(found) == len(DECODE_KERNELS):
            return ModuleSet({n: found[n] for n in DECODE_KERNELS}, _runtime_dir(found["decode"], root))
    return None


def set_name(params: TVMParams, dims: KernelDims, arch: str) -> str:
    """A readable folder name for one module set (content-matched anyway: the name is for people)."""
    import hashlib

    digest = hashlib.sha256(json.dumps(_wanted(params, dims, arch), sort_keys=True).encode()).hexdigest()[:10]
    return (f"dec-H{dims.H}-HQ{dims.HQ}-D{dims.D}-DV{dims.DV}-{dims.dtype}-{'fox' if dims.gated else 'path'}-"
            f"{arch}-{digest}")


def copy_decode_modules(wanted: Sequence[tuple[TVMParams, KernelDims]], arch: str, roots: Sequence[os.PathLike],
                        dest: os.PathLike) -> tuple[list[Path], list[str]]:
    """Copy the module sets of ``wanted`` (knobs, dims) found in ``roots`` to ``dest/<set>/``, plus the TVM
    runtime libraries (``dest/tvm_runtime``) when a store has them. Returns (copied set folders, what was
    not found, one line each)."""
    dest = Path(dest)
    copied, missing = [], []
    runtime = None
    for params, dims in wanted:
        found = find_decode_modules(params, dims, arch, roots)
        if found is None:
            missing.append(f"{dims} with {params.decode_dict()} for {arch}")
            continue
        sub = dest / set_name(params, dims, arch)
        sub.mkdir(parents=True, exist_ok=True)
        for name, so in found.paths.items():
            shutil.copy2(so, sub / f"{name}.so")
            shutil.copy2(so.with_suffix(".json"), sub / f"{name}.json")
        copied.append(sub)
        runtime = runtime or found.runtime_dir
    if copied and runtime is not None:
        (dest / _RUNTIME).mkdir(parents=True, exist_ok=True)
        for lib in RUNTIME_LIBS:
            shutil.copy2(runtime / lib, dest / _RUNTIME / lib)
    return copied, missing


def pack_decode_sets(doc: Mapping) -> list[tuple[TVMParams, KernelDims]]:
    """(knobs, dims) of every TVM decode entry of a pack document (``pathtune export``)."""
    out = []
    for e in doc.get("entries") or []:
        if e.get("backend") != "tvm" or e.get("pass") != "decode":
            continue
        w = e["workload"]
        dims = KernelDims(H=w["heads_kv"], HQ=w["heads_q"], D=w["head_dim"], DV=w["head_dim_v"], dtype=w["dtype"],
                          gated=bool(w["use_gate"]))
        item = (TVMParams.from_config(e["config"]), dims)
        if item not in out:
            out.append(item)
    return out


def copy_pack_modules(doc: Mapping, roots: Sequence[os.PathLike], pack_path: os.PathLike
                      ) -> tuple[list[Path], list[str]]:
    """Copy the modules of a pack's TVM decode entries from ``roots`` into ``tvm_modules/`` beside the pack,
    where the runtime looks (store_roots). Returns (copied set folders, what was not found)."""
    arch = arch_of((doc.get("_metadata") or {}).get("cc"))
    wanted = pack_decode_sets(doc)
    if not wanted:
        return [], []
    if arch is None:
        return [], [f"the pack names no compute capability: cannot tell which arch {len(wanted)} module sets need"]
    return copy_decode_modules(wanted, arch, roots, Path(pack_path).resolve().parent / "tvm_modules")
