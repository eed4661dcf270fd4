"""What the TVM kernels read from a tuning ``Config`` and from the workload (no TVM import here).

Every tile size, thread count and precision a TVM kernel uses comes from one of these two frozen
objects: ``TVMParams`` (the spec's knobs, built from a ``Config``) and ``KernelDims`` (the workload
dims a module is compiled for). Nothing is hard-coded per GPU.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Optional

from .._knobs import check_params, resolve, spec_default

__all__ = ["TVMParams", "KernelDims", "UnsupportedConfig", "SCAN_VARIANTS", "DECODE_LOCAL_KNOBS"]

# scan_precision knob -> operand dtype of the scan matmuls ("tf32" keeps float32 operands; only the
# CUDA-core variant supports it, mma.sync has no tf32 path in TIRx)
_SCAN_DTYPES = {"fp16": "float16", "bf16": "bfloat16", "tf32": "float32"}
_QKV_DTYPES = ("bfloat16", "float16", "float32", "float64")

# scan kernels: "tc" = TIRx kernel whose matmuls are mma.sync (tensor cores),
#               "simt" = scheduled S-TIR on CUDA cores (the CPU-verified TensorIR, thread-bound)
SCAN_VARIANTS = ("tc", "simt")


def _local_knobs() -> tuple[str, ...]:
    from pathtune.specs import load_spec

    return tuple(load_spec().backend_knobs("tvm", "decode"))


# TVMParams' decode knobs that are not spec knobs (the spec's backends.tvm.knobs): a TVM decode record
# stores them next to the spec's
DECODE_LOCAL_KNOBS = _local_knobs()


class UnsupportedConfig(ValueError):
    """A config/workload combination this backend cannot compile (the tuner records it as pruned)."""


@dataclass(frozen=True)
class TVMParams:
    """The knobs the TVM kernels read: spec knobs and the TVM decode knobs of the spec's
    ``backends.tvm.knobs`` (0 = auto, see stir_decode.decode_layout); defaults, domains and constraints
    are the spec's (``spec_default``, ``check_params``)."""

    BACKEND: ClassVar[str] = "tvm"

    chunk_size: int = spec_default("chunk_size")
    superchunk_size: int = spec_default("superchunk_size")
    block_n: int = spec_default("block_n")
    num_warps: int = spec_default("num_warps")
    num_stages: int = spec_default("num_stages")
    scan_precision: str = spec_default("scan_precision")
    transition_precision: str = spec_default("transition_precision")
    beta_clip_eps: Optional[float] = spec_default("beta_clip_eps")
    decode_block_n: int = spec_default("decode_block_n")
    decode_num_warps: int = spec_default("decode_num_warps")
    decode_splits: int = spec_default("decode_splits")
    decode_vec: int = spec_default("decode_vec", "tvm")
    decode_threads_per_row: int = spec_default("decode_threads_per_row", "tvm")
    decode_rows_per_thread: int = spec_default("decode_rows_per_thread", "tvm")
    decode_prefetch: int = spec_default("decode_prefetch", "tvm")

    def __post_init__(self):
        check_params(self, "tvm")

    @classmethod
    def from_config(cls, config: Any = None) -> "TVMParams":
        """``resolve("tvm", None, config)``: from a spec ``Config`` (or any mapping of knob values); knobs
        TVM does not read are ignored, missing ones take the spec's defaults, unknown names raise."""
        return resolve("tvm", None, config)

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
