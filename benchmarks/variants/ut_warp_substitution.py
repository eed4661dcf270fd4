"""Candidate UT stage: the diagonal-block substitution of ``ut_fused_kernel`` without cross-warp reductions.

The shipped ``_diagonal_block_inverses`` keeps the SB x SB blocks as one [C/SB, SB, SB] tensor and, per
substitution step, picks row i of every block and multiplies it into the inverse with two reductions over
the tensor's middle axis.  On sm_90 that axis spans the four warps (TTGIR of the tf32 kernel at D = 128:
threadsPerWarp [1, 2, 16], warpsPerCTA [1, 4, 1]), so each of the SB - 1 dependent steps passes through
shared memory with barriers, plus one layout conversion between the two reductions.

Here the inverse is held transposed, as a [C, SB] tile whose row (b, c) is column c of block b's inverse:
a step's product with row i of the block is a reduction over the tile's last axis, which Triton lays across
the lanes of one warp (shuffles, no barrier).  Row i of N's blocks is read from the chunk's rows of m, where
the kernel stores the diagonal blocks first (the same scratch the shipped kernel uses to return the
inverse): those loads do not depend on the steps, so they issue early.  The inverse returns to the C x C
layout through the same rows of m as before.  Same arithmetic, same order of the step sums' terms up to
the reduction tree.

``ut_fused_kernel_prefetch``: the same, each step's row of N loaded three steps ahead (the loads' latency,
not the reductions, may set a step's time once no barrier is left).

Everything else is the shipped kernel's source (a text replacement of ``codegen/triton/ut.py``);
``benchmarks/ut_probe.py --candidate FILE`` times it beside the shipped kernel.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from kernel_variants import load_variant_module, module_source  # noqa: E402

import pathtune.codegen.triton.ut as ut  # noqa: E402

_SRC = module_source(ut)
_START = _SRC.index("@triton.jit\ndef _diagonal_block_inverses(")
_END = _SRC.index("@triton.jit\ndef _operand(")

_NEW = '''@triton.jit
def _block_row(m_ptr, first, i, send, h, H: tl.constexpr, C: tl.constexpr, SB: tl.constexpr):
    """Row i of each row's SB x SB block of N, from the first SB columns of m's rows ([C, SB])."""
    row_i = (first + i).to(tl.int64)
    return tl.load(m_ptr + (row_i * H + h)[:, None] * C + tl.arange(0, SB)[None, :], mask=(row_i < send)[:, None],
                   other=0.0)


@triton.jit
def _diagonal_block_inverses(N, m_ptr, tok0, send, h, H: tl.constexpr, C: tl.constexpr, SB: tl.constexpr):
    """The inverses of the SB x SB diagonal blocks of I + N (N strictly lower, C x C float32), as a
    block-diagonal C x C tile, by forward substitution (SB - 1 dependent steps).

    The blocks of N go to the first SB columns of this chunk's rows of m (``m_ptr``, [N_tok, H, C]
    float32; M overwrites them later); the inverse is held transposed, ``it[b * SB + c, k]`` =
    inverse of block b at (k, c), so that step i's product with row i of block b (read back from m)
    reduces over the tile's last axis, inside one warp.  The inverse returns to the C x C layout through
    the same columns of m.  Rows outside ``send`` (past a sequence end) read back as 0: they only meet
    later rows of the lower-triangular products."""
    r = tl.arange(0, C)
    k = tl.arange(0, SB)
    rows = (tok0 + r).to(tl.int64)
    rmask = rows < send
    blockdiag = (r // SB)[:, None] == (r // SB)[None, :]
    tl.store(m_ptr + (rows[:, None] * H + h) * C + (r % SB)[None, :], N, mask=blockdiag & rmask[:, None])
    tl.debug_barrier()
    first = tok0 + (r // SB) * SB           # first token row of row (b, c)'s block
    it = tl.where((r % SB)[:, None] == k[None, :], 1.0, 0.0)
    # rows of N in flight: n_a for this step, n_b / n_c for the next two (PREFETCH), each loaded early
    n_a = _block_row(m_ptr, first, 1, send, h, H, C, SB)
    if PREFETCH:
        n_b = _block_row(m_ptr, first, 2 % SB, send, h, H, C, SB)
        n_c = _block_row(m_ptr, first, 3 % SB, send, h, H, C, SB)
    for i in tl.static_range(1, SB):
        if PREFETCH and i + 3 < SB:
            n_d = _block_row(m_ptr, first, i + 3, send, h, H, C, SB)
        corr = tl.sum(n_a * it, axis=1)
        it = tl.where(k[None, :] == i, it - corr[:, None], it)
        if i + 1 < SB:
            if PREFETCH:
                n_a = n_b
                n_b = n_c
                if i + 3 < SB:
                    n_c = n_d
            else:
                n_a = _block_row(m_ptr, first, i + 1, send, h, H, C, SB)
    tl.debug_barrier()                      # every row of N is read before the inverse overwrites it
    inv_rows = (first[:, None] + k[None, :]).to(tl.int64)
    tl.store(m_ptr + (inv_rows * H + h) * C + (r % SB)[:, None], it, mask=inv_rows < send)
    tl.debug_barrier()
    return tl.load(m_ptr + (rows[:, None] * H + h) * C + (r % SB)[None, :],
                   mask=blockdiag & rmask[:, None], other=0.0)

'''


def _variant(tag: str, prefetch: bool):
    new = _NEW.replace("PREFETCH", str(prefetch))
    return load_variant_module(_SRC, tag, [(_SRC[_START:_END], new)]).ut_fused_kernel


ut_fused_kernel = _variant("ut_warp_substitution", prefetch=False)
# the same with each step's row of N loaded three steps ahead (a hand-pipelined load)
ut_fused_kernel_prefetch = _variant("ut_warp_substitution_prefetch", prefetch=True)
