"""Host side of the Triton backward: seven stages, every buffer O(T) per head.

Order (each stage only reads what earlier ones wrote):
  1. bwd_prep          Y (queries at their super-chunk start), delta = rowsum(dO * O)
  3. bwd_inter_dkv     dKJ, inter part of dV, dOm per super-chunk pair, key side of dc
  4. superchunk chain  dWhat from dOm
  2. bwd_inter_dq      dY from all earlier super-chunks, query side of dc (after 3-4: dOm is
                       freed before dY is allocated; wide head dims, padded D above 128: 3 and 2
                       run column-blocked on every pair's Om_{I,J}, computed in torch before 3
                       by ``_superchunk_pairs_torch``, as large as dOm, freed after 2)
  5. bwd_transport     dK~, dW, dU from dKJ and dWhat (a chain kernel storing the states, then a
                       per-chunk kernel summing their products)
  6. bwd_intra         dq (final) and the chunk-level dK~, dU, dW, dM, dK, dV, dc inside super-chunks
  7. ut_bwd            dw, dk, dbeta through the UT transform (C x C chunk kernel, then per column block)
then dg = reverse cumsum of dc per sequence.  Stages 5-7 only touch rows of one super-chunk; on
long inputs they run per token range of super-chunks (see ``path_attention_bwd``), which bounds
the extra peak memory (``benchmarks/memory_probe.py``: 0.95 GiB at T=16384, B=2, H=16, D=64, with
the 256 MiB budget ``PHASE2_RANGE_BYTES``).
"""
from __future__ import annotations

import bisect
import dataclasses

import torch

from ._layout import SequenceTables
from ._ops import interpreting
from .bwd_chain import bwd_superchunk_chain_kernel, bwd_transport_chain_kernel, bwd_transport_grads_kernel
from .bwd_inter import bwd_inter_dkv_kernel, bwd_inter_dq_kernel
from .bwd_intra import bwd_intra_kernel
from .bwd_prep import bwd_prep_kernel
from .forward import (
    _LOG2E,
    UT_COLUMN_BLOCK,
    ForwardState,
    _pow2,
    _tokens,
    transition_column_block,
    transport_rows,
    ut_forward,
    ut_inverse_scratch,
)
from .params import TritonParams
from .ut_bwd import CC_TILES, UT_BWD_APPLY_WARPS, UT_BWD_CHUNK_WARPS, ut_bwd_apply_kernel, ut_bwd_chunk_kernel


def _gate_grad(dc: torch.Tensor, tables: SequenceTables, shape) -> torch.Tensor:
    """dg_l = sum_{i >= l, same sequence} dc_i (c is the inclusive cumsum of g).

    Runs along the innermost dimension (tokens moved last) in float64.
    """
    d64 = dc.t().to(torch.float64)                                   # [HQ, N]
    rc = torch.flip(torch.cumsum(torch.flip(d64, [-1]), -1), [-1])   # sum over i >= l, whole stream
    tail = torch.cat([rc, torch.zeros_like(rc[:, :1])], -1)[:, tables.seq_end]  # beyond each sequence
    lengths = tables.seq_end - tables.seq_start
    rc = rc - torch.repeat_interleave(tail, lengths, dim=-1)
    return rc.t().reshape(shape)


def _superchunk_chain_torch(what: torch.Tensor, dom: torch.Tensor, tables: SequenceTables) -> torch.Tensor:
    """Same result as bwd_superchunk_chain_kernel, batched over heads and super-chunks in torch.

    Used for head dims above 64, where the kernel's D x D float32 tiles exceed shared memory.
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

    The inter backward kernels read these on the column-blocked path (DB < BD), where no kernel
    can hold a BD x BD float32 tile to carry the running product itself.  One batched matmul per
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


# Working set of the per-range stages (transport, intra, UT backward) above which they run over
# token ranges of whole super-chunks, each with its own recomputed u, K~, m and accumulators.
# Below it they run once over the whole stream on the forward state (no recomputation).
# Extra peak of one gated bf16 fwd+bwd at T=16384, B=2 (benchmarks/memory_probe.py, CPU count;
# D=64 H=16 / D=128 H=8) per budget (before bwd_intra's chain-state slots and the transport
# backward's stored states joined the range count: with them 0.910 / 0.889 GiB at 256 MiB, 8 ranges):
#   128 MiB 0.848 / 0.834 GiB   192 MiB 0.883 / 0.865   256 MiB 0.953 / 0.928
#   384 MiB 0.988 / 0.959       512 MiB 1.094 / 1.053   unbounded 1.707 / 1.646
# The bound is 1.0 GiB; 256 MiB keeps ~0.05 GiB of margin below it (384 MiB keeps 0.01).  With
# 128 MiB (10 ranges at B*T = 32768 tokens, D=64 H=16) the H200 measured the gated fwd+bwd 23%
# slower at T=4096 and 11% slower at T=16384 than a single range (33.1 vs 27.0 ms,
# 59.8 vs 53.9 ms); 256 MiB halves the ranges (5), so the extra launches and ut_chunk recomputes.
# PATHTUNE_BWD_RANGE_MIB overrides it per call
# (``_range_budget``), so one process can time several budgets (benchmarks/dev_gpu_run2.py ranges).
PHASE2_RANGE_BYTES = 256 << 20
# Warps of the transport backward's two kernels, from compile_check for sm_90 at the heuristic configs:
# the chain kernel spills 260 B per thread at D = 64 with 4 warps (tf32x3 products), none with 8, and
# none at D = 128 with 4; the per-chunk kernel (three C x BD float32 accumulators) spills 732 B at
# D = 64 with 4 warps, 40 B with 8, none at D = 128 with 8.
def transport_warps(BD: int) -> tuple[int, int]:
    """(chain kernel, grads kernel) warps for padded head dim BD."""
    return (8 if BD <= 64 else 4), 8




def _range_budget():
    """Bytes of the per-range stages' working set above which they split; None: never split."""
    from pathtune import _env

    mib = _env.BWD_RANGE_MIB.get()
    if mib is None:
        return PHASE2_RANGE_BYTES
    return None if mib == float("inf") else int(mib) << 20


def _phase2_bytes_per_token(H: int, D: int, C: int, S: int, multi: bool, HQ: int | None = None,
                            scan_bytes: int = 2) -> int:
    """Bytes per token of one range: float32 u, K~, m, the UT scratch, the accumulators dK~, dW, dU,
    dK (D wide) and dM (C wide) and the transport's states and their gradients per kv head; per query head (HQ, default
    H) bwd_intra's chain states (S // (2C) slots of its 64-or-wider tiles, scan dtype).  The UT backward's
    C x C tiles (CC_TILES x C float32 per kv head) live after u, K~, m and the chain states are freed:
    they count where they are larger."""
    BD = _pow2(D)
    per_head = C + 4 * D + C + (2 * BD * BD // C if multi else 0)
    states = (HQ or H) * (S // (2 * C)) * max(BD, 64) * scan_bytes
    return 4 * H * per_head + max(4 * H * (2 * D + C) + states, 4 * H * CC_TILES * C)


def _host_bounds(tb: SequenceTables, B: int, T: int):
    """(start, end) of every sequence on the host: a dense batch from its shape, else one read."""
    if tb.n_seq == B and tb.max_seq_len == T:    # dense (varlen has B == 1): no device read
        return [(b * T, (b + 1) * T) for b in range(B)]
    return list(zip(tb.seq_start.tolist(), tb.seq_end.tolist()))   # packed varlen (host sync)


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


def _range_tables(tb: SequenceTables, a, c0, c1, j0, j1) -> SequenceTables:
    """The chunk / super-chunk tables of one token range, token indices rebased to its start."""
    if (a, c0, c1, j0, j1) == (0, 0, tb.n_chunks, 0, tb.n_sc):
        return tb
    return dataclasses.replace(
        tb, chunk_tok0=tb.chunk_tok0[c0:c1] - a, chunk_seq=tb.chunk_seq[c0:c1],
        sc_tok0=tb.sc_tok0[j0:j1] - a, sc_seq=tb.sc_seq[j0:j1],
        seq_start=tb.seq_start - a, seq_end=tb.seq_end - a, n_chunks=c1 - c0, n_sc=j1 - j0)


def path_attention_bwd(
    do: torch.Tensor, q, k, v, w, beta, g, o, lse, state: ForwardState, *, scale: float,
    params: TritonParams, gate_placement: str = "inside_scale", dlse: torch.Tensor | None = None,
):
    """Gradients (dq, dk, dv, dw, dbeta, dg) of PaTH(-FoX) attention; dg is None without a gate.

    do is the gradient of o; dlse (optional) the gradient of the returned lse.  The backward
    consumes ``state``: each of its tensors is released (the field set to None) once dead.

    Memory: the inter-super-chunk stages (1-4) run over the whole stream; transport, intra and
    UT backward (5-7) only touch rows of one super-chunk, so above ``PHASE2_RANGE_BYTES`` (or
    ``PATHTUNE_BWD_RANGE_MIB``) they run per token range of whole super-chunks, with u, K~, m
    recomputed for the range (one extra ut_chunk pass) and range-sized accumulators.  Every
    program computes exactly what it did in one launch over the stream, and a row's atomic adds
    come from the same programs in the same kernel order, so the gradients are unchanged.
    """
    B, T, HQ, D = q.shape
    H, DV = v.shape[2], v.shape[3]
    C, S, BN = params.chunk_size, params.superchunk_size, params.bwd_block_n
    BD, BDV = _pow2(D), _pow2(DV)
    dev = q.device
    # the backward's own D x D transition products (the recomputed forward state keeps the forward's)
    dt, tp = params.scan_dtype, params.bwd_transition_precision
    tb = state.tables
    interp = interpreting()
    use_gate = g is not None
    qt, kt_in, vt, wt, bt = _tokens(q), _tokens(k), _tokens(v), _tokens(w), _tokens(beta)
    dot_, ot, lset = _tokens(do), _tokens(o), _tokens(lse)
    N = qt.shape[0]
    gc = state.gc if use_gate else lset  # dummy pointer when ungated
    qk_scale = scale * _LOG2E
    gate_nat = scale if gate_placement == "inside_scale" else 1.0
    gate_scale = gate_nat * _LOG2E
    f32 = dict(device=dev, dtype=torch.float32)
    common = dict(HQ=HQ, H=H, D=D, DV=DV, BD=BD, BDV=BDV, C=C, S=S, DT=dt)
    multi = tb.max_seq_len > S
    budget = _range_budget()
    scan_store = state.kj.dtype     # the scan dtype's storage type (state.kj dies before stage 6)
    per_token = _phase2_bytes_per_token(H, D, C, S, multi, HQ, state.kj.element_size())
    n_ranges = 1 if budget is None else -(-N * per_token // budget)
    ranges = _ranges(tb, B, T, N, C, S, n_ranges)
    recompute = len(ranges) > 1

    # 1. queries at their super-chunk start, stored in the scan dtype: they are only ever GEMM operands
    y = torch.zeros(N, HQ, D, device=dev, dtype=scan_store)
    delta = torch.empty(N, HQ, **f32)
    dlse_t = _tokens(dlse).float() if dlse is not None else delta
    bwd_prep_kernel[(tb.n_chunks, HQ)](
        qt, wt, state.u, ot, dot_, dlse_t, y, delta,
        tb.chunk_tok0, tb.chunk_seq, tb.seq_start, tb.seq_end,
        INTERP=interp, HAS_DLSE=dlse is not None, num_warps=params.bwd_num_warps, num_stages=1, **common,
    )
    del dlse_t
    if recompute:   # u, K~, m are recomputed per range below
        state.u = state.kt = state.m = None

    dc = torch.zeros(N, HQ, **f32)
    dv = torch.zeros(N, H, DV, **f32)
    if multi:
        # 3. + 4. first (dom and its chain die before dY exists); stage 2 adds to dc after them,
        # and a sum of two terms from zero does not depend on their order
        dkj = torch.zeros(N, H, D, **f32)
        dom = torch.zeros(max(tb.n_pairs, 1), H, BD, BD, **f32)
        # column-blocked transitions (wide head dims): every pair's Om (like dom) from torch, and
        # scratch rows for KZ / Z; otherwise the kernels carry Om themselves (dummy pointers)
        DB = transition_column_block(BD)
        om = _superchunk_pairs_torch(state.what, tb, dom) if DB < BD else state.what
        kz = torch.empty(N, H, D, device=dev, dtype=state.kj.dtype) if DB < BD else dkj
        bwd_inter_dkv_kernel[(tb.n_sc * (S // BN), H)](
            y, state.kj, vt, state.what, gc, dot_, lset, delta, dkj, dv, dom, dc, om, kz,
            tb.sc_tok0, tb.sc_seq, tb.seq_start, tb.seq_end, tb.seq_sc_base, tb.seq_pair_base,
            qk_scale, gate_scale, scale, gate_nat,
            BLOCK_N=BN, BLOCK_M=params.bwd_block_m, DB=DB, TP=tp, USE_GATE=use_gate, INTERP=interp,
            num_warps=params.bwd_num_warps, num_stages=params.bwd_num_stages, **common,
        )
        del kz
        if BD <= 64:
            dwhat = torch.zeros_like(state.what)
            bwd_superchunk_chain_kernel[(tb.n_seq, H)](
                state.what, dom, dwhat, tb.seq_start, tb.seq_end, tb.seq_sc_base, tb.seq_pair_base,
                H=H, BD=BD, S=S, TP=tp, num_warps=4, num_stages=1,
            )
        else:
            dwhat = _superchunk_chain_torch(state.what, dom, tb)
        del dom
        dy = torch.zeros(N, HQ, D, **f32)
        z = torch.empty(N, HQ, D, device=dev, dtype=y.dtype) if DB < BD else dy
        bwd_inter_dq_kernel[(tb.n_chunks, HQ)](
            y, state.kj, vt, state.what, gc, dot_, lset, delta, dy, dc, om, z,
            tb.chunk_tok0, tb.chunk_seq, tb.seq_start, tb.seq_end, tb.seq_sc_base, tb.seq_pair_base,
            tb.n_chunks, qk_scale, gate_scale, scale, gate_nat,
            BLOCK_N=BN, DB=DB, TP=tp, USE_GATE=use_gate, INTERP=interp,
            num_warps=params.bwd_num_warps, num_stages=params.bwd_num_stages, **common,
        )
        del om, z
    else:
        dy = torch.zeros(N, HQ, D, **f32)
    del y
    state.kj = state.what = None

    # 5.-7. per token range of whole super-chunks
    dq = torch.empty(N, HQ, D, device=dev, dtype=q.dtype)
    dw = torch.empty(N, H, D, device=dev, dtype=w.dtype)
    dk = torch.empty(N, H, D, device=dev, dtype=k.dtype)
    dbeta = torch.empty(N, H, device=dev, dtype=beta.dtype)
    for a, b, c0, c1, j0, j1 in ranges:
        tr = _range_tables(tb, a, c0, c1, j0, j1)
        r = slice(a, b)
        nr = b - a
        if recompute:
            u, ktil, m, ut_scratch, _ = ut_forward(kt_in[r], wt[r], bt[r], tr, H, D, C, params)
        else:
            u, ktil, m, ut_scratch = state.u, state.kt, state.m, None
        dkt = torch.zeros(nr, H, D, **f32)
        dw_acc = torch.zeros(nr, H, D, **f32)
        du = torch.zeros(nr, H, D, **f32)
        if multi:
            # the states Suf_m and their gradients G_m of every chunk: S / C of ROWS x BD per row block
            rows = transport_rows(BD)
            suf = torch.empty(tr.n_sc * H * (BD // rows) * (S // C) * rows * BD, **f32)
            gs = torch.empty_like(suf)
            tkw = dict(H=H, D=D, BD=BD, C=C, S=S, ROWS=rows, TP=tp, num_stages=1)
            chain_warps, grads_warps = transport_warps(BD)
            bwd_transport_chain_kernel[(tr.n_sc, H, BD // rows)](
                ktil, wt[r], u, dkj[r], dwhat[j0:j1], suf, gs,
                tr.sc_tok0, tr.sc_seq, tr.seq_end, num_warps=chain_warps, **tkw,
            )
            bwd_transport_grads_kernel[(tr.n_sc, S // C, H)](
                wt[r], u, dkj[r], suf, gs, dkt, dw_acc, du,
                tr.sc_tok0, tr.sc_seq, tr.seq_end, num_warps=grads_warps, **tkw,
            )
            del suf, gs
        dk_acc = torch.zeros(nr, H, D, **f32)
        dm = torch.zeros(nr, H, C, **f32)
        # bwd_intra's chain-state slots (see the kernel): S // (2C) per chunk and query head
        xs = torch.empty(max(1, HQ * tr.n_chunks * (S // (2 * C)) * C * max(BD, 64)), device=dev, dtype=scan_store)
        bwd_intra_kernel[(tr.n_chunks, HQ)](
            qt[r], kt_in[r], vt[r], wt[r], u, m, ktil, gc[r], dot_[r], lset[r], delta[r], dy[r],
            dq[r], dk_acc, dv[r], dw_acc, du, dm, dkt, dc[r], xs,
            tr.chunk_tok0, tr.chunk_seq, tr.seq_start, tr.seq_end,
            tr.n_chunks, qk_scale, gate_scale, scale, gate_nat,
            TP=tp, USE_GATE=use_gate, INTERP=interp, num_warps=params.bwd_num_warps, num_stages=1,
            # head dims under 64 run on 64-wide (masked) tiles here: at D = 32 this kernel's atomic
            # adds of 64 x 32 products faulted on the H200 (illegal address; D = 64 ran clean)
            **dict(common, BD=max(BD, 64), BDV=max(BDV, 64)),
        )
        del u, ktil, m, xs
        if not recompute:
            state.u = state.kt = state.m = None
            ut_scratch = ut_inverse_scratch(wt, bt, tb, H, D, C, params)
        # 7. the UT backward: C x C gradients per chunk, then dw, dk per column block
        cc = torch.empty(nr, H, CC_TILES, C, **f32)
        udb = min(BD, UT_COLUMN_BLOCK)
        uk = dict(H=H, D=D, DB=udb, C=C, GP=params.ut_grad_precision, num_stages=1)
        ut_bwd_chunk_kernel[(tr.n_chunks, H)](
            wt[r], bt[r], kt_in[r], du, dkt, dm, ut_scratch, cc, dbeta[r],
            tr.chunk_tok0, tr.chunk_seq, tr.seq_end,
            BD=BD, BETA_MAX=params.beta_max, UP=params.ut_precision, num_warps=UT_BWD_CHUNK_WARPS, **uk,
        )
        del ut_scratch, dm
        ut_bwd_apply_kernel[(tr.n_chunks, H, BD // udb)](
            wt[r], kt_in[r], du, dkt, dw_acc, dk_acc, cc, dw[r], dk[r],
            tr.chunk_tok0, tr.chunk_seq, tr.seq_end, num_warps=UT_BWD_APPLY_WARPS, **uk,
        )
        del cc, dkt, dw_acc, du, dk_acc
    del dy, delta
    if multi:
        del dkj, dwhat
    state.gc = None
    del gc
    dv = dv.to(v.dtype)
    dg = _gate_grad(dc, tb, (B, T, HQ)).to(g.dtype).contiguous() if use_gate else None
    return (dq.view(B, T, HQ, D), dk.view(B, T, H, D), dv.view(B, T, H, DV),
            dw.view(B, T, H, D), dbeta.view(B, T, H), dg)
