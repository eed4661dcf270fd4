"""TEMPORARY stand-in for pathtune.PaTHAttention (runtime/layer.py, being written elsewhere).

Delete once the real layer lands; model.py imports the real one first.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from pathtune.runtime.api import path_attention


class PaTHAttention(nn.Module):
    def __init__(self, hidden_size, num_heads, *, num_kv_heads=None, head_dim=None, value_head_dim=None,
                 use_forget_gate=False, use_qk_norm=False, w_rank=32, conv_size=3, bias=False,
                 backend="auto", layer_idx=0, device=None, dtype=None):
        super().__init__()
        H = num_kv_heads or num_heads
        D = head_dim or hidden_size // num_heads
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, H, D
        self.backend = backend
        kw = dict(device=device, dtype=dtype)
        self.q_proj = nn.Linear(hidden_size, num_heads * D, bias=bias, **kw)
        self.k_proj = nn.Linear(hidden_size, H * D, bias=bias, **kw)
        self.v_proj = nn.Linear(hidden_size, H * D, bias=bias, **kw)
        self.w_proj = nn.Sequential(nn.Linear(hidden_size, w_rank, bias=False, **kw),
                                    nn.Linear(w_rank, H * D, bias=False, **kw))
        self.w_conv = nn.Conv1d(H * D, H * D, conv_size, groups=H * D, padding=conv_size - 1, bias=False, **kw)
        self.bt_proj = nn.Linear(hidden_size, H, bias=True, **kw)
        self.g_proj = nn.Linear(hidden_size, num_heads, bias=True, **kw) if use_forget_gate else None
        self.o_proj = nn.Linear(num_heads * D, hidden_size, bias=bias, **kw)

    def forward(self, hidden_states, *, cache=None, cu_seqlens=None):
        B, T, _ = hidden_states.shape
        q = self.q_proj(hidden_states).view(B, T, self.num_heads, self.head_dim)
        k = self.k_proj(hidden_states).view(B, T, self.num_kv_heads, self.head_dim)
        v = self.v_proj(hidden_states).view(B, T, self.num_kv_heads, self.head_dim)
        w = self.w_proj(hidden_states).transpose(1, 2)
        w = F.silu(self.w_conv(w)[..., :T]).transpose(1, 2).float()
        w = F.normalize(w.view(B, T, self.num_kv_heads, self.head_dim), dim=-1)
        beta = (2 * torch.sigmoid(self.bt_proj(hidden_states).float())).clamp(max=2 - 2 ** -6)
        g = F.logsigmoid(self.g_proj(hidden_states).float()) if self.g_proj is not None else None
        o = path_attention(q, k, v, w, beta, g, backend=self.backend)
        return self.o_proj(o.reshape(B, T, -1).to(hidden_states.dtype))
