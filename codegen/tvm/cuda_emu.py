"""Run TVM-generated CUDA kernels on the CPU (a numerics check of the GPU code on a machine without a GPU).

    ex = compile_cuda(mod, "sm_90", ...)                    # the real build (nvcc, sm_90 machine code)
    k = EmulatedKernel(ex, prim_func, grid=(NC, HQ, 1), threads=128)
    k(*args)                                                # same arguments as the TVM function, CPU tensors

The kernel's generated CUDA source (``inspect_source``) is compiled with g++ against cuda_emu.h, which
emulates threads, barriers, shuffles, dynamic shared memory and mma.sync m16n8k16 on the CPU (one OS thread
per CUDA thread, blocks in sequence). It runs exactly the code TVM generated for the GPU, so index math,
fragment maps, masks and barrier placement are checked; timing, memory ordering on real hardware and
hardware rounding of ex2.approx are not. Slow: meant for small shapes in tests.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

__all__ = ["EmulatedKernel", "emulator_available"]

_HEADER = Path(__file__).with_name("cuda_emu.h")
_KNOWN_BUILTINS = {"tvm_builtin_ptx_mma_sync_aligned_m16n8k16_row_col_f32_f16_f16_f32",
                   "tvm_builtin_ptx_mma_sync_aligned_m16n8k16_row_col_f32_bf16_bf16_f32",
                   "tvm_builtin_cuda_cta_sync", "tvm_builtin_cuda_warp_sync"}


def emulator_available() -> bool:
    return (shutil.which("g++") or shutil.which("c++")) is not None


def _kernel_source(src: str) -> Tuple[str, str, List[Tuple[str, str]]]:
    """(kernel body source, kernel name, [(ctype, param name)]) from TVM's generated CUDA source."""
    m = re.search(r'extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(([^)]*)\) \{', src)
    if m is None:
        raise ValueError("no kernel definition found in the CUDA source")
    name, plist = m.group(1), m.group(2)
    body = src[m.start():]
    body = re.sub(r"extern __shared__ __align__\((\d+)\) (\w+) (\w+)\[\];", r"\2* \3 = (\2*)emu_dyn_smem;", body)
    if re.search(r"\b__shared__\b", body):
        raise ValueError("static __shared__ arrays are not supported by the emulator")
    used = set(re.findall(r"\btvm_builtin_\w+", body))
    unknown = used - _KNOWN_BUILTINS
    if unknown:
        raise ValueError(f"the emulator does not know the helpers {sorted(unknown)}")
    params = []
    for p in plist.split(","):
        p = p.replace("__restrict__", "").strip()
        ctype, pname = p.rsplit(" ", 1)
        params.append((ctype.strip(), pname.strip()))
    return body, name, params


def _compile(code: str) -> Path:
    from .toolchain import cache_root

    digest = hashlib.sha256((code + _HEADER.read_text()).encode()).hexdigest()[:20]
    out_dir = cache_root() / "tvm" / "emu"
    lib = out_dir / f"{digest}.so"
    if lib.exists():
        return lib
    out_dir.mkdir(parents=True, exist_ok=True)
    cpp = out_dir / f"{digest}.{os.getpid()}.cpp"
    cpp.write_text(code)
    cxx = shutil.which("g++") or shutil.which("c++")
    tmp = out_dir / f"{digest}.{os.getpid()}.so"
    cmd = [cxx, "-std=c++20", "-O1", "-fno-strict-aliasing", "-w", "-shared", "-fPIC", "-pthread",
           f"-I{_HEADER.parent}", "-o", str(tmp), str(cpp)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"compiling the emulated kernel failed:\n{proc.stderr[-4000:]}")
    os.replace(tmp, lib)
    cpp.unlink(missing_ok=True)
    return lib


class EmulatedKernel:
    """A TVM-built CUDA kernel (single-kernel module) run on the CPU through cuda_emu.h."""

    def __init__(self, executable: Any, prim_func: Any, *, grid: Sequence[int], threads: int,
                 smem_bytes: int = 232448):
        mod = getattr(executable, "mod", executable)
        src = [m for m in mod.imports if m.kind == "cuda"][0].inspect_source()
        body, self.name, self.params = _kernel_source(src)
        self.func = prim_func
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self.threads = threads
        self.smem = smem_bytes
        args = []
        for i, (ctype, pname) in enumerate(self.params):
            if ctype.endswith("*"):
                args.append(f"({ctype})ptrs[{i}]")
            elif ctype in ("float", "double"):
                args.append(f"({ctype})flts[{i}]")
            else:
                args.append(f"({ctype})ints[{i}]")
        launcher = (f'\nextern "C" void emu_launch(void** ptrs, const long long* ints, const double* flts, int gx, '
                    f'int gy, int gz, int nt, long long smem) {{\n'
                    f'  emu_run_grid(gx, gy, gz, nt, (size_t)smem, [&]() {{ {self.name}({", ".join(args)}); }});\n}}\n')
        self.lib = ctypes.CDLL(str(_compile('#include "cuda_emu.h"\n' + body + launcher)))
        self.lib.emu_launch.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_longlong),
                                        ctypes.POINTER(ctypes.c_double)] + [ctypes.c_int] * 4 + [ctypes.c_longlong]

    def _bind(self, args: Sequence[Any]) -> Dict[str, Any]:
        """name -> value for every buffer pointer (<buffer>_ptr), shape var and scalar of the prim_func."""
        import torch

        vals: Dict[str, Any] = {}
        f = self.func
        if len(args) != len(f.params):
            raise TypeError(f"{self.name}: expected {len(f.params)} arguments, got {len(args)}")
        for p, a in zip(f.params, args):
            shape = getattr(p, "shape", None)          # buffer params carry a shape, scalars do not
            if shape is not None:
                if not isinstance(a, torch.Tensor) or a.device.type != "cpu" or not a.is_contiguous():
                    raise TypeError(f"{p.name}: the emulator takes contiguous CPU tensors")
                vals[f"{p.name}_ptr"] = a
                for dim, size in zip(shape, a.shape):
                    if type(dim).__name__ == "Var":
                        vals[dim.name] = int(size)
            else:
                vals[p.name] = a
        return vals

    def __call__(self, *args):
        vals = self._bind(args)
        n = len(self.params)
        ptrs = (ctypes.c_void_p * n)()
        ints = (ctypes.c_longlong * n)()
        flts = (ctypes.c_double * n)()
        keep = []
        for i, (ctype, pname) in enumerate(self.params):
            if pname not in vals:
                raise KeyError(f"{self.name}: no value for kernel parameter {pname} ({ctype})")
            v = vals[pname]
            if ctype.endswith("*"):
                keep.append(v)
                ptrs[i] = v.data_ptr()
            elif ctype in ("float", "double"):
                flts[i] = float(v)
            else:
                ints[i] = int(v)
        gx, gy, gz = (int(vals.get(g, g)) if isinstance(g, str) else int(g) for g in self.grid)
        self.lib.emu_launch(ptrs, ints, flts, gx, gy, gz, self.threads, self.smem)
