"""The untuned defaults of the Triton backend (``TritonParams.heuristic``).

Hashed for the bwd pass only (``PASS_SOURCES``): a fwd or decode record stores every knob its
kernels read, so which config the runtime falls back to, or a tune starts from, changes none of those
measurements; a bwd record times forward + backward, and the forward's own tiles (block_m, block_n,
warps, stages) come from here.  Revising a default retires the bwd records, not the others.
"""
from __future__ import annotations


def heuristic_knobs(head_dim: int, head_dim_v: int | None = None) -> dict:
    """Knob values that differ from the spec defaults for these head dims.

    Spec defaults, shrunk where they do not fit an sm_90 multiprocessor (228 KB shared memory;
    ``python -m pathtune.codegen.triton.compile_check --head-dim D``): up to head dim 128 the forward's
    transition products take fp16 operands and its inter scan 128-key tiles; above head dim 64 the
    backward loops run single-stage and its D x D transition products use one tf32 pass instead
    of three; the backward runs 8 warps (at D = 128 its kernels spill at 4: bwd_intra 4.4 KB per
    thread; on the H200 8 warps took a D = 128, T = 4096 forward+backward from 50.1 to 43.7 ms); the
    decode kernel gets 8 warps (with 4, its fp32 key tile of 128 x 128 takes 252 registers a thread)
    and key tiles of 64 rows (112 registers: two programs per multiprocessor, instead of one at 128
    rows).  Decoding splits the cache 16 ways (capped by its tiles): with 4, a batch of 8 x 16 heads
    launches 512 programs, 1.3 waves of an H200 at three programs per SM, and the second wave runs
    a third full.

    Above head dim 128 (padded 256) the D x D transitions run column-blocked (forward
    ``transition_column_block``) and the tiles shrink until every kernel fits (compile_check, sm_90,
    D = 256): UT chunks of 32 (at 64 the backward's intra, transport and UT kernels need 393, 246
    and 377 KB); query tiles of 64 rows and key tiles of 32 in the inter kernels, forward and
    backward (block_m, block_n, bwd_block_m, bwd_block_n; with bwd 128 / 64 the key-side inter
    backward needs 279 KB, and the forward's inter scan at 128 / 64 spills 1.5 KB a thread
    instead of 148 B).  Super-chunks of 2048 tokens: the backward holds dOm and the precomputed
    Om of every super-chunk pair at once (n_sc^2 tiles of 256 x 256 float32 per head and sequence,
    256 KB each): 2 x 16 MB per head and sequence at T = 16384 (64 pairs), against 2 x 64 MB at 1024.
    """
    d = max(head_dim, head_dim_v or head_dim)
    # the forward's transitions on fp16 operands and 128-key tiles (H200, benchmarks/fwd_probe.py, B*T = 32K,
    # same o error 2.1e-3): at D = 128, T = 4K the forward went 2.86 -> 2.46 ms (with num_stages 2 for the inter
    # scan, which fits once X What_J no longer needs float32 tiles: 131 -> 99 KB of shared memory); D = 64 T = 4K
    # 3.35 -> 2.78 ms
    fwd = dict(transition_precision="fp16", block_n=128)
    if d <= 64:
        return dict(fwd, decode_splits=16)
    knobs = dict(fwd, num_stages=2, bwd_num_stages=1, bwd_transition_precision="tf32",
                 num_warps=8 if d > 128 else 4, bwd_num_warps=8,
                 decode_block_n=64, decode_num_warps=8, decode_splits=16)
    if d > 128:
        knobs.update(chunk_size=32, superchunk_size=2048, block_m=64, block_n=32, bwd_block_m=64, bwd_block_n=32,
                     num_stages=1, transition_precision="tf32")
    return knobs
