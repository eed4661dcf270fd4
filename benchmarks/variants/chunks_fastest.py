"""Candidate program order for the per-chunk kernels: the chunks fastest (last to first) and the query heads slowest,
on the shipped flat grid (chunks * HQ,) -- the order the kernels had on their former (chunks, heads) grid, where a
launch ran every chunk of one head before the next head's.  Same arguments and grid as the shipped
``scan_intra_kernel``, ``bwd_intra_walk_kernel``, ``bwd_intra_diag_kernel`` and ``bwd_prep_kernel`` (built from
their sources by replacing ``_ops.chunk_and_head``'s call, ``kernel_variants``); only the order the GPU starts the
programs in differs, so the outputs are the shipped kernels' (the gradients up to the order of the walk's atomic
adds).

The shipped order (heads fastest) took a D128 T4K fwd+bwd from 13.12 to 12.67 ms on the H200; the tuned bench of
that tree shows D64 fwd+bwd rounds spread over 8.95-11.2 ms at T 2K (the previous tree's: 8.84-9.17).  This times
the D64 cells in the former order to tell a regression of the order from noise:

    python benchmarks/dev_kernel_probe.py --D 64 --T 2048,4096 --only e2e \\
        --intra-v2 benchmarks/variants/chunks_fastest.py

tests/test_triton_backward.py checks a fwd+bwd with it against the float64 oracle.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pathtune.codegen.triton.bwd_intra as intra_mod
import pathtune.codegen.triton.bwd_prep as prep_mod
import pathtune.codegen.triton.scan_fwd as scan_mod

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))      # benchmarks/: kernel_variants
from kernel_variants import load_variant_module, module_source  # noqa: E402

ORDER = [("    n, hq = chunk_and_head(HQ)\n",
          "    n_all = tl.num_programs(0) // HQ\n"
          "    n, hq = n_all - 1 - tl.program_id(0) % n_all, tl.program_id(0) // n_all\n")]

scan_intra_kernel = load_variant_module(module_source(scan_mod), "chunks_fastest_scan", ORDER).scan_intra_kernel
bwd_prep_kernel = load_variant_module(module_source(prep_mod), "chunks_fastest_prep", ORDER).bwd_prep_kernel
# the walk and the diagonal kernel share the tile helper that picks the program's chunk and head
_intra = load_variant_module(module_source(intra_mod), "chunks_fastest_intra", ORDER)
bwd_intra_walk_kernel = _intra.bwd_intra_walk_kernel
bwd_intra_diag_kernel = _intra.bwd_intra_diag_kernel
