"""Candidate program order without a table: the per-chunk kernels of benchmarks/variants/longest_first.py
(``scan_intra_kernel``, ``bwd_intra_walk_kernel``, ``bwd_prep_kernel``) on one grid axis with the query heads
fastest and the chunks from the last to the first, so that the GPU starts, per super-chunk, every head's chunk at
place S / C - 1, then S / C - 2, ... (longest first within each super-chunk; super-chunks last to first).

That is longest_first.py's order with groups of one super-chunk times the heads, computed from the program id
alone (no order table, nothing to build or cache per layout; any layout, since a super-chunk's chunks are
consecutive in the chunk tables).  ``python benchmarks/tail_model.py --group 1`` models it: the full saving
where one super-chunk's programs (S / C x heads) fill the GPU's program slots (the walk: 128 at D128 / 8 heads on 132
slots, 256 at D64 / 16 heads on 264), less where they do not (scan_intra at T 2K D128: 2 % of the launch instead
of 5 %; bwd_prep 2 % instead of 4-8 %).  Same arguments as the shipped kernels; each kernel here is a wrapper that
launches the variant on the flat grid when given the shipped launcher's (chunks, heads) grid.

    python benchmarks/scan_probe.py --candidates benchmarks/variants/heads_fastest.py
    python benchmarks/dev_kernel_probe.py --only intra,prep,e2e --intra-v2 benchmarks/variants/heads_fastest.py

tests/test_triton_forward.py and tests/test_triton_backward.py check the outputs against the shipped kernels'.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pathtune.codegen.triton.bwd_intra as intra_mod
import pathtune.codegen.triton.bwd_prep as prep_mod
import pathtune.codegen.triton.scan_fwd as scan_mod

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))      # benchmarks/: kernel_variants
from kernel_variants import RegriddedKernel, load_variant, module_source  # noqa: E402

_FLAT = ("    n = tl.num_programs(0) // HQ - 1 - tl.program_id(0) // HQ     # chunks last to first, heads fastest\n"
         "    hq = tl.program_id(0) % HQ\n")
SCAN_EDITS = [("    n = n_chunks - 1 - tl.program_id(0)\n    hq = tl.program_id(1)\n", _FLAT)]
PREP_EDITS = [("    n = tl.program_id(0)\n    hq = tl.program_id(1)\n", _FLAT)]
WALK_EDITS = [("    n = n_chunks - 1 - tl.program_id(0)     # latest chunks of a super-chunk (most work) first\n"
               "    hq = tl.program_id(1)\n", _FLAT)]


def _flat(grid: tuple) -> tuple:
    """The shipped (chunks, query heads) grid as one axis."""
    return (grid[0] * grid[1],)


scan_intra_kernel = RegriddedKernel(load_variant(module_source(scan_mod), "scan_intra_kernel", "heads_fastest_scan",
                                                 SCAN_EDITS), _flat)
bwd_prep_kernel = RegriddedKernel(load_variant(module_source(prep_mod), "bwd_prep_kernel", "heads_fastest_prep",
                                               PREP_EDITS), _flat)
# the walk's tile helper is shared with the diagonal kernel, which this module does not export
bwd_intra_walk_kernel = RegriddedKernel(load_variant(module_source(intra_mod), "bwd_intra_walk_kernel",
                                                     "heads_fastest_walk", WALK_EDITS), _flat)
