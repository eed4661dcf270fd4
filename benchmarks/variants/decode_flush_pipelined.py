"""Candidate ``decode_kernel``: the flush pass loads the next block of keys before the current block's products (built
from codegen/triton/decode.py by text replacement, ``kernel_variants``; same signature and launch arguments).

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

``python benchmarks/decode_probe.py --skip checks,profiles,hostprofile,generate --tokens 1,16 --candidate-decode
benchmarks/variants/decode_flush_pipelined.py:decode_kernel_flush_prefetch`` (``candidate_flush_net_ms`` beside
``flush_net_ms``); tests/test_triton_decode.py checks it against the shipped kernel.
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
