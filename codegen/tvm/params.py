"""What the TVM kernels read from a tuning ``Config`` and from the workload (no TVM import here).

Every tile size, thread count and precision a TVM kernel uses comes from one of these two frozen
objects: ``TVMParams`` (the spec's knobs, built from a ``Config``) and ``KernelDims`` (the workload
dims a module is compiled for). Nothing is hard-coded per GPU.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Optional

from .._knobs import params_from_config

__all__ = ["TVMParams", "KernelDims", "UnsupportedConfig", "SCAN_VARIANTS", "DECODE_LOCAL_KNOBS"]

# scan_precision knob -> operand dtype of the scan matmuls ("tf32" keeps float32 operands; only the
# CUDA-core variant supports it, mma.sync has no tf32 path in TIRx)
_SCAN_DTYPES = {"fp16": "float16", "bf16": "bfloat16", "tf32": "float32"}
_TRANSITION = ("tf32", "tf32x3", "ieee", "fp16", "bf16")   # the TVM kernels run 3 products for each
_QKV_DTYPES = ("bfloat16", "float16", "float32", "float64")

# scan kernels: "tc" = TIRx kernel whose matmuls are mma.sync (tensor cores),
#               "simt" = scheduled S-TIR on CUDA cores (the CPU-verified TensorIR, thread-bound)
SCAN_VARIANTS = ("tc", "simt")


# TVMParams' decode knobs that are not spec knobs: a TVM decode record stores them next to the spec's
DECODE_LOCAL_KNOBS = ("decode_vec", "decode_threads_per_row", "decode_rows_per_thread", "decode_prefetch")


class UnsupportedConfig(ValueError):
    """A config/workload combination this backend cannot compile (the tuner records it as pruned)."""


@dataclass(frozen=True)
class TVMParams:
    """The spec knobs the TVM kernels read (defaults = the spec's defaults)."""

    chunk_size: int = 64
    superchunk_size: int = 1024
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 2
    scan_precision: str = "fp16"
    transition_precision: str = "tf32x3"
    beta_clip_eps: Optional[float] = None
    decode_block_n: int = 128
    decode_num_warps: int = 4
    decode_splits: int = 4
    # TVM-local decode knobs (not in the spec: adding them there would change files outside codegen/tvm;
    # the tuner does not tune the TVM decode pass yet). 0 = auto, see stir_decode.decode_layout.
    decode_vec: int = 0               # elements per vector load/store (auto: 16 bytes of the cache dtype)
    decode_threads_per_row: int = 0   # threads sharing one key row (auto: one vector per thread, <= 32)
    decode_rows_per_thread: int = 0   # rows per thread per step (auto: min(4, decode_block_n / row groups))
    decode_prefetch: int = 0          # 1: load the next step's rows (second register set) before computing this one

    def __post_init__(self):
        if self.scan_precision not in _SCAN_DTYPES:
            raise ValueError(f"scan_precision must be one of {sorted(_SCAN_DTYPES)}, got {self.scan_precision!r}")
        if self.transition_precision not in _TRANSITION:
            raise ValueError(f"transition_precision must be one of {_TRANSITION}, got {self.transition_precision!r}")
        if self.superchunk_size % self.chunk_size or self.superchunk_size < 2 * self.chunk_size:
            raise ValueError(f"superchunk_size ({self.superchunk_size}) must be a multiple of chunk_size "
                             f"({self.chunk_size}) holding at least two chunks")
        if self.superchunk_size % self.block_n:
            raise ValueError(f"superchunk_size ({self.superchunk_size}) must be a multiple of block_n ({self.block_n})")
        for name in ("chunk_size", "block_n", "num_warps", "decode_block_n", "decode_num_warps", "decode_splits"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        for name in ("decode_vec", "decode_threads_per_row", "decode_rows_per_thread", "decode_prefetch"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 (0 = auto)")

    @classmethod
    def from_config(cls, config: Any = None) -> "TVMParams":
        """From a spec ``Config`` (or any mapping); unknown knobs are ignored, missing ones take defaults."""
        return params_from_config(cls, config)

    @property
    def threads(self) -> int:
        return 32 * self.num_warps

    @property
    def decode_threads(self) -> int:
        return 32 * self.decode_num_warps

    @property
    def beta_max(self) -> float:
        """Upper clip of beta inside kernels (3.0 = no clip: beta <= 2 is validated on input)."""
        return 3.0 if self.beta_clip_eps is None else 2.0 - float(self.beta_clip_eps)

    def scan_dtype(self) -> str:
        """TVM dtype of the scan matmul operands (w, U, transported keys, the moving query)."""
        return _SCAN_DTYPES[self.scan_precision]

    def fwd_dict(self) -> dict:
        """The knobs the forward kernels depend on (for cache keys)."""
        return {k: getattr(self, k) for k in ("chunk_size", "superchunk_size", "block_n", "num_warps",
                                               "num_stages", "scan_precision", "transition_precision")}

    def decode_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("decode_block_n", "decode_num_warps", "decode_splits", "decode_vec",
                                               "decode_threads_per_row", "decode_rows_per_thread", "decode_prefetch")}

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class KernelDims:
    """Workload dims a module is compiled for: heads, head dims, the q/k/v dtype and the FoX gate.

    Token counts, batch size, sequence lengths and cu_seqlens stay runtime values.
    """

    H: int
    HQ: int
    D: int
    DV: int
    dtype: str = "bfloat16"
    gated: bool = False

    def __post_init__(self):
        if self.HQ % self.H:
            raise ValueError(f"HQ={self.HQ} must be a multiple of H={self.H}")
        if self.dtype not in _QKV_DTYPES:
            raise ValueError(f"dtype must be one of {_QKV_DTYPES}, got {self.dtype!r}")

    @property
    def G(self) -> int:
        return self.HQ // self.H

    def key(self) -> dict:
        return asdict(self)

    @classmethod
    def from_tensors(cls, q, v, k=None, g=None) -> "KernelDims":
        import torch  # noqa: F401  (only for the dtype names)

        H = (k if k is not None else v).shape[-2]
        return cls(H=int(H), HQ=int(q.shape[-2]), D=int(q.shape[-1]), DV=int(v.shape[-1]),
                   dtype=str(q.dtype).replace("torch.", ""), gated=g is not None)
