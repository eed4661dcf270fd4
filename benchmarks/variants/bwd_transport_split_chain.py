"""Candidate ``bwd_transport_chain_kernel``: its two serial walks in programs of their own (built from
codegen/triton/bwd_chain.py by text replacement, ``kernel_variants``; same arguments, twice the programs).

Per (super-chunk, kv head, ROWS rows) the shipped kernel first replays the right-to-left walk of the suffix
product, storing every state Suf_m, then walks left to right with the gradient G of Suf, storing every G_m:
2 S / C dependent steps per program, with 96 programs per range launch at D = 128, T = 4K (under one per SM).
The G walk, G <- G - (G U_m^T) W_m + dKJ_m^T K~_m, never reads Suf: the two walks are independent.  Here the
grid's third axis is doubled; programs of its first half replay Suf, the second half walk G, so each program
runs S / C dependent steps and twice the programs share the SMs -- if two fit one: at the shipped launch options
the chain holds one program per SM (offline sm_90: 160 KB of shared memory at D128, 3 stages; 249 registers at
8 warps at D64), so the probe also times it at fewer stages / warps.  ``bwd_transport_chain_kernel`` is a wrapper
that launches the variant on that grid when given the shipped launcher's grid (``kernel[grid](...)``), so the
launcher and a captured launch take it in the shipped kernel's place.

``python benchmarks/dev_kernel_probe.py --only transport --transport-v2
benchmarks/variants/bwd_transport_split_chain.py`` times it beside the shipped chain on the same captured launch;
tests/test_triton_backward.py checks its gradients.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pathtune.codegen.triton.bwd_chain as chain_mod

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))      # benchmarks/: kernel_variants
from kernel_variants import RegriddedKernel, load_variant, module_source  # noqa: E402

_SPLIT = [
    ("    j = tl.program_id(0)\n    h = tl.program_id(1)\n    rb = tl.program_id(2)\n"
     "    tok0 = tl.load(sc_tok0 + j)\n    send = tl.load(seq_end + tl.load(sc_seq + j))\n"
     "    if tok0 + S < send:\n        NCH: tl.constexpr = S // C\n",
     "    j = tl.program_id(0)\n    h = tl.program_id(1)\n    rb = tl.program_id(2) % (BD // ROWS)\n"
     "    walk_g = tl.program_id(2) >= BD // ROWS\n"
     "    tok0 = tl.load(sc_tok0 + j)\n    send = tl.load(seq_end + tl.load(sc_seq + j))\n"
     "    if tok0 + S < send:\n        NCH: tl.constexpr = S // C\n"),
    ("        Suf = tl.where(e[:, None] == d[None, :], 1.0, 0.0)\n"
     "        for step in range(0, NCH):\n",
     "        Suf = tl.where(e[:, None] == d[None, :], 1.0, 0.0)\n"
     "        for step in range(0, tl.where(walk_g, 0, NCH)):\n"),
    ("        G = tl.load(dwhat_ptr + ((j * H + h) * BD + e[:, None]) * BD + d[None, :])\n"
     "        for back in range(0, NCH):\n",
     "        G = tl.load(dwhat_ptr + ((j * H + h) * BD + e[:, None]) * BD + d[None, :])\n"
     "        for back in range(0, tl.where(walk_g, NCH, 0)):\n"),
]

_kernel = load_variant(module_source(chain_mod), "bwd_transport_chain_kernel", "bwd_transport_split_chain", _SPLIT)


def _doubled(grid: tuple) -> tuple:
    """The third grid axis doubled (the Suf walks, then the G walks)."""
    g0, g1, g2 = grid
    return (g0, g1, 2 * g2)


bwd_transport_chain_kernel = RegriddedKernel(_kernel, _doubled)
