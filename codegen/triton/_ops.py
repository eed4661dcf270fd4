"""Small jit helpers shared by the PaTH kernels."""
from __future__ import annotations

import os

import triton
import triton.language as tl


def interpreting() -> bool:
    """True when kernels run under Triton's CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def next_pow2(x: int) -> int:
    """The smallest power of two >= x (x >= 1), in plain Python: launchers call it per launch, where
    ``triton.next_power_of_2`` (a constexpr function) costs microseconds."""
    return 1 << (x - 1).bit_length()


def padded_dim(x: int) -> int:
    """A head dim as the kernels tile it: its next power of two, at least 16 (the MMA's K)."""
    return max(16, next_pow2(x))


@triton.jit
def mm(a, b, INTERP: tl.constexpr):
    """tl.dot with fp32 accumulation.

    Triton 3.6's interpreter multiplies bfloat16 tiles as raw 16-bit integers; under the
    interpreter (only) bf16 operands are widened to fp32 first.  bf16 x bf16 products are exact
    in fp32, so this computes the same function the GPU's bf16 MMA does.
    """
    if INTERP:
        if a.dtype == tl.bfloat16:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
            return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def tile_of(n, tile_tok0, tile_seq, seq_start, seq_end):
    """Where tile n (a UT chunk or a query block) lies: (first token, sequence id, the sequence's
    first token, one past its last token) -- the prologue every per-tile kernel starts with."""
    tok0 = tl.load(tile_tok0 + n)
    sid = tl.load(tile_seq + n)
    return tok0, sid, tl.load(seq_start + sid), tl.load(seq_end + sid)


@triton.jit
def chunk_and_head(HQ: tl.constexpr):
    """(chunk, query head) of a per-chunk program on the flat grid (chunks * HQ,): the query heads fastest,
    the chunks from the last to the first.  The GPU so starts every head's chunk at one place of a super-chunk
    before any chunk at the place before it: the latest chunks of a super-chunk (the most work in the walks over
    its earlier chunks) first, and no launch ends on a few long programs of one head."""
    pid = tl.program_id(0)
    return tl.num_programs(0) // HQ - 1 - pid // HQ, pid % HQ


@triton.jit
def tdot(a, b, TP: tl.constexpr, INTERP: tl.constexpr):
    """A transition product at precision TP (the spec's transition_precision): "fp16" / "bf16"
    round both operands to that 16-bit type (one tensor-core pass, half the shared memory of a
    float32 operand; fp16 keeps tf32's 10-bit mantissa), "tf32" / "tf32x3" / "ieee" multiply
    float32 operands in that mode.  Accumulation is float32 in every case."""
    if TP == "fp16":
        return mm(a.to(tl.float16), b.to(tl.float16), INTERP)
    elif TP == "bf16":
        return mm(a.to(tl.bfloat16), b.to(tl.bfloat16), INTERP)
    else:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision=TP)
