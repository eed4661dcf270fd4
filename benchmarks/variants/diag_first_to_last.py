"""Candidate program order for the backward's diagonal-tile kernel: the chunks from the first to the last (query heads
fastest), the reverse of the walk's order.

The walk (``bwd_intra_walk_kernel``) runs a token range's chunks from the last to the first, so the super-chunk
it touched last, whose float32 accumulators (dK~, dW, dU, dK, dV, dM of its rows: ~23 MB at D 128, H 8, 1024
tokens) and carried query gradients (dY) are the likeliest to still sit in L2, is the range's first; the shipped
diagonal kernel starts at the range's last.  Nsight Compute on an H100 (D 128, T 4K, one range launch of 512
programs) shows the shipped diagonal kernel DRAM-bound: 69 % of DRAM bandwidth, ~270 MB moved, L2 hit rate 42 %,
about half of it the read-modify-write of those accumulators by its atomic adds.  Same arguments, grid and results
as the shipped kernel (up to the order of the atomic adds), built from its source (``kernel_variants``).  Only a
fwd+bwd shows the order's effect (a launch timed alone runs on whatever its previous run left in L2):

    python benchmarks/dev_kernel_probe.py --only e2e --D 64,128 --intra-v2 benchmarks/variants/diag_first_to_last.py

tests/test_triton_backward.py checks a fwd+bwd with it against the shipped kernel and the float64 oracle.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pathtune.codegen.triton.bwd_intra as intra_mod

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))      # benchmarks/: kernel_variants
from kernel_variants import load_variant_module, module_source  # noqa: E402

# the module's tile helper, in a private copy of bwd_intra.py whose diagonal kernel alone is taken (the walk keeps the
# shipped order)
ORDER = [("    n, hq = chunk_and_head(HQ)\n", "    n, hq = tl.program_id(0) // HQ, tl.program_id(0) % HQ\n")]


def build(order=ORDER, tag="diag_first_to_last"):
    """The diagonal kernel with ``order``'s edits (a test builds a wrong order this way)."""
    return load_variant_module(module_source(intra_mod), tag, order).bwd_intra_diag_kernel


bwd_intra_diag_kernel = build()
