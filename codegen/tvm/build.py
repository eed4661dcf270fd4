"""Lower the spec to TVM kernels and build them: for the GPU (exported, cached modules) or the CPU.

    paths = build_kernels("fwd", config, KernelDims(H=8, HQ=8, D=128, DV=128, dtype="bfloat16"))
    # -> {"ut": ".../ut.so", "transport": ".../transport.so", "scan": ".../scan.so"}

A build needs no GPU: nvcc compiles each kernel to sm_XX machine code embedded in the exported
module (toolchain.py), and a module that came out source-only is an error. Modules are cached under
<PATHTUNE_CACHE_DIR>/tvm/modules/<key>/ where key is a content hash of (the pass's spec hash
``Spec.pass_hash``, the pass's knobs, TVM version, arch, workload dims, kernel variant, this package's
source), so a change to any of them rebuilds; a change to another pass's part of the spec does not.

Kernels per pass: fwd = ut, transport, scan; decode = decode, decode_merge. The scan has two
variants: "tc" (TIRx, mma.sync tensor cores; the default) and "simt" (the S-TIR stage with the
CUDA-core schedule). The decode kernel is S-TIR written with its own thread layout (stir_decode.py:
vector loads, warp-shuffle row sums; the same generator gives its CPU form); everything else is
S-TIR with the CUDA-core schedule.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple

from .params import KernelDims, TVMParams, UnsupportedConfig

__all__ = ["PASS_KERNELS", "make_kernel", "build_kernels", "compile_cpu_kernels", "module_key", "source_hash",
           "DEFAULT_ARCH"]

PASS_KERNELS = {"fwd": ("ut", "transport", "scan"), "decode": ("decode", "decode_merge")}
DEFAULT_ARCH = "sm_90"
REDUCTION_UNROLL = 4  # inner unroll of the CUDA-core reduction loops (a backend constant, not per GPU)
_PKG_DIR = Path(__file__).resolve().parent


# the GPU-host scripts, the runtime loader and the module store do not change what a module computes
_NOT_KERNEL_SOURCES = ("gpu_check.py", "build_gpu_check.py", "build_decode_bench.py", "runtime.py", "module_store.py")


def source_hash() -> str:
    """Hash of this package's kernel sources (a code change invalidates cached modules)."""
    h = hashlib.sha256()
    for p in sorted(_PKG_DIR.glob("*.py")) + sorted(_PKG_DIR.glob("*.c")):
        if p.name in _NOT_KERNEL_SOURCES:
            continue
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def _spec_hash(pass_: Optional[str] = None) -> str:
    """The spec hash a module of ``pass_`` is keyed by: the pass's (``Spec.pass_hash``), so that a change to
    another pass's part of the spec keeps its modules; None: the full spec hash (modules cached before
    per-pass hashes)."""
    from pathtune.specs import load_spec

    spec = load_spec()
    return spec.hash if pass_ is None else spec.pass_hash(pass_)


def _kernel_pass(name: str) -> str:
    return next(p for p, names in PASS_KERNELS.items() if name in names)


def _tvm_version() -> str:
    import tvm

    return str(tvm.__version__)


def module_key(name: str, params: TVMParams, dims: KernelDims, arch: str, variant: str, *,
               full_spec: bool = False) -> str:
    """The cache folder name of a kernel's module. ``full_spec``: keyed by the full spec hash, as modules
    were cached before per-pass hashes (build_kernels still takes those from the cache)."""
    knobs = params.decode_dict() if name.startswith("decode") else params.fwd_dict()
    if name == "ut":
        knobs = {k: knobs[k] for k in ("chunk_size", "num_warps")}
    spec = _spec_hash(None if full_spec else _kernel_pass(name))
    payload = dict(kernel=name, spec=spec, knobs=knobs, dims=dims.key(), tvm=_tvm_version(), arch=arch,
                   variant=variant if name == "scan" else "simt", src=source_hash())
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:24]


SMEM_LIMIT = 227 * 1024   # dynamic shared memory per block on sm_90


def _smem_check(what: str, need: int) -> None:
    if need > SMEM_LIMIT:
        raise UnsupportedConfig(f"{what} needs {need} B of shared memory per block (> {SMEM_LIMIT} B)")


def _check_supported(name: str, params: TVMParams, dims: KernelDims, variant: str) -> None:
    if dims.dtype not in ("bfloat16", "float16", "float32"):
        raise UnsupportedConfig(f"q/k/v dtype {dims.dtype} is not supported by the TVM GPU kernels")
    if name == "ut":
        from .stir_ut import ut_smem_bytes

        _smem_check("the UT stage", ut_smem_bytes(params.chunk_size, dims.D))
    if name == "transport":
        from .stir_transport import transport_smem_bytes

        _smem_check("the transport stage", transport_smem_bytes(params.chunk_size, dims.D))
    if name == "decode":
        from .stir_decode import decode_layout, decode_smem_bytes

        lay = decode_layout(params, dims.D, dims.DV, dims.dtype)
        _smem_check("the decode kernel", decode_smem_bytes(lay, dims.G))
    if name == "scan" and variant == "tc":
        from .tc_scan import check_tc_supported

        check_tc_supported(params, dims)
    if name == "scan" and variant == "simt":
        from .stir_scan import scan_smem_bytes

        need = scan_smem_bytes(params.chunk_size, params.block_n, dims.D, dims.DV, "float32", params.scan_dtype(),
                               dims.dtype)
        _smem_check("the CUDA-core scan (use a smaller chunk_size/block_n or the tensor-core scan)", need)


def make_kernel(name: str, params: TVMParams, dims: KernelDims, *, target: str = "cuda", variant: str = "tc",
                fdt: str = "float32") -> Tuple[Any, bool]:
    """The IRModule of one kernel, and whether it is TIRx (else S-TIR, scheduled for CUDA when target='cuda').

    target='llvm' returns the UNSCHEDULED S-TIR (the CPU numerics check); fdt='float64' there makes the
    whole computation float64 (scan operands too).
    """
    import tvm

    from .schedule import SimtSchedule, schedule_simt

    gpu = target == "cuda"
    smem = "shared.dyn" if gpu else "global"
    C, S = params.chunk_size, params.superchunk_size
    sdt = params.scan_dtype() if fdt == "float32" else fdt
    unroll = REDUCTION_UNROLL if gpu else 1
    H, HQ, D, DV = dims.H, dims.HQ, dims.D, dims.DV
    if name == "scan" and gpu and variant == "tc":
        from .tc_scan import tc_scan_func

        return tvm.IRModule({"scan": tc_scan_func(params, dims)}), True
    if name == "ut":
        from .stir_ut import ut_func

        func = ut_func(C, H, D, dims.dtype, fdt, smem, unroll, params.threads)
    elif name == "transport":
        from .stir_transport import transport_func

        func = transport_func(C, S, H, D, sdt, fdt, smem, unroll, params.threads)
    elif name == "scan":
        from .stir_scan import scan_func

        func = scan_func(C, S, params.block_n, H, HQ, D, DV, dims.dtype, sdt, dims.gated, fdt, smem, unroll)
    elif name == "decode":
        # written with its thread layout (row groups, lane vectors, warp-shuffle row sums): not scheduled here
        from .stir_decode import decode_func, decode_layout

        func = decode_func(decode_layout(params, D, DV, dims.dtype), H, HQ, dims.dtype, dims.dtype, dims.gated, fdt,
                           gpu=gpu)
        return tvm.IRModule({name: func}), False
    elif name == "decode_merge":
        from .stir_decode import merge_func

        func = merge_func(params.decode_splits, HQ, DV, dims.dtype, fdt, smem)
    else:
        raise ValueError(f"unknown kernel {name!r}")
    if not gpu:
        return tvm.IRModule({name: func}), False
    threads = params.decode_threads if name.startswith("decode") else params.threads
    return schedule_simt(func, SimtSchedule(threads=threads)), False


def build_kernels(pass_: str, config: Any, dims: KernelDims, *, arch: str = DEFAULT_ARCH, variant: str = "tc",
                  cache_dir: Optional[os.PathLike] = None, force: bool = False, log=None,
                  ptxas: bool = False) -> Dict[str, Path]:
    """Build (or take from the cache) the exported modules of one pass; returns kernel name -> .so path.

    config: a spec Config (or mapping, or TVMParams) of the pass's knobs. Raises UnsupportedConfig
    for combinations the kernels cannot compile, BuildError (toolchain.py) for compile failures.
    ptxas: also record the kernels' registers / spills / stack (``ptxas -v``) in the .json metadata.
    """
    from .toolchain import cache_root, compile_cuda, ptxas_stats

    params = TVMParams.from_config(config)
    root = Path(cache_dir) if cache_dir is not None else cache_root() / "tvm" / "modules"
    out: Dict[str, Path] = {}
    for name in PASS_KERNELS[pass_]:
        _check_supported(name, params, dims, variant)
        key = module_key(name, params, dims, arch, variant)
        kdir = root / key
        path = kdir / f"{name}.so"
        if not force:
            older = root / module_key(name, params, dims, arch, variant, full_spec=True) / f"{name}.so"
            hit = next((p for p in (path, older) if p.exists() and (
                not ptxas or "ptxas" in json.loads(p.with_suffix(".json").read_text()))), None)
            if hit is not None:
                out[name] = hit
                continue
        t0 = time.time()
        mod, is_tirx = make_kernel(name, params, dims, target="cuda", variant=variant)
        ex = compile_cuda(mod, arch, tirx=is_tirx, explicit_barriers=not is_tirx, what=f"{pass_}/{name}")
        kdir.mkdir(parents=True, exist_ok=True)
        tmp = kdir / f".{name}.{os.getpid()}.so"
        ex.export_library(str(tmp))
        meta = dict(kernel=name, entry=name, pass_=pass_, arch=arch, variant=variant if name == "scan" else "simt",
                    params=json.loads(params.to_json()), dims=dims.key(), tvm=_tvm_version(), spec=_spec_hash(pass_),
                    src=source_hash(), build_seconds=round(time.time() - t0, 2))
        if ptxas:
            meta["ptxas"] = ptxas_stats(ex, arch)
        (kdir / f"{name}.json").write_text(json.dumps(meta, indent=1, sort_keys=True))
        os.replace(tmp, path)
        if log:
            log(f"built {pass_}/{name} ({meta['variant']}) in {meta['build_seconds']} s -> {path}")
        out[name] = path
    return out


def compile_cpu_kernels(pass_: str, config: Any, dims: KernelDims, *, fdt: str = "float64") -> Dict[str, Any]:
    """The unscheduled S-TIR of a pass compiled for the CPU (llvm): kernel name -> callable."""
    from .toolchain import compile_cpu

    params = TVMParams.from_config(config)
    out = {}
    for name in PASS_KERNELS[pass_]:
        mod, _ = make_kernel(name, params, dims, target="llvm", fdt=fdt)
        out[name] = compile_cpu(mod, what=f"{pass_}/{name}")[name]
    return out


def manifest(paths: Mapping[str, Path]) -> Dict[str, Any]:
    """name -> metadata of built modules (read from the .json next to each .so)."""
    return {n: json.loads(Path(p).with_suffix(".json").read_text()) for n, p in paths.items()}
