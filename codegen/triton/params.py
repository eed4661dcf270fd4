"""Kernel parameters derived from the spec's knobs.

The Triton code never hard-codes a tile size: every launch reads one of these frozen,
hashable objects, built from a spec ``Config`` (or defaults taken from the spec).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Mapping

import triton.language as tl

from .._knobs import params_from_config

_SCAN_DTYPES = {"fp16": tl.float16, "bf16": tl.bfloat16, "tf32": tl.float32}
_SCAN_TORCH = {"fp16": "float16", "bf16": "bfloat16", "tf32": "float32"}
_TRANSITION = {"tf32": "tf32", "tf32x3": "tf32x3", "ieee": "ieee", "fp16": "fp16", "bf16": "bf16"}


@dataclass(frozen=True)
class TritonParams:
    """Everything the Triton PaTH kernels read from a tuning config."""

    chunk_size: int = 64
    superchunk_size: int = 1024
    block_n: int = 64
    block_m: int = 128
    num_warps: int = 4
    inter_num_warps: int = 8
    num_stages: int = 2
    scan_precision: str = "fp16"
    transition_precision: str = "tf32x3"
    bwd_transition_precision: str = "tf32x3"
    beta_clip_eps: float | None = None
    ut_precision: str = "tf32x3"
    ut_grad_precision: str = "tf32"
    bwd_block_n: int = 64
    bwd_block_m: int = 64
    bwd_num_warps: int = 4
    bwd_num_stages: int = 2
    decode_block_n: int = 128
    decode_num_warps: int = 4
    decode_splits: int = 4
    decode_num_stages: int = 1

    def __post_init__(self):
        if self.scan_precision not in _SCAN_DTYPES:
            raise ValueError(f"scan_precision must be one of {sorted(_SCAN_DTYPES)}, got {self.scan_precision!r}")
        if self.bwd_transition_precision not in ("tf32", "tf32x3", "ieee"):
            raise ValueError("bwd_transition_precision must be one of ['ieee', 'tf32', 'tf32x3'], "
                             f"got {self.bwd_transition_precision!r}")
        if self.transition_precision not in _TRANSITION:
            raise ValueError(
                f"transition_precision must be one of {sorted(_TRANSITION)}, got {self.transition_precision!r}"
            )
        if self.ut_precision not in ("tf32", "tf32x3", "ieee"):
            raise ValueError(f"ut_precision must be tf32, tf32x3 or ieee, got {self.ut_precision!r}")
        if self.ut_grad_precision not in ("tf32", "tf32x3", "ieee"):
            raise ValueError(f"ut_grad_precision must be tf32, tf32x3 or ieee, got {self.ut_grad_precision!r}")
        if int(self.decode_num_stages) < 1:
            raise ValueError(f"decode_num_stages must be >= 1 (1: the tile loop is not pipelined), "
                             f"got {self.decode_num_stages!r}")
        if self.superchunk_size % self.chunk_size:
            raise ValueError(
                f"superchunk_size ({self.superchunk_size}) must be a multiple of chunk_size ({self.chunk_size})"
            )
        if self.block_m > self.superchunk_size:
            # a schedule knob only: a super-chunk shorter than the default query tile takes the
            # whole super-chunk as its tile (configs written before block_m existed keep working)
            object.__setattr__(self, "block_m", self.superchunk_size)
        if self.superchunk_size % self.block_m:
            raise ValueError(f"superchunk_size ({self.superchunk_size}) must be a multiple of block_m ({self.block_m})")
        if self.bwd_block_m > self.superchunk_size:   # as block_m: a short super-chunk is one step
            object.__setattr__(self, "bwd_block_m", self.superchunk_size)
        if self.superchunk_size % self.bwd_block_m:
            raise ValueError(f"superchunk_size ({self.superchunk_size}) must be a multiple of bwd_block_m "
                             f"({self.bwd_block_m})")
        if self.superchunk_size % self.block_n:
            raise ValueError(f"superchunk_size ({self.superchunk_size}) must be a multiple of block_n ({self.block_n})")

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | Any | None,
                    base: "TritonParams | None" = None) -> "TritonParams":
        """Build from a spec Config / mapping; unknown knobs are ignored, missing ones come from
        ``base`` (default: the spec defaults)."""
        return params_from_config(cls, config, base)

    @classmethod
    def heuristic(cls, head_dim: int, head_dim_v: int | None = None) -> "TritonParams":
        """The built-in fallback when neither perf_db nor a pack has a config for this shape
        (``heuristics.py``: its choices key no measurement, so tuning them retires no record)."""
        from .heuristics import heuristic_knobs

        return cls(**heuristic_knobs(head_dim, head_dim_v))

    @property
    def scan_dtype(self):
        return _SCAN_DTYPES[self.scan_precision]

    @property
    def scan_torch_dtype(self):
        """The scan's element type as a torch dtype (the forward's compact 16-bit state)."""
        import torch

        return getattr(torch, _SCAN_TORCH[self.scan_precision])

    @property
    def beta_max(self) -> float:
        """Upper clip for beta inside kernels (2.0 + 1 = no clip, since beta <= 2 is validated)."""
        return 3.0 if self.beta_clip_eps is None else 2.0 - float(self.beta_clip_eps)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))
