"""pathtune.runtime.reference: PyTorch reference implementations of PaTH / PaTH-FoX attention.

* naive_path_attention      - the oracle (full logit matrix, autograd-differentiable)
* blockwise_path_attention  - the executable spec of the fast kernels (UT chunks + super-chunks)
* path_attention_prefill / path_attention_decode_step / path_attention_decode - decoding with a
  current-frame KV cache (PaTHKVCache)
* the blockwise pieces (ut_transform, boundary_adjust, ...) for kernel unit tests

Conventions: q [B,T,HQ,D], k/w [B,T,H,D], v [B,T,H,DV], beta [B,T,H], g [B,T,HQ] (log forget
gate), HQ = G*H with query head h using kv head h // G;
S_ij = q_i^T H_i ... H_{j+1} k_j, H_t = I - beta_t w_t w_t^T.

The math, in the notation used here and with the kernels that implement each piece: docs/algorithm.md
(each module cites its sections, e.g. docs/algorithm.md#notation-and-layout).
"""
from ._common import apply_gate
from .blockwise import (apply_transition, blockwise_path_attention, boundary_adjust,
                        boundary_adjust_keys, boundary_adjust_queries, chunk_transition,
                        diagonal_logits, online_softmax_finalize, online_softmax_init,
                        online_softmax_update, superchunk_transport, ut_transform)
from .naive import naive_path_attention, naive_path_logits
from .recurrent import (PaTHKVCache, current_frame_keys, path_attention_decode,
                        path_attention_decode_step, path_attention_prefill)

__all__ = [
    "naive_path_attention", "naive_path_logits", "blockwise_path_attention",
    "path_attention_prefill", "path_attention_decode_step", "path_attention_decode",
    "PaTHKVCache", "current_frame_keys",
    "ut_transform", "chunk_transition", "boundary_adjust", "boundary_adjust_queries",
    "boundary_adjust_keys", "diagonal_logits", "apply_transition", "superchunk_transport",
    "online_softmax_init", "online_softmax_update", "online_softmax_finalize", "apply_gate",
]
