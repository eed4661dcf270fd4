"""Candidate for the forward's UT stage: ``ut_fused_kernel`` with 8 x 8 instead of 16 x 16 diagonal blocks.

The shipped kernel inverts the diagonal blocks of T = I + strictLower(diag(beta) W W^T) by forward
substitution in registers, 15 dependent row steps for its C / 16 blocks at once, then merges them with
full C x C products: F = Dinv E, (I + F)^{-1} = (I - F)(I + F^2)... and T^{-1} = (I + F)^{-1} Dinv.
On the H200 a candidate with 3.3x fewer multiply-adds but 31 substitution steps (the chunk's halves
as blocks) ran slower than the shipped kernel, so the dependent steps, not the products, may set the
time.  Here the substitution takes 7 steps (C / 8 blocks of 8 rows) and the merge one more product
pair (F^(C/8) = 0: (I - F)(I + F^2)(I + F^4) at C = 64), everything else as shipped: the kernel is
``codegen/triton/ut.py``'s own, with the block size 16 of its two block helpers
(``_diagonal_block_inverses``, ``_finish_inverse``) set to 8 in a copy of the source
(``kernel_variants.load_variant_module``).
"""
from __future__ import annotations

import re

import torch
from kernel_variants import load_variant_module, module_source

import pathtune.codegen.triton.ut as _shipped

SB = 8   # diagonal block size


def _with_block(src: str, helper: str, size: int) -> str:
    """``src`` with every 16 in the function ``helper`` (from its ``def`` to the next decorator) set to ``size``."""
    start = src.index(f"def {helper}(")
    end = src.index("\n@triton.jit", start)
    return src[:start] + re.sub(r"\b16\b", str(size), src[start:end]) + src[end:]


_src = module_source(_shipped)
for _helper in ("_diagonal_block_inverses", "_finish_inverse"):
    _src = _with_block(_src, _helper, SB)
ut_sub8_kernel = load_variant_module(_src, f"ut_sub{SB}").ut_fused_kernel


def ut_sub8(kt_in, wt, bt, tables, H: int, D: int, C: int, params, out_dtype=torch.float32, write_w: bool = False,
            apply_mode=None, num_warps: int = 4):
    """``forward.ut_fused`` launching ``ut_sub8_kernel`` (same arguments and outputs)."""
    from kernel_variants import swapped

    from pathtune.codegen.triton import forward as fwd

    with swapped(fwd, "ut_fused_kernel", ut_sub8_kernel):
        return fwd.ut_fused(kt_in, wt, bt, tables, H, D, C, params, out_dtype=out_dtype, write_w=write_w,
                            apply_mode=apply_mode, num_warps=num_warps)
