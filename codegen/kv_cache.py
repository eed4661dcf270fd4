"""``PaTHKVCache``: the decoding state of one PaTH(-FoX) attention layer (keys in the current frame, lazily).

A neutral module: the PyTorch reference (``runtime/reference/recurrent.py``), the Triton decode step
(``codegen/triton/decode.py``) and the TVM decode step (``codegen/tvm/host.py``) all read and write it,
and it imports nothing of pathtune. Users import it as ``pathtune.PaTHKVCache``.

Layout (contiguous; rows >= length are unused capacity):

* ``k`` [B, max_len, H, D]: keys in the CURRENT frame, k_j^(t) = H_t ... H_{j+1} k_j (t = length - 1);
  reading ``k`` materializes pending rows first (below); ``k_buffer`` is the storage as the kernels hold it;
* ``v`` [B, max_len, H, DV];
* ``c`` [B, max_len, HQ]: inclusive FoX gate cumsum (float32; float64 for float64 gates), None ungated;
  ``gate_heads()`` is its head-major copy [B, HQ, max_len] for the Triton step (a key tile's offsets contiguous),
  which that step extends with its own rows and completes from ``c`` where other writers appended rows (rows of
  ``c`` below the length are never rewritten in place: to replace them, assign a new ``c``); built when a cache is
  made from tensors holding rows, else by the first Triton step (or prefill), which must precede a CUDA-graph
  capture on the cache;
* ``state_tensor`` [4] int32 on the cache's device: (length, frame base F, old rows F1, old frame FP), read and
  advanced by the kernels on the device, so a captured CUDA graph of a decode step can be replayed as the cache
  grows; ``length_tensor`` and ``frame_tensor`` are one-element views of the first two;
* ``arrival_counters`` [B*H + 1] int32 on the cache's device: zero between steps (the decode kernel's split
  arrival counters, which it resets itself), filled once at creation;
* ``layout_key()``: an int naming the buffers' layout (sizes but the capacity, dtypes, devices, contiguity,
  HQ), computed once and dropped whenever k, v, c or num_q_heads is replaced (growth included).

Lazy rotation (the Triton decode step, codegen/triton/decode.py): rows j < F of ``k_buffer`` hold keys in
the frame of position F-1; rows F .. length-1 are pending: raw keys, whose w (fp32) and clipped beta sit in
the pending window (``pending_window``: w [B, slots, H, D], beta [B, slots, H], slot j - F). ``materialize()``
rotates every row into the current frame (fp32 math, one rounding to the cache dtype) and sets F = length;
the ``k`` getter calls it, so the reference and TVM steps and every other reader see current-frame keys.
Setting ``length`` declares rows < length current-frame keys (F = length).

Two frame levels (a Triton step with ``decode_frame_bound`` > 0): rows j < F1 ("old", F1 a multiple of the
kernel's alignment) hold keys in the frame of position FP-1 (F1 <= FP <= F), and ``frame_map()`` [B*H, D, D]
float32 holds Phi = H_FP .. H_{F-1} per (batch, kv head), so that an old row's logit is k~_j . (Phi q^_i).  A flush
then rotates only the rows F1 .. N-1 and folds its transitions into Phi; one that would leave more than the bound
past F1 rotates every row (old ones by Phi first) and sets FP = F = N, F1 = N rounded down to the alignment.
Phi is read only while F1 > 0 and FP < F (else it is the identity, whatever the buffer holds); ``materialize()``
applies it too, and setting ``length`` sets F1 = 0, FP = length.

The host keeps mirrors of the length and F so eager steps need no device read. A CUDA-graph capture of a
step leaves the mirrors unknown (replays advance only the device values): ``length`` then reads the
device (one synchronisation per read) and ``sync_length()`` re-arms the mirrors.

Capacity: a growable cache (``static=False``, the default) reallocates, at least doubling, when a step
needs more rows (outside a graph capture); a static cache (``static=True``) keeps its buffers for its
life, which a captured graph needs, and an eager step past its capacity raises ``CacheFullError``.
A replayed graph cannot raise: its kernels drop rows past the capacity and the next ``length`` read
raises ``CacheFullError``.
"""
from __future__ import annotations

import itertools
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

    __slots__ = ("_k", "_v", "_c", "_hq", "static", "_state", "_len", "_frame", "_old", "_old_frame", "_hint",
                 "_work", "_pw", "_pb", "_phi", "_ch", "_ch_rows", "_count", "_layout")

    def __init__(self, k: Tensor, v: Tensor, c: Optional[Tensor], length: int, num_q_heads: int, *,
                 static: bool = False) -> None:
        self._layout: Optional[int] = None   # layout_key(), computed on first use, dropped when a buffer is replaced
        self._ch: Optional[Tensor] = None     # head-major copy of c [B, HQ, max_len] (gate_heads)
        self._ch_rows: Optional[int] = 0      # its rows that equal c's; None: every row < length (after a capture)
        self._k, self.v, self.c = k, v, c
        self.num_q_heads = int(num_q_heads)
        self.static = bool(static)
        n = int(length)
        self._len: Optional[int] = n      # host mirror of the device length; None: unknown (after a graph capture)
        self._frame: Optional[int] = n    # host mirror of the device frame base F; None: unknown
        self._old = 0                     # host mirror of F1 (rows < F1 are old); meaningful while _frame is known
        self._old_frame = n               # host mirror of FP (old rows are in the frame of position FP-1)
        self._hint = n                    # last known length (dispatch buckets), never None
        self._state = _state_tensor(n, k.device)   # (length, F, F1, FP)
        self._work: dict = {}             # kernel scratch buffers, allocated once per launch shape
        self._pw: Optional[Tensor] = None  # pending window: w [B, slots, H, D] fp32
        self._pb: Optional[Tensor] = None  # pending window: beta [B, slots, H] fp32 (clipped)
        self._phi: Optional[Tensor] = None  # frame map of the old rows: [B*H, D, D] fp32 (two frame levels)
        self._count = _arrival_counters(k)
        if c is not None and n > 0 and not _capturing(k):
            self.gate_heads()     # built now, so that a step captured on this cache finds it current

    # -- keys and device state -----------------------------------------------------------------------
    @property
    def k(self) -> Tensor:
        """Keys in the current frame [B, max_len, H, D] (pending rows are materialized first; inside a CUDA-graph
        capture the storage is returned as it is)."""
        if self._frame is None or self._len is None or self._frame < min(self._len, self.max_len) or self._mapped():
            self.materialize()
        return self._k

    def _mapped(self) -> bool:
        """Old rows sit in an older frame than the rest (two frame levels, the frame map not the identity)."""
        return self._old > 0 and self._frame is not None and self._old_frame < self._frame

    @k.setter
    def k(self, t: Tensor) -> None:
        self._k = t
        self._layout = None

    @property
    def v(self) -> Tensor:
        """Values [B, max_len, H, DV]."""
        return self._v

    @v.setter
    def v(self, t: Tensor) -> None:
        self._v = t
        self._layout = None

    @property
    def c(self) -> Optional[Tensor]:
        """Inclusive FoX gate cumsum [B, max_len, HQ], None for an ungated cache."""
        return self._c

    @c.setter
    def c(self, t: Optional[Tensor]) -> None:
        self._c = t
        self._ch, self._ch_rows = None, 0
        self._layout = None

    def gate_heads(self) -> Optional[Tensor]:
        """The head-major copy of ``c``, [B, HQ, max_len] (None for an ungated cache), whose rows < length equal
        c's: allocated on first use and brought up to date from c where rows were written by anything but the
        Triton step (which writes both).  Inside a CUDA-graph capture it must be current already (run one eager
        Triton step first)."""
        c = self._c
        if c is None:
            return None
        B, cap, HQ = c.shape
        if self._ch is None or self._ch.shape[-1] != cap:
            if _capturing(self._k):
                raise RuntimeError("the gated cache's head-major gate copy is not allocated for this capacity; run "
                                   "one eager Triton decode step with the same cache before capturing the CUDA graph")
            ch = torch.empty(B, HQ, cap, dtype=c.dtype, device=c.device)
            keep = 0 if self._ch is None else min(self._ch_rows or 0, self._ch.shape[-1])
            if keep:
                ch[:, :, :keep] = self._ch[:, :, :keep]
            self._ch, self._ch_rows = ch, keep
        n = self._len
        if n is not None and self._ch_rows is not None and self._ch_rows < min(n, cap):
            if _capturing(self._k):
                raise RuntimeError("the gated cache's head-major gate copy is behind its gate cumsum; run one eager "
                                   "Triton decode step with the same cache before capturing the CUDA graph")
            a, b = self._ch_rows, min(n, cap)
            self._ch[:, :, a:b] = c[:, a:b].transpose(1, 2)
            self._ch_rows = b
        return self._ch

    @property
    def num_q_heads(self) -> int:
        return self._hq

    @num_q_heads.setter
    def num_q_heads(self, n: int) -> None:
        self._hq = n
        self._layout = None

    def layout_key(self) -> int:
        """The layout of the buffers as a small int, equal for two caches iff their layouts are: the cache's type,
        HQ, and per buffer (k, v, c) its sizes other than max_len, dtype, device and contiguity (None for an
        ungated c).  Decode calls key their prepared steps by it.  Computed once and kept until k, v, c or
        num_q_heads is replaced (assignment, growth by ``reserve``, unpickling); a tensor of the cache changed
        in place (``resize_``, ``set_``, ``as_strided_``) is not noticed: assign a new tensor instead."""
        key = self._layout
        if key is None:
            layout = (type(self), self._hq, _buffer_layout(self._k), _buffer_layout(self._v),
                      _buffer_layout(self._c))
            key = self._layout = _LAYOUT_IDS.setdefault(layout, next(_LAYOUT_COUNT))
        return key

    @property
    def k_buffer(self) -> Tensor:
        """The key storage as the decode kernels hold it (rows < F in frame F-1, rows F .. length-1 raw)."""
        return self._k

    @property
    def state_tensor(self) -> Tensor:
        """(length, F, F1, FP) int32 [4] on the cache's device."""
        return self._state

    @property
    def old_rows(self) -> tuple[int, int]:
        """(F1, FP) of two frame levels: rows < F1 hold keys in the frame of position FP-1 (F1 = 0: no old rows);
        reads the device when unknown."""
        if self._frame is None or self._len is None:
            self.sync_length()
        return self._old, self._old_frame

    @property
    def length_tensor(self) -> Tensor:
        return self._state[:1]

    @property
    def frame_tensor(self) -> Tensor:
        return self._state[1:2]

    @property
    def batch_size(self) -> int:
        return self._k.shape[0]

    # -- sizes ---------------------------------------------------------------------------------------
    @property
    def max_len(self) -> int:
        """Capacity in tokens (rows of k / v / c)."""
        return self._k.shape[1]

    @property
    def gated(self) -> bool:
        return self.c is not None

    @property
    def length(self) -> int:
        """Valid rows. Exact on the host unless a CUDA graph of a step was captured; then read from the device."""
        if self._len is not None:
            return self._len
        n, f, f1, fp = (int(x) for x in self._state.tolist())
        if n > self.max_len:
            raise CacheFullError(f"PaTHKVCache overflowed during CUDA-graph replay: {n} tokens were appended to a "
                                 f"cache of capacity max_len={self.max_len} (the rows past it were dropped); "
                                 f"create the cache with max_len >= the prompt plus every generated token")
        self._hint = n
        self._frame = f
        self._old, self._old_frame = f1, fp
        return n

    @length.setter
    def length(self, n: int) -> None:
        """Set the length; rows < n are declared current-frame keys (F = FP = n, nothing pending, no old rows)."""
        n = int(n)
        prev = self._len
        # rows of c below the previous length are never rewritten (a step appends; prefill fills an empty cache):
        # the head-major copy keeps those, the rest is copied from c when the Triton step next reads it
        if prev is None:
            self._ch_rows = 0
        elif self._ch_rows is not None:
            self._ch_rows = min(self._ch_rows, prev)
        else:
            self._ch_rows = prev
        self._len = self._hint = self._frame = self._old_frame = n
        self._old = 0
        self._state.fill_(n)
        self._state[2].fill_(0)

    @property
    def frame(self) -> int:
        """The frame base F (rows < F are in the frame of position F-1); reads the device when unknown."""
        if self._frame is None or self._len is None:
            self.sync_length()
        return self._frame

    def set_state(self, length: int, frame: int, old: int = 0, old_frame: Optional[int] = None) -> None:
        """Set the length and the frame base F <= length (rows F .. length-1 then count as pending: their w and
        beta must be in the pending window) and, for two frame levels, the old rows F1 = ``old`` and their frame
        FP = ``old_frame`` (default F; F1 <= FP <= F; FP < F needs the frame map, whose contents then stand for
        H_FP .. H_{F-1}).  For benchmarks that replay a flush step."""
        n, f, f1 = int(length), int(frame), int(old)
        fp = f if old_frame is None else int(old_frame)
        if not 0 <= f <= n:
            raise ValueError(f"need 0 <= frame <= length, got frame={f}, length={n}")
        if not 0 <= f1 <= fp <= f:
            raise ValueError(f"need 0 <= old <= old_frame <= frame, got old={f1}, old_frame={fp}, frame={f}")
        if f < n and (self._pw is None or self._pw.shape[1] < n - f):
            raise ValueError(f"{n - f} pending rows need a pending window of as many slots (pending_window())")
        if f1 > 0 and fp < f and self._phi is None:
            raise ValueError("old rows in an older frame need the frame map (frame_map()) first")
        self._len = self._hint = n
        self._frame = f
        self._old, self._old_frame = f1, fp
        if self._ch_rows is not None:
            self._ch_rows = min(self._ch_rows, n)   # rows below the length are unchanged
        for i, x in enumerate((n, f, f1, fp)):
            self._state[i].fill_(x)   # device fills: no host-to-device copy, capturable

    def sync_length(self) -> int:
        """Read the device length and frame into the host mirrors (after replaying captured decode steps)."""
        self._len = None
        n = self.length
        self._len = n
        return n

    def advanced(self, n: int, window: Optional[int] = None, frame_bound: int = 0, frame_align: int = 1) -> None:
        """Record on the host what a decode step did on the device: the length advanced by ``n`` and, with a
        pending window ``window``, F moved to the new length N when more than ``window`` rows would be pending
        (the kernels' flush rule); ``window=None``: the step left every key in the current frame.  With two frame
        levels (``frame_bound`` > 0) a flush that leaves more than ``frame_bound`` rows past F1 rotates every row:
        F1 = N rounded down to ``frame_align``, FP = N.
        Inside a CUDA-graph capture the device is not advanced now but at every replay: the mirrors become unknown."""
        self._hint += n
        if self._len is None or self._frame is None or _capturing(self._k):
            self._len = self._frame = None
            self._ch_rows = None        # the replays write both copies of the gate: trusted up to the length
            return
        L = min(self._len, self.max_len)
        if self._ch_rows is not None and self._ch_rows >= L:
            self._ch_rows = min(L + n, self.max_len)   # the step wrote its rows into the head-major copy too
        F = min(self._frame, L)
        if window is None or L - F + n > window:
            N = min(L + n, self.max_len)
            self._frame = N
            if frame_bound > 0 and N - min(self._old, F) > frame_bound:
                self._old, self._old_frame = N // frame_align * frame_align, N
        self._len += n

    def pending_window(self, slots: int) -> tuple[Tensor, Tensor]:
        """The pending window (w [B, S, H, D], beta [B, S, H], float32) with S >= max(slots, 1) slots, allocated on
        first use and grown (contents kept) when a step needs more; a static cache keeps it once allocated.
        Inside a CUDA-graph capture it is allocated without initialisation (a captured fill would re-run at every
        replay); growing a window that holds pending rows there raises (run one eager step first)."""
        need = max(int(slots), 1)
        if self._pw is None or self._pw.shape[1] < need:
            B, _, H, D = self._k.shape
            # inside a capture a fill or copy would be re-run by every replay, resetting the window the replayed
            # steps write: allocate without one (the kernels read only slots < pending rows, which they write
            # first) and refuse when rows are pending in an older window
            capturing = _capturing(self._k)
            if capturing and self._pw is not None and (self._len is None or self._frame is None
                                                       or self._frame < self._len):
                raise RuntimeError(
                    f"this decode step needs a pending window of {need} slots but the cache has "
                    f"{self._pw.shape[1]} with rows pending; run one eager step with the same config "
                    f"before capturing the CUDA graph")
            alloc = torch.empty if capturing else torch.zeros
            pw = alloc(B, need, H, D, dtype=torch.float32, device=self._k.device)
            pb = alloc(B, need, H, dtype=torch.float32, device=self._k.device)
            if self._pw is not None and not capturing:
                pw[:, :self._pw.shape[1]] = self._pw
                pb[:, :self._pb.shape[1]] = self._pb
            self._pw, self._pb = pw, pb
        return self._pw, self._pb

    def frame_map(self) -> Tensor:
        """The old rows' frame map Phi [B*H, D, D] float32 (two frame levels), allocated on first use (the identity;
        inside a CUDA-graph capture uninitialised: the kernels write it before they read it)."""
        if self._phi is None:
            B, _, H, D = self._k.shape
            if _capturing(self._k):
                self._phi = torch.empty(B * H, D, D, dtype=torch.float32, device=self._k.device)
            else:
                self._phi = torch.eye(D, dtype=torch.float32, device=self._k.device).repeat(B * H, 1, 1)
        return self._phi

    def materialize(self) -> None:
        """Rotate every row into the current frame: the old rows by the frame map (two frame levels), then rows
        j < length by H_p for every pending position p > j, in order (fp32 math, float64 for a float64 cache; one
        rounding to the cache dtype); then F = FP = length, F1 = 0.
        Reads the device state when the host mirrors are unknown; does nothing inside a CUDA-graph capture."""
        if _capturing(self._k):
            return
        if self._len is None or self._frame is None:
            self.sync_length()
        L = min(self._len, self.max_len)
        F = min(self._frame, L)
        F1 = min(self._old, F)
        mapped = self._mapped()
        if F >= L and not mapped:
            return
        P = L - F
        if self._pw is None or self._pw.shape[1] < P:
            raise RuntimeError(f"PaTHKVCache has {P} pending rows but no pending window to rotate them with")
        if mapped and self._phi is None:
            raise RuntimeError("PaTHKVCache has old rows in an older frame but no frame map to rotate them with")
        cdt = torch.float64 if self._k.dtype == torch.float64 else torch.float32
        with torch.no_grad():
            kk = self._k[:, :L].to(cdt)                                   # [B, L, H, D]
            if mapped:   # row form: k~ <- k~ Phi, per (batch, kv head)
                B, _, H, D = kk.shape
                phi = self._phi.view(B, H, D, D).to(cdt)
                kk[:, :F1] = torch.einsum("bjhe,bhed->bjhd", kk[:, :F1], phi)
            for s in range(P):
                p = F + s
                w = self._pw[:, s].to(cdt)                                # [B, H, D]
                a = (kk[:, :p] * w[:, None]).sum(-1) * self._pb[:, s].to(cdt)[:, None]   # [B, p, H]
                kk[:, :p] -= a[..., None] * w[:, None]
            self._k[:, :L] = kk.to(self._k.dtype)
        self._frame = self._old_frame = L
        self._old = 0
        self._state[1].fill_(L)
        self._state[2].fill_(0)
        self._state[3].fill_(L)

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
        if self.static or _capturing(self._k):
            why = "a static cache" if self.static else "a cache inside a CUDA-graph capture"
            raise CacheFullError(f"PaTHKVCache is full: {self._len} tokens + {n} new > max_len={self.max_len} "
                                 f"({why} cannot grow); create it with max_len >= {need} "
                                 f"(PaTHCache(max_len=...) or path_attention_prefill(..., max_len=...))")
        cap = max(need, 2 * self.max_len)

        def grow(x):
            return None if x is None else F.pad(x, [0, 0] * (x.dim() - 2) + [0, cap - x.shape[1]])
        self._k, self._v, self._c = grow(self._k), grow(self._v), grow(self._c)
        self._layout = None

    @property
    def arrival_counters(self) -> Tensor:
        """int32 [B*H + 1] on the cache's device, zero between steps: one arrival counter per (batch, kv head),
        then one for the whole grid.  A kernel that counts on them sets them back to 0 before it ends, so they
        are filled once, when the cache is created, and a captured step contains no fill of them."""
        return self._count

    def workspace_parts(self, key: tuple, sizes: tuple) -> tuple:
        """float32 scratch views of ``sizes`` elements on the cache's device, each starting 16-byte aligned in one
        buffer; buffer and views are made on first use and kept for later steps (no slicing per step)."""
        parts = self._work.get(key)
        if parts is None:
            starts, n = [], 0
            for size in sizes:
                starts.append(n)
                n += -(-size // 4) * 4
            buf = torch.empty(n, dtype=torch.float32, device=self._k.device)
            parts = self._work[key] = tuple(buf[a:a + size] for a, size in zip(starts, sizes))
        return parts

    # pickled state: the public names of k's companions (v, c, num_q_heads), never the layout key
    _PICKLED = ("_k", "v", "c", "num_q_heads", "static", "_state", "_len", "_frame", "_old", "_old_frame", "_hint",
                "_work", "_pw", "_pb", "_phi", "_ch", "_ch_rows", "_count")

    def __getstate__(self):
        return {s: getattr(self, s) for s in self._PICKLED}

    def __setstate__(self, state) -> None:
        for s, val in state.items():   # v, c, num_q_heads through their setters
            object.__setattr__(self, s, val)
        self._layout = None
        if "_count" not in state:   # pickled by a version without arrival counters
            self._count = _arrival_counters(self._k)
        if "_ch" not in state:      # pickled by a version without the head-major gate copy
            self._ch, self._ch_rows = None, 0
        if "_old" not in state:     # pickled by a version with one frame level: (length, F) on the device
            st = self._state
            self._state = torch.cat([st, torch.zeros_like(st[:1]), st[1:2]])
            self._old, self._old_frame, self._phi = 0, self._frame, None

    def __repr__(self) -> str:
        n = self._len if self._len is not None else f"~{self._hint} (on the device)"
        B, _, H, D = self._k.shape
        pend = "" if self._len is None or self._frame is None else f", pending={self._len - self._frame}"
        if self._len is not None and self._mapped():
            pend += f", old={self._old} (frame {self._old_frame - 1})"
        return (f"PaTHKVCache(B={B}, H={H}, HQ={self.num_q_heads}, D={D}, DV={self.v.shape[-1]}, length={n}{pend}, "
                f"max_len={self.max_len}, gated={self.gated}, static={self.static}, dtype={self._k.dtype}, "
                f"device={self._k.device})")


# every buffer layout met in this process -> its id (layout_key); the ids are never reused
_LAYOUT_IDS: dict = {}
_LAYOUT_COUNT = itertools.count()


def _buffer_layout(t: Optional[Tensor]):
    if t is None:
        return None
    shape = t.shape
    return (shape[:1], shape[2:], t.dtype, t.device, t.is_contiguous())


def _state_tensor(n: int, device) -> Tensor:
    """The device state (length, F, F1, FP) of a cache whose n rows are current-frame keys."""
    st = torch.full((4,), n, dtype=torch.int32, device=device)   # device fills: no host-to-device copy
    st[2].fill_(0)
    return st


def _arrival_counters(k: Tensor) -> Tensor:
    """The zeroed arrival counters of the decode kernels for a key buffer k [B, max_len, H, D]: int32 [B*H + 1],
    filled here, once (never inside a step or a graph capture)."""
    return torch.zeros(k.shape[0] * k.shape[2] + 1, dtype=torch.int32, device=k.device)
