"""Token-major layout and the chunk/super-chunk tables every PaTH kernel indexes with.

All kernels see a packed token stream: ``[N_tok, heads, dim]``.  A dense batch ``[B, T, ...]``
is the same memory as a packed stream with ``cu_seqlens = [0, T, 2T, ...]``, so one code
path serves both.  UT chunks and super-chunks never straddle a sequence boundary; the last
chunk of a sequence may be partial (kernels mask it).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


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

    A dense batch needs no host synchronisation.  Packed varlen reads ``cu_seqlens`` on the
    host once (the number of chunks decides the launch grid).
    """
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


def gate_cumsum(g: torch.Tensor, cu_seqlens: torch.Tensor | None) -> torch.Tensor:
    """Inclusive cumulative sum of the log forget gate per sequence, float32.

    g: [B, T, HQ] (or [1, N_tok, HQ] with cu_seqlens).  Summed in float64 so that long
    sequences keep the differences c_i - c_j accurate, then stored as float32.  The sum runs
    over the innermost dimension (T moved last): a cumsum over an outer dimension is a slow
    strided scan on the GPU (11 ms at 32K tokens x 16 heads, measured on the H200).
    """
    c = torch.cumsum(g.transpose(1, 2).to(torch.float64), dim=-1)  # [B, HQ, T]
    if cu_seqlens is not None:
        # restart the sum at each sequence start: subtract the running total before it
        starts = cu_seqlens[:-1].to(torch.int64)
        lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).to(torch.int64)
        offs = torch.cat([torch.zeros_like(c[..., :1]), c], dim=-1)[..., starts]  # [1, HQ, n_seq]
        c = c - torch.repeat_interleave(offs, lengths, dim=-1)
    return c.to(torch.float32).transpose(1, 2)
