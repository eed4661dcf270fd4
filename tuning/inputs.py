"""The shapes and random inputs the bench and the tuner time kernels on (torch loads on use)."""
from __future__ import annotations

from typing import Any, Optional

__all__ = ["TOKENS", "HEADS_FOR_DIM", "make_inputs"]

TOKENS = 32768                                                     # B * T of every timed shape
HEADS_FOR_DIM = {32: 32, 64: 16, 96: 12, 128: 8, 192: 6, 256: 4}   # heads per head dim (H * D = 1024)


def make_inputs(B: int, T: int, HQ: int, H: int, D: int, DV: int, gate: bool, *, device: str,
                seed: Optional[int] = None, dtype: Any = None, generator: Any = None):
    """Fresh random PaTH inputs: beta in [1.5, 2) (the hard regime), real gate decay; q, k, v in
    ``dtype`` (default bfloat16), w, beta, g in float32.  Drawn from a generator seeded with ``seed``, or
    from ``generator`` (a caller's running one, e.g. the one that filled a decode cache)."""
    import torch

    if (seed is None) == (generator is None):
        raise ValueError("make_inputs takes a seed or a generator (exactly one)")
    dtype = torch.bfloat16 if dtype is None else dtype
    gen = generator if generator is not None else torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(B, T, HQ, D, device=device, generator=gen).to(dtype)
    k = torch.randn(B, T, H, D, device=device, generator=gen).to(dtype)
    v = torch.randn(B, T, H, DV, device=device, generator=gen).to(dtype)
    w = torch.nn.functional.normalize(torch.randn(B, T, H, D, device=device, generator=gen), dim=-1)
    beta = torch.rand(B, T, H, device=device, generator=gen) * 0.5 + 1.5
    g = torch.log(torch.rand(B, T, HQ, device=device, generator=gen) * 0.05 + 0.95) if gate else None
    return q, k, v, w, beta, g
