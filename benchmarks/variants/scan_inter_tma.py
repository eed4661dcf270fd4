"""Candidate forward ``scan_inter_kernel``: the transported keys and the values read through TMA tensor
descriptors, optionally as one flat loop over every key tile of every earlier super-chunk.

The shipped kernel reads KJ and V with block pointers (address tiles in registers, cp.async) and walks
the super-chunks in a nested loop whose inner loop has S / BLOCK_N iterations (8 at S = 1024, BLOCK_N =
128): the software pipeline fills and drains once per super-chunk.  Here:

- the loads are TMA copies (``TensorDescriptor`` over the [N, H * D] / [N, H * DV] views; a key tile of
  a super-chunk J < I never crosses a sequence end, so no masks), which frees the address registers;
- ``tl.dot(p, v, acc)`` accumulates into the output tile in the MMA itself;
- FLAT: one loop of sc_idx * S / BLOCK_N iterations; at the last tile of a super-chunk J > 0 the carried
  queries advance, X <- X What_J (X float32 in its buffer, as shipped; the 16-bit copy Xd is the
  loop-carried operand), inside the loop, so the pipeline fills once per query block.

Requires D == BD and DV == BDV (power-of-two head dims up to 128: the descriptor's column block is one
head's slice).  ``TmaScanInter`` launches it with the shipped kernel's arguments (for
benchmarks/scan_probe.py), building the descriptors from them.
"""
from __future__ import annotations

import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from pathtune.codegen.triton._ops import mm, tdot, tile_of


@triton.jit
def _step(s, m_i, l_i, acc, v, INTERP: tl.constexpr):
    """One online-softmax step of base-2 logits s, the P V product accumulated in the MMA."""
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None]
    if INTERP:
        acc = acc + mm(p.to(v.dtype), v, INTERP)
    else:
        acc = tl.dot(p.to(v.dtype), v, acc)
    return m_new, l_i, acc


@triton.jit
def _tile(Xd, kj_desc, v_desc, krow, h, gc_h, rn, m_i, l_i, acc, qk_scale, gate_scale,
          D: tl.constexpr, DV: tl.constexpr, DT: tl.constexpr, USE_GATE: tl.constexpr, INTERP: tl.constexpr):
    KJ = kj_desc.load([krow, (h * D).to(tl.int32)]).to(DT)
    Vt = v_desc.load([krow, (h * DV).to(tl.int32)])
    sj = mm(Xd, tl.trans(KJ), INTERP)
    if USE_GATE:
        c_kj = tl.load(gc_h + krow + rn)
        sj = sj * qk_scale - (c_kj * gate_scale)[None, :]
    else:
        sj = sj * qk_scale
    return _step(sj, m_i, l_i, acc, Vt, INTERP)


@triton.jit
def _advance_queries(x_blk, what_ptr, sc_base, jj, h, H: tl.constexpr, BD: tl.constexpr, TP: tl.constexpr,
                     INTERP: tl.constexpr):
    """X <- X What_J in place in x's buffer (float32); returns the new X."""
    d = tl.arange(0, BD)
    Wh = tl.load(what_ptr + (((sc_base + jj) * H + h) * BD + d[:, None]) * BD + d[None, :])
    X = tl.load(x_blk, boundary_check=(0, 1), padding_option="zero")
    tl.debug_barrier()   # every thread has read its part of X before any row is overwritten
    Xn = tdot(X, Wh, TP, INTERP)
    tl.store(x_blk, Xn, boundary_check=(0, 1))
    tl.debug_barrier()
    return Xn


@triton.jit
def scan_inter_tma_kernel(
    x_ptr, kj_desc, v_desc, what_ptr, gc_ptr, o_part_ptr,
    o_ptr, lse_ptr,
    blk_tok0, blk_seq, seq_start, seq_end, seq_sc_base,
    n_blocks, qk_scale, gate_scale, gc_hs,
    HQ: tl.constexpr, H: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    BD: tl.constexpr, BDV: tl.constexpr, BLOCK_M: tl.constexpr, S: tl.constexpr, BLOCK_N: tl.constexpr,
    DB: tl.constexpr, DT: tl.constexpr, TP: tl.constexpr, USE_GATE: tl.constexpr, INTERP: tl.constexpr,
    FLAT: tl.constexpr,
):
    """``scan_inter_kernel`` (same grid, same in-place buffers) with kj / v as tensor descriptors."""
    n = n_blocks - 1 - tl.program_id(0)
    hq = tl.program_id(1)
    h = hq // (HQ // H)
    tok0, sid, s0, send = tile_of(n, blk_tok0, blk_seq, seq_start, seq_end)
    sc_base = tl.load(seq_sc_base + sid)
    sc_idx = (tok0 - s0) // S

    r = tl.arange(0, BLOCK_M)
    n_rows = (send - tok0).to(tl.int32)
    rmask = r < n_rows
    q_base = tok0.to(tl.int64) * HQ + hq
    o_blk = tl.make_block_ptr(o_part_ptr + q_base * DV, (n_rows, DV), (HQ * DV, 1), (0, 0), (BLOCK_M, BDV), (1, 0))
    acc = tl.load(o_blk, boundary_check=(0, 1), padding_option="zero")
    m_i = tl.load(lse_ptr + q_base + r * HQ, mask=rmask, other=0.0) * 1.4426950408889634
    l_i = tl.full((BLOCK_M,), 1.0, tl.float32)
    if sc_idx > 0:
        x_blk = tl.make_block_ptr(x_ptr + q_base * D, (n_rows, D), (HQ * D, 1), (0, 0), (BLOCK_M, BD), (1, 0))
        gc_h = gc_ptr + hq.to(tl.int64) * gc_hs
        if USE_GATE:
            c_q = tl.load(gc_h + tok0 + r, mask=rmask, other=0.0)
            m_i = m_i - c_q * gate_scale
        rn = tl.arange(0, BLOCK_N)
        NT: tl.constexpr = S // BLOCK_N
        s0i = s0.to(tl.int32)
        if FLAT:
            Xd = tl.load(x_blk, boundary_check=(0, 1), padding_option="zero").to(DT)
            for it in range(0, sc_idx * NT):
                jj = sc_idx - 1 - it // NT
                t = it % NT
                krow = (s0i + jj * S + t * BLOCK_N).to(tl.int32)
                m_i, l_i, acc = _tile(Xd, kj_desc, v_desc, krow, h, gc_h, rn, m_i, l_i, acc, qk_scale, gate_scale,
                                      D, DV, DT, USE_GATE, INTERP)
                if (t == NT - 1) & (jj > 0):
                    Xd = _advance_queries(x_blk, what_ptr, sc_base, jj, h, H, BD, TP, INTERP).to(DT)
        else:
            for step in range(0, sc_idx):
                jj = sc_idx - 1 - step
                Xd = tl.load(x_blk, boundary_check=(0, 1), padding_option="zero").to(DT)
                for t in range(0, NT):
                    krow = (s0i + jj * S + t * BLOCK_N).to(tl.int32)
                    m_i, l_i, acc = _tile(Xd, kj_desc, v_desc, krow, h, gc_h, rn, m_i, l_i, acc, qk_scale,
                                          gate_scale, D, DV, DT, USE_GATE, INTERP)
                if jj > 0:
                    _advance_queries(x_blk, what_ptr, sc_base, jj, h, H, BD, TP, INTERP)
        if USE_GATE:
            m_i = m_i + c_q * gate_scale
        tl.store(lse_ptr + q_base + r * HQ, (m_i + tl.log2(l_i)) * 0.6931471805599453, mask=rmask)
    o_out = tl.make_block_ptr(o_ptr + q_base * DV, (n_rows, DV), (HQ * DV, 1), (0, 0), (BLOCK_M, BDV), (1, 0))
    tl.store(o_out, (acc / l_i[:, None]).to(o_ptr.dtype.element_ty), boundary_check=(0, 1))


class TmaScanInter:
    """Launches ``scan_inter_tma_kernel`` with ``scan_inter_kernel``'s launch arguments: ``kernel[grid](*args,
    **kw)`` as for the shipped kernel (kj and v, arguments 1 and 2, become descriptors)."""

    def __init__(self, flat: bool, block_n: int | None = None, num_stages: int | None = None):
        self.flat, self.block_n, self.num_stages = flat, block_n, num_stages

    @staticmethod
    def applies(kw: dict) -> bool:
        return kw["D"] == kw["BD"] and kw["DV"] == kw["BDV"]

    def __getitem__(self, grid):
        def launch(*args, **kw):
            kw = dict(kw, FLAT=self.flat)
            if self.block_n:
                kw["BLOCK_N"] = self.block_n
            if self.num_stages:
                kw["num_stages"] = self.num_stages
            kj, v = args[1], args[2]
            kj_desc = TensorDescriptor.from_tensor(kj.view(kj.shape[0], -1), [kw["BLOCK_N"], kw["BD"]])
            v_desc = TensorDescriptor.from_tensor(v.view(v.shape[0], -1), [kw["BLOCK_N"], kw["BDV"]])
            return scan_inter_tma_kernel[grid](args[0], kj_desc, v_desc, *args[3:], **kw)
        return launch
