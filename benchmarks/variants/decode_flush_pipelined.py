"""Candidate ``decode_kernel``s for the flush step (built from codegen/triton/decode.py by text replacement,
``kernel_variants``; same signature and launch arguments).

A flush step rotates every frame row of the program's split in blocks of ROT_ROWS rows: load the block, two
products with the pending transitions in compact WY form, store it back.  The shipped loop runs those rounds one
after the other (a 32K-cache flush step takes 0.68-0.88 ms against 0.26-0.31 for a plain step, while rewriting K
is ~0.035 ms of HBM traffic: the rounds' latency, not bandwidth, sets it).  ``tl.range(..., num_stages=N)`` does
not pipeline this loop in Triton 3.6 (offline sm_90 builds: no async copies, the same shared memory; the load
feeds a float32 product after a conversion), so ``decode_kernel_flush_prefetch`` does it by hand: the next
block's keys (in the cache dtype) are loaded before this block's products and store, one block in flight behind
each block's work (blocks are disjoint rows: a later block's load never reads a row an earlier store writes).
Offline sm_90 at the heuristic configs: the same registers (255 at D128, 239 -> 254 at D64 one token), spills
256 -> 264 B (D128, one token), 444 -> 456 B (16 tokens).

``decode_kernel_flush_inloop`` drops the second pass: on a flush step the attention loop rotates each key tile right
after its logits, in the shipped pass's ROT_ROWS-row rounds, reading the tile back from L2 (the loop has just read
it from HBM) instead of a second HBM pass over the split.  W and M = T W are formed before the loop (zeros on a
non-flush step, where the loop's rotation branch is skipped).  Rotating the registers' tile itself instead made
the compiler stage every tile (flush or not) as float32 in shared memory (128 KB at D128, 3.6 KB of spills).
Same rows, same products, same rounding as the shipped pass: the rotated keys and the output are equal.

``python benchmarks/decode_probe.py --skip checks,profiles,hostprofile,generate --tokens 1,16 --candidate-decode
benchmarks/variants/decode_flush_pipelined.py:decode_kernel_flush_prefetch,benchmarks/variants/decode_flush_pipelined.py:decode_kernel_flush_inloop``
(``candidate_flush_net_ms``, ``candidate2_flush_net_ms`` beside ``flush_net_ms``); tests/test_triton_decode.py
checks both against the shipped kernel.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pathtune.codegen.triton.decode as decode_mod

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))      # benchmarks/: kernel_variants
from kernel_variants import load_variant, module_source  # noqa: E402

SHIPPED_LOOP = """        for r0 in range(t_lo * BLOCK_N, row_hi, ROT_ROWS):
            kr = r0 + rr
            kmask = (kr < row_hi)[:, None] & dmask[None, :]
            kro = kr.to(tl.int64) if OFF64 else kr
            kroff = kro[:, None] * (H * D) + d[None, :]
            Kf = tl.load(k_base + kroff, mask=kmask, other=0.0).to(tl.float32)
"""
PREFETCH_LOOP = """        r_lo = t_lo * BLOCK_N
        kr_n = r_lo + rr
        kmask_n = (kr_n < row_hi)[:, None] & dmask[None, :]
        kro_n = kr_n.to(tl.int64) if OFF64 else kr_n
        K_n = tl.load(k_base + kro_n[:, None] * (H * D) + d[None, :], mask=kmask_n, other=0.0)
        for r0 in range(r_lo, row_hi, ROT_ROWS):
            kr = r0 + rr
            kmask = (kr < row_hi)[:, None] & dmask[None, :]
            kro = kr.to(tl.int64) if OFF64 else kr
            kroff = kro[:, None] * (H * D) + d[None, :]
            Kf = K_n.to(tl.float32)
            kr_n = kr + ROT_ROWS             # the next block's keys, in flight behind this block's products
            kmask_n = (kr_n < row_hi)[:, None] & dmask[None, :]
            kro_n = kr_n.to(tl.int64) if OFF64 else kr_n
            K_n = tl.load(k_base + kro_n[:, None] * (H * D) + d[None, :], mask=kmask_n, other=0.0)
"""

decode_kernel_flush_prefetch = load_variant(module_source(decode_mod), "decode_kernel", "decode_flush_prefetch",
                                            [(SHIPPED_LOOP, PREFETCH_LOOP)])

# the flush's WY factors before the tile loop (zeros when this step does not flush)
SHIPPED_LOOP_HEAD = """    for tile in tl.range(t_lo, t_hi, num_stages=STAGES):
"""
INLOOP_HEAD = """    if flush:
        Wm, M = _wy(F, NP, pw_base, pb_base, wb, bb, P, H, D, d, dmask, PB, BETA_MAX, F32)
    else:
        Wm = tl.zeros([PB, BD], tl.float32)
        M = tl.zeros([PB, BD], tl.float32)
    ROT_ROWS: tl.constexpr = 8192 // BD if BD <= 128 else 16
    rr = tl.arange(0, ROT_ROWS)
    for tile in tl.range(t_lo, t_hi, num_stages=STAGES):
"""
SHIPPED_LOOP_TAIL = """        acc = acc * alpha[:, None] + _pv(p, V, ROWWISE, F32, INTERP)
        m_i = m_new
"""


def _second_pass(src: str) -> str:
    """The shipped kernel's second pass over the split's frame rows: from its ``if flush:`` to its store."""
    start = src.index("    if flush:\n        # the split's frame rows, rotated")
    end = src.index("tl.store(k_base + kroff, _to_cache(Kf, cdt, INTERP), mask=kmask)\n", start)
    return src[start:src.index("\n", end) + 1]


def _inloop_tail(src: str) -> str:
    """The end of the tile loop's body on a flush step: the shipped pass's rounds over this tile's rows (read back
    from L2: the loop has just read them), after a barrier (every thread is past its reads of the tile)."""
    body = _second_pass(src)
    body = body[body.index("            kr = r0 + rr\n"):]
    return SHIPPED_LOOP_TAIL + """        if flush:
            tl.debug_barrier()
            row_hi = tl.minimum(tile * BLOCK_N + BLOCK_N, F)
            for r0 in range(tile * BLOCK_N, row_hi, ROT_ROWS):
""" + "".join("    " + line + "\n" for line in body.splitlines())


_SRC = module_source(decode_mod)
decode_kernel_flush_inloop = load_variant(_SRC, "decode_kernel", "decode_flush_inloop",
                                          [(SHIPPED_LOOP_HEAD, INLOOP_HEAD),
                                           (SHIPPED_LOOP_TAIL, _inloop_tail(_SRC)), (_second_pass(_SRC), "")])
