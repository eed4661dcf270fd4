"""Candidate repeat launcher with less host work per launch than codegen/triton/launch.py's ``_RepeatLaunch``.

A training step at B * T = 32K makes 81-85 launches, and the host spends 5.8-6.6 ms on it (H100 host, GPU kept
busy ahead, ``H100-20261206T141400Z-host-time.json``) against ~8 ms of kernels at D64 T 2K: host jitter then idles
the GPU.  Per repeat launch the shipped path splits the keywords into constexprs and options, builds a key from
``spec_key`` (a tuple per argument), looks the kernel up, and calls the compiled kernel's ``[grid]`` runner, which
looks up the device and stream through Triton's driver wrappers, builds launch metadata and hands every tensor to
Triton's C launcher, which calls ``data_ptr()`` on it and asks the driver for its device pointer.  This one:

* keys a launch by (grid, the keywords as passed, one signature tuple of the arguments): a call site passes its
  keywords in one order, so they need no split on a repeat (another order is another key: a miss, not an error);
* builds the signature and the launch arguments in one pass over the arguments, each tensor's data pointer read
  once and handed to the launcher as an int (what Triton's launcher takes as it is);
* calls the compiled kernel's launcher (``CompiledKernel.run``) itself with the current raw stream when Triton has
  no launch hooks installed (a profiler's hooks get the runner, as before).

The first launch of a key still goes through the JIT with the tensors (their types and alignment are what it
specialises on), through ``KernelLauncher`` as the shipped path does.  What it specialises on is covered as in
``launch.spec_key``: per tensor dtype, 16-byte alignment and device; per int whether it is 1, a multiple of 16,
within int32 and beyond int64; per tensor descriptor its dtype, block, device and padding; per bool / float / None
its kind.

    python benchmarks/variants/launch_lean.py        # CPU: host us per repeat launch, shipped vs this, stubbed run
    python benchmarks/fwd_probe.py --host --launch-candidate benchmarks/variants/launch_lean.py     # GPU

tests/test_triton_launch.py checks what it launches with.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

import pathtune.codegen.triton.launch as launch_mod

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))      # benchmarks/: kernel_variants
from kernel_variants import repeat_launcher_in_place  # noqa: E402

_I32_LO, _I32_HI, _I64_HI = -(1 << 31), 1 << 31, 1 << 63


def signature_and_args(args: tuple) -> tuple[tuple | None, tuple]:
    """(what Triton specialises ``args`` on, at least as fine as ``launch.spec_key``; None for an argument kind it
    does not cover) and ``args`` with every tensor replaced by its data pointer, in one pass."""
    sig, out = [], []
    for a in args:
        t = type(a)
        if t is torch.Tensor or isinstance(a, torch.Tensor):
            p = a.data_ptr()
            sig.append((a.dtype, p & 15 == 0, a.device))
            out.append(p)
            continue
        if t is bool:
            sig.append(("b", a))
        elif t is int:
            sig.append((a == 1, a & 15 == 0, _I32_LO <= a < _I32_HI, a >= _I64_HI))
        elif t is float:
            sig.append("f")
        elif a is None:
            sig.append(None)
        elif isinstance(a, TensorDescriptor):
            sig.append((a.base.dtype, tuple(a.block_shape), a.base.device, getattr(a, "padding", None)))
        else:
            return None, args
        out.append(a)
    return tuple(sig), tuple(out)


def _hooks_installed() -> bool:
    from triton import knobs
    return knobs.runtime.launch_enter_hook is not None or knobs.runtime.launch_exit_hook is not None


def _direct_runner(kernel, grid: tuple):
    """A callable launching the compiled ``kernel`` on ``grid`` (three dims) with its runtime and constexpr
    arguments: its launcher itself on the current stream, or its ``[grid]`` runner where it is not a Triton
    ``CompiledKernel`` with a loaded function or launch hooks are installed."""
    runner = kernel[grid]
    run, function, meta = (getattr(kernel, n, None) for n in ("run", "function", "packed_metadata"))
    if run is None or function is None or not torch.cuda.is_available():
        return runner
    gx, gy, gz = grid
    current_device, raw_stream = torch.cuda.current_device, torch._C._cuda_getCurrentRawStream

    def direct(*args):
        if _hooks_installed():
            return runner(*args)
        run(gx, gy, gz, raw_stream(current_device()), function, meta, None, None, None, *args)
    return direct


class LeanRepeatLaunch:
    """``[grid](*runtime_args, **constexprs_and_options)`` for one ``triton.jit`` kernel (the JIT's calling
    convention), repeats launched as the module docstring says."""

    def __init__(self, kernel) -> None:
        self.kernel = kernel
        self.launcher = launch_mod.KernelLauncher(self, "kernel")
        self._fast: dict = {}        # (grid, keyword items, signature) -> (kernel object, direct launch, constexprs)

    def __getitem__(self, grid):
        grid = tuple(grid)

        def launch(*args, **kw):
            sig, ptr_args = signature_and_args(args)
            key = None
            if sig is not None:
                key = (grid, tuple(kw.items()), sig)
                try:
                    hit = self._fast.get(key)
                except TypeError:        # an unhashable constexpr or option: this call through the JIT
                    hit, key = None, None
                if hit is not None and hit[0] is self.kernel and not getattr(self.kernel, "pre_run_hooks", None):
                    self.launcher.hits += 1      # what launch.repeat_hits() counts
                    hit[1](*ptr_args, *hit[2])
                    return None
            lau = self.launcher
            constexprs = {n: v for n, v in kw.items() if n in lau.constexpr_names}
            options = {n: v for n, v in kw.items() if n not in lau.constexpr_names}
            compiled = lau(grid, args, constexprs, options, None)
            if key is not None and isinstance(compiled, launch_mod._compiled_type()):
                if len(self._fast) >= launch_mod.MAX_KEYS:
                    self._fast.pop(next(iter(self._fast)), None)
                g = grid + (1,) * (3 - len(grid))
                self._fast[key] = (self.kernel, _direct_runner(compiled, g), lau.constexpr_values(constexprs))
            return compiled
        return launch


def in_place(cls=LeanRepeatLaunch):
    """Every ``compiled(kernel)`` launch through ``cls`` (default: ``LeanRepeatLaunch``) while inside."""
    return repeat_launcher_in_place(cls)


def host_us_per_repeat(cls, n: int = 20000, runtime_args: int = 22, constexprs: int = 24) -> float:
    """Host microseconds per repeat launch through ``cls`` of a stand-in kernel whose compiled launcher does
    nothing: ``runtime_args`` arguments (two thirds tensors, the rest ints and floats, as a backward launch) and
    ``constexprs`` constexprs plus two options.  What the repeat path itself costs, without Triton's launcher."""
    from triton.compiler import CompiledKernel

    class Compiled(CompiledKernel):
        def __init__(self):  # noqa: D107 - no module to load
            pass

        def __getitem__(self, grid):
            return lambda *a: None

    names = [f"a{i}" for i in range(runtime_args)] + [f"C{i}" for i in range(constexprs)]
    src = "def kernel({}):\n    pass\n".format(", ".join(
        [f"a{i}" for i in range(runtime_args)] + [f"C{i}: 'tl.constexpr'" for i in range(constexprs)]))
    ns: dict = {}
    exec(src, ns)                                  # noqa: S102 - a signature of the wanted size

    class Jit:
        fn, pre_run_hooks = staticmethod(ns["kernel"]), []

        def __getitem__(self, grid):
            return lambda *a, **k: Compiled()

    n_tensors = 2 * runtime_args // 3
    ints = [4096 + 16 * i for i in range(runtime_args - n_tensors - 1)]
    args = tuple([torch.empty(64) for _ in range(n_tensors)] + ints + [0.125])
    kw = {n: i for i, n in enumerate(names[runtime_args:])}
    kw.update(num_warps=4, num_stages=2)
    launch = cls(Jit())[(512, 8)]
    launch(*args, **kw)
    for _ in range(200):
        launch(*args, **kw)
    t0 = time.perf_counter()
    for _ in range(n):
        launch(*args, **kw)
    return (time.perf_counter() - t0) / n * 1e6


if __name__ == "__main__":
    for label, cls in (("shipped", launch_mod._RepeatLaunch), ("lean", LeanRepeatLaunch)):
        best = min(host_us_per_repeat(cls) for _ in range(5))
        print(f"{label:8s}: {best:6.2f} us of host per repeat launch (22 arguments, 24 constexprs; launcher stubbed)")
