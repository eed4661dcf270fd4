"""Candidate repeat launcher for the forward / backward launches (``compiled(kernel)[grid](...)``): a repeat hands the
compiled kernel's launcher the tensors' data pointers as ints (codegen/triton/launch.py's ``_RepeatLaunch``
rebuilt with one line replaced, ``kernel_variants.load_variant_module``; the kernels and their arguments are the
shipped ones).

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

import sys
from pathlib import Path

import torch

import pathtune.codegen.triton.launch as launch_mod

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))      # benchmarks/: kernel_variants
from kernel_variants import load_variant_module, module_source, repeat_launcher_in_place  # noqa: E402


def pointer_args(args) -> tuple:
    """``args`` with every tensor replaced by its data pointer (the form a compiled launcher takes as it is)."""
    return tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args)


# the shipped _RepeatLaunch's repeat, with the arguments as pointer_args gives them
INT_POINTERS = [("                if lau.repeat(key, args):\n",
                 "                if lau.repeat(key, pointer_args(args) if key is not None else args):\n")]

module = load_variant_module(module_source(launch_mod), "launch_int_pointers", INT_POINTERS)
module.pointer_args = pointer_args      # the replaced line's helper, looked up in the variant's globals per call
RepeatLaunch = module._RepeatLaunch


def in_place(cls=None):
    """Every ``compiled(kernel)`` launch through ``cls`` (default: this module's ``RepeatLaunch``) while inside."""
    return repeat_launcher_in_place(cls or RepeatLaunch)
