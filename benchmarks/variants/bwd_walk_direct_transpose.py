"""Candidate ``bwd_intra_walk_kernel``: the walk's dU product without a transposed register tile (same signature,
same arguments as the shipped kernel in codegen/triton/bwd_intra.py, built from its source by text replacement,
``kernel_variants``).

Per key chunk m the shipped step forms Y_l = X_m W_m^T (C x C) and uses it only transposed, dU_m -= Y_l^T G,
so every step moves Y_l from the accumulator layout through shared memory into a transposed A operand.  Here the
step forms Y_l^T = W_m X_m^T directly (X_m^T is a B operand read from shared memory, whose transposed read is
free for 16-bit tiles) and multiplies it as it is: same FLOPs, one shared-memory round trip (store, barrier,
transposed load) fewer on each of the s (s - 1) / 2 steps of a super-chunk.

``python benchmarks/dev_kernel_probe.py --only intra --intra-v2 benchmarks/variants/bwd_walk_direct_transpose.py``
times it beside the shipped walk on the same captured launch; tests/test_triton_backward.py checks its gradients.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pathtune.codegen.triton.bwd_intra as intra_mod

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))      # benchmarks/: kernel_variants
from kernel_variants import load_variant, module_source  # noqa: E402

_STEP = [
    ("        Yl = mm(Xd, tl.trans(Wm), INTERP)\n", "        YlT = mm(Wm, tl.trans(Xd), INTERP)\n"),
    ("        _acc(du_ptr + kof, -mm(tl.trans(Yl.to(DT)), Gd, INTERP), dmask)\n",
     "        _acc(du_ptr + kof, -mm(YlT.to(DT), Gd, INTERP), dmask)\n"),
]

bwd_intra_walk_kernel = load_variant(module_source(intra_mod), "bwd_intra_walk_kernel", "bwd_walk_direct_transpose",
                                     _STEP)
