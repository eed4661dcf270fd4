"""Kernel parameters derived from the spec's knobs.

The Triton code never hard-codes a tile size: every launch reads one of these frozen,
hashable objects, built from a spec ``Config`` (or defaults taken from the spec).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Mapping

import triton.language as tl

from .._knobs import check_params, params_from_config, resolve, spec_default

# scan_precision (the spec's domain) -> the scan's operand type
_SCAN_DTYPES = {"fp16": tl.float16, "bf16": tl.bfloat16, "tf32": tl.float32}
_SCAN_TORCH = {"fp16": "float16", "bf16": "bfloat16", "tf32": "float32"}


@dataclass(frozen=True)
class TritonParams:
    """Everything the Triton PaTH kernels read from a tuning config: one field per spec knob, its default
    the spec's (``spec_default``), its checks the spec's domains and constraints (``check_params``).
    Build it from a Config with ``resolve("triton", pass_, config, dims)`` (codegen/_knobs.py)."""

    BACKEND: ClassVar[str] = "triton"

    chunk_size: int = spec_default("chunk_size")
    superchunk_size: int = spec_default("superchunk_size")
    block_n: int = spec_default("block_n")
    block_m: int = spec_default("block_m")
    num_warps: int = spec_default("num_warps")
    inter_num_warps: int = spec_default("inter_num_warps")
    num_stages: int = spec_default("num_stages")
    intra_num_stages: int = spec_default("intra_num_stages")
    scan_precision: str = spec_default("scan_precision")
    transition_precision: str = spec_default("transition_precision")
    bwd_transition_precision: str = spec_default("bwd_transition_precision")
    beta_clip_eps: float | None = spec_default("beta_clip_eps")
    ut_precision: str = spec_default("ut_precision")
    ut_diag_block: int = spec_default("ut_diag_block")
    ut_grad_precision: str = spec_default("ut_grad_precision")
    bwd_block_n: int = spec_default("bwd_block_n")
    bwd_block_m: int = spec_default("bwd_block_m")
    bwd_num_warps: int = spec_default("bwd_num_warps")
    bwd_inter_num_warps: int = spec_default("bwd_inter_num_warps")
    bwd_num_stages: int = spec_default("bwd_num_stages")
    bwd_forward_state: str = spec_default("bwd_forward_state")
    decode_block_n: int = spec_default("decode_block_n")
    decode_num_warps: int = spec_default("decode_num_warps")
    decode_splits: int = spec_default("decode_splits")
    decode_num_stages: int = spec_default("decode_num_stages")
    decode_pending_window: int = spec_default("decode_pending_window")

    def __post_init__(self):
        check_params(self, "triton")

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | Any | None,
                    base: "TritonParams | None" = None) -> "TritonParams":
        """Build from a spec Config / mapping; unknown knobs are ignored, missing ones come from
        ``base`` (default: the spec defaults)."""
        return params_from_config(cls, config, base)

    @classmethod
    def heuristic(cls, head_dim: int, head_dim_v: int | None = None) -> "TritonParams":
        """The untuned config for these head dims (the spec's ``backends.triton.head_dim_defaults``): the
        fallback when neither perf_db nor a pack has a config for this shape."""
        return resolve("triton", None, None, (head_dim, head_dim_v))

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
