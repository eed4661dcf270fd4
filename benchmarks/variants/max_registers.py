"""Candidates: shipped kernels launched under a register cap (Triton's ``maxnreg`` launch option), so that more
programs share a multiprocessor.  Same kernels, same arguments; only the register allocation changes (values
above the cap spill to local memory, which L1 caches).

The forward's one-launch UT stage (``ut_fused_kernel``) is a serial program of dependent phases (W W^T, the
diagonal inverses, the merges, W K^T, the apply), each waiting on global loads, at 4 warps and 255 registers:
2 programs per multiprocessor.  Offline sm_90 builds at the shipped ut_precision tf32 (no GPU needed;
``codegen/triton/compile_check.py``):

============  =======  =======================  ======================
cap           D        registers / spills (B)   programs per SM
============  =======  =======================  ======================
(none)        64, 128  255 / 0                  2
168           64, 128  168 / 168, 244           3 (3 x 49 KB shared)
128           64, 128  128 / 420, 1096          4
============  =======  =======================  ======================

* ``ut_fused_kernel_regs168`` / ``ut_fused_kernel_regs128``: ``ut_fused_kernel`` at those caps.
* ``MaxRegisters(kernel, n)``: the wrapper, for any kernel a launcher starts with ``kernel[grid](...)``.

``python benchmarks/ut_probe.py --paths fused --candidate
benchmarks/variants/max_registers.py:ut_fused_kernel_regs168,benchmarks/variants/max_registers.py:ut_fused_kernel_regs128
--precisions tf32 --diag-blocks 8,16``
"""
from __future__ import annotations

from pathtune.codegen.triton._ops import interpreting
from pathtune.codegen.triton.ut import ut_fused_kernel


class MaxRegisters:
    """``kernel[grid](*args, **kw)`` launched with ``maxnreg=n`` (dropped in Triton's interpreter, which compiles
    nothing); other attributes are the kernel's."""

    def __init__(self, kernel, n: int) -> None:
        self.kernel, self.n = kernel, int(n)

    def __getattr__(self, attr):
        return getattr(self.kernel, attr)

    def __getitem__(self, grid):
        launch = self.kernel[grid]
        if interpreting():
            return launch

        def run(*args, **kw):
            return launch(*args, **kw, maxnreg=self.n)
        return run


ut_fused_kernel_regs168 = MaxRegisters(ut_fused_kernel, 168)
ut_fused_kernel_regs128 = MaxRegisters(ut_fused_kernel, 128)
