"""Candidate decode step: repeat launches hand the compiled kernel's launcher the data pointers as ints (the module
codegen/triton/decode.py rebuilt by text replacement, ``kernel_variants.load_variant_module``; the kernel is the
shipped one, only ``TritonDecodeStep.__call__`` changes).

A repeat of a prepared step goes to the compiled kernel's launcher with its 20 tensors (q .. the arrival counters).
Triton's launcher then calls ``data_ptr()`` on each and asks the driver for its device pointer
(``cuPointerGetAttribute``), per pointer and per launch; an int it takes as it is.  The step already reads every
data pointer for its launch key (``tensor_key``: the 16-byte alignment), so here it keeps them
(``pointers_and_key``) and passes them as ints on a repeat; the JIT's first call of a key still gets the tensors
(their types and alignment are what it specialises on).  On the CPU with the launch stubbed the step's Python
takes the same ~9 us per call; the saving is in the launcher's C, 20 method calls and driver queries a step
(the launch measured 12 us on the H200 host of a ~39 us eager step).

``python benchmarks/decode_probe.py --skip steps,profiles,checks,generate --candidate-step
benchmarks/variants/decode_int_pointers.py --out probe.json`` times the public call's host and wall time per step
with this step in place beside the shipped one (host profile section); tests/test_triton_launch.py checks what it
launches with.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pathtune.codegen.triton.decode as decode_mod

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))      # benchmarks/: kernel_variants
from kernel_variants import load_variant_module, module_source  # noqa: E402

INT_POINTERS = [
    ("import functools\n", "import functools\nimport operator\n"),
    ("class TritonDecodeStep:\n", '''_DATA_PTR, _DTYPE = torch.Tensor.data_ptr, operator.attrgetter("dtype")


def pointers_and_key(tensors) -> tuple:
    """(the data pointers of ``tensors`` as ints, their dtypes or None): the dtypes when every pointer is 16-byte
    aligned (what Triton specialises a pointer on), else None (Triton then compiles for the unaligned pointers:
    leave that call to the JIT)."""
    ptrs = tuple(map(_DATA_PTR, tensors))
    return ptrs, (None if functools.reduce(operator.or_, ptrs, 0) & 15 else tuple(map(_DTYPE, tensors)))


class TritonDecodeStep:
'''),
    ('''        key = tensor_key(tensors)
        if key is not None:   # what the compiled kernel depends on besides the geometry's constants
            key = (key, max_len, WS, return_lse, torch.cuda.current_device() if q.is_cuda else -1)
        args = (*tensors, max_len, splits, self.qk_scale, self.gate_scale)
        if not self._launch.repeat(key, args):
            self._launch(grid, args, dict(const, WS=WS, STORE_LSE=return_lse), self._options, key)
''', '''        ptrs, key = pointers_and_key(tensors)
        if key is not None:   # what the compiled kernel depends on besides the geometry's constants
            key = (key, max_len, WS, return_lse, torch.cuda.current_device() if q.is_cuda else -1)
        scalars = (max_len, splits, self.qk_scale, self.gate_scale)
        # a repeat hands the compiled launcher the data pointers as ints (it then skips its per-pointer device
        # query); the JIT's call takes the tensors, whose types and alignment it specialises on
        if not self._launch.repeat(key, (*ptrs, *scalars)):
            self._launch(grid, (*tensors, *scalars), dict(const, WS=WS, STORE_LSE=return_lse), self._options, key)
'''),
]

module = load_variant_module(module_source(decode_mod), "decode_int_pointers", INT_POINTERS)
TritonDecodeStep = module.TritonDecodeStep
pointers_and_key = module.pointers_and_key
