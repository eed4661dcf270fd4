"""Compiling TVM modules for a CUDA GPU on a host that has no GPU (nvcc + a libcuda stub).

Three things must hold, or tvm.compile silently produces a CUDA module that carries only source:

1. ``libtvm_runtime_cuda.so`` must load. It needs ``libcuda.so.1``; without a driver we load a stub
   (cuda_stub.c, built once with gcc into the cache dir) with RTLD_GLOBAL *before* TVM loads the
   runtime library, or load that library ourselves afterwards.
2. ``TVM_CUDA_COMPILE_MODE=nvcc`` (the default, nvrtc, needs cuda-bindings and libnvrtc).
3. The target is a dict with an explicit arch, and compilation runs inside ``with target:`` (the
   nvcc callback reads ``Target.current()`` for ``-arch``).

``compile_cuda`` then checks that every CUDA module came out with machine code and raises
``SourceOnlyModuleError`` otherwise.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional

__all__ = ["cache_root", "ensure_cuda_build_env", "cuda_target", "compile_cuda", "compile_cpu",
           "check_device_binary", "SourceOnlyModuleError", "BuildError", "stub_path"]

_STUB_SOURCE = Path(__file__).with_name("cuda_stub.c")
_ENV_READY = False


class BuildError(RuntimeError):
    """A TVM kernel failed to lower or compile (the tuner records it as compile_error)."""


class SourceOnlyModuleError(BuildError):
    """tvm.compile produced a CUDA module without machine code (nvcc did not run)."""


def cache_root() -> Path:
    """pathtune's cache dir: PATHTUNE_CACHE_DIR (pathtune/_env.py) or the platformdirs user cache dir."""
    try:
        from pathtune import _env

        return Path(_env.CACHE_DIR.get())
    except Exception:  # pragma: no cover - pathtune._env is part of the package
        import platformdirs

        return Path(os.environ.get("PATHTUNE_CACHE_DIR") or platformdirs.user_cache_dir("pathtune"))


def stub_path() -> Path:
    """Build (once, cached by source hash) and return the stub libcuda.so.1."""
    src = _STUB_SOURCE.read_bytes()
    digest = hashlib.sha256(src).hexdigest()[:16]
    out_dir = cache_root() / "tvm" / "cudastub" / digest
    out = out_dir / "libcuda.so.1"
    if out.exists():
        return out
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise BuildError("building the libcuda stub needs a C compiler (gcc/cc) on PATH")
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f"libcuda.so.1.tmp{os.getpid()}"
    proc = subprocess.run([cc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(tmp), str(_STUB_SOURCE)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"building the libcuda stub failed:\n{proc.stderr}")
    os.replace(tmp, out)
    return out


def _driver_present() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
        return True
    except OSError:
        return False


def ensure_cuda_build_env() -> None:
    """Make this process able to compile CUDA modules with nvcc (idempotent). Call before building."""
    global _ENV_READY
    if _ENV_READY:
        return
    os.environ["TVM_CUDA_COMPILE_MODE"] = "nvcc"
    if shutil.which("nvcc") is None and not os.path.exists("/usr/local/cuda/bin/nvcc"):
        raise BuildError("nvcc not found on PATH (the TVM CUDA build runs nvcc; install the CUDA toolkit)")
    if not _driver_present():
        ctypes.CDLL(str(stub_path()), mode=ctypes.RTLD_GLOBAL)
    if "tvm" in sys.modules:
        # TVM was imported before the stub was loaded: its CUDA runtime library failed to load then.
        from tvm.base import _LOADED_LIBS

        if "tvm_runtime_cuda" not in _LOADED_LIBS:
            from tvm_ffi.libinfo import load_lib_ctypes

            runtime_dir = Path(_LOADED_LIBS["tvm_runtime"]._name).resolve().parent
            _LOADED_LIBS["tvm_runtime_cuda"] = load_lib_ctypes(
                package="tvm", target_name="tvm_runtime_cuda", extra_lib_paths=[runtime_dir], mode="RTLD_LOCAL")
    else:
        import tvm  # noqa: F401  (loads libtvm_runtime_cuda.so now that libcuda.so.1 resolves)
    from tvm.base import _LOADED_LIBS

    if "tvm_runtime_cuda" not in _LOADED_LIBS:
        raise BuildError("libtvm_runtime_cuda.so did not load even with the libcuda stub; CUDA builds would be "
                         "source-only")
    _ENV_READY = True


def cuda_target(arch: str = "sm_90"):
    import tvm

    return tvm.target.Target({"kind": "cuda", "arch": arch})


def check_device_binary(executable, what: str = "module") -> None:
    """Raise SourceOnlyModuleError unless every CUDA module of ``executable`` carries machine code."""
    mod = getattr(executable, "mod", executable)
    cuda_mods = [m for m in mod.imports if m.kind == "cuda"]
    if not cuda_mods:
        raise SourceOnlyModuleError(f"{what}: no CUDA device module was produced")
    for m in cuda_mods:
        has_bin = True
        try:
            has_bin = len(m.inspect_source("cubin")) > 0
        except UnicodeDecodeError:  # binary content: exactly what we want
            has_bin = True
        if not m.is_runnable() or not has_bin:
            raise SourceOnlyModuleError(
                f"{what}: the CUDA module came out source-only (nvcc did not run). Build with "
                "pathtune.codegen.tvm.toolchain (libcuda stub + TVM_CUDA_COMPILE_MODE=nvcc + target dict with arch).")


def _skip_thread_sync_instrument():
    import tvm

    @tvm.ir.instrument.pass_instrument
    class SkipThreadSync:
        """Skip TVM's barrier planner: the S-TIR stages place a barrier before every leaf themselves
        (stir_common.barrier_macro). The planner treats all dynamic shared memory as one buffer, so it
        would add a barrier inside every leaf loop, and fail on leaves under a spare-thread guard."""

        def should_run(self, mod, info):
            return info.name != "s_tir.ThreadSync"

    return SkipThreadSync()


def compile_cuda(mod, arch: str = "sm_90", *, tirx: bool = False, explicit_barriers: bool = False,
                 what: str = "module"):
    """tvm.compile an IRModule for CUDA ``arch`` with nvcc; returns the Executable (machine code checked).

    tirx: use TVM's TIRx pipeline (kernels written in TIRx). explicit_barriers: the module places its
    own barriers (S-TIR stages of this package); TVM's barrier planner is skipped.
    """
    ensure_cuda_build_env()
    import tvm

    target = cuda_target(arch)
    instruments = [_skip_thread_sync_instrument()] if explicit_barriers else []
    try:
        with tvm.transform.PassContext(opt_level=3, instruments=instruments), target:
            if tirx:
                ex = tvm.compile(mod, target=target, tir_pipeline="tirx")
            else:
                ex = tvm.compile(mod, target=target)
    except Exception as e:  # lowering or nvcc failure
        raise BuildError(f"{what}: TVM compile for {arch} failed: {e}") from e
    check_device_binary(ex, what)
    return ex


def compile_cpu(mod, what: str = "module"):
    """tvm.compile for the host CPU (llvm): the numerics check of the unscheduled TensorIR."""
    import tvm

    try:
        return tvm.compile(mod, target="llvm")
    except Exception as e:
        raise BuildError(f"{what}: TVM compile for llvm failed: {e}") from e


def ptxas_stats(executable, arch: str = "sm_90") -> dict:
    """Registers, spills and stack of every kernel of a built CUDA module: its generated source recompiled
    with ``nvcc -cubin -Xptxas -v`` (the flags TVM's nvcc build uses: -O3 --use_fast_math).

    Returns {kernel name: dict(registers=, spill_stores=, spill_loads=, stack=)}; {} when nvcc is missing."""
    import re
    import tempfile

    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not os.path.exists(nvcc):
        return {}
    mod = getattr(executable, "mod", executable)
    src = [m for m in mod.imports if m.kind == "cuda"][0].inspect_source()
    with tempfile.TemporaryDirectory() as d:
        cu = Path(d) / "k.cu"
        cu.write_text(src)
        proc = subprocess.run([nvcc, f"-arch={arch}", "-cubin", "-O3", "--use_fast_math", "-w", "-Xptxas", "-v",
                               "-o", str(Path(d) / "k.cubin"), str(cu)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"nvcc -Xptxas -v failed:\n{proc.stderr[-2000:]}")
    out: dict = {}
    name = None
    for line in proc.stderr.splitlines():
        m = re.search(r"Function properties for (\w+)", line)
        if m:
            name = m.group(1)
            out[name] = {}
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and name:
            out[name].update(stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
        m = re.search(r"Used (\d+) registers", line)
        if m and name:
            out[name]["registers"] = int(m.group(1))
    return out


def nvcc_version() -> Optional[str]:
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    except OSError:
        return None
    return out.strip().splitlines()[-1] if out.strip() else None
