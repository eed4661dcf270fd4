"""Candidate dq kernel of the backward between super-chunks with its query gradient added into memory per
super-chunk instead of carried in registers (``bwd_inter_dq_kernel`` of codegen/triton/bwd_inter.py rebuilt with a
few lines replaced, ``kernel_variants.load_variant_module``; same signature, grid and launch).

The shipped kernel walks the earlier super-chunks J of its query chunk and keeps dY = sum_J dZ_J Om_J^T as a
C x BD float32 tile in registers through the whole walk, stored once at the end.  That tile (64 registers a thread
at D 128, 4 warps) is live through every key step, where the logits, dP, dS and dZ tiles peak: offline sm_90 the
D 128 kernel spills 472 B per thread gated (304 ungated), 18 local loads and 11 local stores in the key loop, and
Nsight Compute counts 6.5x the spill requests of the ungated launch (H100, T 4K: 1.24 vs 1.01 ms,
``benchmarks/results/H100-20261206T091600Z-ncu-bwd-inter-gate.json``).  Here each super-chunk's share,
scale * dZ_J Om_J^T, is added into the program's own rows of dy right after its key loop (stored at the first,
read-modify-written after; the rows belong to this program alone, as in the column-blocked path of wide head dims):
108 B of spills gated, 120 ungated, none in the key loop (311 instead of 349 SASS instructions a step gated).  Up to
head dim 64 neither build spills.

Measured (H100, head-dim default config, D 128, ``benchmarks/results/H100-20261206T093000Z-dq-dy-in-memory-kprobe.json``
and ``H100-20261206T113400Z-dkv-tiles-e2e-gate-sums-dq-kprobe.json``): on dq's own launch 0.91 / 0.95x the shipped
kernel with the FoX gate (T 4K / 16K: 0.985 vs 1.080 ms, 4.20 vs 4.42) and 1.13 / 1.11x without it (0.986 vs 0.868,
4.03 vs 3.63); fwd+bwd 0.988-1.020x, within the probe's noise.  Taken only for the gated kernel it would save
~0.1 / 0.2 ms of a 12.4 / 24.7 ms PaTH-FoX fwd+bwd: not taken yet (it retires the bwd records).

``python benchmarks/dev_kernel_probe.py --only dq,e2e --dq-v2 benchmarks/variants/dq_dy_in_memory.py`` times the
kernel on the shipped launch's arguments and the public fwd+bwd with it in place beside the shipped kernel;
tests/test_triton_backward.py checks it against the shipped backward.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pathtune.codegen.triton.bwd_inter as inter_mod

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))      # benchmarks/: kernel_variants
from kernel_variants import load_variant_module, module_source  # noqa: E402

DY_IN_MEMORY = [
    ("            dY = tl.zeros((C, BD), dtype=tl.float32)\n"
     "            for step in range(0, sc_idx):\n",
     "            ymask = rmask[:, None] & dmask\n"
     "            for step in range(0, sc_idx):\n"),
    ("                dY += mm(dZ.to(DT), tl.trans(tl.load(om_base + dpair).to(DT)), INTERP)\n"
     "            tl.store(dy_ptr + qoff, dY * scale, mask=rmask[:, None] & dmask)\n",
     "                upd = mm(dZ.to(DT), tl.trans(tl.load(om_base + dpair).to(DT)), INTERP) * scale\n"
     "                if step > 0:\n"
     "                    upd += tl.load(dy_ptr + qoff, mask=ymask, other=0.0)\n"
     "                tl.store(dy_ptr + qoff, upd, mask=ymask)\n"),
]

bwd_inter_dq_kernel = load_variant_module(module_source(inter_mod), "dq_dy_in_memory",
                                          DY_IN_MEMORY).bwd_inter_dq_kernel
