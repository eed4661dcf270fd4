"""The Triton fallback knobs per head dim (``heuristic_knobs`` / ``TritonParams.heuristic``) are pinned
value for value: every head dim D and head_dim_v in 16..256 maps to one of three knob sets, and the
full params built from them are the spec defaults overlaid with that set.  Moving these defaults (to
the spec's table of defaults per head-dim range) must not change a single value."""
from __future__ import annotations

from dataclasses import asdict

import pytest

from pathtune.codegen.triton.heuristics import heuristic_knobs
from pathtune.codegen.triton.params import TritonParams

NARROW = {"block_n": 128, "decode_block_n": 256, "transition_precision": "fp16", "ut_diag_block": 8,
          "intra_num_stages": 2, "ut_precision": "tf32", "bwd_transition_precision": "tf32", "decode_frame_bound": 2048,
          "gate_bias": "product"}
MEDIUM = {"block_n": 128, "bwd_num_stages": 1, "bwd_transition_precision": "fp16",
          "num_stages": 3, "num_warps": 4, "transition_precision": "fp16", "bwd_dkv_block_n": 128,
          "bwd_dkv_num_warps": 8}
WIDE = {"block_m": 64, "block_n": 32, "bwd_block_m": 64, "bwd_block_n": 32, "bwd_num_stages": 1, "bwd_num_warps": 8,
        "bwd_inter_num_warps": 8,
        "bwd_transition_precision": "tf32", "chunk_size": 32, "decode_block_n": 64, "decode_num_warps": 8,
        "decode_splits": 16, "num_stages": 1, "num_warps": 8, "superchunk_size": 2048, "transition_precision": "tf32"}

# (D, head_dim_v) -> knob set; head_dim_v None means "same as D"
EXPECTED = {
    (16, None): NARROW, (16, 16): NARROW, (16, 32): NARROW, (16, 48): NARROW, (16, 64): NARROW, (16, 80): MEDIUM,
    (16, 96): MEDIUM, (16, 128): MEDIUM, (16, 192): WIDE, (16, 256): WIDE,
    (32, None): NARROW, (32, 16): NARROW, (32, 32): NARROW, (32, 48): NARROW, (32, 64): NARROW, (32, 80): MEDIUM,
    (32, 96): MEDIUM, (32, 128): MEDIUM, (32, 192): WIDE, (32, 256): WIDE,
    (48, None): NARROW, (48, 16): NARROW, (48, 32): NARROW, (48, 48): NARROW, (48, 64): NARROW, (48, 80): MEDIUM,
    (48, 96): MEDIUM, (48, 128): MEDIUM, (48, 192): WIDE, (48, 256): WIDE,
    (64, None): NARROW, (64, 16): NARROW, (64, 32): NARROW, (64, 48): NARROW, (64, 64): NARROW, (64, 80): MEDIUM,
    (64, 96): MEDIUM, (64, 128): MEDIUM, (64, 192): WIDE, (64, 256): WIDE,
    (80, None): MEDIUM, (80, 16): MEDIUM, (80, 32): MEDIUM, (80, 48): MEDIUM, (80, 64): MEDIUM, (80, 80): MEDIUM,
    (80, 96): MEDIUM, (80, 128): MEDIUM, (80, 192): WIDE, (80, 256): WIDE,
    (96, None): MEDIUM, (96, 16): MEDIUM, (96, 32): MEDIUM, (96, 48): MEDIUM, (96, 64): MEDIUM, (96, 80): MEDIUM,
    (96, 96): MEDIUM, (96, 128): MEDIUM, (96, 192): WIDE, (96, 256): WIDE,
    (128, None): MEDIUM, (128, 16): MEDIUM, (128, 32): MEDIUM, (128, 48): MEDIUM, (128, 64): MEDIUM,
    (128, 80): MEDIUM, (128, 96): MEDIUM, (128, 128): MEDIUM, (128, 192): WIDE, (128, 256): WIDE,
    (192, None): WIDE, (192, 16): WIDE, (192, 32): WIDE, (192, 48): WIDE, (192, 64): WIDE, (192, 80): WIDE,
    (192, 96): WIDE, (192, 128): WIDE, (192, 192): WIDE, (192, 256): WIDE,
    (256, None): WIDE, (256, 16): WIDE, (256, 32): WIDE, (256, 48): WIDE, (256, 64): WIDE, (256, 80): WIDE,
    (256, 96): WIDE, (256, 128): WIDE, (256, 192): WIDE, (256, 256): WIDE,
}

# every TritonParams field with no head-dim override (the spec defaults, beta_clip_eps 'off' as None)
BASE = {"chunk_size": 64, "superchunk_size": 1024, "block_n": 64, "block_m": 128, "num_warps": 4,
        "inter_num_warps": 8, "num_stages": 2, "intra_num_stages": 1, "scan_precision": "fp16",
        "transition_precision": "tf32x3",
        "bwd_transition_precision": "tf32x3", "beta_clip_eps": None, "ut_precision": "tf32x3",
        "ut_diag_block": 16, "ut_grad_precision": "tf32", "bwd_block_n": 64, "bwd_block_m": 64, "bwd_num_warps": 4,
        "bwd_inter_num_warps": 4,
        "bwd_num_stages": 2, "bwd_forward_state": "keep_inter",
        "decode_block_n": 128, "decode_num_warps": 4, "decode_splits": 4, "decode_num_stages": 1,
        "decode_pending_window": 16}


@pytest.mark.parametrize("dims", sorted(EXPECTED, key=lambda k: (k[0], k[1] or 0)), ids=str)
def test_heuristic_knobs_are_pinned(dims):
    head_dim, head_dim_v = dims
    got = heuristic_knobs(head_dim, head_dim_v)
    assert got == EXPECTED[dims]
    assert all(type(got[k]) is type(v) for k, v in EXPECTED[dims].items())


# knobs that only one pass's params class holds (a pass-only knob keys that pass's source hash alone): the decode
# pass's, the backward's and the forward's, with their spec defaults
DECODE_ONLY = {"decode_frame_bound": 0}
BWD_ONLY = {"bwd_dkv_block_n": 0, "bwd_dkv_num_warps": 0, "bwd_walk_chunks": 1, "bwd_gate_bias": "subtract"}
FWD_ONLY = {"gate_bias": "subtract"}


@pytest.mark.parametrize("dims", sorted(EXPECTED, key=lambda k: (k[0], k[1] or 0)), ids=str)
def test_heuristic_params_are_pinned(dims):
    from pathtune.codegen._knobs import resolve

    head_dim, head_dim_v = dims
    got = asdict(TritonParams.heuristic(head_dim, head_dim_v))
    assert got == {k: v for k, v in {**BASE, **EXPECTED[dims]}.items()
                   if k not in DECODE_ONLY and k not in BWD_ONLY and k not in FWD_ONLY}
    for pass_, only in (("decode", DECODE_ONLY), ("bwd", BWD_ONLY), ("fwd", FWD_ONLY)):
        params = resolve("triton", pass_, None, (head_dim, head_dim_v or head_dim))
        for knob, default in only.items():
            assert getattr(params, knob) == EXPECTED[dims].get(knob, default), (pass_, knob)
    assert TritonParams.heuristic(head_dim, head_dim_v) == TritonParams.heuristic(head_dim, head_dim_v)
