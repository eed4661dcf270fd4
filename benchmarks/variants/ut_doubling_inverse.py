"""Candidate ``ut_fused_kernel``s: the diagonal-block inverses by recursive doubling on the whole C x C tile instead
of forward substitution (built from codegen/triton/ut.py by text replacement, ``kernel_variants``; same signature).

The shipped kernel inverts the SB x SB diagonal blocks of I + N (N strictly lower) by substitution, SB - 1
dependent steps that each read a row of N back from global memory (the blocks are parked in m's rows), then merges
the blocks with log2(C / SB) + 2 full-tile products (``_finish_inverse``).  Here the inverse of the 2s-blocks comes
from that of the s-blocks, X <- X - X E_s X (E_s: N's blocks below the diagonal inside each 2s-block; block
triangular inversion, the same function as substitution), from 2-blocks up to SB-blocks: 2 (log2(SB) - 1)
dependent full-tile products, no global round trips, no barriers.  SB = C leaves no merge (A = X diag(beta)).

* ``ut_fused_kernel_doubling``: the doubling products at the stage's precision UP.
* ``ut_fused_kernel_doubling_x3``: at tf32x3 whatever UP is (fp32-accurate blocks; the merges at UP).

``python benchmarks/ut_probe.py --paths fused --candidate
benchmarks/variants/ut_doubling_inverse.py:ut_fused_kernel_doubling,benchmarks/variants/ut_doubling_inverse.py:ut_fused_kernel_doubling_x3
--precisions tf32,tf32x3 --diag-blocks 8,16,64``
(errors on U, K~, M against float64, stress rows: nearly parallel w at beta = 2); tests/test_triton_forward.py
checks them against the shipped kernel under the interpreter.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pathtune.codegen.triton.ut as ut_mod

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))      # benchmarks/: kernel_variants
from kernel_variants import load_variant, module_source  # noqa: E402

SHIPPED_INVERSE = ("    Dinv = _diagonal_block_inverses(N, m_ptr, tl.load(chunk_tok0 + n), "
                   "tl.load(seq_end + tl.load(chunk_seq + n)),\n"
                   "                                    h, H, C, SB)\n"
                   "    A = _finish_inverse(N, Dinv, C, UP, SB) * beta[None, :]\n")
DOUBLING_INVERSE = """    Dinv = _doubling_block_inverses(N, C, SB, DOUBLING_PRECISION)
    if SB == C:
        A = Dinv * beta[None, :]
    else:
        A = _finish_inverse(N, Dinv, C, UP, SB) * beta[None, :]
"""
HELPER = '''

@triton.jit
def _doubling_block_inverses(N, C: tl.constexpr, SB: tl.constexpr, DP: tl.constexpr):
    """The inverses of the SB x SB diagonal blocks of I + N (N strictly lower, C x C float32) as a block-diagonal
    C x C tile: the 2-blocks' directly (I - N inside them), then each 2s-block's from its two s-blocks,
    X <- X - X E_s X, E_s = N's s x s block below the diagonal inside each 2s-block (products at DP)."""
    r = tl.arange(0, C)
    X = tl.where(r[:, None] == r[None, :], 1.0, 0.0) - tl.where((r // 2)[:, None] == (r // 2)[None, :], N, 0.0)
    for lv in tl.static_range(1, 7):
        SBLK = 1 << lv
        if SBLK < SB:
            E = tl.where(((r // (2 * SBLK))[:, None] == (r // (2 * SBLK))[None, :])
                         & ((r // SBLK) % 2 == 1)[:, None] & ((r // SBLK) % 2 == 0)[None, :], N, 0.0)
            X = X - _pdot(_pdot(X, E, DP), X, DP)
    return X
'''

_SRC = module_source(ut_mod)
ut_fused_kernel_doubling = load_variant(
    _SRC, "ut_fused_kernel", "ut_doubling",
    [(SHIPPED_INVERSE, DOUBLING_INVERSE.replace("DOUBLING_PRECISION", "UP"))], append=HELPER)
ut_fused_kernel_doubling_x3 = load_variant(
    _SRC, "ut_fused_kernel", "ut_doubling_x3",
    [(SHIPPED_INVERSE, DOUBLING_INVERSE.replace("DOUBLING_PRECISION", '"tf32x3"'))], append=HELPER)
