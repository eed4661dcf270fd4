"""Flip-flop language modelling data, FFL(T, p_ignore), generated on the fly (no download).

Definition (after Liu et al. 2023, arXiv 2306.00946, the setup of the PaTH paper's Table 1):

* Vocabulary: the instructions ``w`` (write), ``r`` (read), ``i`` (ignore) and the bits ``0``, ``1``.
  Token ids here: ``0 -> "0"``, ``1 -> "1"``, ``2 -> "w"``, ``3 -> "r"``, ``4 -> "i"`` (no BOS).
* A sequence has ``T`` tokens = ``T/2`` (instruction, bit) pairs, laid out
  ``[instr_0, bit_0, instr_1, bit_1, ...]``; instructions sit at even positions, bits at odd ones.
* ``instr_0`` is forced to ``w``; the last instruction is forced to ``r``; every other instruction is
  drawn i.i.d.: ``i`` with probability ``p_ignore``, ``w`` and ``r`` with ``(1 - p_ignore) / 2`` each.
* The bit after ``w`` or ``i`` is a fair coin; the bit after ``r`` equals the bit of the most recent
  ``w`` before it (there always is one: ``instr_0 = w``).
* Expected reads per sequence: ``1 + (T/2 - 2) * (1 - p_ignore) / 2`` (= 1 + 254 p_r at T = 512).

Splits (all T = 512): train FFL(0.8), in-distribution test FFL(0.8), sparse OOD FFL(0.98),
dense OOD FFL(0.1).  Each split draws from its own seeded ``torch.Generator``, so a (seed, split,
device) triple always gives the same sequences, and the training stream never repeats an eval stream.

Metric: at every position holding ``r`` the model's next-token prediction (argmax over the whole
vocabulary) must be the bit that follows; errors are pooled over all reads of a split.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterator, Optional

import torch

BIT0, BIT1, WRITE, READ, IGNORE = 0, 1, 2, 3, 4
VOCAB = ("0", "1", "w", "r", "i")
VOCAB_SIZE = len(VOCAB)
SEQ_LEN = 512


@dataclass(frozen=True)
class Split:
    """One evaluation or training distribution: FFL(seq_len, p_ignore) from its own seed stream."""

    name: str
    p_ignore: float
    seed_offset: int
    seq_len: int = SEQ_LEN

    def expected_reads(self) -> float:
        return expected_reads(self.seq_len, self.p_ignore)


# seed offsets keep the four streams disjoint for a given --seed
SPLITS: Dict[str, Split] = {
    "train": Split("train", 0.8, 0),
    "id": Split("id", 0.8, 1_000_003),
    "sparse": Split("sparse", 0.98, 2_000_003),
    "dense": Split("dense", 0.1, 3_000_003),
}


def expected_reads(seq_len: int, p_ignore: float) -> float:
    """Mean number of ``r`` instructions per sequence: the forced last one plus the free ones."""
    n_pairs = seq_len // 2
    return 1.0 + (n_pairs - 2) * (1.0 - p_ignore) / 2.0


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(int(seed))
    return g


def sample_flipflop(batch: int, seq_len: int, p_ignore: float, generator: torch.Generator,
                    device: torch.device | str | None = None) -> torch.Tensor:
    """``batch`` FFL(seq_len, p_ignore) sequences as int64 token ids, shape [batch, seq_len].

    The recipe: categorical draw of the instructions, force the first
    (``w``) and last (``r``), draw all bits uniformly, then forward-fill the last written bit into
    the read slots.
    """
    if seq_len < 4 or seq_len % 2:
        raise ValueError(f"seq_len must be an even number >= 4, got {seq_len}")
    if not 0.0 <= p_ignore <= 1.0:
        raise ValueError(f"p_ignore must lie in [0, 1], got {p_ignore}")
    device = torch.device(device) if device is not None else generator.device
    n = seq_len // 2
    p_rw = (1.0 - p_ignore) / 2.0
    u = torch.rand(batch, n, generator=generator, device=device)
    # u < p_rw -> w, p_rw <= u < 2 p_rw -> r, else i
    instr = torch.full((batch, n), IGNORE, dtype=torch.int64, device=device)
    instr[u < 2 * p_rw] = READ
    instr[u < p_rw] = WRITE
    instr[:, 0] = WRITE
    instr[:, -1] = READ
    bits = torch.randint(0, 2, (batch, n), generator=generator, device=device, dtype=torch.int64)
    # index of the most recent write at or before each pair (pair 0 is always a write)
    idx = torch.arange(n, device=device).expand(batch, n)
    last_w = torch.where(instr == WRITE, idx, torch.zeros_like(idx)).cummax(dim=1).values
    remembered = bits.gather(1, last_w)
    bits = torch.where(instr == READ, remembered, bits)
    return torch.stack([instr, bits], dim=2).reshape(batch, seq_len)


def batches(split: Split, batch: int, seed: int, device: torch.device | str,
            n_sequences: Optional[int] = None) -> Iterator[torch.Tensor]:
    """Batches of ``split`` from its seeded stream; endless when ``n_sequences`` is None.

    The stream depends on (seed, split, device, batch): the same arguments give the same tokens.
    """
    gen = make_generator(seed + split.seed_offset, device)
    done = 0
    while n_sequences is None or done < n_sequences:
        b = batch if n_sequences is None else min(batch, n_sequences - done)
        yield sample_flipflop(b, split.seq_len, split.p_ignore, gen, device)
        done += b


def read_mask(tokens: torch.Tensor) -> torch.Tensor:
    """Bool [B, T]: positions whose token is ``r`` and whose next token is the answer bit.

    A read at the very last position (no answer inside the sequence) is not counted; in FFL data
    reads sit at even positions, so this never drops one.
    """
    mask = tokens == READ
    mask[:, -1] = False
    return mask


def loss_targets(tokens: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Next-token targets [B, T] masked to the read positions (the only predictable tokens)."""
    tgt = torch.full_like(tokens, ignore_index)
    tgt[:, :-1] = tokens[:, 1:]
    return tgt.masked_fill(~read_mask(tokens), ignore_index)
