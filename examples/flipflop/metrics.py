"""Read-position error counting and the Wilson score interval (no scipy needed)."""
from __future__ import annotations

import math
from typing import Tuple

import torch

from .data import read_mask

Z95 = 1.959963984540054  # two-sided 95% normal quantile


def read_errors(logits: torch.Tensor, tokens: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(errors, reads)`` of one batch as 0-dim int64 tensors on the batch's device (no host sync).

    ``logits[b, p]`` is the model's next-token prediction after reading ``tokens[b, :p+1]``.  Every
    position ``p`` with ``tokens[b, p] == r`` is a read; it is an error when the argmax over the whole
    vocabulary differs from ``tokens[b, p+1]`` (the remembered bit).
    """
    if logits.shape[:2] != tokens.shape:
        raise ValueError(f"logits {tuple(logits.shape)} do not match tokens {tuple(tokens.shape)}")
    mask = read_mask(tokens)[:, :-1]
    wrong = (logits[:, :-1].argmax(dim=-1) != tokens[:, 1:]) & mask
    return wrong.sum(), mask.sum()


def count_read_errors(logits: torch.Tensor, tokens: torch.Tensor) -> Tuple[int, int]:
    """``(errors, reads)`` for one batch as Python ints (see ``read_errors``)."""
    e, n = read_errors(logits, tokens)
    return int(e.item()), int(n.item())


def wilson_interval(errors: int, n: int, z: float = Z95) -> Tuple[float, float]:
    """Wilson score interval for a binomial proportion ``errors / n`` (95% by default)."""
    if n <= 0:
        return 0.0, 1.0
    if not 0 <= errors <= n:
        raise ValueError(f"need 0 <= errors <= n, got errors={errors}, n={n}")
    p = errors / n
    z2 = z * z
    denom = 1.0 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom
    lo = 0.0 if errors == 0 else max(0.0, centre - half)      # exact ends at 0 and n (no rounding residue)
    hi = 1.0 if errors == n else min(1.0, centre + half)
    return lo, hi


def reads_to_resolve(rate: float, z: float = Z95) -> int:
    """Reads needed so that zero errors give a Wilson upper bound below ``rate``."""
    # with errors = 0 the upper bound is z^2 / (n + z^2)
    return int(math.floor(z * z * (1.0 - rate) / rate)) + 1
