"""Candidate transport backward on 64-row tiles: the split chain of benchmarks/variants/bwd_transport_split_chain.py
(the Suf replay and the G walk in programs of their own) and the shipped ``bwd_transport_grads_kernel``, both at
ROWS = 64 rows of the D x D states per tile instead of ``forward.transport_rows`` (32).

At 32 rows every product of the chain is a 32-row tile, which Triton lowers to sm_90's mma.sync (offline: D128
320 sites, D64 480), and the grads kernel's Suf / G products too (128 / 192 of them); at 64 rows all are wgmma
(tf32, the shipped bwd_transition_precision).  The split keeps the chain's programs at the shipped count (a range
at D128 T4K: 4 super-chunks x 8 heads x 2 row blocks x 2 walks = 128 on 132 SMs), each with the 16 dependent steps
of one walk.  Launch options from offline sm_90 builds (``compile_check.compile_kernel``): the split chain at 4 warps
and 2 stages (D64 82 KB, two programs per SM, 20 B of spills; D128 229 KB, one, none), the grads at 8 warps and 2
stages (D64 236 registers, D128 253, no spills; the shipped D64 grads at 4 warps spill 712 B).  These options
replace the launch's (the probe's warps / stages variants of a transport candidate time the same launch).  The
states' scratch buffers keep their size (BD / ROWS row blocks of ROWS rows).

Each kernel here is a wrapper that takes the shipped launcher's grid and keyword arguments (ROWS = 32) and launches
on the 64-row grid with these options, so the backward's launcher and a captured launch take them in place.

    python benchmarks/dev_kernel_probe.py --only transport,e2e \
        --transport-v2 benchmarks/variants/bwd_transport_rows64.py

tests/test_triton_backward.py checks its gradients against the shipped ones and the float64 oracle.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pathtune.codegen.triton.bwd_chain as chain_mod

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))      # benchmarks/: kernel_variants, variants
from kernel_variants import load_variant, module_source  # noqa: E402

from variants.bwd_transport_split_chain import _SPLIT  # noqa: E402
from variants.transport_rows64 import Rows64Launch  # noqa: E402

CHAIN_OPTIONS = dict(num_warps=4, num_stages=2)
GRADS_OPTIONS = dict(num_warps=8, num_stages=2)


_split_chain = load_variant(module_source(chain_mod), "bwd_transport_chain_kernel", "bwd_transport_rows64_chain",
                            _SPLIT)
bwd_transport_chain_kernel = Rows64Launch(_split_chain, CHAIN_OPTIONS, row_axis=2, split=True)
bwd_transport_grads_kernel = Rows64Launch(chain_mod.bwd_transport_grads_kernel, GRADS_OPTIONS, row_axis=None,
                                          split=False)
