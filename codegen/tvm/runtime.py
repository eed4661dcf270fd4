"""Running prebuilt TVM modules with only the TVM runtime (no compiler): the GPU-host side.

    load_tvm_runtime("/path/to/tvm_runtime")            # tvm_ffi + libtvm_runtime{,_cuda}.so
    fwd = TVMForward.from_paths(paths, dims, config)   # paths from build.build_kernels (or a bundle)
    o, lse = fwd(q, k, v, w, beta, g, scale=..., cu_seqlens=None)

Needs: the ``apache-tvm-ffi`` wheel (``import tvm_ffi``), and the two runtime libraries of the
apache-tvm wheel (``libtvm_runtime.so``, ``libtvm_runtime_cuda.so``), loaded with RTLD_GLOBAL after
``import tvm_ffi`` and before ``tvm_ffi.load_module``. The folder is an argument; without one it is the
``tvm_runtime`` folder next to the modules (the bundle layout of build_gpu_check.py), else the lib
folder of an installed ``tvm`` package (found without importing it). torch CUDA tensors are passed
directly (DLPack); kernels run on torch's current stream.
"""
from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import shutil
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from .params import KernelDims, TVMParams

__all__ = ["RUNTIME_LIBS", "copy_runtime_libs", "load_tvm_runtime", "runtime_dir_candidates", "load_kernels",
           "TVMForward", "TVMDecode",
           "path_attention_tvm", "path_attention_decode_step_tvm"]

RUNTIME_LIBS = ("libtvm_runtime.so", "libtvm_runtime_cuda.so")
_LOADED: Dict[str, Any] = {}


def copy_runtime_libs(dest: os.PathLike) -> Path:
    """Copy the installed apache-tvm wheel's runtime libraries into ``dest`` (a build host's bundle: the GPU
    host that loads them has no compiler). Raises FileNotFoundError when apache-tvm is not installed."""
    spec = importlib.util.find_spec("tvm")
    if spec is None or not spec.origin:
        raise FileNotFoundError("apache-tvm is not installed here: the TVM runtime libraries come from its wheel "
                                "(pip install 'pathtune[tvm]')")
    lib = Path(spec.origin).resolve().parent / "lib"
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for name in RUNTIME_LIBS:
        shutil.copy2(lib / name, dest / name)
    return dest


def runtime_dir_candidates(near: Optional[os.PathLike] = None) -> Sequence[Path]:
    out = []
    if near is not None:
        p = Path(near).resolve()
        for base in (p, p.parent, p.parent.parent):
            out.append(base / "tvm_runtime")
    spec = importlib.util.find_spec("tvm")
    if spec is not None and spec.origin:
        out.append(Path(spec.origin).parent / "lib")
    return out


def load_tvm_runtime(lib_dir: Optional[os.PathLike] = None, near: Optional[os.PathLike] = None) -> Path:
    """import tvm_ffi, then ctypes-load libtvm_runtime.so and libtvm_runtime_cuda.so (RTLD_GLOBAL)."""
    import tvm_ffi  # noqa: F401  (must come first: the runtime libraries link against libtvm_ffi)

    if "dir" in _LOADED:
        return _LOADED["dir"]
    cands = [Path(lib_dir)] if lib_dir is not None else list(runtime_dir_candidates(near))
    for d in cands:
        if all((d / lib).exists() for lib in RUNTIME_LIBS):
            for lib in RUNTIME_LIBS:
                _LOADED[lib] = ctypes.CDLL(str(d / lib), mode=ctypes.RTLD_GLOBAL)
            _LOADED["dir"] = d
            return d
    raise FileNotFoundError(f"{' and '.join(RUNTIME_LIBS)} not found in "
                            f"{', '.join(map(str, cands)) or '(no candidates)'}; "
                            "pass the folder that holds them (they come from the apache-tvm==0.27.0.post1 wheel)")


def load_kernels(paths: Mapping[str, os.PathLike], lib_dir: Optional[os.PathLike] = None) -> Dict[str, Any]:
    """kernel name -> callable, from exported modules (each module's entry function has the kernel's name)."""
    first = next(iter(paths.values()))
    load_tvm_runtime(lib_dir, near=Path(first).parent)
    import tvm_ffi

    out = {}
    for name, p in paths.items():
        mod = tvm_ffi.load_module(str(p))
        out[name] = mod[name]
    return out


def _meta(path: os.PathLike) -> dict:
    j = Path(path).with_suffix(".json")
    return json.loads(j.read_text()) if j.exists() else {}


class _Pass:
    def __init__(self, kernels: Mapping[str, Any], dims: KernelDims, params: TVMParams,
                 gate_placement: str = "inside_scale"):
        self.kernels = dict(kernels)
        self.dims = dims
        self.params = params
        self.gate_placement = gate_placement

    @classmethod
    def from_paths(cls, paths: Mapping[str, os.PathLike], dims: Optional[KernelDims] = None, config: Any = None,
                   lib_dir: Optional[os.PathLike] = None, gate_placement: str = "inside_scale"):
        """From exported modules; dims and knobs default to the build metadata stored next to them."""
        meta = _meta(next(iter(paths.values())))
        if dims is None:
            dims = KernelDims(**meta["dims"])
        params = TVMParams.from_config(config if config is not None else meta.get("params"))
        return cls(load_kernels(paths, lib_dir), dims, params, gate_placement)


class TVMForward(_Pass):
    """The forward pass (ut -> transport -> scan) of one compiled workload."""

    def __call__(self, q, k, v, w, beta, g=None, *, scale: Optional[float] = None, cu_seqlens=None):
        from . import host

        scale = host.default_scale(q.shape[-1], scale)
        return host.forward(self.kernels, q, k, v, w, beta, g, scale=scale, cu_seqlens=cu_seqlens,
                            params=self.params, dims=self.dims, gate_placement=self.gate_placement)


class TVMDecode(_Pass):
    """One fused decoding step (decode -> decode_merge) on a runtime.reference.PaTHKVCache."""

    def __call__(self, q_t, k_t, v_t, w_t, beta_t, g_t, cache, *, scale: Optional[float] = None):
        from . import host

        scale = host.default_scale(q_t.shape[-1], scale)
        return host.decode_step(self.kernels, q_t, k_t, v_t, w_t, beta_t, g_t, cache, scale=scale,
                                params=self.params, dims=self.dims, gate_placement=self.gate_placement)


_FWD_CACHE: Dict[Tuple, TVMForward] = {}
_DEC_CACHE: Dict[Tuple, TVMDecode] = {}


def _gate_placement() -> str:
    from pathtune.specs import load_spec

    return load_spec().gate_placement


def _pass_for(kind: str, dims: KernelDims, config: Any, module_dir: Optional[os.PathLike], lib_dir, variant: str):
    params = TVMParams.from_config(config)
    cache = _FWD_CACHE if kind == "fwd" else _DEC_CACHE
    key = (dims, params, str(module_dir), variant)
    if key in cache:
        return cache[key]
    from .build import PASS_KERNELS

    if module_dir is not None:
        paths = {n: Path(module_dir) / f"{n}.so" for n in PASS_KERNELS[kind]}
        missing = [str(p) for p in paths.values() if not p.exists()]
        if missing:
            raise FileNotFoundError(f"prebuilt TVM modules missing: {', '.join(missing)}")
    else:
        try:
            from .build import build_kernels
        except ImportError as e:  # pragma: no cover
            raise NotImplementedError(f"no prebuilt modules given and the TVM compiler is unavailable ({e})") from e
        paths = build_kernels(kind, params, dims, variant=variant)
    cls = TVMForward if kind == "fwd" else TVMDecode
    obj = cls(load_kernels(paths, lib_dir), dims, params, _gate_placement())
    cache[key] = obj
    return obj


def path_attention_tvm(q, k, v, w, beta, g=None, *, scale: Optional[float] = None, cu_seqlens=None,
                       config: Any = None, module_dir: Optional[os.PathLike] = None,
                       lib_dir: Optional[os.PathLike] = None, variant: str = "tc"):
    """PaTH(-FoX) attention forward with the TVM backend -> (o, lse).

    q [B,T,HQ,D], k/w [B,T,H,D], v [B,T,H,DV] (bf16/fp16, CUDA), beta [B,T,H], g [B,T,HQ] or None
    (float32). ``config``: the fwd knobs (spec Config or mapping; None = spec defaults).
    ``module_dir``: a folder with prebuilt ut.so/transport.so/scan.so for exactly these dims and knobs
    (GPU host without the TVM compiler); without it the modules are built (and cached) here, which
    needs apache-tvm. Forward only: the result does not support autograd.
    """
    if any(getattr(t, "requires_grad", False) for t in (q, k, v, w, beta, g) if t is not None):
        raise NotImplementedError("the TVM backend implements the forward pass only; backward is not available "
                                  "(use the Triton backend or the reference for training)")
    dims = KernelDims.from_tensors(q, v, k, g)
    fwd = _pass_for("fwd", dims, config, module_dir, lib_dir, variant)
    return fwd(q, k, v, w, beta, g, scale=scale, cu_seqlens=cu_seqlens)


def path_attention_decode_step_tvm(q_t, k_t, v_t, w_t, beta_t, g_t, cache, *, scale: Optional[float] = None,
                                   config: Any = None, module_dir: Optional[os.PathLike] = None,
                                   lib_dir: Optional[os.PathLike] = None):
    """One decoding step with the TVM backend (fused in-place rank-1 cache update + attention).

    Token tensors without a time dim: q_t [B,HQ,D], k_t/w_t [B,H,D], v_t [B,H,DV], beta_t [B,H],
    g_t [B,HQ] or None; ``cache`` a runtime.reference.PaTHKVCache in k's dtype (mutated). -> (o_t, lse).
    """
    H = k_t.shape[1]
    dims = KernelDims(H=int(H), HQ=int(q_t.shape[1]), D=int(q_t.shape[2]), DV=int(v_t.shape[-1]),
                      dtype=str(q_t.dtype).replace("torch.", ""), gated=g_t is not None)
    dec = _pass_for("decode", dims, config, module_dir, lib_dir, "simt")
    return dec(q_t, k_t, v_t, w_t, beta_t, g_t, cache, scale=scale)
