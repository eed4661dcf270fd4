"""``PaTHAttention``: a PaTH (or PaTH-FoX) attention layer for causal language models.

    attn = PaTHAttention(hidden_size=512, num_heads=8, num_kv_heads=2, use_forget_gate=True)
    y = attn(x)                                   # x [B, T, 512] -> y [B, T, 512]; training, any backend
    cache = PaTHCache()
    y = attn(prompt, cache=cache)                 # prefill (fills cache[layer_idx])
    y = attn(next_tokens, cache=cache)            # decode steps, any number of tokens

Per token and head the layer computes (HQ query heads, H key/value heads, HQ = G * H):

* q, k, v, o: linear projections (``bias``), q [B,T,HQ,D], k [B,T,H,D], v [B,T,H,DV];
  ``use_qk_norm``: RMS-norm of q and k over D (learned scale);
* the Householder directions w [B,T,H,D]: low-rank projection hidden -> ``w_rank`` -> H*D, then a
  short causal depthwise convolution of width ``conv_size`` along time (its last ``conv_size - 1``
  inputs are the decoding state), then L2-normalised per head in float32;
* the strengths beta [B,T,H] = 2 * sigmoid(linear(hidden)) in float32, kept inside the spec's
  interval (0, 2] (the sigmoid can round to 0 or 1). The spec's ``numerics.beta_clip`` (beta <= 2 - eps)
  is applied inside the kernels by the ``beta_clip_eps`` knob, not here, so every backend sees the
  same beta;
* ``use_forget_gate``: the FoX log forget gate g [B,T,HQ] = logsigmoid(linear(hidden)) in float32;

then ``pathtune.path_attention`` (dispatch: ``backend``), and the output projection.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .api import BACKENDS, path_attention
from .cache import LayerState, PaTHCache, _check_decode_inputs, decode_fn, prefill_fn

__all__ = ["PaTHAttention", "causal_short_conv"]

_BETA_MIN = torch.finfo(torch.float32).tiny  # beta must stay > 0 (spec interval (0, 2])
_GATE_BIAS_INIT = 3.0  # forget gates start near sigmoid(3) = 0.95 (slow forgetting)


def _positive_int(name: str, value, *, allow_none: bool = False) -> Optional[int]:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"PaTHAttention: {name} must be a positive int, got {value!r}")
    return value


def _positions_in_sequence(cu_seqlens: Tensor, T: int, device: torch.device) -> Tensor:
    """[T] index of each packed token inside its own sequence."""
    cu = cu_seqlens.to(device=device, dtype=torch.int64)
    idx = torch.arange(T, device=device)
    seq = torch.searchsorted(cu[1:], idx, right=True)
    return idx - cu[seq]


def causal_short_conv(x: Tensor, weight: Tensor, state: Optional[Tensor] = None,
                      cu_seqlens: Optional[Tensor] = None) -> tuple[Tensor, Optional[Tensor]]:
    """Causal depthwise convolution along time: ``out[t] = sum_i weight[:, K-1-i] * x[t-i]``.

    x [B, T, C], weight [C, K]; ``state`` [B, K-1, C]: the inputs before x (None: zeros, i.e. the
    sequence starts here); ``cu_seqlens``: packed sequences (B == 1) do not see each other.
    Returns (out [B, T, C], new state [B, K-1, C] (detached; None when K == 1)).
    """
    B, T, C = x.shape
    K = weight.shape[-1]
    w = weight.to(x.dtype)
    if K == 1:
        return x * w[:, 0], None
    if state is None:
        state = x.new_zeros(B, K - 1, C)
    elif tuple(state.shape) != (B, K - 1, C):
        raise ValueError(f"conv state must be [B, K-1, C] = {[B, K - 1, C]}, got {list(state.shape)}")
    xp = torch.cat([state.to(x.dtype), x], dim=1)                       # [B, T+K-1, C]
    if cu_seqlens is None:
        out = F.conv1d(xp.transpose(1, 2), w.unsqueeze(1), groups=C).transpose(1, 2)
    else:
        pos = _positions_in_sequence(cu_seqlens, T, x.device)[None, :, None]
        out = x * w[:, K - 1]
        for i in range(1, K):                                           # x[t - i], inside t's sequence
            out = out + xp[:, K - 1 - i:K - 1 - i + T] * w[:, K - 1 - i] * (pos >= i).to(x.dtype)
    return out, xp[:, T:].detach()


class PaTHAttention(nn.Module):
    """PaTH(-FoX) attention layer; see the module docstring for the computation.

    Args:
        hidden_size: model width.
        num_heads: query heads HQ.
        num_kv_heads: key/value heads H (GQA; HQ must be a multiple); default HQ.
        head_dim: D of q, k, w; default hidden_size // num_heads.
        value_head_dim: DV of v and the output; default D.
        use_forget_gate: PaTH-FoX (a log forget gate per query head).
        use_qk_norm: RMS-norm q and k per head.
        w_rank: rank of the hidden -> w projection.
        conv_size: width of the causal convolution on the w path (1: none).
        bias: biases of the q/k/v/o projections.
        backend: ``path_attention`` backend ("auto", "reference", "triton", "tvm"); decoding uses the
            matching decode kernels (the PyTorch reference where none exist).
        layer_idx: this layer's key in a ``PaTHCache``.
    """

    def __init__(self, hidden_size: int, num_heads: int, *, num_kv_heads: Optional[int] = None,
                 head_dim: Optional[int] = None, value_head_dim: Optional[int] = None,
                 use_forget_gate: bool = False, use_qk_norm: bool = False, w_rank: int = 32, conv_size: int = 3,
                 bias: bool = False, backend: str = "auto", layer_idx: int = 0, device=None, dtype=None) -> None:
        super().__init__()
        hidden_size = _positive_int("hidden_size", hidden_size)
        num_heads = _positive_int("num_heads", num_heads)
        num_kv_heads = _positive_int("num_kv_heads", num_kv_heads, allow_none=True) or num_heads
        if num_heads % num_kv_heads:
            raise ValueError(f"PaTHAttention: num_heads ({num_heads}) must be a multiple of num_kv_heads "
                             f"({num_kv_heads}) (grouped-query attention)")
        if head_dim is None:
            if hidden_size % num_heads:
                raise ValueError(f"PaTHAttention: hidden_size ({hidden_size}) is not a multiple of num_heads "
                                 f"({num_heads}); pass head_dim")
            head_dim = hidden_size // num_heads
        head_dim = _positive_int("head_dim", head_dim)
        value_head_dim = _positive_int("value_head_dim", value_head_dim, allow_none=True) or head_dim
        w_rank = _positive_int("w_rank", w_rank)
        conv_size = _positive_int("conv_size", conv_size)
        if backend not in BACKENDS:
            raise ValueError(f"PaTHAttention: backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
        if isinstance(layer_idx, bool) or not isinstance(layer_idx, int) or layer_idx < 0:
            raise ValueError(f"PaTHAttention: layer_idx must be an int >= 0, got {layer_idx!r}")

        self.hidden_size, self.num_heads, self.num_kv_heads = hidden_size, num_heads, num_kv_heads
        self.head_dim, self.value_head_dim = head_dim, value_head_dim
        self.use_forget_gate, self.use_qk_norm = bool(use_forget_gate), bool(use_qk_norm)
        self.w_rank, self.conv_size, self.backend, self.layer_idx = w_rank, conv_size, backend, layer_idx
        fk = {"device": device, "dtype": dtype}
        HQ, H, D, DV = num_heads, num_kv_heads, head_dim, value_head_dim
        self.q_proj = nn.Linear(hidden_size, HQ * D, bias=bias, **fk)
        self.k_proj = nn.Linear(hidden_size, H * D, bias=bias, **fk)
        self.v_proj = nn.Linear(hidden_size, H * DV, bias=bias, **fk)
        self.o_proj = nn.Linear(HQ * DV, hidden_size, bias=bias, **fk)
        self.w_down = nn.Linear(hidden_size, w_rank, bias=False, **fk)
        self.w_up = nn.Linear(w_rank, H * D, bias=False, **fk)
        self.w_conv = nn.Parameter(torch.empty(H * D, conv_size, **fk))
        self.beta_proj = nn.Linear(hidden_size, H, bias=True, **fk)
        self.g_proj = nn.Linear(hidden_size, HQ, bias=True, **fk) if use_forget_gate else None
        self.q_norm = nn.RMSNorm(D, eps=1e-6, **fk) if use_qk_norm else None
        self.k_norm = nn.RMSNorm(D, eps=1e-6, **fk) if use_qk_norm else None
        self.reset_conv_parameters()

    def reset_conv_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.conv_size)
        with torch.no_grad():
            nn.init.uniform_(self.w_conv, -bound, bound)
            self.w_conv[:, -1] += 1.0  # start near the identity on the current token
            if self.g_proj is not None:
                self.g_proj.bias.fill_(_GATE_BIAS_INIT)

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
                f"head_dim={self.head_dim}, value_head_dim={self.value_head_dim}, "
                f"use_forget_gate={self.use_forget_gate}, use_qk_norm={self.use_qk_norm}, w_rank={self.w_rank}, "
                f"conv_size={self.conv_size}, backend={self.backend!r}, layer_idx={self.layer_idx}")

    def project(self, hidden_states: Tensor, *, conv_state: Optional[Tensor] = None,
                cu_seqlens: Optional[Tensor] = None):
        """The attention inputs of ``hidden_states`` [B, T, hidden]:
        ``(q, k, v, w, beta, g, new_conv_state)`` as ``path_attention`` takes them (g None without the gate)."""
        B, T, _ = hidden_states.shape
        HQ, H, D, DV = self.num_heads, self.num_kv_heads, self.head_dim, self.value_head_dim
        x = hidden_states
        q = self.q_proj(x).view(B, T, HQ, D)
        k = self.k_proj(x).view(B, T, H, D)
        v = self.v_proj(x).view(B, T, H, DV)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        w_in = self.w_up(self.w_down(x))
        w_pre, new_state = causal_short_conv(w_in, self.w_conv, conv_state, cu_seqlens)
        w = F.normalize(w_pre.float().view(B, T, H, D), dim=-1)
        beta = (2.0 * torch.sigmoid(self.beta_proj(x).float())).clamp(min=_BETA_MIN, max=2.0)
        g = F.logsigmoid(self.g_proj(x).float()) if self.g_proj is not None else None
        return q, k, v, w, beta, g, new_state

    def forward(self, hidden_states: Tensor, *, cache: Optional[PaTHCache] = None,
                cu_seqlens: Optional[Tensor] = None) -> Tensor:
        """[B, T, hidden] -> [B, T, hidden].

        ``cache``: a ``PaTHCache``; without an entry for ``layer_idx`` this call is the prefill (and
        stores the entry), otherwise a decode step of T tokens that extends it.
        ``cu_seqlens``: packed sequences along T (B == 1), as in ``path_attention`` (not with a cache;
        under torch.compile with the Triton backend: the reference reads cu_seqlens on the host).
        """
        if not isinstance(hidden_states, Tensor) or hidden_states.dim() != 3 \
                or hidden_states.shape[-1] != self.hidden_size:
            got = tuple(hidden_states.shape) if isinstance(hidden_states, Tensor) else type(hidden_states).__name__
            raise ValueError(f"PaTHAttention: hidden_states must be [B, T, {self.hidden_size}], got {got}")
        if cache is not None and not isinstance(cache, PaTHCache):
            raise TypeError(f"PaTHAttention: cache must be a pathtune.PaTHCache, got {type(cache).__name__}")
        if cache is not None and cu_seqlens is not None:
            raise ValueError("PaTHAttention: a cache with packed sequences (cu_seqlens) is not supported; "
                             "pass a padded batch [B, T, hidden] for generation")
        B, T, _ = hidden_states.shape
        if B == 0 or T == 0:
            raise ValueError(f"PaTHAttention: hidden_states has no tokens (shape {tuple(hidden_states.shape)}); "
                             "pass at least one sequence of at least one token")
        if cache is not None:
            cache.claim(self.layer_idx, self)
        state = cache.get(self.layer_idx) if cache is not None else None
        if state is not None:
            _check_decode_inputs(hidden_states, state)
        q, k, v, w, beta, g, conv_state = self.project(
            hidden_states, conv_state=state.conv if state is not None else None, cu_seqlens=cu_seqlens)
        scale = self.head_dim ** -0.5
        if cache is None:
            o = path_attention(q, k, v, w, beta, g, scale=scale, cu_seqlens=cu_seqlens, backend=self.backend)
        elif state is None:
            cap = cache.max_len
            if cap is not None and cap < T:
                raise ValueError(f"PaTHAttention: the prompt has {T} tokens but PaTHCache(max_len={cap}) holds at most "
                                 f"{cap}; create the cache with max_len >= the prompt plus the tokens to generate")
            o, kv = prefill_fn(self.backend)(q, k, v, w, beta, g, scale=scale, max_len=cap, static=cap is not None)
            # own buffer (not a view of the prefill's padded input), updated in place by decode steps
            conv = None if conv_state is None else conv_state.clone(memory_format=torch.contiguous_format)
            cache.set(self.layer_idx, LayerState(kv, conv))
        else:
            o = decode_fn(self.backend)(q, k, v, w, beta, g, state.kv, scale=scale)
            if conv_state is not None:
                state.conv.copy_(conv_state)   # in place: a captured CUDA graph keeps reading this buffer
        return self.o_proj(o.reshape(B, T, self.num_heads * self.value_head_dim))
