"""Token-major layout and the chunk/super-chunk tables every PaTH kernel indexes with.

All kernels see a packed token stream: ``[N_tok, heads, dim]``.  A dense batch ``[B, T, ...]``
is the same memory as a packed stream with ``cu_seqlens = [0, T, 2T, ...]``, so one code
path serves both.  UT chunks and super-chunks never straddle a sequence boundary; the last
chunk of a sequence may be partial (kernels mask it).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ._ops import interpreting, next_pow2
from .launch import compiled


@dataclass(frozen=True)
class SequenceTables:
    """Int tensors (on the data's device) describing chunks and super-chunks.

    chunk_tok0  [n_chunks]  global token index where each UT chunk starts
    chunk_seq   [n_chunks]  sequence id of each chunk
    sc_tok0     [n_sc]      global token index where each super-chunk starts
    sc_seq      [n_sc]      sequence id of each super-chunk
    seq_start   [n_seq]     first token of each sequence
    seq_end     [n_seq]     one past the last token of each sequence
    seq_sc_base [n_seq]     index (into the super-chunk arrays) of each sequence's first super-chunk
    seq_pair_base [n_seq]   offset of each sequence's n_sc x n_sc block of super-chunk pairs
    blk_tok0    [n_blocks]  global token index where each query block of the forward's
                            inter-super-chunk kernel starts (blocks of ``block_m`` tokens,
                            aligned like chunks; empty unless ``block_m`` was given)
    blk_seq     [n_blocks]  sequence id of each such block
    """

    chunk_tok0: torch.Tensor
    chunk_seq: torch.Tensor
    sc_tok0: torch.Tensor
    sc_seq: torch.Tensor
    seq_start: torch.Tensor
    seq_end: torch.Tensor
    seq_sc_base: torch.Tensor
    seq_pair_base: torch.Tensor
    blk_tok0: torch.Tensor
    blk_seq: torch.Tensor
    n_chunks: int
    n_blocks: int
    n_pairs: int
    n_sc: int
    n_seq: int
    max_seq_len: int
    seq_nsc_host: tuple = ()        # super-chunks per sequence (host ints)
    sc_base_host: tuple = ()
    pair_base_host: tuple = ()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def build_tables(
    batch: int,
    seq_len: int,
    cu_seqlens: torch.Tensor | None,
    chunk_size: int,
    superchunk_size: int,
    device: torch.device,
    block_m: int | None = None,
) -> SequenceTables:
    """Chunk and super-chunk tables for a dense batch or a packed varlen stream.

    A dense batch's tables depend on its sizes only: they are built once per (sizes, device) and
    cached (``dense_tables``), so a call at fixed shapes does no host work, no host-to-device copy
    and no synchronisation (CUDA-graph capturable once warm).  Packed varlen reads ``cu_seqlens``
    on the host once per call (the number of chunks decides the launch grid).
    """
    if cu_seqlens is None:
        return dense_tables(batch, seq_len, chunk_size, superchunk_size, torch.device(device), block_m)
    return _build_tables(batch, seq_len, cu_seqlens, chunk_size, superchunk_size, device, block_m)


@functools.lru_cache(maxsize=256)
def dense_tables(batch: int, seq_len: int, chunk_size: int, superchunk_size: int, device: torch.device,
                 block_m: int | None = None) -> SequenceTables:
    """The tables of a dense [batch, seq_len] input, cached per argument tuple (read-only tensors:
    no kernel writes them)."""
    return _build_tables(batch, seq_len, None, chunk_size, superchunk_size, device, block_m)


def _build_tables(batch, seq_len, cu_seqlens, chunk_size, superchunk_size, device, block_m) -> SequenceTables:
    if cu_seqlens is None:
        bounds = [b * seq_len for b in range(batch + 1)]
    else:
        bounds = [int(x) for x in cu_seqlens.detach().to("cpu", torch.int64).tolist()]
    starts, ends = bounds[:-1], bounds[1:]
    chunk_tok0, chunk_seq, sc_tok0, sc_seq, sc_base, pair_base = [], [], [], [], [], []
    blk_tok0, blk_seq = [], []
    n_pairs = 0
    for sid, (s0, s1) in enumerate(zip(starts, ends)):
        length = s1 - s0
        sc_base.append(len(sc_tok0))
        pair_base.append(n_pairs)
        n_pairs += _cdiv(length, superchunk_size) ** 2
        for c in range(_cdiv(length, chunk_size)):
            chunk_tok0.append(s0 + c * chunk_size)
            chunk_seq.append(sid)
        if block_m:
            for c in range(_cdiv(length, block_m)):
                blk_tok0.append(s0 + c * block_m)
                blk_seq.append(sid)
        for j in range(_cdiv(length, superchunk_size)):
            sc_tok0.append(s0 + j * superchunk_size)
            sc_seq.append(sid)

    def t(x):
        return torch.tensor(x, dtype=torch.int64, device=device)

    return SequenceTables(
        chunk_tok0=t(chunk_tok0),
        chunk_seq=t(chunk_seq),
        sc_tok0=t(sc_tok0),
        sc_seq=t(sc_seq),
        seq_start=t(starts),
        seq_end=t(ends),
        seq_sc_base=t(sc_base),
        seq_pair_base=t(pair_base),
        blk_tok0=t(blk_tok0),
        blk_seq=t(blk_seq),
        n_chunks=len(chunk_tok0),
        n_blocks=len(blk_tok0),
        n_pairs=n_pairs,
        n_sc=len(sc_tok0),
        n_seq=len(starts),
        max_seq_len=max((e - s for s, e in zip(starts, ends)), default=0),
        seq_nsc_host=tuple(_cdiv(e - s, superchunk_size) for s, e in zip(starts, ends)),
        sc_base_host=tuple(sc_base),
        pair_base_host=tuple(pair_base),
    )


def gate_cumsum(g: torch.Tensor, cu_seqlens: torch.Tensor | None, head_major: bool = False) -> torch.Tensor:
    """Inclusive cumulative sum of the log forget gate per sequence, float32 [B, T, HQ] (contiguous);
    head_major: [HQ, B * T] (contiguous, token t of head hq at hq * B * T + t).

    g: [B, T, HQ] (or [1, N_tok, HQ] with cu_seqlens).  On the GPU (and under Triton's interpreter)
    ``gate_cumsum_kernel``: one launch for sequences of one span, else two (the span totals, then the
    spans); no float64 torch ops, no transposes, and for a dense batch no host work.  A packed varlen
    batch reads its longest length on the host (the grid).  Elsewhere, and for float64 g, a float64
    torch cumsum (rounded to float32 like the kernel's).
    """
    if g.dtype == torch.float64 or not (g.is_cuda or interpreting()):
        return _gate_cumsum_torch(g, cu_seqlens, head_major)
    B, T, HQ = g.shape
    gt = g.reshape(B * T, HQ).contiguous()
    c = torch.empty((HQ, B * T) if head_major else (B * T, HQ), device=g.device, dtype=torch.float32)
    BH = min(next_pow2(HQ), 16)
    BT = max(16, 1024 // BH)
    if cu_seqlens is None:
        n_seq, max_len, cu = B, T, gt
    else:
        cu = cu_seqlens.to(device=g.device, dtype=torch.int64)
        n_seq, max_len = cu.shape[0] - 1, int((cu[1:] - cu[:-1]).max())
    span = GATE_CUMSUM_SPAN
    n_spans = triton.cdiv(max(max_len, 1), span)
    # (hi, lo) float32 total of every span: the prefix of a span is the sum of the totals before it
    totals = torch.empty(n_seq, n_spans, 2, HQ, device=g.device, dtype=torch.float32) if n_spans > 1 else c
    grid = (n_seq, n_spans, triton.cdiv(HQ, BH))
    kw = dict(HQ=HQ, BH=BH, BT=min(BT, span), SPAN=span, VARLEN=cu_seqlens is not None, HEAD_MAJOR=head_major,
              num_warps=4)
    if n_spans > 1:
        compiled(gate_cumsum_kernel)[grid](gt, c, totals, cu, T, n_spans, B * T, TOTALS_ONLY=True, **kw)
    compiled(gate_cumsum_kernel)[grid](gt, c, totals, cu, T, n_spans, B * T, TOTALS_ONLY=False, **kw)
    return c if head_major else c.view(B, T, HQ)


GATE_CUMSUM_SPAN = 256   # tokens per program of gate_cumsum_kernel (H200, 32K tokens x 16 heads: 0.043 -> 0.015 ms)


@triton.jit
def _add2(hi, lo, x):
    """(hi, lo) + x with hi + lo the running sum (Fast2Sum: |hi| >= |x| for the gate's same-sign terms)."""
    y = lo + x
    new_hi = hi + y
    return new_hi, y - (new_hi - hi)


@triton.jit
def gate_cumsum_kernel(g_ptr, c_ptr, tot_ptr, cu_ptr, seq_len, n_spans, c_hs, HQ: tl.constexpr, BH: tl.constexpr,
                       BT: tl.constexpr, SPAN: tl.constexpr, VARLEN: tl.constexpr, HEAD_MAJOR: tl.constexpr,
                       TOTALS_ONLY: tl.constexpr):
    """One program per (sequence, span of SPAN tokens, BH heads): c[t] = g[s0] + ... + g[t].

    g [N, HQ] token-major; c [N, HQ] token-major, or HEAD_MAJOR [HQ, c_hs] (c_hs = N, head hq's tokens
    contiguous from hq * c_hs).

    TOTALS_ONLY: the span's sum, stored as a (hi, lo) float32 pair in tot_ptr [n_seq, n_spans, 2, HQ].
    Else the span starts from the sum of the totals of the spans before it (at most T / SPAN loads of
    BH pairs; a single-span sequence has none) and scans its tokens in tiles of BT.  Running totals are
    float32 pairs (hi, lo) with hi + lo the sum (Fast2Sum), so a long sequence keeps float64-like
    accuracy before the final float32 rounding."""
    sid = tl.program_id(0)
    span = tl.program_id(1)
    hs = tl.program_id(2) * BH + tl.arange(0, BH)
    hmask = hs < HQ
    if VARLEN:
        s0 = tl.load(cu_ptr + sid)
        s1 = tl.load(cu_ptr + sid + 1)
    else:
        s0 = sid.to(tl.int64) * seq_len
        s1 = s0 + seq_len
    a = s0 + span.to(tl.int64) * SPAN
    r = tl.arange(0, BT)
    hi = tl.zeros((BH,), dtype=tl.float32)
    lo = tl.zeros((BH,), dtype=tl.float32)
    tot = tot_ptr + sid.to(tl.int64) * n_spans * 2 * HQ + hs
    if a < s1:
        b = tl.minimum(a + SPAN, s1)
        if TOTALS_ONLY:
            for t0 in range(a, b, BT):
                t = t0 + r
                x = tl.load(g_ptr + t[:, None] * HQ + hs[None, :], mask=(t < b)[:, None] & hmask[None, :], other=0.0)
                hi, lo = _add2(hi, lo, tl.sum(x.to(tl.float32), axis=0))
            tl.store(tot + span * 2 * HQ, hi, mask=hmask)
            tl.store(tot + span * 2 * HQ + HQ, lo, mask=hmask)
        else:
            for j in range(0, span):          # the spans before this one: their totals only
                hi, lo = _add2(hi, lo, tl.load(tot + j * 2 * HQ, mask=hmask, other=0.0))
                hi, lo = _add2(hi, lo, tl.load(tot + j * 2 * HQ + HQ, mask=hmask, other=0.0))
            for t0 in range(a, b, BT):
                t = t0 + r
                mask = (t < b)[:, None] & hmask[None, :]
                off = t[:, None] * HQ + hs[None, :]
                x = tl.load(g_ptr + off, mask=mask, other=0.0).to(tl.float32)
                part = tl.cumsum(x, axis=0)
                if HEAD_MAJOR:
                    c_off = hs[None, :].to(tl.int64) * c_hs + t[:, None]
                else:
                    c_off = off
                tl.store(c_ptr + c_off, hi[None, :] + (lo[None, :] + part), mask=mask)
                hi, lo = _add2(hi, lo, tl.sum(tl.where((r == BT - 1)[:, None], part, 0.0), axis=0))


def _gate_cumsum_torch(g: torch.Tensor, cu_seqlens: torch.Tensor | None, head_major: bool = False) -> torch.Tensor:
    """``gate_cumsum`` in float64 torch ops (CPU without the interpreter, float64 g), in the same layout
    ([B, T, HQ], or head_major [HQ, B * T]).  The sum runs over the innermost dimension (T moved last):
    a cumsum over an outer dimension is a slow strided scan on the GPU."""
    c = torch.cumsum(g.transpose(1, 2).to(torch.float64), dim=-1)  # [B, HQ, T]
    if cu_seqlens is not None:
        # restart the sum at each sequence start: subtract the running total before it
        starts = cu_seqlens[:-1].to(torch.int64)
        lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).to(torch.int64)
        offs = torch.cat([torch.zeros_like(c[..., :1]), c], dim=-1)[..., starts]  # [1, HQ, n_seq]
        c = c - torch.repeat_interleave(offs, lengths, dim=-1)
    c = c.to(torch.float32)
    if head_major:
        return c.transpose(0, 1).reshape(c.shape[1], -1)              # [HQ, B * T]
    return c.transpose(1, 2).contiguous()
