"""Candidate ``bwd_intra_walk_kernel``: the walk over earlier UT chunks with 8 tensor-core products per step
instead of 10 (same signature, same arguments as the shipped kernel in codegen/triton/bwd_intra.py, built from
its source by text replacement, ``kernel_variants``).

Per key chunk m the shipped step multiplies X_m by W_m^T and by K~_m^T (two C x C x D products) and adds
dY_l W_m and dS K~_m into dX (two C x D x C products).  Both pairs share an operand, so here W_m and K~_m are
loaded as ONE 2C x D tile WK = [W_m; K~_m] (a row-selected load), and

    [Y_l | S] = X_m WK^T             one C x 2C x D product instead of two C x C x D
    dX = G + [dY_l | dS] WK          one C x D x 2C product instead of two C x D x C

with the C x 2C tiles split / joined by a reshape (no slicing in Triton).  Same FLOPs, two fewer MMA waits on
a step whose chain G -> dY_l -> dX is latency-bound (the walk runs at ~100 TFLOP/s on the H200).  The key-side
gradients keep their own products and atomic adds (a merged [dW; dK~] would hold a 2C x D float32 tile live:
128 registers a thread at D = 128 and 4 warps).

``python benchmarks/dev_kernel_probe.py --only intra --intra-v2 benchmarks/variants/bwd_walk_merged.py`` times
it beside the shipped walk on the same captured launch; tests/test_triton_backward.py checks its gradients.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pathtune.codegen.triton.bwd_intra as intra_mod

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))      # benchmarks/: kernel_variants
from kernel_variants import load_variant, module_source  # noqa: E402

_STEP = [
    # WK = [W_m; K~_m]: rows below C from w, the rest from K~ (one load through a row-selected pointer tile)
    ("    G = tl.load(dy_ptr + qoff, mask=m2, other=0.0)\n    for mi in range(0, ci):\n",
     "    G = tl.load(dy_ptr + qoff, mask=m2, other=0.0)\n    r2 = tl.arange(0, 2 * C)\n"
     "    top = (r2 < C)[:, None]\n    for mi in range(0, ci):\n"),
    ("        Kt = tl.load(kt_ptr + kof, mask=dmask, other=0.0).to(DT)\n"
     "        Wm = tl.load(w_ptr + kof, mask=dmask, other=0.0).to(DT)\n",
     "        wkof = (((tokI + mi * C + r2 % C).to(tl.int64))[:, None] * H + h) * D + d[None, :]\n"
     "        WK = tl.load(tl.where(top, w_ptr + wkof, kt_ptr + wkof), mask=dmask, other=0.0).to(DT)\n"),
    ("        Yl = mm(Xd, tl.trans(Wm), INTERP)\n", "        Yl, s = _split_cols(mm(Xd, tl.trans(WK), INTERP), C)\n"),
    ("        dX = G + mm(dYl, Wm, INTERP)\n", ""),
    ("        s = mm(Xd, tl.trans(Kt), INTERP) * qk_scale\n", "        s = s * qk_scale\n"),
    ("        dX += mm(dsd, Kt, INTERP)\n", ""),
    ("        G = dX\n", "        G = G + mm(_join_cols(dYl, dsd, C), WK, INTERP)\n"),
]

_HELPERS = '''

@triton.jit
def _split_cols(x, C: tl.constexpr):
    """(x[:, :C], x[:, C:]) of a C x 2C tile."""
    return tl.split(tl.permute(tl.reshape(x, (C, 2, C)), (0, 2, 1)))


@triton.jit
def _join_cols(a, b, C: tl.constexpr):
    """[a | b], the C x 2C tile of two C x C tiles."""
    return tl.reshape(tl.permute(tl.join(a, b), (0, 2, 1)), (C, 2 * C))
'''

bwd_intra_walk_kernel = load_variant(module_source(intra_mod), "bwd_intra_walk_kernel", "bwd_walk_merged", _STEP,
                                     append=_HELPERS)
