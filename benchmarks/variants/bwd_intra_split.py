"""Candidate for the backward's intra-super-chunk kernel: the walk and the diagonal tile as two kernels.

``codegen/triton/bwd_intra.py: bwd_intra_kernel`` runs, per (query UT chunk, query head), the walk over
the earlier chunks of its super-chunk and then the diagonal tile (the products with the float32 M at
the transition precision, where sm_90 spills ~2 KB per thread; the walk alone spills ~90 B at D64).
A kernel's registers are allocated for its largest live set, so the walk -- most of the work, up to 15
chunk steps per program -- runs at the occupancy the diagonal tile allows.  Here:

1. ``bwd_intra_walk_kernel``: the shipped kernel up to the end of the walk, which then stores the carried
   query gradient G (float32, laid out as dY) and, with the gate, the walk's query-side gate sums.
2. ``bwd_intra_diag_kernel``: the shipped kernel's diagonal tile, starting from that G and those sums.

Both are cut from the shipped kernel's source at its comments (``kernel_variants.load_variant_module``),
so they compute exactly what it computes; the extra traffic is one float32 C x D tile per program,
written and read once.  ``bwd_intra_kernel`` launches both with the shipped kernel's arguments (plus
their scratch), so ``backward.py``, the interpreter test and ``dev_kernel_probe.py --intra-v2`` run it
in the shipped kernel's place.
"""
from __future__ import annotations

import torch
from kernel_variants import load_variant_module, module_source

import pathtune.codegen.triton.bwd_intra as _shipped

_SRC = module_source(_shipped)
_DEF = "def bwd_intra_kernel("
_SIG = "n_chunks, qk_scale, gate_scale, scale, gate_nat,"   # the last runtime arguments: scratch after them
_WALK_FROM = "    QW = tl.where(causal, mm(Q, tl.trans(Wc), INTERP), 0.0)\n    Xc ="
_DIAG_FROM = "    # diagonal tile and the boundary adjustment"


def _cut(src: str, start: str, end: str | None, middle: str) -> str:
    """``src`` with the text from the (unique) ``start`` up to ``end`` (None: the end) replaced by ``middle``."""
    if src.count(start) != 1 or (end is not None and src.count(end) != 1):
        raise ValueError(f"the shipped bwd_intra.py changed: {start[:40]!r} / {str(end)[:40]!r} not found once")
    i = src.index(start)
    j = len(src) if end is None else src.index(end)
    return src[:i] + middle + src[j:]


if _SRC.count(_SIG) != 1:
    raise ValueError(f"the shipped bwd_intra.py changed: {_SIG!r} not found once")
_base = _SRC.replace(_SIG, _SIG + " g_ptr, dcq_ptr,")
_WALK_TAIL = """    # the carried query gradient and the walk's query-side gate sums for the diagonal kernel
    tl.store(g_ptr + qoff, G, mask=m2)
    if USE_GATE:
        tl.store(dcq_ptr + rows * HQ + hq, dcq, mask=rmask)
"""
_walk_src = _cut(_base, _DIAG_FROM, None, _WALK_TAIL).replace(_DEF, "def bwd_intra_walk_kernel(")
_diag_src = _cut(_base, _WALK_FROM, _DIAG_FROM, """    G = tl.load(g_ptr + qoff, mask=m2, other=0.0)
    if USE_GATE:
        dcq = tl.load(dcq_ptr + rows * HQ + hq, mask=rmask, other=0.0)
""").replace(_DEF, "def bwd_intra_diag_kernel(")

bwd_intra_walk_kernel = load_variant_module(_walk_src, "bwd_intra_split_walk").bwd_intra_walk_kernel
bwd_intra_diag_kernel = load_variant_module(_diag_src, "bwd_intra_split_diag").bwd_intra_diag_kernel


class _SplitLaunch:
    """``bwd_intra_kernel[grid](*args, **kw)`` as the two kernels, with G and the gate sums in scratch."""

    def __getitem__(self, grid):
        names = bwd_intra_walk_kernel.arg_names

        def launch(*args, **kw):
            dy = args[names.index("dy_ptr")]
            lse = args[names.index("lse_ptr")]
            scratch = dict(g_ptr=torch.empty_like(dy, dtype=torch.float32),
                           dcq_ptr=torch.empty_like(lse, dtype=torch.float32))
            bwd_intra_walk_kernel[grid](*args, **scratch, **kw)
            bwd_intra_diag_kernel[grid](*args, **scratch, **kw)
        return launch


bwd_intra_kernel = _SplitLaunch()
