"""Host side of the Triton backward: seven stages, every buffer O(T) per head.

Order (each stage only reads what earlier ones wrote):
  1. bwd_prep          Y (queries at their super-chunk start), delta = rowsum(dO * O) - dlse
  3. bwd_inter_dkv     dKJ, inter part of dV, dOm per super-chunk pair, key side of dc
  4. superchunk chain  dWhat from dOm (``superchunk_chain``: one kernel per sequence up to padded
                       head dim 64, two blocked kernels per super-chunk above)
  2. bwd_inter_dq      dY and the query side of dc from all earlier super-chunks (after 3-4: dOm is
                       freed before dY is allocated; wide head dims, padded D above 128: 3 and 2
                       run column-blocked on every pair's Om_{I,J}, computed before 3 by
                       ``superchunk_pairs`` (one kernel), as large as dOm, freed after 2)
  5. bwd_transport     dK~, dW, dU from dKJ and dWhat (a chain kernel storing the states, then a
                       per-chunk kernel summing their products)
  6. bwd_intra         dq (final) and the chunk-level dK~, dU, dW, dM, dK, dV, dc inside super-chunks
                       (two kernels: the walk over earlier chunks, then the diagonal tile)
  7. ut_bwd            dw, dk, dbeta through the UT transform (one kernel: the C x C tiles, then per column block)
then dg = reverse cumsum of dc per sequence (``gate_grad_kernel``).  Stages 5-7 only touch rows of
one super-chunk; on long inputs they run per token range of super-chunks (see
``path_attention_bwd``), which bounds the extra peak memory (``benchmarks/memory_probe.py``: 0.91
GiB at T=16384, B=2, H=16, D=64, at the default ``bwd_range_budget_mib`` of 256).

Host work per call: no device read for a dense batch (its range tables are built once per shape
and cached); buffers that kernels accumulate into are zeroed in as few memsets as their lifetimes
allow (``_zeros``: one flat buffer carved into views), the rest are left uninitialised.
"""
from __future__ import annotations

import bisect
import dataclasses
import math
from typing import Optional

import torch
import triton
from triton.runtime.errors import OutOfResources

from .._knobs import resolve_json, spec_default
from ._layout import SequenceTables
from ._ops import interpreting, next_pow2, padded_dim
from .bwd_chain import (
    bwd_chain_dwhat_kernel,
    bwd_chain_rows_kernel,
    bwd_superchunk_chain_kernel,
    bwd_superchunk_pairs_kernel,
    bwd_transport_chain_kernel,
    bwd_transport_grads_kernel,
    gate_grad_kernel,
)
from .bwd_inter import bwd_inter_dkv_kernel, bwd_inter_dq_kernel, bwd_pair_transitions_kernel
from .bwd_intra import bwd_intra_diag_kernel, bwd_intra_walk_kernel, bwd_intra_walk_pairs_kernel
from .bwd_prep import bwd_prep_kernel
from .forward import (
    _LOG2E,
    UT_COLUMN_BLOCK,
    UT_FUSED_MIN_BD,
    UT_NUM_WARPS,
    ForwardState,
    _tokens,
    config_error,
    gate_parts,
    has_kept_state,
    prepare_state,
    state_from_kept,
    state_tables,
    transition_column_block,
    ut_apply_mode,
    ut_chunk_state,
    ut_forward,
    ut_operand_type,
)
from .launch import compiled
from .params import TritonParams
from .ut import ut_recompute_kernel
from .ut_bwd import UT_BWD_WARPS, ut_bwd_kernel

GATE_GRAD_SPAN = 256    # tokens per program of gate_grad_kernel (H200, 32K tokens x 16 heads: 0.055 -> 0.039 ms)


def _gate_grad(dc: torch.Tensor, tables: SequenceTables, shape) -> torch.Tensor:
    """dg_l = sum_{i >= l, same sequence} dc_i (c is the inclusive cumsum of g), float32, one launch of
    ``gate_grad_kernel`` (no host work: the grid comes from the tables' host ints).  dc [HQ, N]
    head-major (rows of stride dc.stride(0)); dg [N, HQ] token-major, viewed as ``shape``."""
    HQ, N = dc.shape
    dg = torch.empty(N, HQ, device=dc.device, dtype=torch.float32)
    BH = min(next_pow2(HQ), 16)
    BT = min(max(16, 1024 // BH), GATE_GRAD_SPAN)
    grid = (tables.n_seq, triton.cdiv(max(tables.max_seq_len, 1), GATE_GRAD_SPAN), triton.cdiv(HQ, BH))
    compiled(gate_grad_kernel)[grid](dc, dg, tables.seq_start, tables.seq_end, dc.stride(0), HQ=HQ, BH=BH, BT=BT,
                                     SPAN=GATE_GRAD_SPAN, num_warps=4)
    return dg.view(shape)


def _gate_grad_torch(dc: torch.Tensor, tables: SequenceTables, shape) -> torch.Tensor:
    """``_gate_grad`` in float64 torch ops along the innermost dimension (tokens moved last): the
    reference of the kernel's test.  dc [HQ, N] head-major, dg [N, HQ] viewed as ``shape``."""
    d64 = dc.to(torch.float64)                                       # [HQ, N]
    rc = torch.flip(torch.cumsum(torch.flip(d64, [-1]), -1), [-1])   # sum over i >= l, whole stream
    tail = torch.cat([rc, torch.zeros_like(rc[:, :1])], -1)[:, tables.seq_end]  # beyond each sequence
    lengths = tables.seq_end - tables.seq_start
    rc = rc - torch.repeat_interleave(tail, lengths, dim=-1)
    return rc.t().reshape(shape)


def _superchunk_chain_torch(what: torch.Tensor, dom: torch.Tensor, tables: SequenceTables) -> torch.Tensor:
    """Same result as bwd_superchunk_chain_kernel, batched over heads and super-chunks in torch.

    The reference the chain kernels are tested against (``superchunk_chain`` launches kernels at
    every head dim); a Python loop per sequence, not for the hot path.
    """
    dwhat = torch.zeros_like(what)
    H, BD = what.shape[1], what.shape[2]
    eye = torch.eye(BD, device=what.device, dtype=what.dtype)
    for nsc, base, pb in zip(tables.seq_nsc_host, tables.sc_base_host, tables.pair_base_host):
        if nsc < 2:
            continue
        W = what[base:base + nsc]
        dOm = dom[pb:pb + nsc * nsc].view(nsc, nsc, H, BD, BD)
        Ls, L = [], torch.zeros(nsc, H, BD, BD, device=what.device, dtype=what.dtype)
        for K in range(nsc - 1):       # L_{I,K+1} = L_{I,K} What_K^T + dOm_{I,K}, all I at once
            Ls.append(L[K + 1:].clone())   # only rows I > K are read below (half the memory)
            L = L @ W[K].transpose(-1, -2) + dOm[:, K]
        Om = eye.expand(nsc, H, BD, BD).clone()   # Om[I] = Om_{I,K}, meaningful for I > K
        for K in range(nsc - 2, -1, -1):
            if K < nsc - 2:
                Om = Om @ W[K + 1]
                Om[K + 1] = eye
            dwhat[base + K] = (Om[K + 1:].transpose(-1, -2) @ Ls[K]).sum(0)
            Ls[K] = None
    return dwhat


def _superchunk_pairs_torch(what: torch.Tensor, tables: SequenceTables, like: torch.Tensor) -> torch.Tensor:
    """Om_{I,J} = What_{I-1} ... What_{J+1} (the identity for J = I-1) of every super-chunk pair
    J < I of every sequence, laid out like dOm (``like``: [n_pairs, H, BD, BD] float32, entry
    pair_base + I * n_sc + J).  Entries J >= I are left unwritten (no kernel reads them).

    The reference of ``bwd_superchunk_pairs_kernel`` (``superchunk_pairs``), one batched matmul per
    distance I - J and sequence: Om_{I,J} = Om_{I,J+1} What_{J+1}.
    """
    om = torch.empty_like(like)
    H, BD = what.shape[1], what.shape[2]
    eye = torch.eye(BD, device=what.device, dtype=what.dtype)
    for nsc, base, pb in zip(tables.seq_nsc_host, tables.sc_base_host, tables.pair_base_host):
        if nsc < 2:
            continue
        W = what[base:base + nsc]
        o = om[pb:pb + nsc * nsc].view(nsc, nsc, H, BD, BD)
        i = torch.arange(1, nsc, device=what.device)
        o[i, i - 1] = eye
        for k in range(2, nsc):
            i = torch.arange(k, nsc, device=what.device)
            o[i, i - k] = o[i, i - k + 1] @ W[i - k + 1]
    return om


# Padded head dims up to which ``bwd_superchunk_chain_kernel`` (whole BD x BD float32 tiles, one program
# per sequence) runs the super-chunk chain; above, the blocked kernels (``superchunk_chain``).
CHAIN_KERNEL_MAX_BD = 64


def chain_blocks(BD: int) -> tuple[int, int, int, int]:
    """(ROWS, CB of the row-walk kernels, CB of ``bwd_chain_dwhat_kernel``, warps) of the wide-head-dim
    chain kernels (bwd_chain.py) at padded head dim BD, from compile_check for sm_90: at BD = 256,
    rows of 32 and 64 columns spilled 10-14 KB per thread (4 warps, tf32); 16 x 32 with 8 warps
    spill nothing at 128 and 256, tf32 and tf32x3."""
    return min(BD, 16), min(BD, 32), min(BD, 64), 8 if BD > 64 else 4


def superchunk_pairs(what: torch.Tensor, tables: SequenceTables, like: torch.Tensor, S: int, tp: str) -> torch.Tensor:
    """Om_{I,J} of every super-chunk pair J < I (as ``_superchunk_pairs_torch``) in one launch of
    ``bwd_superchunk_pairs_kernel``; entries J >= I left unwritten."""
    om = torch.empty_like(like)
    H, BD = what.shape[1], what.shape[2]
    rows, cb, _, warps = chain_blocks(BD)
    compiled(bwd_superchunk_pairs_kernel)[(tables.n_sc, H, BD // rows)](
        what, om, tables.sc_seq, tables.seq_start, tables.seq_end, tables.seq_sc_base, tables.seq_pair_base,
        H=H, BD=BD, S=S, ROWS=rows, CB=cb, TP=tp, num_warps=warps, num_stages=1,
    )
    return om


def pair_transitions(what: torch.Tensor, tables: SequenceTables, S: int, tp: str, dtype: torch.dtype) -> torch.Tensor:
    """Om_{I,J} of every super-chunk pair J < I in ``dtype`` (the inter kernels' 16-bit operand), laid out
    like dOm ([max(n_pairs, 1), H, BD, BD]), in one launch of ``bwd_pair_transitions_kernel`` (float32
    walk, one rounding per pair); entries J >= I left unwritten.  Padded head dims up to 128."""
    H, BD = what.shape[1], what.shape[2]
    om = torch.empty(max(tables.n_pairs, 1), H, BD, BD, device=what.device, dtype=dtype)
    rows = min(BD, 64)
    # warps from compile_check (sm_90): 4 at BD <= 64 (167 registers), 8 at 128 (144; 255 at 4)
    compiled(bwd_pair_transitions_kernel)[(tables.n_sc, H, BD // rows)](
        what, om, tables.sc_seq, tables.seq_start, tables.seq_end, tables.seq_sc_base, tables.seq_pair_base,
        H=H, BD=BD, S=S, ROWS=rows, TP=tp, num_warps=4 if BD <= 64 else 8, num_stages=1,
    )
    return om


def superchunk_chain(what: torch.Tensor, dom: torch.Tensor, tables: SequenceTables, S: int, tp: str,
                     om: torch.Tensor | None = None, dwhat: torch.Tensor | None = None) -> torch.Tensor:
    """dWhat from dOm (overwritten).  Padded head dims up to 64: ``bwd_superchunk_chain_kernel``, one
    program per sequence and kv head, adding into ``dwhat`` (zero-filled, given or allocated).
    Above: ``bwd_chain_rows_kernel`` then ``bwd_chain_dwhat_kernel`` (ROWS x BD / BD x CB blocks,
    programs per super-chunk), which store every entry of a fresh ``dwhat``; ``om`` (every pair's
    Om, when the column-blocked inter kernels made it) saves that kernel the What products."""
    H, BD = what.shape[1], what.shape[2]
    t = (tables.seq_start, tables.seq_end, tables.seq_sc_base, tables.seq_pair_base)
    if BD <= CHAIN_KERNEL_MAX_BD:
        dwhat = torch.zeros_like(what) if dwhat is None else dwhat
        compiled(bwd_superchunk_chain_kernel)[(tables.n_seq, H)](what, dom, dwhat, *t, H=H, BD=BD, S=S, TP=tp,
                                                                 num_warps=4, num_stages=1)
        return dwhat
    dwhat = torch.empty_like(what)
    rows, cb, dcb, warps = chain_blocks(BD)
    compiled(bwd_chain_rows_kernel)[(tables.n_sc, H, BD // rows)](
        what, dom, tables.sc_seq, *t, H=H, BD=BD, S=S, ROWS=rows, CB=cb, TP=tp, num_warps=warps, num_stages=1,
    )
    compiled(bwd_chain_dwhat_kernel)[(tables.n_sc, H, (BD // dcb) ** 2)](
        what, what if om is None else om, dom, dwhat, tables.sc_seq, *t,
        H=H, BD=BD, S=S, CB=dcb, HAS_OM=om is not None, TP=tp, num_warps=warps, num_stages=1,
    )
    return dwhat


# Working set of the per-range stages (transport, intra, UT backward) above which they run over token ranges
# of whole super-chunks, each with its own recomputed u, K~, m and accumulators: the spec's memory knob
# bwd_range_budget_mib (0: one range over the stream, on the forward state).  Extra peak of one gated bf16
# fwd+bwd at T=16384, B=2 (benchmarks/memory_probe.py, CPU count; D=64 H=16 / D=128 H=8) per budget (before
# bwd_intra's chain-state slots and the transport backward's stored states joined the range count: with them
# 0.910 / 0.889 GiB at 256 MiB, 8 ranges):
#   128 MiB 0.848 / 0.834 GiB   192 MiB 0.883 / 0.865   256 MiB 0.953 / 0.928
#   384 MiB 0.988 / 0.959       512 MiB 1.094 / 1.053   unbounded 1.707 / 1.646
# With 128 MiB (10 ranges at B*T = 32768 tokens, D=64 H=16) the H200 measured the gated fwd+bwd 23% slower
# at T=4096 and 11% slower at T=16384 than a single range (33.1 vs 27.0 ms, 59.8 vs 53.9 ms).


# Warps of the transport backward's two kernels, from compile_check for sm_90 at the heuristic configs:
# the chain kernel spills 260 B per thread at D = 64 with 4 warps (tf32x3 products), none with 8, and
# none at D = 128 with 4; the per-chunk kernel (three C x BD float32 accumulators) spills 732 B at
# D = 64 with 4 warps, 40 B with 8, none at D = 128 with 8.
def transport_launch(BD: int) -> tuple[int, int, int]:
    """(chain kernel warps, chain kernel pipeline stages, grads kernel warps) for padded head dim BD.

    The chain kernel's serial steps each wait on their W / U loads: pipelined over 3 stages it took
    0.66x the time of one stage on the H200 (T = 4K, one range, D 64 and 128); the grads kernel at 4
    warps 0.70x the time of 8 at D64, 1.16x at D128."""
    return (8 if BD <= 64 else 4), (3 if BD <= 128 else 1), (4 if BD <= 64 else 8)


def float_transition_mode(tp: str) -> str:
    """The float32 matmul mode of the backward's transition products outside the transport backward at
    bwd_transition_precision ``tp``: "fp16" (16-bit operands in the transport backward only) takes tf32 there."""
    return "tf32" if tp == "fp16" else tp


def transport_backward_rows(BD: int) -> int:
    """Rows of the suffix product per program of the transport backward's chain kernel (its grid's third
    axis; the stored states' layout follows it).  32: at 64 rows (wgmma tiles, the grid halved) the two
    kernels took 1.05x the time of 32 at D 128 T 4K on the H200: their serial chains then run on half the
    programs."""
    return min(BD, 32)


def intra_walk_stages(BD: int, operand_bytes: int) -> int:
    """Software-pipelining stages of ``bwd_intra_walk_kernel`` at padded head dim BD (the kernel runs at
    least 64 wide) with K~ / W / U elements of ``operand_bytes``: two while a row of those operands is at
    most 256 bytes, else one.  Two stages of its per-step loads (X, K~, W, U, V of the next key chunk)
    took 0.86-0.96x the time of one on the H200 (T = 4K, one range, D 64 and 128, PaTH and PaTH-FoX; three
    gained nothing at D 64); at D 128 with the float32 state of a single range (a tf32 scan or a
    tf32x3 UT stage) two stages need 262 KB of shared memory, over sm_90's 227 KB."""
    return 2 if max(BD, 64) * operand_bytes <= 256 else 1


def intra_walk_launch(params: TritonParams, BD: int, operand_bytes: int):
    """(kernel, warps, stages) of the walk inside a super-chunk at padded head dim BD with K~ / W / U elements of
    ``operand_bytes``: ``bwd_walk_chunks`` 2 (params without the bwd knobs take its spec default) runs two query
    chunks per program stacked, on two warpgroups and one pipelining stage (two need 279 KB of shared memory at
    D 128), up to padded head dim 128; else one chunk per program at ``bwd_num_warps`` and
    ``intra_walk_stages``."""
    chunks = getattr(params, "bwd_walk_chunks", TritonBwdParams.bwd_walk_chunks)
    if chunks == 2 and BD <= 128:
        return bwd_intra_walk_pairs_kernel, 8, 1
    return bwd_intra_walk_kernel, params.bwd_num_warps, intra_walk_stages(BD, operand_bytes)


def gate_sums_by_mma(BD: int) -> bool:
    """Whether ``bwd_inter_dkv_kernel`` takes the FoX gate's key-side sums (row sums of dS^T, every step of
    its walk) from a tensor-core product with a ones column (True) or a row reduction (False), at padded
    head dim BD.  On the H200 (T = 4K, heuristic config) the product took 0.91x the kernel's time at D 64
    (1.81 vs 1.99 ms; without any row sums 1.79) and 1.07x at D 128 (2.46 vs 2.31 ms: its float32
    BLOCK_N x 16 accumulator adds to the dV / dKZ tiles' spills there)."""
    return BD <= 64


@dataclasses.dataclass(frozen=True)
class TritonBwdParams(TritonParams):
    """``TritonParams`` plus the knobs only the backward reads (declared here, so that they key the bwd pass's
    source hash alone); ``resolve("triton", "bwd", ...)`` builds it (``codegen/_knobs.py``)."""

    bwd_dkv_block_n: int = spec_default("bwd_dkv_block_n")
    bwd_dkv_num_warps: int = spec_default("bwd_dkv_num_warps")
    bwd_range_budget_mib: int = spec_default("bwd_range_budget_mib")
    bwd_walk_chunks: int = spec_default("bwd_walk_chunks")
    bwd_gate_bias: str = spec_default("bwd_gate_bias")
    bwd_gate_sums: str = spec_default("bwd_gate_sums")

    def __post_init__(self):
        super().__post_init__()
        if self.bwd_walk_chunks not in (1, 2):     # the walks there are (intra_walk_launch)
            raise ValueError(f"bwd_walk_chunks must be 1 or 2 (query chunks per program of the backward's walk), "
                             f"got {self.bwd_walk_chunks!r}")


def inter_gate_by_product(params: TritonParams, gated: bool) -> bool:
    """Whether the kernels between super-chunks (dq, dk / dv) add the gate's key offsets by a K = 16 product of their
    bf16 parts (knob ``bwd_gate_bias`` product; params without the bwd knobs take its spec default): only with a
    gate."""
    return gated and getattr(params, "bwd_gate_bias", TritonBwdParams.bwd_gate_bias) == "product"


def walk_gate_sums_by_product(params: TritonParams, gated: bool) -> bool:
    """Whether the walk inside a super-chunk takes the gate's sums of dS by products with a ones column (knob
    ``bwd_gate_sums`` product; params without the bwd knobs take its spec default): only with a gate."""
    return gated and getattr(params, "bwd_gate_sums", TritonBwdParams.bwd_gate_sums) == "product"


def dkv_launch(params: TritonParams) -> tuple[int, int]:
    """(key tile, warps) of ``bwd_inter_dkv_kernel``: ``bwd_dkv_block_n`` / ``bwd_dkv_num_warps``, where 0 (their
    default, and what params without the bwd knobs hold) takes dq's ``bwd_block_n`` / ``bwd_inter_num_warps``.
    On the H200 (D 128, T 4K, PaTH, kernel probe) 128-key tiles at 8 warps took the key-side pass 0.85x the time
    of 64 at 4 (1.59 vs 1.87 ms), where dq on those tiles lost (PaTH-FoX 1.03x, D 64 1.15x)."""
    block_n = getattr(params, "bwd_dkv_block_n", 0) or params.bwd_block_n
    warps = getattr(params, "bwd_dkv_num_warps", 0) or params.bwd_inter_num_warps
    return block_n, warps


def dkv_query_step(params: TritonParams) -> int:
    """Query rows per step of ``bwd_inter_dkv_kernel``'s walk over a later super-chunk: bwd_block_m, or the
    whole super-chunk when that is shorter."""
    return min(params.bwd_block_m, params.superchunk_size)


def _range_budget(params: TritonParams) -> int | None:
    """Bytes of the per-range stages' working set above which they split (``bwd_range_budget_mib``; params
    without the bwd knobs take its spec default); None: never split."""
    mib = getattr(params, "bwd_range_budget_mib", TritonBwdParams.bwd_range_budget_mib)
    return None if mib == 0 else int(mib) << 20


def _phase2_bytes_per_token(H: int, D: int, C: int, S: int, multi: bool, HQ: int | None = None,
                            scan_bytes: int = 2, DV: int | None = None) -> int:
    """Bytes per token of one range: float32 m, A (C wide, kept for the UT backward), the accumulators
    dK~, dW, dU, dK (D wide) and the transport's states and their gradients per kv head; u, K~ and w's copy
    in the scan dtype, dM (C wide, float32) and the float32 copy of dV's rows (DV wide, default D) per kv
    head, and per query head (HQ, default H) bwd_intra's chain states (S // (2C) slots of its 64-or-wider
    tiles, scan dtype).  The UT backward allocates nothing of its own (its C x C tiles live in registers)."""
    BD = padded_dim(D)
    per_head = C + 4 * D + C + (2 * BD * BD // C if multi else 0)
    states = (HQ or H) * (S // (2 * C)) * max(BD, 64) * scan_bytes
    intra = H * (3 * D * scan_bytes + 4 * C + 4 * (DV or D)) + states
    return 4 * H * per_head + intra


def _range_count(tb: SequenceTables, N: int, H: int, HQ: int, D: int, params: TritonParams,
                 DV: int | None = None) -> int:
    """How many token ranges the per-range stages (5-7) run in: the working set over the budget
    (``_range_budget``), at most one per super-chunk."""
    budget = _range_budget(params)
    if budget is None:
        return 1
    C, S = params.chunk_size, params.superchunk_size
    per_token = _phase2_bytes_per_token(H, D, C, S, tb.max_seq_len > S, HQ, params.scan_torch_dtype.itemsize, DV)
    return max(1, min(-(-N * per_token // budget), tb.n_sc))


def backward_state(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, beta: torch.Tensor, g: torch.Tensor | None,
                   *, cu_seqlens: torch.Tensor | None, params: TritonParams, DV: int | None = None) -> ForwardState:
    """Stages ut_inverse and transport again for the backward (only o and lse are saved by the forward).

    When the per-range stages run in more than one token range they recompute u, K~ (in the scan dtype,
    with w's copy) and m, A per range, and this state only feeds bwd_prep (u) and the transport (kj, What):
    then it is the forward's compact state (16-bit u, K~ and w, one launch of the UT stage on 16-bit tensor cores), so
    the backward's kj and What are the forward's own.  One range reads u, K~ and m in its kernels:
    float32.  DV: the values' head dim (default D), which the range count depends on."""
    B, T, HQ, D = q.shape
    tb = state_tables(B, T, cu_seqlens, params, q.device)
    ranged = _range_count(tb, B * T, k.shape[2], HQ, D, params, DV) > 1
    return prepare_state(q, k, w, beta, g, cu_seqlens=cu_seqlens, params=params, compact=ranged)


_LAST_BOUNDS: list = [None, None]     # (tables, bounds) of the last packed varlen batch read


def _host_bounds(tb: SequenceTables, B: int, T: int):
    """(start, end) of every sequence on the host: a dense batch from its shape, else one read per
    tables (kept for the next call with the same tables: ranges and range tables need them both)."""
    if tb.n_seq == B and tb.max_seq_len == T:    # dense (varlen has B == 1): no device read
        return [(b * T, (b + 1) * T) for b in range(B)]
    if _LAST_BOUNDS[0] is not tb:
        cut = torch.cat([tb.seq_start[:1], tb.seq_end]).tolist()   # packed varlen: one read (host sync)
        _LAST_BOUNDS[:] = [tb, list(zip(cut[:-1], cut[1:]))]
    return _LAST_BOUNDS[1]


def _ranges(tb: SequenceTables, B: int, T: int, N: int, C: int, S: int, n_ranges: int):
    """Token ranges of whole consecutive super-chunks: [(a, b, c0, c1, j0, j1)] with the UT chunks
    [c0, c1) and super-chunks [j0, j1) inside tokens [a, b)."""
    if n_ranges <= 1:
        return [(0, N, 0, tb.n_chunks, 0, tb.n_sc)]
    bounds = _host_bounds(tb, B, T)
    sc = []      # (first token, one past the last) of every super-chunk, in table order
    for s0, s1 in bounds:
        sc += [(t, min(t + S, s1)) for t in range(s0, s1, S)]
    chunk_tok0 = [t for s0, s1 in bounds for t in range(s0, s1, C)]
    assert len(sc) == tb.n_sc and len(chunk_tok0) == tb.n_chunks
    n_ranges = min(n_ranges, len(sc))
    cuts = [round(i * len(sc) / n_ranges) for i in range(n_ranges + 1)]
    out = []
    for j0, j1 in zip(cuts[:-1], cuts[1:]):
        a, b = sc[j0][0], sc[j1 - 1][1]
        c0, c1 = bisect.bisect_left(chunk_tok0, a), bisect.bisect_left(chunk_tok0, b)
        out.append((a, b, c0, c1, j0, j1))
    return out


_RANGE_TABLES: dict = {}     # (id(tables), ranges) -> (tables, per-range tables) of dense batches


def _range_tables(tb: SequenceTables, ranges, B: int, T: int, C: int, S: int) -> list[SequenceTables]:
    """The chunk / super-chunk tables of every token range, token indices rebased to its start.

    Built on the host (the ranges' bounds are host ints already) and copied to the device in one
    non-blocking transfer, no device read.  A dense batch's tables are cached per shape, so its
    range tables are built once per (tables, ranges) and later calls do no host-to-device work."""
    if len(ranges) == 1:
        return [tb]
    dense = tb.n_seq == B and tb.max_seq_len == T
    key = (id(tb), tuple(ranges))
    hit = _RANGE_TABLES.get(key)
    if hit is not None and hit[0] is tb:
        return hit[1]
    bounds = _host_bounds(tb, B, T)
    chunk_tok0, chunk_seq, sc_tok0, sc_seq = [], [], [], []
    for sid, (s0, s1) in enumerate(bounds):
        chunk_tok0 += range(s0, s1, C)
        sc_tok0 += range(s0, s1, S)
        chunk_seq += [sid] * len(range(s0, s1, C))
        sc_seq += [sid] * len(range(s0, s1, S))
    starts, ends = [s0 for s0, _ in bounds], [s1 for _, s1 in bounds]
    flat, parts = [], []
    for a, _b, c0, c1, j0, j1 in ranges:
        segs = ([t - a for t in chunk_tok0[c0:c1]], chunk_seq[c0:c1], [t - a for t in sc_tok0[j0:j1]],
                sc_seq[j0:j1], [t - a for t in starts], [t - a for t in ends])
        spans = []
        for seg in segs:       # each table 16-byte aligned (two int64), like a fresh tensor
            spans.append((len(flat), len(seg)))
            flat += seg + [0] * (len(seg) % 2)
        parts.append(spans)
    host = torch.tensor(flat, dtype=torch.int64)
    dev = tb.chunk_tok0.device
    if dev.type == "cuda":
        host = host.pin_memory()
    allt = host.to(dev, non_blocking=True)
    out = []
    for (_a, _b, c0, c1, j0, j1), spans in zip(ranges, parts):
        ct, cs, st, ss, s0, s1 = (allt[o:o + n] for o, n in spans)
        out.append(dataclasses.replace(tb, chunk_tok0=ct, chunk_seq=cs, sc_tok0=st, sc_seq=ss,
                                       seq_start=s0, seq_end=s1, n_chunks=c1 - c0, n_sc=j1 - j0))
    if dense:
        if len(_RANGE_TABLES) >= 64:
            _RANGE_TABLES.pop(next(iter(_RANGE_TABLES)))
        _RANGE_TABLES[key] = (tb, out)
    return out


def _carve(shapes, dtype, device, *, zero: bool) -> list[torch.Tensor]:
    """Tensors of ``shapes`` carved from one flat buffer (each view starts 512-byte aligned), zero-filled
    with one memset for all when ``zero``.  They share one storage: it lives while any of them does."""
    sizes = [math.prod(s) for s in shapes]
    align = 512 // torch.empty((), dtype=dtype).element_size()
    offs, n = [], 0
    for size in sizes:
        offs.append(n)
        n += -(-size // align) * align
    flat = (torch.zeros if zero else torch.empty)(max(n, 1), dtype=dtype, device=device)
    return [flat[o:o + size].view(s) for o, size, s in zip(offs, sizes, shapes)]


def _zeros(shapes, dtype, device) -> list[torch.Tensor]:
    """Zero-filled tensors of ``shapes`` carved from one flat buffer: one memset for all."""
    return _carve(shapes, dtype, device, zero=True)


def path_attention_bwd(
    do: torch.Tensor, q, k, v, w, beta, g, o, lse, state: ForwardState, *, scale: float,
    params: TritonParams, gate_placement: str = "inside_scale", dlse: torch.Tensor | None = None,
    state_kept: bool = False,
):
    """Gradients (dq, dk, dv, dw, dbeta, dg) of PaTH(-FoX) attention; dg is None without a gate.

    do is the gradient of o; dlse (optional) the gradient of the returned lse.  The backward
    consumes ``state``: each of its tensors is released (the field set to None) once dead.

    Memory: the inter-super-chunk stages (1-4) run over the whole stream; transport, intra and
    UT backward (5-7) only touch rows of one super-chunk, so above ``bwd_range_budget_mib`` (a spec knob)
    they run per token range of whole super-chunks, with u, K~, m
    recomputed for the range (one extra ut_chunk pass) and range-sized accumulators; ``state_kept``
    (the forward's compact state, bwd_forward_state keep) makes every range read its rows of the
    state's u, K~, m and w copy instead, and recompute only A and M for the UT backward.  The recomputed
    u and K~ are stored in the scan dtype with a copy of w (the 16-bit operands bwd_intra multiplies,
    rounded once instead of per load; the transport backward widens them to float32).  Every
    program computes what it did in one launch over the stream, and a row's atomic adds come from
    the same programs in the same kernel order; with a 16-bit scan the gradients differ from one
    range's only by the rounding of u and K~ (a single range reads the forward's float32 state).
    """
    B, T, HQ, D = q.shape
    H, DV = v.shape[2], v.shape[3]
    C, S, BN = params.chunk_size, params.superchunk_size, params.bwd_block_n
    BD, BDV = padded_dim(D), padded_dim(DV)
    dev = q.device
    # the backward's own D x D transition products (the recomputed forward state keeps the forward's): the
    # transport backward's at bwd_transition_precision, the others in its float32 mode
    dt, tp_transport = params.scan_dtype, params.bwd_transition_precision
    tp = float_transition_mode(tp_transport)
    tb = state.tables
    interp = interpreting()
    use_gate = g is not None
    qt, kt_in, vt, wt, bt = _tokens(q), _tokens(k), _tokens(v), _tokens(w), _tokens(beta)
    dot_, ot, lset = _tokens(do), _tokens(o), _tokens(lse)
    N = qt.shape[0]
    # gc, dc: [HQ, N] head-major (a key tile's gates contiguous), head stride N
    gc = state.gc if use_gate else lset  # dummy pointer when ungated
    qk_scale = scale * _LOG2E
    gate_nat = scale if gate_placement == "inside_scale" else 1.0
    gate_scale = gate_nat * _LOG2E
    f32 = dict(device=dev, dtype=torch.float32)
    common = dict(HQ=HQ, H=H, D=D, DV=DV, BD=BD, BDV=BDV, C=C, S=S, DT=dt)
    multi = tb.max_seq_len > S
    scan_store = state.kj.dtype     # the scan dtype's storage type (state.kj dies before stage 6)
    ranges = _ranges(tb, B, T, N, C, S, _range_count(tb, N, H, HQ, D, params, DV))
    # u, K~, m (and w's 16-bit copy) of the per-range stages: each range reads its rows of the state's own when
    # the state holds them for every range -- the forward's kept compact state (``state_kept``: autograd holds
    # it to the end of the backward anyway) or a float32 state of one range -- and then only A (and M) are
    # recomputed, for the UT backward.  Otherwise they are recomputed per range: in the scan dtype across
    # ranges, else (one range, no state of its own: bwd_forward_state keep_inter) in float32, as the backward's
    # own state of one range is; a 16-bit state the backward built itself is dropped after stage 1 (the peak)
    recompute = state.u is None or not (state_kept or (len(ranges) == 1 and state.u.dtype == torch.float32))
    range_dtype = scan_store if len(ranges) > 1 or state.u is not None else torch.float32

    # 1. queries at their super-chunk start, stored in the scan dtype: they are only ever GEMM operands.
    # The forward's own when it kept them (bwd_forward_state keep_inter / keep); else bwd_prep walks each
    # query chunk's chain (it writes every row of every sequence); only the inter stages read them
    chain = multi and state.y is None
    if state.y is not None:
        y = state.y
    else:
        y = torch.empty(N, HQ, D, device=dev, dtype=scan_store) if chain else None
    # delta [N, HQ] (bwd_prep writes it whole) shares dc's buffer: one memset, and two N x HQ float32
    # arrays rounded together instead of dc rounding up a larger buffer (the caching allocator's 2 MiB)
    delta, dc = _zeros([(N, HQ), (HQ, N)], torch.float32, dev)
    dlse_t = _tokens(dlse).float() if dlse is not None else delta
    compiled(bwd_prep_kernel)[(tb.n_chunks * HQ,)](     # query heads fastest (_ops.chunk_and_head)
        qt, wt, state.u if chain else wt, ot, dot_, dlse_t, y if chain else delta, delta,
        tb.chunk_tok0, tb.chunk_seq, tb.seq_start, tb.seq_end,
        INTERP=interp, HAS_DLSE=dlse is not None, CHAIN=chain, num_warps=params.bwd_num_warps,
        num_stages=1, **common,
    )
    del dlse_t
    state.y = None
    if recompute:   # u, K~, m are recomputed per range below (w's 16-bit copy only fed the transport)
        state.u = state.kt = state.m = state.wd = None

    # dv in its final type: the inter stage stores every row (its part of dV, summed over the query heads of a
    # group), each token range adds the intra part in a float32 copy of its rows (``_range_dv``).  Accumulators
    # that live to the end, zeroed at once: dKJ and dWhat (the narrow chain kernel adds into it) between
    # super-chunks.  dY (read by bwd_intra's walk, which leaves its carried query gradient there for the
    # diagonal tile): written whole by the dq kernel between super-chunks, else zeroed
    if multi:
        dv = torch.empty(N, H, DV, device=dev, dtype=v.dtype)
        chain_adds = BD <= CHAIN_KERNEL_MAX_BD
        shapes = [(N, H, D)] + ([tuple(state.what.shape)] if chain_adds else [])
        dkj, *dwhat0 = _zeros(shapes, torch.float32, dev)
        dwhat0 = dwhat0[0] if chain_adds else None
        # 3. + 4. first (dom and its chain die before dY exists)
        dom = torch.zeros(max(tb.n_pairs, 1), H, BD, BD, **f32)
        # every pair's Om (laid out like dom): in the scan's 16-bit type, the inter kernels' operand, up to
        # padded head dim 128; float32 for the column-blocked transitions of wide head dims, with scratch
        # rows for KZ / Z (dummy pointers otherwise)
        DB = transition_column_block(BD)
        om = superchunk_pairs(state.what, tb, dom, S, tp) if DB < BD else pair_transitions(state.what, tb, S, tp,
                                                                                             scan_store)
        kz = torch.empty(N, H, D, device=dev, dtype=state.kj.dtype) if DB < BD else dkj
        dkv_n, dkv_warps = dkv_launch(params)
        inter_parts = inter_gate_by_product(params, use_gate)
        compiled(bwd_inter_dkv_kernel)[(tb.n_sc * (S // dkv_n), H)](
            y, state.kj, vt, gc, dot_, lset, delta, dkj, dv, dom, dc, om, kz,
            tb.sc_tok0, tb.sc_seq, tb.seq_start, tb.seq_end, tb.seq_sc_base, tb.seq_pair_base,
            qk_scale, gate_scale, scale, gate_nat, N,
            BLOCK_N=dkv_n, BLOCK_M=dkv_query_step(params), DB=DB, TP=tp, USE_GATE=use_gate,
            GATE_SUM_MMA=gate_sums_by_mma(BD), INTERP=interp, GATE_MMA=inter_parts,
            num_warps=dkv_warps, num_stages=params.bwd_num_stages, **common,
        )
        del kz
        dwhat = superchunk_chain(state.what, dom, tb, S, tp, om=om if DB < BD else None, dwhat=dwhat0)
        del dom, dwhat0
        # dY: the dq kernel stores every row at DB == BD (zeros in a sequence's first super-chunk); column-blocked
        # (DB < BD) it adds into zeroed rows
        dy = _carve([(N, HQ, D)], torch.float32, dev, zero=DB < BD)[0]
        z = torch.empty(N, HQ, D, device=dev, dtype=y.dtype) if DB < BD else dy
        # bwd_gate_bias product: the keys' gate offsets as bf16 parts [HQ, N, 16] for dq (dkv builds its own)
        gp = gate_parts(gc, -gate_scale / qk_scale) if inter_parts else gc
        compiled(bwd_inter_dq_kernel)[(tb.n_chunks, HQ)](
            y, state.kj, vt, gc, dot_, lset, delta, dy, om, z, dc, gp,
            tb.chunk_tok0, tb.chunk_seq, tb.seq_start, tb.seq_end, tb.seq_sc_base, tb.seq_pair_base,
            tb.n_chunks, qk_scale, gate_scale, scale, gate_nat, N,
            BLOCK_N=BN, DB=DB, TP=tp, USE_GATE=use_gate, INTERP=interp, GATE_MMA=inter_parts,
            num_warps=params.bwd_inter_num_warps, num_stages=params.bwd_num_stages, **common,
        )
        del om, z, gp
    else:
        dv = torch.zeros(N, H, DV, device=dev, dtype=v.dtype)
        dy = torch.zeros(N, HQ, D, **f32)
    del y
    state.kj = state.what = None

    # 5.-7. per token range of whole super-chunks
    dq = torch.empty(N, HQ, D, device=dev, dtype=q.dtype)
    dw = torch.empty(N, H, D, device=dev, dtype=w.dtype)
    dk = torch.empty(N, H, D, device=dev, dtype=k.dtype)
    dbeta = torch.empty(N, H, device=dev, dtype=beta.dtype)
    for (a, b, _c0, _c1, j0, j1), tr in zip(ranges, _range_tables(tb, ranges, B, T, C, S)):
        r = slice(a, b)
        nr = b - a
        if recompute:   # A stays for the UT backward, which reads A and M instead of inverting again
            u, ktil, m, amat, wd = ut_recompute(kt_in[r], wt[r], bt[r], tr, H, D, C, params, range_dtype)
            wd = wt[r] if wd is None else wd
        else:       # the state's rows of the range (its 16-bit copy of w, where it has one)
            u, ktil, m, amat = state.u[r], state.kt[r], state.m[r], None
            wd = wt[r] if state.wd is None else state.wd[r]
        # the range's accumulators: the transport backward stores dK~, dW, dU of every row (zeros in a
        # sequence's last super-chunk), bwd_intra adds into all five; dK and dM (and without inter stages
        # all five) zeroed at once
        if multi:
            dkt, dw_acc, du = _carve([(nr, H, D)] * 3, torch.float32, dev, zero=False)
            dk_acc, dm = _zeros([(nr, H, D), (nr, H, C)], torch.float32, dev)
            # the states Suf_m and their gradients G_m of every chunk: S / C of ROWS x BD per row block
            rows = transport_backward_rows(BD)
            suf = torch.empty(tr.n_sc * H * (BD // rows) * (S // C) * rows * BD, **f32)
            gs = torch.empty_like(suf)
            tkw = dict(H=H, D=D, BD=BD, C=C, S=S, ROWS=rows, TP=tp_transport)
            chain_warps, chain_stages, grads_warps = transport_launch(BD)
            compiled(bwd_transport_chain_kernel)[(tr.n_sc, H, BD // rows)](
                ktil, wt[r], u, dkj[r], dwhat[j0:j1], suf, gs,
                tr.sc_tok0, tr.sc_seq, tr.seq_end, num_warps=chain_warps, num_stages=chain_stages, **tkw,
            )
            compiled(bwd_transport_grads_kernel)[(tr.n_sc, S // C, H)](
                wt[r], u, dkj[r], suf, gs, dkt, dw_acc, du,
                tr.sc_tok0, tr.sc_seq, tr.seq_end, num_warps=grads_warps, num_stages=1, **tkw,
            )
            del suf, gs
        else:
            dkt, dw_acc, du, dk_acc, dm = _zeros([(nr, H, D)] * 4 + [(nr, H, C)], torch.float32, dev)
        dv_r = _range_dv(dv, r)
        # bwd_intra's chain-state slots (see the kernel): S // (2C) per chunk and query head
        xs = torch.empty(max(1, HQ * tr.n_chunks * (S // (2 * C)) * C * max(BD, 64)), device=dev, dtype=scan_store)
        # the range's columns of gc and dc: views with the full head stride N
        intra_args = (qt[r], kt_in[r], vt[r], wd, u, m, ktil, gc[:, r] if use_gate else gc, dot_[r], lset[r],
                      delta[r], dy[r], dq[r], dk_acc, dv_r, dw_acc, du, dm, dkt, dc[:, r], xs,
                      tr.chunk_tok0, tr.chunk_seq, tr.seq_start, tr.seq_end,
                      tr.n_chunks, qk_scale, gate_scale, scale, gate_nat, N)
        # head dims under 64 run on 64-wide (masked) tiles here: at D = 32 this kernel's atomic
        # adds of 64 x 32 products faulted on the H200 (illegal address; D = 64 ran clean)
        intra_kw = dict(common, BD=max(BD, 64), BDV=max(BDV, 64), TP=tp, USE_GATE=use_gate, INTERP=interp,
                        num_warps=params.bwd_num_warps, num_stages=1)
        # the walk leaves its carried query gradient in dy[r] for the diagonal tile's kernel
        walk, walk_warps, walk_stages = intra_walk_launch(
            params, BD, max(u.element_size(), ktil.element_size(), wd.element_size()))
        walk_kw = dict(intra_kw, num_warps=walk_warps, num_stages=walk_stages,
                       GATE_SUM_MMA=walk_gate_sums_by_product(params, use_gate))
        compiled(walk)[(tr.n_chunks * HQ,)](*intra_args, **walk_kw)
        compiled(bwd_intra_diag_kernel)[(tr.n_chunks * HQ,)](*intra_args, **intra_kw)
        if dv_r.dtype != dv.dtype:
            dv[r].copy_(dv_r)
        # the tuple holds u, K~ and the chain-state slots: drop it with them, before the UT backward
        del intra_args, u, ktil, xs, wd, dv_r
        if not recompute:   # A and M of the UT backward, in the same operations as the recompute's
            if b == N:      # the last range: the state's u, K~, m are dead
                state.u = state.kt = state.m = state.wd = None
            _, _, m, amat, _ = ut_recompute(kt_in[r], wt[r], bt[r], tr, H, D, C, params, range_dtype, write_uk=False)
        # 7. the UT backward, one program per chunk and kv head: dbeta, then dw, dk per column block
        compiled(ut_bwd_kernel)[(tr.n_chunks, H)](
            wt[r], bt[r], kt_in[r], du, dkt, dm, dw_acc, dk_acc, amat, m, dw[r], dk[r], dbeta[r],
            tr.chunk_tok0, tr.chunk_seq, tr.seq_end,
            H=H, D=D, BD=BD, DB=min(BD, UT_COLUMN_BLOCK), C=C, BETA_MAX=params.beta_max, UP=params.ut_precision,
            GP=params.ut_grad_precision, num_warps=UT_BWD_WARPS, num_stages=1,
        )
        del dm, amat, m, dkt, dw_acc, du, dk_acc
    del dy, delta
    if multi:
        del dkj, dwhat
    state.gc = None
    del gc
    dg = _gate_grad(dc, tb, (B, T, HQ)).to(g.dtype).contiguous() if use_gate else None
    return (dq.view(B, T, HQ, D), dk.view(B, T, H, D), dv.view(B, T, H, DV),
            dw.view(B, T, H, D), dbeta.view(B, T, H), dg)


def fused_ut_recompute(BD: int) -> bool:
    """Whether a token range's UT stage is rebuilt in one launch (``ut_recompute_kernel``): from padded head dim
    ``UT_FUSED_MIN_BD``, where the forward's is fused too; below, the three-launch stage."""
    return BD >= UT_FUSED_MIN_BD


def ut_recompute(kt_in, wt, bt, tables: SequenceTables, H: int, D: int, C: int, params: TritonParams,
                 out_dtype: torch.dtype, write_uk: bool = True):
    """The UT stage of a token range for the backward: (u, K~, m, A, w copy).  u, K~ in ``out_dtype`` ([N, H, D];
    None without ``write_uk``), m and A ([N, H, C] float32; A for ``ut_bwd_kernel``), and w in a 16-bit
    ``out_dtype`` (None otherwise, and without ``write_uk``).

    One launch (``ut_recompute_kernel``, where ``fused_ut_recompute``), in the operations of the forward's fused
    stage for a state of ``out_dtype``: a 16-bit state is the forward's bit for bit, and a kept state's A and M
    (``write_uk`` off) are the recompute's.  Else the three-launch stage (``ut_forward``)."""
    N = kt_in.shape[0]
    dev = kt_in.device
    op16 = out_dtype in (torch.float16, torch.bfloat16)
    BD = padded_dim(D)
    if not fused_ut_recompute(BD):
        if not write_uk:
            a, m = ut_chunk_state(kt_in, wt, bt, tables, H, D, C, params)
            return None, None, m, a, None
        u, ktil, m, a, wd = ut_forward(kt_in, wt, bt, tables, H, D, C, params, out_dtype=out_dtype, write_w=op16,
                                       keep_a=True)
        return u, ktil, m, a, wd
    m, a = torch.empty(2, N, H, C, device=dev, dtype=torch.float32).unbind(0)
    u = ktil = wd = None
    if write_uk:
        u, ktil, *wd = torch.empty(3 if op16 else 2, N, H, D, device=dev, dtype=out_dtype).unbind(0)
        wd = wd[0] if op16 else None
    compiled(ut_recompute_kernel)[(tables.n_chunks, H)](
        wt, bt, kt_in, wt if u is None else u, wt if ktil is None else ktil, wt if wd is None else wd, m, a,
        tables.chunk_tok0, tables.chunk_seq, tables.seq_end,
        H=H, D=D, BD=BD, DB=min(BD, UT_COLUMN_BLOCK), C=C, BETA_MAX=params.beta_max, UP=params.ut_precision,
        AP=ut_apply_mode(params, out_dtype), OPDT=ut_operand_type(out_dtype),
        WRITE_UK=write_uk, WRITE_W=wd is not None, INTERP=interpreting(), SB=params.ut_diag_block,
        num_warps=UT_NUM_WARPS, num_stages=1,
    )
    return u, ktil, m, a, wd


def _range_dv(dv: torch.Tensor, r: slice) -> torch.Tensor:
    """The rows ``r`` of dv for the intra kernels' atomic adds: a float32 copy of a 16-bit dv's rows (written
    back after them: the inter part and the sum each round once to dv's type), a float32 dv's own rows."""
    return dv[r] if dv.dtype == torch.float32 else dv[r].float()


def kept_state(kept: list[torch.Tensor], q: torch.Tensor, cu_seqlens: torch.Tensor | None,
               params: TritonParams) -> ForwardState:
    """The forward's kept state (bwd_forward_state keep / keep_inter: ``forward.KEPT_STATE_FIELDS``, None where
    a field is not kept) as the backward's ForwardState, over the same tables ``backward_state`` would build."""
    B, T = q.shape[:2]
    return state_from_kept(list(kept), state_tables(B, T, cu_seqlens, params, q.device))


def backward_op(do: torch.Tensor, dlse: Optional[torch.Tensor], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                w: torch.Tensor, beta: torch.Tensor, g: Optional[torch.Tensor], o: torch.Tensor, lse: torch.Tensor,
                cu_seqlens: Optional[torch.Tensor], kept: list[torch.Tensor], scale: float, config_json: str,
                gate_placement: str) -> list[torch.Tensor]:
    """The custom op ``pathtune::path_attn_bwd`` (autograd.py registers it): the gradients at the config
    ``config_json``, from the kept forward state when the forward op returned one (else the state is
    recomputed); dg is an empty tensor without a gate."""
    params = resolve_json("triton", "bwd", config_json, int(q.shape[-1]), int(v.shape[-1]))
    try:
        state = kept_state(kept, q, cu_seqlens, params) if has_kept_state(kept) else None
        # bwd_forward_state keep: the forward's u, K~, m, w copy, which every token range reads
        state_kept = state is not None and state.u is not None
        if state is None or (state.u is None and state.y is None):
            # nothing kept, or keep_inter with no sequence longer than one super-chunk (no inter stages: what
            # the per-range stages read is the UT stage's, computed here as without a kept state)
            state = backward_state(q, k, w, beta, g, cu_seqlens=cu_seqlens, params=params, DV=int(v.shape[-1]))
        grads = path_attention_bwd(do.contiguous(), q, k, v, w, beta, g, o, lse, state, scale=scale, params=params,
                                   gate_placement=gate_placement, dlse=dlse, state_kept=state_kept)
    except OutOfResources as exc:
        raise config_error(exc, q, v, config_json, "backward") from exc
    dg = grads[5] if grads[5] is not None else beta.new_empty(0)
    return [*grads[:5], dg]


def backward_op_like(do, dlse, q, k, v, w, beta, g, o, lse, cu_seqlens, kept, scale, config_json, gate_placement):
    """``backward_op``'s results as uninitialised tensors (its fake implementation): contiguous like the real
    op's (empty_like would copy the strides of a permuted input, and inductor asserts the real strides)."""
    def like(x):
        return x.new_empty(x.shape)
    dg = like(g) if g is not None else beta.new_empty(0)
    return [like(q), like(k), like(v), like(w), like(beta), dg]
