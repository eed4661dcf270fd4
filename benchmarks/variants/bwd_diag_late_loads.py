"""Candidate ``bwd_intra_diag_kernel``: the diagonal tile's kernel with two of its operands loaded where they are
used instead of held in registers across the kernel (same signature, same arguments as the shipped kernel in
codegen/triton/bwd_intra.py, built from its source by text replacement, ``kernel_variants``).

The shipped kernel loads the walk's carried query gradient G (C x BD float32) first and keeps it live through
every product until dQ = G + dS K; M (C x C float32) is live from the logits to dQW at the end.  Here G is
loaded right before dQ and M read again (an L2 hit) for dQW.  Offline sm_90 builds at the untuned configs
(``compile_check``, 4 warps, 255 registers either way): spills per thread 1368 -> 352 B at D 64,
1632 -> 640 B at D 128.  The kernel runs at ~50 TFLOP/s (BENCHMARKS.md profile), 0.95-1.3 ms of a fwd+bwd.

``python benchmarks/dev_kernel_probe.py --only intra --intra-v2 benchmarks/variants/bwd_diag_late_loads.py``
times it beside the shipped kernel on the same captured launch; tests/test_triton_backward.py checks its
gradients.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pathtune.codegen.triton.bwd_intra as intra_mod

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))      # benchmarks/: kernel_variants
from kernel_variants import load_variant, module_source  # noqa: E402

_G_LOAD = "    G = tl.load(dy_ptr + qoff, mask=m2, other=0.0)     # the walk's carried query gradient\n"
_M_LOAD = "    M = tl.load(m_ptr + (rows[:, None] * H + h) * C + r[None, :], mask=rmask[:, None], other=0.0)\n"
_DQW = ("    dQW = tl.where(causal, -mm(Gd, tl.trans(Uc), INTERP) - tl.dot(dsr, tl.trans(M), input_precision=TP), "
        "0.0)\n")

_LATE = [
    (_G_LOAD, ""),
    ("    dQ = G + mm(dsd, K, INTERP)\n", _G_LOAD + "    dQ = G + mm(dsd, K, INTERP)\n"),
    (_DQW, _M_LOAD + _DQW),
]

bwd_intra_diag_kernel = load_variant(module_source(intra_mod), "bwd_intra_diag_kernel", "bwd_diag_late_loads", _LATE)
