"""Repeat launches that skip the JIT's argument binding and Triton's per-launch wrappers.

``fn[grid](*args, **constexprs)`` binds every argument, recomputes the specialisation key (dtype and 16-byte
alignment of each pointer, the ints' value classes), looks the compiled kernel up and only then calls its
launcher: on an H200 host ~50-60 us per launch for a kernel of ~20 runtime arguments and ~25 constexprs, against
~15-20 us for the launcher itself.  A forward launches 4-5 kernels, a forward + backward ~80 at B * T = 32K, a
decode step one: without this the host, not the GPU, sets the pace of small calls.

``KernelLauncher`` launches through the JIT the first time a caller's key is seen and keeps the compiled kernel
the JIT returned; later calls with the same key go to that kernel's launcher (``CompiledKernel.run``) on the
current device's current stream, with each tensor handed over as its data pointer (an int, which Triton's
launcher takes as it is, where a tensor costs it a method call and a driver query per pointer).  With Triton's
launch hooks installed (a profiler) a repeat goes through the compiled kernel's ``[grid]`` runner instead, which
runs them.  The key is the caller's promise: two calls with equal keys have the same grid, constexprs, launch
options and runtime specialisation.  The decode step builds its key from its own geometry
(``pointers_and_key`` gives the tensors' share); ``compiled(kernel)`` computes it from the arguments
(``signature_and_args``: at least as fine as Triton's runtime specialisation, in the same pass that turns the
tensors into pointers) for the forward and backward launchers.  Under the interpreter, for a stand-in kernel (a
test's spy, a probe's candidate), or with JIT pre-run hooks installed, every call goes through the JIT.
"""
from __future__ import annotations

import functools
import inspect
import operator
from typing import Any, Hashable, Optional, Sequence

import torch
from triton.runtime.jit import JITFunction
from triton.tools.tensor_descriptor import TensorDescriptor

MAX_KEYS = 256
"""Compiled kernels kept per launcher (a varlen layout gives a new grid per call: the oldest key goes first)."""

_I32 = (-(1 << 31), 1 << 31)
_DATA_PTR, _DTYPE = torch.Tensor.data_ptr, operator.attrgetter("dtype")


def pointers_and_key(tensors: Sequence[torch.Tensor]) -> tuple[tuple, Optional[tuple]]:
    """(the data pointers of ``tensors`` as ints, their dtypes or None): the dtypes when every pointer is 16-byte
    aligned (what Triton specialises a pointer on), else None (Triton then compiles for the unaligned pointers:
    leave that call to the JIT)."""
    ptrs = tuple(map(_DATA_PTR, tensors))
    aligned = not functools.reduce(operator.or_, ptrs, 0) & 15
    return ptrs, (tuple(map(_DTYPE, tensors)) if aligned else None)


def signature_and_args(args: Sequence) -> tuple[Optional[tuple], tuple]:
    """(what Triton specialises the runtime arguments ``args`` on, at least: per tensor its dtype, device and
    whether it is 16-byte aligned, per int whether it is 1, a multiple of 16, within int32 and beyond int64, per
    tensor descriptor its dtype, block, device and padding, per bool its value; None where an argument is of a kind
    this does not cover (that call goes through the JIT)) and ``args`` with every tensor replaced by its data
    pointer, in one pass."""
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
            sig.append((a == 1, a & 15 == 0, _I32[0] <= a < _I32[1], a >= 1 << 63))
        elif t is float:
            sig.append("f")
        elif a is None:
            sig.append(None)
        elif isinstance(a, TensorDescriptor):
            sig.append((a.base.dtype, tuple(a.block_shape), a.base.device, getattr(a, "padding", None)))
        else:
            return None, tuple(args)
        out.append(a)
    return tuple(sig), tuple(out)


def _compiled_type():
    try:
        from triton.compiler import CompiledKernel
    except ImportError:   # pragma: no cover - Triton without the compiler module: JIT launches only
        return ()
    return CompiledKernel


def _hooks_installed() -> bool:
    from triton import knobs
    return knobs.runtime.launch_enter_hook is not None or knobs.runtime.launch_exit_hook is not None


def _direct_runner(kernel, grid: tuple):
    """A callable launching the compiled ``kernel`` on ``grid`` (three dims) with its runtime and constexpr
    arguments: its launcher itself on the current device's current stream, or its ``[grid]`` runner where it is
    not a Triton ``CompiledKernel`` with a loaded function, or while launch hooks are installed."""
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


class KernelLauncher:
    """Launches of the kernel ``getattr(module, name)`` (a ``triton.jit`` function, looked up per call so that a
    stand-in put there by a test or a probe sees the launches): ``launcher.repeat(key, args) or launcher(grid,
    args, constexprs, options, key)``.  ``args``: the runtime arguments, positional in the kernel's order (its
    constexpr parameters must all come after them); ``constexprs``: their values; ``options``: num_warps,
    num_stages.  A repeat takes the tensors as their data pointers (``pointers_and_key``), the JIT's call the
    tensors.  ``key`` None: always through the JIT.  ``hits`` counts the launches that skipped it; at most
    ``MAX_KEYS`` compiled kernels are kept."""

    def __init__(self, module, name: str) -> None:
        self.module, self.name = module, name
        self.hits = 0
        self._fast: dict = {}    # key -> (kernel object, its compiled launcher on the grid, the constexpr values)
        fn = getattr(module, name)
        params = list(inspect.signature(getattr(fn, "fn", fn)).parameters.values())
        nconst = [i for i, p in enumerate(params) if "constexpr" in str(p.annotation)]
        self._n_runtime = len(params) - len(nconst)
        if nconst != list(range(self._n_runtime, len(params))):
            raise ValueError(f"{name}: the constexpr parameters must follow every runtime parameter for "
                             "KernelLauncher")
        self._const_names = [(p.name, p.default) for p in params[self._n_runtime:]]
        self.constexpr_names = frozenset(name for name, _ in self._const_names)

    def constexpr_values(self, constexprs: dict) -> tuple:
        """The constexpr arguments in the kernel's parameter order (defaults where ``constexprs`` has none)."""
        out = []
        for name, default in self._const_names:
            if name in constexprs:
                out.append(constexprs[name])
            elif default is not inspect.Parameter.empty:
                out.append(default)
            else:
                raise TypeError(f"constexpr {name} of {self.name} has no value")
        return tuple(out)

    def repeat(self, key: Optional[Hashable], args: tuple) -> bool:
        """Launch ``args`` through the compiled kernel an earlier call with ``key`` got from the JIT; False (and no
        launch) when there is none, or the module's kernel is no longer the one it came from, so that the caller
        launches through ``__call__``."""
        if key is None:
            return False
        hit = self._fast.get(key)
        if hit is None:
            return False
        fn, run, tail = hit
        if getattr(self.module, self.name) is not fn or getattr(fn, "pre_run_hooks", None):
            return False
        self.hits += 1
        run(*args, *tail)
        return True

    def __call__(self, grid: tuple, args: tuple, constexprs: dict, options: dict,
                 key: Optional[Hashable] = None) -> Any:
        """Launch through the JIT (which compiles on a miss of its own cache) and keep the compiled kernel under
        ``key`` for ``repeat``; returns what the JIT returned."""
        if len(args) != self._n_runtime:
            raise TypeError(f"{self.name} takes {self._n_runtime} runtime arguments, got {len(args)}")
        fn = getattr(self.module, self.name)
        kernel = fn[grid](*args, **constexprs, **options)
        if key is not None and isinstance(kernel, _compiled_type()):
            if len(self._fast) >= MAX_KEYS:
                self._fast.pop(next(iter(self._fast)), None)
            g = tuple(grid) + (1,) * (3 - len(grid))
            self._fast[key] = (fn, _direct_runner(kernel, g), self.constexpr_values(constexprs))
        return kernel


class _RepeatLaunch:
    """``[grid](*runtime_args, **constexprs_and_options)``, the JIT's calling convention, for one ``triton.jit``
    kernel, through a ``KernelLauncher`` keyed by (grid, the keywords as passed, ``signature_and_args``): a call site
    passes its keywords in one order, so a repeat needs no split of them (another order is another key: a miss,
    not an error), and the signature and the pointer arguments come from one pass over the arguments."""

    def __init__(self, kernel) -> None:
        self.kernel = kernel
        self.launcher = KernelLauncher(self, "kernel")

    def __getitem__(self, grid):
        grid = tuple(grid)

        def launch(*args, **kw):
            lau = self.launcher
            sig, ptr_args = signature_and_args(args)
            key = None if sig is None else (grid, tuple(kw.items()), sig)
            try:
                if lau.repeat(key, ptr_args):
                    return None
            except TypeError:     # an unhashable constexpr or option: this call through the JIT
                key = None
            constexprs = {n: v for n, v in kw.items() if n in lau.constexpr_names}
            options = {n: v for n, v in kw.items() if n not in lau.constexpr_names}
            return lau(grid, args, constexprs, options, key)
        return launch


_REPEAT: dict[int, _RepeatLaunch] = {}


def compiled(kernel):
    """``compiled(kernel)[grid](*args, **kw)`` launches ``kernel`` as ``kernel[grid](*args, **kw)`` does; for a
    ``triton.jit`` kernel a repeat of a specialisation goes to the compiled kernel past the JIT's binding.  Anything
    else (the interpreter's kernels, a test's spy or a probe's candidate put in a launcher module's place) is
    returned as it is: its own launch."""
    if type(kernel) is not JITFunction:
        return kernel
    rep = _REPEAT.get(id(kernel))
    if rep is None or rep.kernel is not kernel:
        rep = _REPEAT[id(kernel)] = _RepeatLaunch(kernel)
    return rep


def repeat_hits() -> int:
    """Launches through ``compiled`` that skipped the JIT, in this process."""
    return sum(r.launcher.hits for r in _REPEAT.values())
