"""The flip-flop model: a 1-layer, 2-head, width-64 causal LM with a switchable attention.

``attention`` selects the token mixer of the one block:

* ``"path"``: ``pathtune.PaTHAttention`` (Householder position encoding, no other position signal);
* ``"path_fox"``: the same layer with the FoX forget gate (``use_forget_gate=True``);
* ``"rope"``: the same q/k/v/o projections, RoPE on q and k, torch SDPA (causal).  Written here,
  not in the library: it is only the baseline of this experiment.

Everything else (embedding, pre-norm block, MLP, output head) is shared.  No absolute position
embedding anywhere, so the attention's position encoding is the only position signal.

``kernel`` (PaTH variants only) picks the attention kernel under the same projections:
``"pathtune"`` (``pathtune.path_attention`` with the layer's backend) or ``"fla"``
(flash-linear-attention's ``parallel_path_attn``, for the same-run throughput comparison).
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from pathtune import PaTHAttention

from .data import VOCAB_SIZE

ATTENTIONS = ("path", "rope", "path_fox")
KERNELS = ("pathtune", "fla")


class RoPEAttention(nn.Module):
    """q/k/v/o projections as in PaTHAttention, rotary position embedding, causal SDPA."""

    def __init__(self, hidden_size: int, num_heads: int, *, head_dim: Optional[int] = None,
                 bias: bool = False, rope_base: float = 10000.0):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim or hidden_size // num_heads
        if self.head_dim % 2:
            raise ValueError(f"RoPE needs an even head_dim, got {self.head_dim}")
        inner = num_heads * self.head_dim
        self.q_proj = nn.Linear(hidden_size, inner, bias=bias)
        self.k_proj = nn.Linear(hidden_size, inner, bias=bias)
        self.v_proj = nn.Linear(hidden_size, inner, bias=bias)
        self.o_proj = nn.Linear(inner, hidden_size, bias=bias)
        inv_freq = rope_base ** (-torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def _rotate(self, x: torch.Tensor) -> torch.Tensor:
        # x [B, H, T, D]; rotate pairs (x[:D/2], x[D/2:]) by angle t * inv_freq
        T = x.shape[-2]
        t = torch.arange(T, device=x.device, dtype=torch.float32)
        ang = torch.outer(t, self.inv_freq)                      # [T, D/2]
        cos, sin = ang.cos(), ang.sin()
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).to(x.dtype)

    def forward(self, hidden_states: torch.Tensor, **_: object) -> torch.Tensor:
        B, T, _ = hidden_states.shape
        shape = (B, T, self.num_heads, self.head_dim)
        q = self.q_proj(hidden_states).view(shape).transpose(1, 2)
        k = self.k_proj(hidden_states).view(shape).transpose(1, 2)
        v = self.v_proj(hidden_states).view(shape).transpose(1, 2)
        o = F.scaled_dot_product_attention(self._rotate(q), self._rotate(k), v, is_causal=True)
        return self.o_proj(o.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, d: int, ratio: int = 4):
        super().__init__()
        self.up = nn.Linear(d, ratio * d)
        self.down = nn.Linear(ratio * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class FlipFlopLM(nn.Module):
    def __init__(self, attention: str = "path", *, d_model: int = 64, n_heads: int = 2, mlp_ratio: int = 4,
                 backend: str = "auto", vocab_size: int = VOCAB_SIZE):
        super().__init__()
        if attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {ATTENTIONS}, got {attention!r}")
        self.attention = attention
        self.embed = nn.Embedding(vocab_size, d_model)
        self.norm1 = nn.RMSNorm(d_model)
        if attention == "rope":
            self.attn = RoPEAttention(d_model, n_heads)
        else:
            self.attn = PaTHAttention(d_model, n_heads, use_forget_gate=(attention == "path_fox"), backend=backend)
        self.norm2 = nn.RMSNorm(d_model)
        self.mlp = MLP(d_model, mlp_ratio)
        self.norm_f = nn.RMSNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size)
        self.kernel = "pathtune"   # PaTH variants: "fla" runs the same layer on fla's kernel

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        h = self.norm1(x)
        x = x + (fla_attention_forward(self.attn, h) if self.kernel == "fla" else self.attn(h))
        x = x + self.mlp(self.norm2(x))
        # the 5-way head in float32 even under autocast: bf16 logits can tie at the argmax
        with torch.autocast(device_type=x.device.type, enabled=False):
            return self.head(self.norm_f(x.float()))


# ---------------------------------------------------------------------------------------------
# fla kernel switch: the same layer (same projections, w/beta/g computation), fla's kernel.

def fla_available() -> tuple[bool, str]:
    try:
        from fla.ops.path_attn import parallel_path_attn  # noqa: F401
    except Exception as exc:  # not installed, or a broken install
        return False, f"{type(exc).__name__}: {exc}"
    return True, ""


def fla_attention_forward(layer: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """``layer`` (a ``PaTHAttention``) with fla's ``parallel_path_attn`` in place of pathtune's kernel.

    The inputs come from the layer's own ``project`` (projections, short conv, w normalisation, beta
    and gate), the output goes through the layer's ``o_proj``: only the attention kernel differs.
    """
    from fla.ops.path_attn import parallel_path_attn

    B, T, _ = hidden_states.shape
    q, k, v, w, beta, g, _ = layer.project(hidden_states)
    o, _ = parallel_path_attn(q, k, v, w.float(), beta.float(), g=None if g is None else g.float(),
                              scale=layer.head_dim ** -0.5)
    return layer.o_proj(o.reshape(B, T, -1))


@contextlib.contextmanager
def attention_kernel(model: FlipFlopLM, kernel: str) -> Iterator[None]:
    """Run ``model``'s PaTH layer on ``kernel`` ("pathtune" or "fla") inside the block."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if kernel == "fla":
        if model.attention == "rope":
            raise ValueError("the fla kernel applies to the PaTH variants only")
        ok, why = fla_available()
        if not ok:
            raise RuntimeError(f"fla is not importable: {why}")
    saved = model.kernel
    model.kernel = kernel
    try:
        yield
    finally:
        model.kernel = saved


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())

