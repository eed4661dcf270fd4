"""``PaTHKVCache``: the decoding state of one PaTH(-FoX) attention layer (keys in the current frame).

A neutral module: the PyTorch reference (``runtime/reference/recurrent.py``), the Triton decode step
(``codegen/triton/decode.py``) and the TVM decode step (``codegen/tvm/host.py``) all read and write it,
and it imports nothing of pathtune. Users import it as ``pathtune.PaTHKVCache``.

Layout (contiguous; rows >= length are unused capacity):

* ``k`` [B, max_len, H, D]: keys in the CURRENT frame, k_j^(t) = H_t ... H_{j+1} k_j (t = length - 1);
* ``v`` [B, max_len, H, DV];
* ``c`` [B, max_len, HQ]: inclusive FoX gate cumsum (float32; float64 for float64 gates), None ungated;
* ``length_tensor`` [1] int32 on the cache's device: the number of valid rows, read and advanced by the
  kernels on the device, so a captured CUDA graph of a decode step can be replayed as the cache grows.

The host keeps a mirror of the length so eager steps need no device read. A CUDA-graph capture of a
step leaves the mirror unknown (replays advance only the device value): ``length`` then reads the
device (one synchronisation per read) and ``sync_length()`` re-arms the mirror.

Capacity: a growable cache (``static=False``, the default) reallocates, at least doubling, when a step
needs more rows (outside a graph capture); a static cache (``static=True``) keeps its buffers for its
life, which a captured graph needs, and an eager step past its capacity raises ``CacheFullError``.
A replayed graph cannot raise: its kernels drop rows past the capacity and the next ``length`` read
raises ``CacheFullError``.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["PaTHKVCache", "CacheFullError"]


class CacheFullError(ValueError):
    """A decode step needs more rows than a static cache (or a cache inside a CUDA-graph capture) has."""


def _capturing(t: Tensor) -> bool:
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


class PaTHKVCache:
    """KV cache for PaTH(-FoX) decoding (mutated in place by the decode functions); see the module docstring.

    ``PaTHKVCache(k, v, c, length, num_q_heads, *, static=False)``: wrap existing tensors (k [B,max_len,H,D],
    v [B,max_len,H,DV], c [B,max_len,HQ] or None; ``length`` valid rows; ``num_q_heads`` HQ).
    """

    __slots__ = ("k", "v", "c", "num_q_heads", "static", "length_tensor", "_len", "_hint", "_work")

    def __init__(self, k: Tensor, v: Tensor, c: Optional[Tensor], length: int, num_q_heads: int, *,
                 static: bool = False) -> None:
        self.k, self.v, self.c = k, v, c
        self.num_q_heads = int(num_q_heads)
        self.static = bool(static)
        n = int(length)
        self._len: Optional[int] = n      # host mirror of length_tensor; None: unknown (after a graph capture)
        self._hint = n                    # last known length (dispatch buckets), never None
        self.length_tensor = torch.full((1,), n, dtype=torch.int32, device=k.device)
        self._work: dict = {}             # kernel scratch buffers, allocated once per launch shape

    # -- sizes ---------------------------------------------------------------------------------------
    @property
    def max_len(self) -> int:
        """Capacity in tokens (rows of k / v / c)."""
        return self.k.shape[1]

    @property
    def gated(self) -> bool:
        return self.c is not None

    @property
    def length(self) -> int:
        """Valid rows. Exact on the host unless a CUDA graph of a step was captured; then read from the device."""
        if self._len is not None:
            return self._len
        n = int(self.length_tensor.item())
        if n > self.max_len:
            raise CacheFullError(f"PaTHKVCache overflowed during CUDA-graph replay: {n} tokens were appended to a "
                                 f"cache of capacity max_len={self.max_len} (the rows past it were dropped); "
                                 f"create the cache with max_len >= the prompt plus every generated token")
        self._hint = n
        return n

    @length.setter
    def length(self, n: int) -> None:
        n = int(n)
        self._len = self._hint = n
        self.length_tensor.fill_(n)

    def sync_length(self) -> int:
        """Read the device length into the host mirror (after replaying captured decode steps); returns it."""
        self._len = None
        n = self.length
        self._len = n
        return n

    def advanced(self, n: int) -> None:
        """Record on the host that a kernel advanced ``length_tensor`` by ``n`` (called by the decode steps).
        Inside a CUDA-graph capture the device is not advanced now but at every replay: the mirror becomes unknown."""
        self._hint += n
        if self._len is not None:
            self._len = None if _capturing(self.k) else self._len + n

    # -- construction / capacity ---------------------------------------------------------------------
    @classmethod
    def empty(cls, batch_size: int, num_kv_heads: int, head_dim: int, value_dim: int,
              num_q_heads: Optional[int] = None, *, max_len: int = 0, gated: bool = False,
              dtype: torch.dtype = torch.float32, gate_dtype: torch.dtype = torch.float32,
              device=None, static: bool = False) -> "PaTHKVCache":
        """An empty cache of capacity ``max_len`` (decode from scratch); ``static``: never reallocated."""
        HQ = num_kv_heads if num_q_heads is None else num_q_heads
        k = torch.zeros(batch_size, max_len, num_kv_heads, head_dim, dtype=dtype, device=device)
        v = torch.zeros(batch_size, max_len, num_kv_heads, value_dim, dtype=dtype, device=device)
        c = torch.zeros(batch_size, max_len, HQ, dtype=gate_dtype, device=device) if gated else None
        return cls(k, v, c, 0, HQ, static=static)

    def reserve(self, n: int) -> None:
        """Make room for ``n`` more tokens: a growable cache reallocates (at least doubling) when full; a static
        one, or any cache inside a CUDA-graph capture, raises ``CacheFullError`` instead. With the length
        unknown on the host (after a capture) a static cache checks nothing here (the kernels guard it)."""
        if self._len is None:
            if self.static:
                return
            self.sync_length()
        need = self._len + n
        if need <= self.max_len:
            return
        if self.static or _capturing(self.k):
            why = "a static cache" if self.static else "a cache inside a CUDA-graph capture"
            raise CacheFullError(f"PaTHKVCache is full: {self._len} tokens + {n} new > max_len={self.max_len} "
                                 f"({why} cannot grow); create it with max_len >= {need} "
                                 f"(PaTHCache(max_len=...) or path_attention_prefill(..., max_len=...))")
        cap = max(need, 2 * self.max_len)

        def grow(x):
            return None if x is None else F.pad(x, [0, 0] * (x.dim() - 2) + [0, cap - x.shape[1]])
        self.k, self.v, self.c = grow(self.k), grow(self.v), grow(self.c)

    def workspace(self, key: tuple, numel: int) -> Tensor:
        """A float32 scratch buffer of ``numel`` elements on the cache's device, kept for later steps."""
        buf = self._work.get(key)
        if buf is None:
            buf = self._work[key] = torch.empty(numel, dtype=torch.float32, device=self.k.device)
        return buf

    def __getstate__(self):
        return {s: getattr(self, s) for s in self.__slots__}

    def __setstate__(self, state) -> None:
        for s, val in state.items():
            object.__setattr__(self, s, val)

    def __repr__(self) -> str:
        n = self._len if self._len is not None else f"~{self._hint} (on the device)"
        B, _, H, D = self.k.shape
        return (f"PaTHKVCache(B={B}, H={H}, HQ={self.num_q_heads}, D={D}, DV={self.v.shape[-1]}, length={n}, "
                f"max_len={self.max_len}, gated={self.gated}, static={self.static}, dtype={self.k.dtype}, "
                f"device={self.k.device})")
