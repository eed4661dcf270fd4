"""What a call looks like, as a frozen key shared by the tuner, perf_db and the dispatcher."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Optional

from .canonical import canonical_json, dtype_name, sha256_hex
from .schema import DTYPE_NAMES, PASS_NAMES

__all__ = ["Workload", "seq_bucket", "batch_bucket", "query_bucket", "KEY_SCHEMA"]

# Bump when the meaning of a field or a bucketing rule changes: old perf_db rows then stop matching.
KEY_SCHEMA = 1
MIN_SEQ_BUCKET = 16


def _next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def seq_bucket(max_seqlen: int) -> int:
    """Power-of-two bucket of the longest sequence: the next power of two >= it, at least 16.  On every
    cached decode call's path: one int conversion and one bit_length, no helper calls."""
    n = int(max_seqlen)
    if n < 1:
        raise ValueError(f"sequence length must be >= 1, got {max_seqlen}")
    return 1 << (n - 1).bit_length() if n > MIN_SEQ_BUCKET else MIN_SEQ_BUCKET


def batch_bucket(num_seqs: int) -> int:
    """Power-of-two bucket of the number of sequences: the next power of two >= it."""
    if num_seqs < 1:
        raise ValueError(f"number of sequences must be >= 1, got {num_seqs}")
    return _next_pow2(num_seqs)


def query_bucket(tokens: int) -> int:
    """Power-of-two bucket of a decode call's new tokens per sequence: the next power of two >= it."""
    if tokens < 1:
        raise ValueError(f"new tokens per decode call must be >= 1, got {tokens}")
    return _next_pow2(tokens)


@dataclass(frozen=True)
class Workload:
    """Frozen key of a PaTH attention call.

    head_dim / head_dim_v: D of q, k, w and DV of v, o (exact).
    heads_q / heads_kv: HQ and H (exact).
    dtype: q's dtype name (``"bfloat16"``); w, beta, g are float32 inside kernels whatever they arrive in.
    use_gate: FoX gate g given. pass_: ``"fwd"``, ``"bwd"`` or ``"decode"``.
    seq_bucket: next power of two >= the longest sequence (key length for decode), at least 16.
    varlen: packed with cu_seqlens. batch_bucket: next power of two >= number of sequences.
    query_bucket: decode only, next power of two >= the new tokens per call (1: one token; always 1 for
    fwd / bwd).  The key's JSON names it only when it is not 1, so one-token keys are as they always were.
    """

    head_dim: int
    head_dim_v: int
    heads_q: int
    heads_kv: int
    dtype: str
    use_gate: bool
    pass_: str
    seq_bucket: int
    varlen: bool = False
    batch_bucket: int = 1
    query_bucket: int = 1

    def __post_init__(self) -> None:
        for f in ("head_dim", "head_dim_v", "heads_q", "heads_kv", "seq_bucket", "batch_bucket", "query_bucket"):
            value = getattr(self, f)
            if type(value) is not int or value < 1:
                raise ValueError(f"Workload.{f} must be a positive int, got {value!r}")
        for f in ("use_gate", "varlen"):
            if not isinstance(getattr(self, f), bool):
                raise ValueError(f"Workload.{f} must be a bool, got {getattr(self, f)!r}")
        if self.heads_q % self.heads_kv:
            raise ValueError(f"Workload.heads_q ({self.heads_q}) must be a multiple of heads_kv ({self.heads_kv})")
        if self.dtype not in DTYPE_NAMES:
            raise ValueError(f"Workload.dtype {self.dtype!r} is not a dtype name; allowed: {', '.join(DTYPE_NAMES)}")
        if self.pass_ not in PASS_NAMES:
            raise ValueError(f"Workload.pass_ {self.pass_!r} is not a pass; allowed: {', '.join(PASS_NAMES)}")
        for f in ("seq_bucket", "batch_bucket", "query_bucket"):
            value = getattr(self, f)
            if value & (value - 1):
                raise ValueError(f"Workload.{f} must be a power of two, got {value}")
        if self.query_bucket != 1 and self.pass_ != "decode":
            raise ValueError(f"Workload.query_bucket is the decode pass's new tokens per call; a {self.pass_} "
                             f"workload has 1, got {self.query_bucket}")
        if self.seq_bucket < MIN_SEQ_BUCKET:
            raise ValueError(f"Workload.seq_bucket must be >= {MIN_SEQ_BUCKET}, got {self.seq_bucket}")

    @classmethod
    def from_tensors(cls, q: Any, k: Any, v: Any, g: Any = None, cu_seqlens: Any = None, pass_: str = "fwd",
                     *, max_seqlen: Optional[int] = None) -> "Workload":
        """Key of a call with q [B,T,HQ,D], k [B,Tk,H,D], v [B,Tk,H,DV] (Tk = T except for decode).

        With ``cu_seqlens`` the longest sequence is read from it, which copies it to the host (a sync
        on the GPU); pass ``max_seqlen`` when you already know it. Shapes are not validated here
        (``path_attention`` does that); only what the key needs is read.
        """
        if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
            raise ValueError("q, k, v must be 4-D [B, T, heads, head_dim]; "
                             f"got q{tuple(q.shape)}, k{tuple(k.shape)}, v{tuple(v.shape)}")
        B, Tk, Tq = int(k.shape[0]), int(k.shape[1]), int(q.shape[1])
        if cu_seqlens is None:
            num_seqs, longest = B, Tk
        else:
            num_seqs = int(cu_seqlens.shape[0]) - 1
            if max_seqlen is None:
                lengths = cu_seqlens[1:] - cu_seqlens[:-1]
                longest = int(lengths.max()) if num_seqs > 0 else 0
            else:
                longest = int(max_seqlen)
        return cls(
            head_dim=int(q.shape[3]),
            head_dim_v=int(v.shape[3]),
            heads_q=int(q.shape[2]),
            heads_kv=int(k.shape[2]),
            dtype=dtype_name(q.dtype),
            use_gate=g is not None,
            pass_=pass_,
            seq_bucket=seq_bucket(longest),
            varlen=cu_seqlens is not None,
            batch_bucket=batch_bucket(num_seqs),
            query_bucket=query_bucket(Tq) if pass_ == "decode" else 1,
        )

    def to_dict(self) -> dict[str, Any]:
        """Fields with ``pass`` (not ``pass_``) and the key schema version; ``query_bucket`` only when not 1."""
        d = asdict(self)
        d["pass"] = d.pop("pass_")
        if d["query_bucket"] == 1:
            del d["query_bucket"]
        d["key_schema"] = KEY_SCHEMA
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Workload":
        data = dict(data)
        schema = data.pop("key_schema", KEY_SCHEMA)
        if schema != KEY_SCHEMA:
            raise ValueError(f"workload key schema {schema} is not the current {KEY_SCHEMA}")
        if "pass" in data:
            data["pass_"] = data.pop("pass")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"unknown workload fields {unknown}; fields: {sorted(names)}")
        return cls(**data)

    def key(self) -> str:
        """Canonical JSON (sorted keys, compact)."""
        return canonical_json(self.to_dict())

    @property
    def key_hash(self) -> str:
        """First 16 hex digits of the sha256 of ``key()``."""
        return sha256_hex(self.key(), 16)

    def constraint_dims(self) -> dict[str, int]:
        """The workload dims that knob constraints may name."""
        return {"D": self.head_dim, "DV": self.head_dim_v}
