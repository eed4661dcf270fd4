"""Timing-only proxies of the forward's one-launch UT stage (``ut_fused_kernel``) with one of its parts left out
(built from codegen/triton/ut.py by text replacement, ``kernel_variants``; same signature): where the stage's time
goes.  Replacing its inverse by another of the same cost (recursive doubling, with or without the merges) left
its time unchanged at tf32 (``benchmarks/results/H200-20261204T205300Z-ut-probe.json``).

* ``ut_fused_kernel_no_inverse``: A = diag(beta) (no diagonal-block substitution, no merge products).
* ``ut_fused_kernel_no_wk``: M without W K^T (its column-block loads and products; M = 0).
* ``ut_fused_kernel_no_apply``: U, K~ and the w copy not formed or stored (M still stored).

Their outputs are not the stage's (timing only):

``python benchmarks/ut_probe.py --paths fused --candidate
benchmarks/variants/ut_stage_parts.py:ut_fused_kernel_no_inverse,benchmarks/variants/ut_stage_parts.py:ut_fused_kernel_no_wk,benchmarks/variants/ut_stage_parts.py:ut_fused_kernel_no_apply
--precisions tf32 --diag-blocks 8,16``
"""
from __future__ import annotations

import sys
from pathlib import Path

import pathtune.codegen.triton.ut as ut_mod

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))      # benchmarks/: kernel_variants
from kernel_variants import load_variant, module_source  # noqa: E402

INVERSE = ("    Dinv = _diagonal_block_inverses(N, m_ptr, tl.load(chunk_tok0 + n), "
           "tl.load(seq_end + tl.load(chunk_seq + n)),\n"
           "                                    h, H, C, SB)\n"
           "    A = _finish_inverse(N, Dinv, C, UP, SB) * beta[None, :]\n")
# N * 0.0 keeps W W^T's loads and products (nothing else reads N here): only the inverse is left out
NO_INVERSE = "    A = tl.where(r[:, None] == r[None, :], 1.0, 0.0) * beta[None, :] + N * 0.0\n"
WK = "    M = _pdot(A, tl.where(strict, L, 0.0), UP)\n"

_SRC = module_source(ut_mod)


def _wk_loop(src: str) -> str:
    """ut_fused_kernel's W K^T loop (the accumulation of L over column blocks), through its last product."""
    start = src.index("    L = tl.zeros((C, C), dtype=tl.float32)\n", src.index("def ut_fused_kernel("))
    end = src.index(WK, start)
    return src[start:end]


def _apply_loop(src: str) -> str:
    """ut_fused_kernel's last loop: U, K~ and the w copy per column block, to the end of the kernel."""
    fused = src.index("def ut_fused_kernel(")
    start = src.index("    Mt = tl.trans(M)\n", fused)
    end = src.index("            tl.store(wd_ptr + off, W.to(wd_ptr.dtype.element_ty), mask=mask2)\n", start)
    return src[start:src.index("\n", end) + 1]


ut_fused_kernel_no_inverse = load_variant(_SRC, "ut_fused_kernel", "ut_no_inverse", [(INVERSE, NO_INVERSE)])
ut_fused_kernel_no_wk = load_variant(
    _SRC, "ut_fused_kernel", "ut_no_wk",
    [(_wk_loop(_SRC) + WK, "    M = tl.zeros((C, C), dtype=tl.float32)\n")])
ut_fused_kernel_no_apply = load_variant(_SRC, "ut_fused_kernel", "ut_no_apply", [(_apply_loop(_SRC), "")])
