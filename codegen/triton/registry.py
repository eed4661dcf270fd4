"""The Triton backend's implementation of each (stage, variant) of the spec, per pass.

Which variant runs is decided by the launchers for the call's head dims and length (``forward.py``:
the fused UT stage from padded head dim ``UT_FUSED_MIN_BD``, column-blocked transitions above
``TRANSITION_BLOCKED_ABOVE``; ``backward.py``: its per-range UT recompute fused from the same head dim, the
one-program chain up to ``CHAIN_KERNEL_MAX_BD``, per-range recomputation above the memory budget
``bwd_range_budget_mib``).  Checked against the spec by
tests/test_stage_registry.py.  Runs no kernel: not part of any pass's source hash.
"""
from __future__ import annotations

from pathtune.codegen._registry import StageRegistry

REGISTRY = StageRegistry("triton")
_T = "pathtune.codegen.triton."
FWD, BWD, DECODE = ("fwd",), ("bwd",), ("decode",)

REGISTRY.implement("householder_chain", "blockwise", FWD, _T + "forward:path_attention_fwd")
REGISTRY.implement("householder_chain", "blockwise", BWD, _T + "backward:path_attention_bwd")
REGISTRY.implement("householder_chain", "recurrent", DECODE, _T + "decode:path_decode_triton",
                   _T + "decode:decode_kernel")

REGISTRY.implement("ut_inverse", "fused", FWD, _T + "forward:ut_fused", _T + "ut:ut_fused_kernel")
REGISTRY.implement("ut_inverse", "fused", BWD, _T + "backward:ut_recompute", _T + "ut:ut_recompute_kernel")
REGISTRY.implement("ut_inverse", "split", FWD + BWD, _T + "forward:ut_forward", _T + "ut:ut_diag_inverse_kernel",
                   _T + "ut:ut_chunk_kernel", _T + "ut:ut_apply_kernel")
REGISTRY.implement("ut_inverse", "state_stored", BWD, _T + "forward:prepare_state", _T + "forward:ForwardState")
REGISTRY.implement("ut_inverse", "state_recomputed", BWD, _T + "backward:_ranges", _T + "backward:_range_budget")
REGISTRY.implement("ut_inverse", "state_kept", BWD, _T + "forward:forward_op", _T + "forward:kept_state_tensors",
                   _T + "backward:kept_state")
REGISTRY.implement("ut_inverse", "inter_state_kept", BWD, _T + "forward:forward_op", _T + "forward:kept_fields",
                   _T + "backward:kept_state")

REGISTRY.implement("blockwise_scan", "intra_inter_kernels", FWD, _T + "scan_fwd:scan_intra_kernel",
                   _T + "scan_fwd:scan_inter_kernel")
REGISTRY.unsupported("blockwise_scan", "one_kernel", FWD,
                     "the Triton scan is two kernels split at super-chunk boundaries (scan_intra_kernel, then "
                     "scan_inter_kernel: variant intra_inter_kernels)")
REGISTRY.implement("blockwise_scan", "tensor_core", FWD, _T + "scan_fwd:scan_intra_kernel",
                   _T + "scan_fwd:scan_inter_kernel")
REGISTRY.implement("blockwise_scan", "tensor_core", BWD, _T + "bwd_intra:bwd_intra_walk_kernel",
                   _T + "bwd_intra:bwd_intra_diag_kernel",
                   _T + "bwd_inter:bwd_inter_dq_kernel", _T + "bwd_inter:bwd_inter_dkv_kernel")
REGISTRY.unsupported("blockwise_scan", "cuda_core", FWD,
                     "Triton lowers the scan's tl.dot products to tensor cores (scan_precision tf32 keeps float32 "
                     "operands on them); there is no CUDA-core form")
REGISTRY.implement("blockwise_scan", "transition_whole", FWD, _T + "forward:transition_column_block",
                   _T + "transport:superchunk_transport_kernel", _T + "scan_fwd:scan_inter_kernel")
REGISTRY.implement("blockwise_scan", "transition_whole", BWD, _T + "bwd_inter:bwd_inter_dkv_kernel",
                   _T + "bwd_inter:bwd_inter_dq_kernel")
REGISTRY.implement("blockwise_scan", "transition_column_blocked", FWD, _T + "forward:transition_column_block",
                   _T + "forward:TRANSITION_BLOCKED_ABOVE", _T + "scan_fwd:scan_inter_kernel")
REGISTRY.implement("blockwise_scan", "transition_column_blocked", BWD, _T + "backward:superchunk_pairs",
                   _T + "bwd_chain:bwd_superchunk_pairs_kernel", _T + "bwd_inter:bwd_inter_dkv_kernel",
                   _T + "bwd_inter:bwd_inter_dq_kernel")
REGISTRY.implement("blockwise_scan", "chain_kernel", BWD, _T + "backward:superchunk_chain",
                   _T + "bwd_chain:bwd_superchunk_chain_kernel")
REGISTRY.implement("blockwise_scan", "chain_blocked", BWD, _T + "backward:superchunk_chain",
                   _T + "bwd_chain:bwd_chain_rows_kernel", _T + "bwd_chain:bwd_chain_dwhat_kernel")

for _placement in ("inside_scale", "outside_scale"):
    REGISTRY.implement("fox_gate", _placement, FWD, _T + "forward:path_attention_fwd")
    REGISTRY.implement("fox_gate", _placement, BWD, _T + "backward:path_attention_bwd")
    REGISTRY.implement("fox_gate", _placement, DECODE, _T + "decode:path_decode_triton")
