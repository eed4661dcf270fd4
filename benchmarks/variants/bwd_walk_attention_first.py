"""Candidate ``bwd_intra_walk_kernel``: each step of the walk does key chunk m's attention part first (K~ and V
loaded, logits, dV, dP, dS, dK~ and dS K~) and the chain step after it (W and U loaded, Y_l, dU, dY_l, dW and
dY_l W), so the two pairs of operand tiles are never live at once; at padded head dim 128 it runs one pipeline
stage (``OneStageAtWideHeads``).  Same arguments, grid and results as the shipped walk (built from its source by
replacing the loop body, ``kernel_variants``): only the order of the products in a step changes, the chain's G
stays the step's input until both parts have read it.

Why: at D 128 the shipped walk holds 213 KB of shared memory at two stages and 131 KB at one, one program per
SM (4 warps); this order holds 98 KB at one stage (offline sm_90, ``compile_kernel``: 255 registers, 576 B of
spills against 248), so two programs share an SM -- the walk is the largest backward kernel (H100 profile, D128
T4K: 2.71 ms at 143 TFLOP/s, where D64's walk, two per SM, runs at 189).  At D 64 the shipped walk already runs
two per SM (106 KB at two stages, register-bound); this order keeps its stages there.

    python benchmarks/dev_kernel_probe.py --D 128,64 --T 4096 --only intra,e2e \\
        --intra-v2 benchmarks/variants/bwd_walk_attention_first.py

tests/test_triton_backward.py checks a fwd+bwd with it against the shipped gradients and the float64 oracle.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pathtune.codegen.triton.bwd_intra as intra_mod

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))      # benchmarks/: kernel_variants
from kernel_variants import load_variant_module, module_source  # noqa: E402

_SOURCE = module_source(intra_mod)
# the shipped walk's step: from its per-step operand loads to the carried gradient's update
_STEP_END = "        G = dX\n"
SHIPPED_STEP = _SOURCE[_SOURCE.index("        Kt = tl.load(kt_ptr + kof"):_SOURCE.index(_STEP_END) + len(_STEP_END)]
ATTENTION_FIRST_STEP = '''        # key chunk m's attention part first (K~, V), then the chain step (W, U), both from
        # the step's G: the two pairs of operand tiles are not live at once
        Kt = tl.load(kt_ptr + kof, mask=dmask, other=0.0).to(DT)
        s = mm(Xd, tl.trans(Kt), INTERP) * qk_scale
        if USE_GATE:    # the key's gate offset (the query's is in lse2: _row_stats)
            s -= (tl.load(gc_h + krows) * gate_scale)[None, :]
        p = tl.where(rmask[:, None], tl.exp2(s - lse2[:, None]), 0.0)
        Vm = tl.load(v_ptr + kvof, mask=dvmask, other=0.0)
        _acc(dv_ptr + kvof, mm(tl.trans(p).to(Vm.dtype), dO, INTERP), dvmask)
        dp = mm(dO, tl.trans(Vm), INTERP)
        ds = p * (dp - delta[:, None])
        dsd = (ds * scale).to(DT)
        if USE_GATE:
            _acc(dc_h + krows, -tl.sum(ds, axis=0) * gate_nat)
        _acc(dkt_ptr + kof, mm(tl.trans(dsd), Xd, INTERP), dmask)
        dX = G + mm(dsd, Kt, INTERP)
        # chain step X_{m-1} = X_m - (X_m W_m^T) U_m with the step's G
        Wm = tl.load(w_ptr + kof, mask=dmask, other=0.0).to(DT)
        Um = tl.load(u_ptr + kof, mask=dmask, other=0.0).to(DT)
        Gd = G.to(DT)
        Yl = mm(Xd, tl.trans(Wm), INTERP)
        _acc(du_ptr + kof, -mm(tl.trans(Yl.to(DT)), Gd, INTERP), dmask)
        dYl = (-mm(Gd, tl.trans(Um), INTERP)).to(DT)
        _acc(dw_ptr + kof, mm(tl.trans(dYl), Xd, INTERP), dmask)
        G = dX + mm(dYl, Wm, INTERP)
'''

attention_first_walk = load_variant_module(_SOURCE, "walk_attention_first",
                                           [(SHIPPED_STEP, ATTENTION_FIRST_STEP)]).bwd_intra_walk_kernel


class OneStageAtWideHeads:
    """``[grid](...)`` of a walk kernel with one pipeline stage at padded head dim >= 128 (the launch's stages
    below): two stages prefetch every operand tile of the next step, which puts the shared memory back at 213 KB."""

    def __init__(self, kernel) -> None:
        self.kernel = kernel

    def __getitem__(self, grid):
        def launch(*args, **kw):
            return self.kernel[grid](*args, **(dict(kw, num_stages=1) if kw.get("BD", 0) >= 128 else kw))
        return launch


bwd_intra_walk_kernel = OneStageAtWideHeads(attention_first_walk)
