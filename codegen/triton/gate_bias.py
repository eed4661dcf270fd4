"""The FoX gate's logit bias as a tensor-core product (knob ``gate_bias`` product, the forward's scans).

A gated logit, in the frame without the query's own offset c_i (which rides in its row's running max and lse),
is s_ij * qk_scale - c_j * gate_scale.  Added element by element, the key offsets cost one float32 operation
per logit on top of the handful a FlashAttention step spends per logit (max, exp2, sum, conversion), plus a
load of the offsets in the accumulator's column layout every step.  Written as a product instead,

    s + X  with  X_ij = x_j = -c_j * gate_scale / qk_scale,   X = E @ P^T,

where P [n, 16] holds x split into three bfloat16 parts (hi + mid + lo = x to float32's rounding: bf16 keeps
8 mantissa bits, three parts 24) in columns 0-2 and zeros after (the MMA's K is 16), and E [m, 16] is one in
columns 0-2: one more K = 16 step of the logits' own tensor-core product, accumulated in its float32
registers, after which the step is the ungated one.  Products of bf16 parts with ones are exact; the MMA sums
them in float32, as the subtraction did.  bf16 rather than the scan's type: fp16's range (65504) would
overflow the offsets of long, strongly gated sequences.  ``gate_parts_kernel`` writes P for every token once
per forward; the scans read a key tile's parts as they read its keys.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def bias_parts(x):
    """x [n] float32 as an [n, 16] bfloat16 tile: its three parts hi + mid + lo in columns 0, 1, 2, zeros after."""
    hi = x.to(tl.bfloat16)
    rest = x - hi.to(tl.float32)
    mid = rest.to(tl.bfloat16)
    lo = (rest - mid.to(tl.float32)).to(tl.bfloat16)
    col = tl.arange(0, 16)[None, :]
    part = tl.where(col == 0, hi.to(tl.float32)[:, None],
                    tl.where(col == 1, mid.to(tl.float32)[:, None], lo.to(tl.float32)[:, None]))
    return tl.where(col < 3, part, 0.0).to(tl.bfloat16)


@triton.jit
def bias_ones(N: tl.constexpr):
    """The [N, 16] bfloat16 tile E of ``bias_parts``' partner: ones in columns 0, 1, 2, zeros after."""
    col = tl.arange(0, 16)[None, :]
    return tl.where((tl.arange(0, N)[:, None] >= 0) & (col < 3), 1.0, 0.0).to(tl.bfloat16)


@triton.jit
def add_product(acc, a, b, INTERP: tl.constexpr):
    """acc + a @ b for 16-bit a, b (the ones and parts of K = 16, or the scan's operands), accumulated in the MMA's
    float32 registers on the GPU; the interpreter (whose bf16 products are not the GPU's) multiplies them widened to
    float32, where a product of two 16-bit numbers is exact."""
    if INTERP:
        return acc + tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b, acc)


@triton.jit
def gate_parts_kernel(gc_ptr, gp_ptr, n, scale, BLOCK: tl.constexpr):
    """gp[i] = ``bias_parts``(gc[i] * scale) for the n entries of the flat gate cumsum gc (float32): gp [n, 16]
    bfloat16, one program per BLOCK entries (the forward's scans read a key tile's parts as one [rows, 16] block)."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    x = tl.load(gc_ptr + i, mask=mask, other=0.0) * scale
    tl.store(gp_ptr + i[:, None] * 16 + tl.arange(0, 16)[None, :], bias_parts(x), mask=mask[:, None])
