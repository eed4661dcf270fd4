"""Candidate ``bwd_intra_walk_kernel``: each step of the walk in keys-as-rows tiles, so that two programs fit one
sm_90 multiprocessor (same signature and arguments as the shipped kernel in codegen/triton/bwd_intra.py, built
from its source by text replacement, ``kernel_variants``; one pipeline stage at D 128, ``intra_walk_stages``).

The shipped step forms the C x C tiles query-major (Y_l = X W^T, dY_l, the logits s, P, dP, dS) and feeds four of
them transposed into the key-side products (dU, dW, dV, dK~), each a round trip through shared memory, and it
reads V as a transposed B operand, so V, U, W, K~, X, G and dO all sit in shared memory: 128 KB at one stage
(213 KB at the shipped two), one program per multiprocessor at D 128.  Here the step forms those tiles key-major:

    Y_l^T  = W_m X_m^T          dU_m  -= Y_l^T G              (B operands: X^T, G: views of tiles in shared)
    dY_l^T = -U_m G^T           dW_m  += dY_l^T X_m
    s^T    = K~_m X_m^T         dV_m  += P^T dO               (P^T, dS^T: the key-side products' A operands as formed)
    dP^T   = V_m dO^T           dK~_m += dS^T X_m,   dc_m -= gate_nat * rowsum(dS^T)
    dX     = G + dY_l W_m + dS K~_m                            (the two transposes left: dY_l, dS)

U_m and V_m are only A operands (read from registers), so they need no shared copy; the two transposes left are
the query side's.  Same FLOPs as the shipped step.  Offline sm_90 at the D128 heuristic config (fp16 scan, 4
warps; ``python -m pathtune.codegen.triton.compile_check``'s ``compile_kernel``): the shipped walk 213 KB of
shared memory at its two stages (128 KB at one), 255 registers, 0.6-0.75 KB of spills, one program per
multiprocessor; this one 112 KB at one stage, 255 registers, ~1.0 KB of spills, two programs per multiprocessor
(logits first: 1.2 KB; U and V through shared: 144 KB, one program).  At D 64 both run two programs (by
registers) and this one spills 128 B at two stages where the shipped spills none: a D 128 candidate.

``python benchmarks/dev_kernel_probe.py --only intra --intra-v2 benchmarks/variants/bwd_walk_keys_rows.py`` times
it beside the shipped walk on the same captured launch (at its own stages, the launch's warps and the other
count); ``--only e2e`` swaps it and its stages into the launcher; tests/test_triton_backward.py checks its
gradients.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pathtune.codegen.triton.bwd_intra as intra_mod

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))      # benchmarks/: kernel_variants
from kernel_variants import load_variant, module_source  # noqa: E402

SHIPPED_STEP = (
    "        Gd = G.to(DT)\n"
    "        # chain step X_{m-1} = X_m - (X_m W_m^T) U_m, G = dX_{m-1}; each product's atomic add follows\n"
    "        # it, so that no finished C x D gradient stays live through the next products\n"
    "        Yl = mm(Xd, tl.trans(Wm), INTERP)\n"
    "        _acc(du_ptr + kof, -mm(tl.trans(Yl.to(DT)), Gd, INTERP), dmask)\n"
    "        dYl = (-mm(Gd, tl.trans(Um), INTERP)).to(DT)\n"
    "        _acc(dw_ptr + kof, mm(tl.trans(dYl), Xd, INTERP), dmask)\n"
    "        dX = G + mm(dYl, Wm, INTERP)\n"
    "        # logits of key chunk m\n"
    "        s = mm(Xd, tl.trans(Kt), INTERP) * qk_scale\n"
    "        if USE_GATE:    # the key's gate offset (the query's is in lse2: _row_stats)\n"
    "            s -= (tl.load(gc_h + krows) * gate_scale)[None, :]\n"
    "        p = tl.where(rmask[:, None], tl.exp2(s - lse2[:, None]), 0.0)\n"
    "        _acc(dv_ptr + kvof, mm(tl.trans(p).to(Vm.dtype), dO, INTERP), dvmask)\n"
    "        dp = mm(dO, tl.trans(Vm), INTERP)\n"
    "        ds = p * (dp - delta[:, None])\n"
    "        dsd = (ds * scale).to(DT)\n"
    "        dX += mm(dsd, Kt, INTERP)\n"
    "        _acc(dkt_ptr + kof, mm(tl.trans(dsd), Xd, INTERP), dmask)\n"
    "        if USE_GATE:\n"
    "            _acc(dc_h + krows, -tl.sum(ds, axis=0) * gate_nat)\n"
    "        G = dX\n"
)

KEYS_ROWS_STEP = (
    "        Gd = G.to(DT)\n"
    "        XdT = tl.trans(Xd)\n"
    "        # chain step X_{m-1} = X_m - (X_m W_m^T) U_m, G = dX_{m-1}, its C x C tiles keys x queries\n"
    "        YlT = mm(Wm, XdT, INTERP)\n"
    "        _acc(du_ptr + kof, -mm(YlT.to(DT), Gd, INTERP), dmask)\n"
    "        dYlT = (-mm(Um, tl.trans(Gd), INTERP)).to(DT)\n"
    "        _acc(dw_ptr + kof, mm(dYlT, Xd, INTERP), dmask)\n"
    "        dX = G + mm(tl.trans(dYlT), Wm, INTERP)\n"
    "        # logits of key chunk m, keys x queries\n"
    "        sT = mm(Kt, XdT, INTERP) * qk_scale\n"
    "        if USE_GATE:    # the key's gate offset (the query's is in lse2: _row_stats)\n"
    "            sT -= (tl.load(gc_h + krows) * gate_scale)[:, None]\n"
    "        pT = tl.where(rmask[None, :], tl.exp2(sT - lse2[None, :]), 0.0)\n"
    "        _acc(dv_ptr + kvof, mm(pT.to(Vm.dtype), dO, INTERP), dvmask)\n"
    "        dpT = mm(Vm, tl.trans(dO), INTERP)\n"
    "        dsT = pT * (dpT - delta[None, :])\n"
    "        dsdT = (dsT * scale).to(DT)\n"
    "        _acc(dkt_ptr + kof, mm(dsdT, Xd, INTERP), dmask)\n"
    "        dX += mm(tl.trans(dsdT), Kt, INTERP)\n"
    "        if USE_GATE:\n"
    "            _acc(dc_h + krows, -tl.sum(dsT, axis=1) * gate_nat)\n"
    "        G = dX\n"
)

# U and V are only A operands in this step: a tile straight from a load is given a shared copy for the product,
# one computed from it (+ 0.0) is read from registers
A_FROM_REGISTERS = [
    ("        Um = tl.load(u_ptr + kof, mask=dmask, other=0.0).to(DT)\n",
     "        Um = tl.load(u_ptr + kof, mask=dmask, other=0.0).to(DT) + 0.0\n"),
    ("        Vm = tl.load(v_ptr + kvof, mask=dvmask, other=0.0)\n",
     "        Vm = tl.load(v_ptr + kvof, mask=dvmask, other=0.0) + 0.0\n"),
]


def logits_first(step: str) -> str:
    """The same step with the logit half (s^T .. dK~, dc) before the chain half (Y_l^T .. dW)."""
    lines = step.split("\n")
    head, chain, logit, gate, tail = lines[0:2], lines[2:8], lines[8:19], lines[19:21], lines[21:]
    logit[-1] = "        dX = G + mm(tl.trans(dsdT), Kt, INTERP)"
    chain[-1] = "        dX += mm(tl.trans(dYlT), Wm, INTERP)"
    return "\n".join(head + logit + gate + chain + tail)


def build(tag: str = "bwd_walk_keys_rows", a_from_registers: bool = True, order: str = "chain_first"):
    """The candidate walk kernel with its options (``order``: "chain_first" or "logits_first")."""
    step = KEYS_ROWS_STEP if order == "chain_first" else logits_first(KEYS_ROWS_STEP)
    reps = [(SHIPPED_STEP, step)] + (A_FROM_REGISTERS if a_from_registers else [])
    return load_variant(module_source(intra_mod), "bwd_intra_walk_kernel", tag, reps)


bwd_intra_walk_kernel = build()


def intra_walk_stages(BD: int, operand_bytes: int) -> int:
    """This walk's software-pipelining stages (the launcher's ``backward.intra_walk_stages`` in its place): one
    where a row of its 16-bit operands is wider than 128 bytes (D 128: two programs per multiprocessor instead of
    one with its loads pipelined), else two as the shipped walk (D <= 64 runs two programs either way)."""
    return 2 if max(BD, 64) * operand_bytes <= 128 else 1
