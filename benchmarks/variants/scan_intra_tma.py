"""Candidate forward ``scan_intra_kernel``: the walk over the earlier chunks of a super-chunk reads K~, W, U
and V through TMA tensor descriptors instead of pointer tiles.

Each program (one UT chunk of C query rows, one query head) walks the chunks before it in its super-chunk;
every step loads four C x D tiles (K~, the 16-bit copy of W, U, and V) with 64-bit pointer tiles and masks
on the head dim, then runs a chain of four dependent products.  Here the four tiles arrive as TMA blocks
of the [N, H * D] / [N, H * DV] views (a chunk before the query's lies wholly inside its sequence: no row
masks), which frees the address registers; ``stages`` > 1 also pipelines the walk's loads (a stage of
four tiles: 64 KB of shared memory at D = 128).

Built from the shipped kernel's source by text replacement (``kernel_variants.load_variant``), so it
follows the shipped kernel in everything else.  Requires D == BD and DV == BDV.  ``TmaScanIntra``
launches it with the shipped kernel's launch arguments (benchmarks/scan_probe.py).
"""
from __future__ import annotations

import os
import sys

from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from kernel_variants import load_variant, module_source  # noqa: E402

import pathtune.codegen.triton.scan_fwd as scan_fwd  # noqa: E402

_LOADS = (
    "        Kt = tl.load(kt_ptr + kof, mask=dmask, other=0.0).to(DT)\n"
    "        Wm = tl.load(w_ptr + kof, mask=dmask, other=0.0).to(DT)\n"
    "        Um = tl.load(u_ptr + kof, mask=dmask, other=0.0).to(DT)\n"
    "        Vm = tl.load(v_ptr + (krows[:, None] * H + h) * DV + dv[None, :], mask=dvmask, other=0.0)\n"
)
_TMA_LOADS = (
    "        krow = (s0 + cc * C).to(tl.int32)\n"
    "        Kt = kt_desc.load([krow, (h * D).to(tl.int32)]).to(DT)\n"
    "        Wm = w_desc.load([krow, (h * D).to(tl.int32)]).to(DT)\n"
    "        Um = u_desc.load([krow, (h * D).to(tl.int32)]).to(DT)\n"
    "        Vm = v_desc.load([krow, (h * DV).to(tl.int32)])\n"
)
_SIGNATURE = ("    o_ptr, lse_ptr, x_ptr,\n    chunk_tok0,",
              "    o_ptr, lse_ptr, x_ptr, kt_desc, w_desc, u_desc, v_desc,\n    chunk_tok0,")
_WALK = "    for step in range(0, c_idx - first_chunk_of_sc):\n"


def variant(stages: int):
    """The candidate kernel; stages > 1: the walk loop software-pipelined over that many stages."""
    replacements = [_SIGNATURE, (_LOADS, _TMA_LOADS)]
    if stages > 1:
        replacements.append((_WALK, f"    for step in tl.range(0, c_idx - first_chunk_of_sc, num_stages={stages}):\n"))
    return load_variant(module_source(scan_fwd), "scan_intra_kernel", f"scan_intra_tma_s{stages}", replacements)


class TmaScanIntra:
    """Launches the candidate with ``scan_intra_kernel``'s launch arguments: ``kernel[grid](*args, **kw)`` as
    for the shipped kernel (descriptors of K~, W, U and V, arguments 6, 3, 4 and 2, added after x)."""

    def __init__(self, stages: int = 1):
        self.kernel = variant(stages)

    @staticmethod
    def applies(kw: dict) -> bool:
        return kw["D"] == kw["BD"] and kw["DV"] == kw["BDV"]

    def __getitem__(self, grid):
        def launch(*args, **kw):
            C, D, DV = kw["C"], kw["D"], kw["DV"]

            def desc(t, width):
                return TensorDescriptor.from_tensor(t.view(t.shape[0], -1), [C, width])

            descs = (desc(args[6], D), desc(args[3], D), desc(args[4], D), desc(args[2], DV))
            return self.kernel[grid](*args[:11], *descs, *args[11:], **kw)
        return launch
