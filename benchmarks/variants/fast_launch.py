"""Candidate host path for the forward and backward launches: a repeat launch goes to the compiled kernel the JIT
returned for the same arguments' specialisation, skipping the JIT's argument binding (the decode step's
``KernelLauncher``, codegen/triton/decode.py, with a key computed from the arguments instead of the caller's).

On the H200 host the JIT's launch path costs ~60 us per launch against ~20 us for the compiled kernel's launcher
(decode_probe's host profile).  A forward launches 4-5 Triton kernels (its public call took 0.56-1.1 ms of host
time against 1.24-1.40 ms of GPU time at T 2K: ``fwd_probe``'s ``api_host_ms``, so the GPU can wait for the host),
a forward + backward ~80 at B * T = 32K (9 per token range).  Each launcher kernel here is ``CompiledLaunch`` around
the shipped kernel: the same grid, arguments and options; only the host path differs, so the outputs are the
shipped launches' (bit for bit up to the order of the backward's atomic adds).

The key (``spec_key``) is at least as fine as Triton's runtime specialisation: per pointer its dtype and whether it
is 16-byte aligned, per int whether it is 1, a multiple of 16 and within int32, per tensor descriptor its dtype and
block; with the grid, the constexprs and the launch options.  A call whose key has no compiled kernel yet, or with an
argument of another kind, goes through the JIT (so the interpreter always does).

    python benchmarks/fwd_probe.py --seq-lens 2048 --no-fla --candidates benchmarks/variants/fast_launch.py
    python benchmarks/dev_kernel_probe.py --only e2e --intra-v2 benchmarks/variants/fast_launch.py

tests/test_triton_launch.py checks the key against Triton's own specialisation and the wrapper's bookkeeping (CPU),
and fwd+bwd through the wrappers against the shipped launches (GPU).
"""
from __future__ import annotations

import inspect
import types

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

import pathtune.codegen.triton.backward as bwd_mod
import pathtune.codegen.triton.forward as fwd_mod
from pathtune.codegen.triton.decode import KernelLauncher

_I32 = (-(1 << 31), 1 << 31)
MAX_KEYS = 256     # compiled kernels kept per wrapper (varlen tables give a new grid per call)


def spec_key(args: tuple):
    """What Triton specialises the runtime arguments ``args`` on, at least (None where an argument is of a kind this
    does not cover: that call goes through the JIT)."""
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append((a.dtype, a.data_ptr() & 15 == 0, a.device))
        elif isinstance(a, bool):
            out.append(("b", a))
        elif isinstance(a, int):
            out.append((a == 1, a & 15 == 0, _I32[0] <= a < _I32[1], a >= 1 << 63))
        elif isinstance(a, float):
            out.append("f")
        elif isinstance(a, TensorDescriptor):
            out.append((a.base.dtype, tuple(a.block_shape), a.base.device, getattr(a, "padding", None)))
        elif a is None:
            out.append(None)
        else:
            return None
    return tuple(out)


class CompiledLaunch:
    """``kernel[grid](*args, **constexprs_and_options)`` as the launchers call it; repeats of a specialisation skip the
    JIT's binding.  Attributes not defined here are the kernel's (probes and tests read its ``arg_names``)."""

    def __init__(self, kernel):
        self.kernel = kernel
        self._launcher = KernelLauncher(types.SimpleNamespace(kernel=kernel), "kernel")
        fn = getattr(kernel, "fn", kernel)
        self._constexprs = frozenset(p.name for p in inspect.signature(fn).parameters.values()
                                     if "constexpr" in str(p.annotation))

    def __getattr__(self, attr):
        return getattr(self.kernel, attr)

    @property
    def hits(self) -> int:
        """Launches that skipped the JIT."""
        return self._launcher.hits

    def __getitem__(self, grid):
        def launch(*args, **kw):
            return self.launch(tuple(grid), args, kw)
        return launch

    def launch(self, grid: tuple, args: tuple, kw: dict):
        constexprs = {n: v for n, v in kw.items() if n in self._constexprs}
        options = {n: v for n, v in kw.items() if n not in self._constexprs}
        spec = spec_key(args)
        key = None if spec is None else (grid, spec, tuple(constexprs.items()), tuple(options.items()))
        try:
            if key is not None and self._launcher.repeat(key, args):
                return None
        except TypeError:      # an unhashable constexpr or option: this call through the JIT
            key = None
        fast = self._launcher._fast
        if key is not None and len(fast) >= MAX_KEYS:
            fast.pop(next(iter(fast)))
        return self._launcher(grid, args, constexprs, options, key)


def _wrapped(module) -> dict:
    """{name: CompiledLaunch} of every Triton kernel launcher ``module`` calls by a module-level name."""
    return {name: CompiledLaunch(obj) for name, obj in vars(module).items()
            if name.endswith("_kernel") and hasattr(obj, "fn") and hasattr(obj, "__getitem__")}


globals().update(_wrapped(fwd_mod))
globals().update(_wrapped(bwd_mod))
