"""Blockwise PaTH(-FoX) attention: the executable specification of the fast kernels.

Written for clarity, not speed (Python loops over chunks). Two levels of blocking:

* UT chunks of C = chunk_size tokens. Per chunk m (rows W_m [C,D], beta_m [C], K_m, Q_m):
      T_m   = I + strictLower(diag(beta_m) W_m W_m^T)
      A_m   = T_m^{-1} diag(beta_m)                     (unit-lower triangular solve)
      U_m   = A_m W_m
      P_m   = I - W_m^T U_m        = H_last ... H_first of the chunk (later on the left)
      Q~_m  = Q_m - tril(Q_m W_m^T) U_m                 row i = q_i^T H_i ... H_first
      K~_m  = K_m - (A_m strictLower(W_m K_m^T))^T W_m  row j = (H_last ... H_{j+1} k_j)^T
      S_mm  = tril(Q_m K_m^T) - tril(Q_m W_m^T) A_m strictLower(W_m K_m^T)   (diagonal tile)
  (tril includes the diagonal, strictLower does not.)
* Super-chunks of superchunk_size = s*C tokens. Walking the chunks of super-chunk J right to
  left with a running D x D matrix Suf (start I): KJ_m = K~_m Suf^T, Suf <- Suf P_m; at the
  end Suf = What_J = P_last ... P_first. KJ rows are keys transported to the END of J.
* Scan for query chunk c in super-chunk I: X = Q~_c; online softmax starts with the diagonal
  tile; for m = c-1 down to the first chunk of I: logits X K~_m^T, update, X <- X - (X W_m^T) U_m
  (= X P_m); then for J = I-1 down to 0: logits X KJ_J^T, update, X <- X What_J.
  Normalise -> o, lse.

The sequence is padded to a multiple of C with w = 0, beta = 0, k = q = v = 0, g = 0; padded
keys are masked (they only occur in the last chunk's diagonal tile), padded queries dropped.
All pieces below work on arbitrary leading batch dims and broadcast (e.g. Q [B,H,G,C,D] with
W [B,H,1,C,D] for GQA).

Math and the kernels that implement each piece, in docs/algorithm.md:
  blocking                   docs/algorithm.md#chunks-and-super-chunks
  ut_transform, boundary_*,  docs/algorithm.md#ut-transform
  diagonal_logits, chunk_transition, apply_transition
  the inner scan loops       docs/algorithm.md#intra-super-chunk-scan, docs/algorithm.md#inter-super-chunk-scan
  superchunk_transport       docs/algorithm.md#super-chunk-transport
  online_softmax_*           docs/algorithm.md#online-softmax-and-lse
(this reference solves T with a triangular solve in the compute dtype; the kernels' blocked
inverse and precision choices: docs/algorithm.md#inverting-t, docs/algorithm.md#precision).
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from ._common import (apply_gate, check_gate_placement, check_inputs, compute_dtype,
                      from_grouped, resolve_scale, segments, to_grouped)

__all__ = [
    "blockwise_path_attention", "ut_transform", "chunk_transition", "boundary_adjust",
    "boundary_adjust_queries", "boundary_adjust_keys", "diagonal_logits", "apply_transition",
    "superchunk_transport", "online_softmax_init", "online_softmax_update",
    "online_softmax_finalize", "apply_gate", "ut_stage_tokens",
]

OnlineState = Tuple[Tensor, Tensor, Tensor]   # (running max m [..,Cq], denominator l [..,Cq], acc [..,Cq,DV])


def _tril(x: Tensor) -> Tensor:          # lower triangle including the diagonal
    return torch.tril(x)


def _strict_lower(x: Tensor) -> Tensor:  # lower triangle excluding the diagonal
    return torch.tril(x, diagonal=-1)


def ut_transform(W: Tensor, beta: Tensor) -> Tuple[Tensor, Tensor]:
    """UT transform of one chunk.

    W [..., C, D], beta [..., C] -> (A [..., C, C], U [..., C, D]) with
    A = (I + strictLower(diag(beta) W W^T))^{-1} diag(beta) (lower triangular), U = A W.
    Then H_{C-1} ... H_0 = I - W^T A W = I - W^T U.
    """
    C = W.shape[-2]
    eye = torch.eye(C, dtype=W.dtype, device=W.device)
    Tm = eye + _strict_lower(beta[..., :, None] * (W @ W.transpose(-1, -2)))
    Db = torch.diag_embed(beta)
    A = torch.linalg.solve_triangular(Tm, Db, upper=False, unitriangular=True)
    return A, A @ W


def chunk_transition(W: Tensor, U: Tensor) -> Tensor:
    """Dense chunk transition P = I - W^T U = H_last ... H_first  ([..., D, D]).

    Acting on row vectors from the right: x^T P = x^T H_last ... H_first.
    """
    D = W.shape[-1]
    return torch.eye(D, dtype=W.dtype, device=W.device) - W.transpose(-1, -2) @ U


def apply_transition(X: Tensor, W: Tensor, U: Tensor) -> Tensor:
    """Low-rank X P = X - (X W^T) U for rows X [..., R, D] (P = chunk_transition(W, U))."""
    return X - (X @ W.transpose(-1, -2)) @ U


def boundary_adjust_queries(Q: Tensor, W: Tensor, U: Tensor) -> Tensor:
    """Q~ = Q - tril(Q W^T) U: row i = q_i^T H_i ... H_first (the chunk's first token)."""
    return Q - _tril(Q @ W.transpose(-1, -2)) @ U


def boundary_adjust_keys(K: Tensor, W: Tensor, A: Tensor) -> Tensor:
    """K~ = K - (A strictLower(W K^T))^T W: row j = (H_last ... H_{j+1} k_j)^T."""
    return K - (A @ _strict_lower(W @ K.transpose(-1, -2))).transpose(-1, -2) @ W


def ut_stage_tokens(w: Tensor, k: Tensor, beta: Tensor, C: int) -> Tuple[Tensor, Tensor, Tensor]:
    """U, K~, M of the UT stage in float64 for token-major inputs (w, k [N, H, D], beta [N, H]; one sequence,
    N a multiple of C), token-major like the Triton kernels' outputs (U, K~ [N, H, D], M [N, H, C])."""
    N, H, D = w.shape
    W = w.double().view(N // C, C, H, D).transpose(1, 2)            # [n, H, C, D]
    K = k.double().view(N // C, C, H, D).transpose(1, 2)
    A, U = ut_transform(W, beta.double().view(N // C, C, H).transpose(1, 2))
    M = A @ _strict_lower(W @ K.transpose(-1, -2))

    def back(x: Tensor) -> Tensor:
        return x.transpose(1, 2).reshape(N, H, x.shape[-1])
    return back(U), back(boundary_adjust_keys(K, W, A)), back(M)


def diagonal_logits(Q: Tensor, K: Tensor, W: Tensor, A: Tensor) -> Tensor:
    """Raw scores of the diagonal tile: tril(Q K^T) - tril(Q W^T) A strictLower(W K^T).

    Entry (i, j), j <= i, = q_i^T H_i ... H_{j+1} k_j; entries above the diagonal are 0.
    """
    return _tril(Q @ K.transpose(-1, -2)) - _tril(Q @ W.transpose(-1, -2)) @ A @ \
        _strict_lower(W @ K.transpose(-1, -2))


def boundary_adjust(Q: Tensor, K: Tensor, W: Tensor, A: Tensor, U: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """(Q~, K~, S_diag) of one chunk; see the three functions above."""
    return (boundary_adjust_queries(Q, W, U), boundary_adjust_keys(K, W, A),
            diagonal_logits(Q, K, W, A))


def superchunk_transport(K_tilde: Sequence[Tensor], P: Sequence[Tensor]) -> Tuple[List[Tensor], Tensor]:
    """Transport boundary-adjusted keys of consecutive chunks to the end of their super-chunk.

    K_tilde[m] [..., C, D] (rows (H_end_m ... H_{j+1} k_j)^T), P[m] [..., D, D] chunk transitions,
    m = 0..s-1 in sequence order. Walks right to left with Suf (start I):
    KJ[m] = K_tilde[m] Suf^T, then Suf <- Suf P[m].
    Returns (KJ list in sequence order, What = P[s-1] ... P[0]).
    """
    D = K_tilde[0].shape[-1]
    Suf = torch.eye(D, dtype=K_tilde[0].dtype, device=K_tilde[0].device)
    KJ: List[Optional[Tensor]] = [None] * len(K_tilde)
    for m in range(len(K_tilde) - 1, -1, -1):
        KJ[m] = K_tilde[m] @ Suf.transpose(-1, -2)
        Suf = Suf @ P[m]
    return KJ, Suf


def online_softmax_init(logits: Tensor, V: Tensor) -> OnlineState:
    """Start the online softmax from a tile of logits [..., Cq, Ck] (every row needs a finite entry)."""
    m = logits.amax(dim=-1)
    p = torch.exp(logits - m[..., None])
    return m, p.sum(-1), p @ V


def online_softmax_update(state: OnlineState, logits: Tensor, V: Tensor) -> OnlineState:
    """FlashAttention update of (m, l, acc) with a new tile of logits [..., Cq, Ck] and V [..., Ck, DV]."""
    m, l, acc = state
    m_new = torch.maximum(m, logits.amax(dim=-1))
    alpha = torch.exp(m - m_new)
    p = torch.exp(logits - m_new[..., None])
    return m_new, l * alpha + p.sum(-1), acc * alpha[..., None] + p @ V


def online_softmax_finalize(state: OnlineState) -> Tuple[Tensor, Tensor]:
    """(o = acc / l, lse = m + log l)."""
    m, l, acc = state
    return acc / l[..., None], m + torch.log(l)


def _blockwise_core(q, k, v, w, beta, g, scale, gate_placement, C, SC):
    """One sequence (or equal-length batch) in grouped layout -> (o [B,H,G,T,DV], lse [B,H,G,T])."""
    T = q.shape[-2]
    Tp = -(-T // C) * C
    pad = Tp - T
    if pad:
        q, k, v, w = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v, w))
        beta = F.pad(beta, (0, pad))
        g = None if g is None else F.pad(g, (0, pad))
    c = None if g is None else torch.cumsum(g, dim=-1)
    NC = Tp // C
    s = SC // C
    sl = [slice(m * C, (m + 1) * C) for m in range(NC)]

    # ---- per UT chunk preprocessing
    A, U, P, Qt, Kt, Sd = [], [], [], [], [], []
    for m in range(NC):
        Wm = w[..., sl[m], :]
        Am, Um = ut_transform(Wm, beta[..., sl[m]])
        q_t, k_t, s_d = boundary_adjust(q[..., sl[m], :], k[..., sl[m], :], Wm, Am, Um)
        A.append(Am); U.append(Um); P.append(chunk_transition(Wm, Um))
        Qt.append(q_t); Kt.append(k_t); Sd.append(s_d)

    # ---- per super-chunk key transport
    NS = -(-NC // s)
    KJ, What = [], []
    for J in range(NS):
        chunks = range(J * s, min((J + 1) * s, NC))
        kj, wh = superchunk_transport([Kt[m] for m in chunks], [P[m] for m in chunks])
        KJ.append(torch.cat(kj, dim=-2))
        What.append(wh)

    def csl(x, a, b):
        return None if x is None else x[..., a:b]

    # ---- scan
    pos = torch.arange(C, device=q.device)
    causal = pos[:, None] >= pos[None, :]
    outs, lses = [], []
    for cq in range(NC):
        I = cq // s
        q0, q1 = cq * C, (cq + 1) * C
        ci = csl(c, q0, q1)
        key_valid = (q0 + pos) < T
        logits = apply_gate(Sd[cq], ci, ci, scale, gate_placement)
        logits = logits.masked_fill(~(causal & key_valid[None, :]), float("-inf"))
        state = online_softmax_init(logits, v[..., q0:q1, :])
        X = Qt[cq]
        for m in range(cq - 1, I * s - 1, -1):
            logits = apply_gate(X @ Kt[m].transpose(-1, -2), ci, csl(c, m * C, (m + 1) * C),
                                scale, gate_placement)
            state = online_softmax_update(state, logits, v[..., sl[m], :])
            X = apply_transition(X, w[..., sl[m], :], U[m])
        for J in range(I - 1, -1, -1):
            k0, k1 = J * SC, (J + 1) * SC
            logits = apply_gate(X @ KJ[J].transpose(-1, -2), ci, csl(c, k0, k1), scale, gate_placement)
            state = online_softmax_update(state, logits, v[..., k0:k1, :])
            X = X @ What[J]
        o_c, lse_c = online_softmax_finalize(state)
        outs.append(o_c)
        lses.append(lse_c)
    o = torch.cat(outs, dim=-2)[..., :T, :]
    lse = torch.cat(lses, dim=-1)[..., :T]
    return o, lse


def blockwise_path_attention(q: Tensor, k: Tensor, v: Tensor, w: Tensor, beta: Tensor,
                             g: Optional[Tensor] = None, *, scale: Optional[float] = None,
                             cu_seqlens: Optional[Union[Tensor, Sequence[int]]] = None,
                             chunk_size: int = 64, superchunk_size: int = 256,
                             gate_placement: str = "inside_scale") -> Tuple[Tensor, Tensor]:
    """Two-level blockwise PaTH(-FoX) forward (see module docstring for the algorithm).

    Shapes as in naive_path_attention: q [B,T,HQ,D], k/w [B,T,H,D], v [B,T,H,DV], beta [B,T,H],
    g [B,T,HQ] or None, cu_seqlens 1-D [0..T] with B == 1. superchunk_size must be a positive
    multiple of chunk_size.

    Returns (o [B,T,HQ,DV] in q.dtype, lse [B,T,HQ] in the compute dtype).
    """
    check_gate_placement(gate_placement)
    if chunk_size <= 0 or superchunk_size <= 0 or superchunk_size % chunk_size:
        raise ValueError("superchunk_size must be a positive multiple of chunk_size "
                         f"(got chunk_size={chunk_size}, superchunk_size={superchunk_size})")
    B, T, HQ, H, G, D, DV = check_inputs(q, k, v, w, beta, g)
    scale = resolve_scale(scale, D)
    dt = compute_dtype(q, k, v, w, beta, g)
    qg, kg, vg, wg, bg, gg = to_grouped(q, k, v, w, beta, g, H, G, dt)
    outs, lses = [], []
    for bos, eos in segments(cu_seqlens, B, T):
        o_s, l_s = _blockwise_core(qg[..., bos:eos, :], kg[..., bos:eos, :], vg[..., bos:eos, :],
                                   wg[..., bos:eos, :], bg[..., bos:eos],
                                   None if gg is None else gg[..., bos:eos], scale, gate_placement,
                                   chunk_size, superchunk_size)
        outs.append(o_s)
        lses.append(l_s)
    o = from_grouped(torch.cat(outs, dim=-2)).to(q.dtype)
    return o, from_grouped(torch.cat(lses, dim=-1))
