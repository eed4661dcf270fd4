"""Candidate for the backward's per-range UT recompute: the forward's one-launch UT stage (``ut_fused_kernel``)
also storing A, in place of ``forward.ut_forward``'s three launches (``ut_diag_inverse``, ``ut_chunk``,
``ut_apply``; on the H200 at T 4K, D 128, the shipped bwd config: 0.89 ms over the 8 ranges against 0.45 ms for
the forward's one launch over the whole stream).

The kernel is ``codegen/triton/ut.py``'s own, built by text replacement (``kernel_variants``): one more pointer
argument and one more store, of the float32 A = T^{-1} diag(beta) the kernel already holds, in
``ut_chunk_kernel``'s layout ([N, H, C] rows), which ``ut_bwd_chunk_kernel`` / ``ut_bwd_apply_kernel`` read.  w and k
are read in float32 (OP16 off, apply products at ut_precision) and u, K~, w's copy stored in the scan dtype:
the backward's T^{-1} = I - A strictLower(W W^T) assumes the A of the float32 W it differentiates with.

``recompute(...)`` has ``ut_forward(..., out_dtype, write_w=True, keep_a=True)``'s signature and outputs.
``python benchmarks/dev_kernel_probe.py --only utrecompute`` times both on one token range; tests/
test_triton_backward.py checks the outputs and the backward with it.
"""
from __future__ import annotations

import functools
import sys
from pathlib import Path

import torch

import pathtune.codegen.triton.ut as ut_mod
from pathtune.codegen.triton._ops import interpreting, padded_dim
from pathtune.codegen.triton.forward import UT_COLUMN_BLOCK, UT_FUSED_MIN_BD, UT_NUM_WARPS, ut_forward

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))      # benchmarks/: kernel_variants
from kernel_variants import load_variant, module_source  # noqa: E402

_ARGS = ("    u_ptr, kt_ptr, wd_ptr, m_ptr,\n    chunk_tok0, chunk_seq, seq_end,",
         "    u_ptr, kt_ptr, wd_ptr, m_ptr, a_ptr,\n    chunk_tok0, chunk_seq, seq_end,")
_STORE_M = "    tl.store(m_ptr + (rows[:, None] * H + h) * C + r[None, :], M, mask=rmask[:, None])\n"
_STORE_A = _STORE_M + "    tl.store(a_ptr + (rows[:, None] * H + h) * C + r[None, :], A, mask=rmask[:, None])\n"


@functools.lru_cache(maxsize=None)
def kernel():
    """``ut_fused_kernel`` with the extra ``a_ptr`` (after ``m_ptr``) and A's store."""
    return load_variant(module_source(ut_mod), "ut_fused_kernel", "ut_fused_write_a",
                        [_ARGS, (_STORE_M, _STORE_A)])


def recompute(kt_in, wt, bt, tables, H: int, D: int, C: int, params, out_dtype=torch.float32, write_w: bool = True,
              keep_a: bool = True):
    """(u, K~ [N, H, D] out_dtype, m [N, H, C] float32, A [N, H, C] float32, w's copy [N, H, D] out_dtype) of
    the chunks of ``tables`` in one launch (the arguments of ``forward.ut_forward``; A and w's copy always).
    Padded head dims under ``forward.UT_FUSED_MIN_BD`` keep the three launches, as the forward does."""
    if padded_dim(D) < UT_FUSED_MIN_BD:
        return ut_forward(kt_in, wt, bt, tables, H, D, C, params, out_dtype=out_dtype, write_w=True, keep_a=True)
    N = kt_in.shape[0]
    dev = kt_in.device
    u = torch.empty(N, H, D, device=dev, dtype=out_dtype)
    ktil = torch.empty(N, H, D, device=dev, dtype=out_dtype)
    wd = torch.empty(N, H, D, device=dev, dtype=out_dtype)
    m = torch.empty(N, H, C, device=dev, dtype=torch.float32)
    a = torch.empty(N, H, C, device=dev, dtype=torch.float32)
    BD = padded_dim(D)
    kernel()[(tables.n_chunks, H)](
        wt, bt, kt_in, u, ktil, wd, m, a,
        tables.chunk_tok0, tables.chunk_seq, tables.seq_end,
        H=H, D=D, BD=BD, DB=min(BD, UT_COLUMN_BLOCK), C=C, BETA_MAX=params.beta_max, UP=params.ut_precision,
        AP=params.ut_precision, OP16=False, WRITE_W=True, INTERP=interpreting(), SB=params.ut_diag_block,
        num_warps=UT_NUM_WARPS, num_stages=1,
    )
    return u, ktil, m, a, wd
