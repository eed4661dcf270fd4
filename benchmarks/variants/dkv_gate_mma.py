"""Candidate ``bwd_inter_dkv_kernel``: the FoX gate's key-side sums by a tensor-core product instead of a
row reduction per step (same signature, same arguments as the shipped kernel in codegen/triton/bwd_inter.py,
built from its source by text replacement, ``kernel_variants``).

Per step over BLOCK_M later queries the shipped kernel adds each key row's sum of dS^T (BLOCK_N x BLOCK_M,
float32) into a BLOCK_N vector: in-thread adds, two shuffle rounds and a vector in a slice layout carried
across the whole walk.  Here the sums come from the product dS^T E with E a BLOCK_M x 16 tile whose first
column is ones (the rest zeros), accumulated in a BLOCK_N x 16 float32 tile (8 registers a thread at
BLOCK_N 64 and 4 warps) and reduced once, after the walk.  dS^T enters in the 16-bit type dK gets it in
(the product dS^T Y of the same step), so the sums round each term to 16 bits, where the shipped ones add
float32 terms: the gradient check in tests/test_triton_backward.py holds it to the oracle's tolerance.

``python benchmarks/dev_kernel_probe.py --only dkv --dkv-v2 benchmarks/variants/dkv_gate_mma.py`` times it
beside the shipped kernel on the same captured launch.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pathtune.codegen.triton.bwd_inter as inter_mod

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))      # benchmarks/: kernel_variants
from kernel_variants import load_variant, module_source  # noqa: E402

_STEP = [
    # E: the ones column, built once per super-chunk call
    ("    dKZ = tl.zeros((BLOCK_N, BD), dtype=tl.float32)\n    for m0 in range(0, S, BLOCK_M):\n",
     "    dKZ = tl.zeros((BLOCK_N, BD), dtype=tl.float32)\n"
     "    ones = ((r[:, None] >= 0) & (tl.arange(0, 16)[None, :] == 0)).to(DT)\n"
     "    for m0 in range(0, S, BLOCK_M):\n"),
    ("        dKZ += mm(dsT.to(DT), Yd, INTERP)\n        if USE_GATE:\n            dck += tl.sum(dsT, axis=1)\n",
     "        dsTd = dsT.to(DT)\n        dKZ += mm(dsTd, Yd, INTERP)\n        if USE_GATE:\n"
     "            dck += mm(dsTd, ones, INTERP)\n"),
    ("            dck = tl.zeros((BLOCK_N,), dtype=tl.float32)   # the gate's key-side sums -sum_i dS_ij\n",
     "            dck = tl.zeros((BLOCK_N, 16), dtype=tl.float32)   # column 0: the key-side sums\n"),
    ("                tl.store(cptr, tl.load(cptr) - dck * gate_nat)\n",
     "                tl.store(cptr, tl.load(cptr) - tl.sum(dck, axis=1) * gate_nat)\n"),
]

bwd_inter_dkv_kernel = load_variant(module_source(inter_mod), "bwd_inter_dkv_kernel", "dkv_gate_mma", _STEP)
