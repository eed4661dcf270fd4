"""The GPU's roundings in Triton's CPU interpreter, for accuracy questions a GPU would otherwise have to answer.

Triton 3.6's interpreter differs from an sm_90 GPU in two roundings that set the error levels of PaTH's gate:

* float32 -> bfloat16 casts truncate (``cast_impl`` passes no rounding mode); the GPU rounds to nearest even.
  Every 16-bit operand, state and output of a bf16 call then carries twice the GPU's rounding error (o's error
  against the float64 oracle at D 128: 4.9e-3 instead of the GPU's 2.2e-3).
* ``tl.dot(..., input_precision="tf32")`` on float32 tiles multiplies in full float32; the tensor cores read
  tf32 operands, the low 13 bits of each mantissa dropped.

``install()`` patches both in the interpreter's builder (this process only): bf16 casts round to nearest even
(through torch), one-pass tf32 products truncate their float32 operands first.  tf32x3 and ieee products, and
16-bit operand products (exact in float32), stay as the interpreter computes them.  With it the CPU reproduces
the GPU's error levels of o and of the gradients that do not hinge on cancellation (o 2.1e-3, dw / dbeta 1.8e-3
at tf32x3 and 5.5e-3 at tf32 at D 128, T 2K, PaTH-FoX: the H100 measured 2.2e-3, 1.8e-3 and 5.3e-3).
"""
from __future__ import annotations

import os

import numpy as np
import torch

_INSTALLED: dict = {}


def _tf32(x: np.ndarray) -> np.ndarray:
    """float32 values with their low 13 mantissa bits cleared (what a tf32 tensor-core operand keeps)."""
    return (np.ascontiguousarray(x).view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)


def install() -> None:
    """Patch the interpreter of this process (idempotent).  Needs TRITON_INTERPRET=1 before kernels are imported."""
    if _INSTALLED:
        return
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("gpu_roundings.install() patches Triton's interpreter: set TRITON_INTERPRET=1 first")
    import triton.language as tl
    from triton._C.libtriton import ir
    from triton.runtime import interpreter as interp

    builder = interp.InterpreterBuilder
    dot, cast = builder.create_dot, builder.cast_impl

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if (input_precision == ir.INPUT_PRECISION.TF32 and a.data.dtype == np.float32
                and b.data.dtype == np.float32):
            a = interp.TensorHandle(_tf32(a.data), a.dtype.scalar)
            b = interp.TensorHandle(_tf32(b.data), b.dtype.scalar)
        return dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            rounded = torch.from_numpy(np.ascontiguousarray(src.data)).to(torch.bfloat16)
            return interp.TensorHandle(rounded.view(torch.int16).numpy().view(np.uint16), dst_type.scalar)
        return cast(self, src, dst_type)

    builder.create_dot = create_dot
    builder.cast_impl = cast_impl
    builder.create_fp_trunc = lambda self, src, dst_type: self.cast_impl(src, dst_type)
    _INSTALLED.update(dot=dot, cast=cast)
