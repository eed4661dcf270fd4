"""Candidate UT backward chunk kernel in two passes over W's column blocks, so that at most two C x C float32
accumulators are live in either (the shipped ``ut_bwd_chunk_kernel`` keeps four: W W^T, W K^T, W dK~^T, dU W^T).

Pass 1 forms W K^T and W dK~^T, from which dM, dL (stored) and dA = dM (W K^T)^T follow; pass 2 forms W W^T and
adds dU W^T into dA in the product's accumulator, re-reading W's column blocks (L2 hits, the first pass just read
them); A is loaded again where T^-1 needs it.  Same arguments, grid and outputs as the shipped kernel (built from
its source by replacing the body up to dA, T^-1 and beta, ``kernel_variants``); the sums of dA add in another
order.

Why: Nsight Compute on an H100 (D 128, T 4K, one range launch of 512 programs) shows the shipped kernel at 36 %
of DRAM bandwidth with 710K local-memory (spill) requests, 2 programs per SM at 255 registers.  Offline sm_90
builds (``compile_kernel``, 4 warps, PaTH-FoX): spills 488 -> 8 B per thread at D 128 and shared memory 64 ->
48 KB (D 64: 0 B either way, 96 -> 48 KB).  Time it beside the shipped kernel, and the fwd+bwd with it:

    python benchmarks/dev_kernel_probe.py --only utbwd,e2e --D 64,128 \\
        --ut-bwd-v2 benchmarks/variants/ut_bwd_two_pass.py --intra-v2 benchmarks/variants/ut_bwd_two_pass.py

tests/test_triton_backward.py checks a fwd+bwd with it against the shipped kernel and the float64 oracle.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pathtune.codegen.triton.ut_bwd as ut_bwd_mod

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))      # benchmarks/: kernel_variants
from kernel_variants import load_variant_module, module_source  # noqa: E402

_SRC = module_source(ut_bwd_mod)
# the shipped kernel's body up to dA, T^{-1} and beta (the gradient tail after them stays as shipped)
_BODY = _SRC[_SRC.index("    Gm = tl.zeros((C, C), dtype=tl.float32)       # W W^T\n"):
             _SRC.index("    # A = T^{-1} diag(beta),  T = I + strictLower(diag(beta) W W^T)\n")]

TWO_PASS_BODY = '''    # pass 1: W K^T and W dK~^T, the two C x C accumulators dM and dA's first term need
    L = tl.zeros((C, C), dtype=tl.float32)        # W K^T
    WdKt = tl.zeros((C, C), dtype=tl.float32)     # W dK~^T
    for d0 in range(0, BD, DB):
        mask2 = rmask[:, None] & (d0 + db < D)[None, :]
        off = (rows[:, None] * H + h) * D + d0 + db[None, :]
        W = tl.load(w_ptr + off, mask=mask2, other=0.0).to(tl.float32)
        K = tl.load(k_ptr + off, mask=mask2, other=0.0).to(tl.float32)
        L += _pdot(W, tl.trans(K), UP)
        dKt = tl.load(dkt_ptr + off, mask=mask2, other=0.0)
        WdKt = tl.dot(W, tl.trans(dKt), WdKt, input_precision=GP)
    strict = r[:, None] > r[None, :]
    L = tl.where(strict, L, 0.0)
    aoff = (rows[:, None] * H + h) * C + r[None, :]
    coff = ((rows[:, None] * H + h) * _CC) * C + r[None, :]
    # K~ = K - M^T W  and  M = A strictLower(W K^T)
    dM = tl.load(dm_ptr + (rows[:, None] * H + h) * C + r[None, :], mask=rmask[:, None], other=0.0) - WdKt
    A = tl.load(a_ptr + aoff, mask=rmask[:, None], other=0.0)
    dL = tl.where(strict, tl.dot(tl.trans(A), dM, input_precision=GP), 0.0)
    tl.store(cc_ptr + coff + _DL * C, dL, mask=rmask[:, None])
    dA = tl.dot(dM, tl.trans(L), input_precision=GP)
    # pass 2: W W^T, and U = A W's dU W^T added into dA in the product's accumulator
    Gm = tl.zeros((C, C), dtype=tl.float32)       # W W^T
    for d0 in range(0, BD, DB):
        mask2 = rmask[:, None] & (d0 + db < D)[None, :]
        off = (rows[:, None] * H + h) * D + d0 + db[None, :]
        W = tl.load(w_ptr + off, mask=mask2, other=0.0).to(tl.float32)
        Gm += _pdot(W, tl.trans(W), UP)
        dU = tl.load(du_ptr + off, mask=mask2, other=0.0)
        dA = tl.dot(dU, tl.trans(W), dA, input_precision=GP)
    beta_raw = tl.load(beta_ptr + rows * H + h, mask=rmask, other=0.0).to(tl.float32)
    beta = tl.minimum(beta_raw, BETA_MAX)
    # T^{-1} = I - A strictLower(W W^T), A loaded again (an L2 hit) instead of live through pass 2
    A = tl.load(a_ptr + aoff, mask=rmask[:, None], other=0.0)
    Tinv = tl.where(r[:, None] == r[None, :], 1.0, 0.0) - _pdot(A, tl.where(strict, Gm, 0.0), UP)
'''


def build(body: str = TWO_PASS_BODY, tag: str = "ut_bwd_two_pass"):
    """The chunk kernel with ``body`` in place of the shipped one (a test builds a wrong body this way)."""
    return load_variant_module(_SRC, tag, [(_BODY, body)]).ut_bwd_chunk_kernel


ut_bwd_chunk_kernel = build()
