"""Candidate repeat launcher for the forward / backward launches (``compiled(kernel)[grid](...)``): a repeat hands the
compiled kernel's launcher the tensors' data pointers as ints (a subclass of codegen/triton/launch.py's
``_RepeatLaunch``; the kernels and their arguments are the shipped ones).

Triton's launcher calls ``data_ptr()`` on every tensor argument of a launch and asks the driver for its device
pointer (``cuPointerGetAttribute``); an int it takes as it is.  A forward launches 4-5 kernels of ~20 pointers
each, a forward + backward ~80 at B * T = 32K, so a host-bound call (small shapes, training a small model) pays
for hundreds of driver queries per step.  The repeat key already reads every pointer's alignment; here the
same pointers go to the launcher as ints.  The JIT's first call of a key still gets the tensors (their types and
alignment are what it specialises on).  The real change would read each pointer once, in ``spec_key``; this
candidate reads them twice (the key, then the ints), so its host time is an upper bound.

``python benchmarks/fwd_probe.py --host --launch-candidate benchmarks/variants/launch_int_pointers.py`` times the
small host-bound call (forward, and forward + backward) with this launcher in place beside the shipped one;
tests/test_triton_launch.py checks what it launches with.
"""
from __future__ import annotations

import contextlib

import torch

import pathtune.codegen.triton.launch as launch_mod


def pointer_args(args) -> tuple:
    """``args`` with every tensor replaced by its data pointer (the form a compiled launcher takes as it is)."""
    return tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args)


class RepeatLaunch(launch_mod._RepeatLaunch):
    """``_RepeatLaunch`` whose repeats pass the tensors' data pointers as ints."""

    def __getitem__(self, grid):
        grid = tuple(grid)

        def launch(*args, **kw):
            lau = self.launcher
            constexprs = {n: v for n, v in kw.items() if n in lau.constexpr_names}
            options = {n: v for n, v in kw.items() if n not in lau.constexpr_names}
            spec = launch_mod.spec_key(args)
            key = None if spec is None else (grid, spec, tuple(constexprs.items()), tuple(options.items()))
            try:
                if lau.repeat(key, pointer_args(args) if key is not None else args):
                    return None
            except TypeError:     # an unhashable constexpr or option: this call through the JIT
                key = None
            return lau(grid, args, constexprs, options, key)
        return launch


@contextlib.contextmanager
def in_place(cls=RepeatLaunch):
    """Every ``compiled(kernel)`` launch through ``cls`` while inside (the kept launchers forgotten on the way in
    and out, so that each side compiles its own repeats)."""
    shipped = launch_mod._RepeatLaunch
    launch_mod._RepeatLaunch = cls
    launch_mod._REPEAT.clear()
    try:
        yield
    finally:
        launch_mod._RepeatLaunch = shipped
        launch_mod._REPEAT.clear()
