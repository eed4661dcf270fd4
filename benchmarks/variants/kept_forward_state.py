"""Candidate: the backward reuses the forward's UT / transport state instead of recomputing it.

Today the custom op ``pathtune::path_attn_fwd`` saves only o and lse; ``backward_state`` runs the UT stage,
the super-chunk transport and the gate cumsum again (``forward.prepare_state``).  Where the backward works
in several token ranges (B * T = 32K at the tuned shapes: 8 ranges) the state it recomputes is the forward's
own compact one (16-bit u, K~ and w copy, float32 m, the transported keys and the super-chunk transitions),
so keeping the forward's state gives the same gradients and saves one UT stage, one transport and one gate
cumsum per fwd+bwd, at the cost of holding that state from the forward to the backward (about 340 MiB at
B * T = 32K, D = 128, H = 8).  A shipped version needs the op to return the state's tensors for autograd to
save, under a memory-budget knob the user opts into (the default keeps the extra memory of one fwd+bwd at
T = 16K under 1.0 GiB); this candidate measures what it would give first.

``kept_forward_state()`` patches the Triton autograd module for the duration of a ``with`` block: every
forward stashes its ``ForwardState`` and the next backward takes it instead of recomputing.  Single-range
backwards (whose kernels read a float32 state, ``backward_state``) keep recomputing.  Timing and
measurement only: not thread-safe, not for torch.compile.
"""
from __future__ import annotations

import contextlib

import pathtune.codegen.triton.autograd as tri_autograd
import pathtune.codegen.triton.backward as tri_backward


@contextlib.contextmanager
def kept_forward_state():
    """Within the block, each Triton backward reuses the state of the forward before it (several ranges)."""
    real_fwd, real_state = tri_autograd.path_attention_fwd, tri_autograd.backward_state
    stash: list = []
    used = {"kept": 0, "recomputed": 0}

    def forward_keeping(*args, **kw):
        o, lse, state = real_fwd(*args, **kw)
        stash[:] = [state]
        return o, lse, state

    def state_for_backward(q, k, w, beta, g, *, cu_seqlens, params):
        state = stash.pop() if stash else None
        if state is not None:
            B, T, HQ, D = q.shape
            if tri_backward._range_count(state.tables, B * T, k.shape[2], HQ, D, params) > 1:
                used["kept"] += 1
                return state
        used["recomputed"] += 1
        return real_state(q, k, w, beta, g, cu_seqlens=cu_seqlens, params=params)

    tri_autograd.path_attention_fwd, tri_autograd.backward_state = forward_keeping, state_for_backward
    try:
        yield used
    finally:
        tri_autograd.path_attention_fwd, tri_autograd.backward_state = real_fwd, real_state
