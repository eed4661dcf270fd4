"""The TVM backend's implementation of each (stage, variant) of the spec, per pass.

The TVM backend has forward and decode kernels (``build.PASS_KERNELS``); a differentiated call runs
the Triton backward.  Its scan comes in two variants, ``tc`` (TIRx, mma.sync: tensor_core) and
``simt`` (scheduled S-TIR: cuda_core), picked by the caller (``params.SCAN_VARIANTS``).  Checked
against the spec by tests/test_stage_registry.py.  No TVM import here.
"""
from __future__ import annotations

from pathtune.codegen._registry import StageRegistry

REGISTRY = StageRegistry("tvm")
_V = "pathtune.codegen.tvm."
FWD, BWD, DECODE = ("fwd",), ("bwd",), ("decode",)

NO_BACKWARD = ("the TVM backend has forward and decode kernels only; a differentiated call runs the Triton "
               "backward, which recomputes its state from q, k, w, beta and the saved o, lse")

REGISTRY.implement("householder_chain", "blockwise", FWD, _V + "host:forward")
REGISTRY.unsupported("householder_chain", "blockwise", BWD, NO_BACKWARD)
REGISTRY.implement("householder_chain", "recurrent", DECODE, _V + "host:decode_step", _V + "stir_decode:decode_func",
                   _V + "stir_decode:merge_func")

REGISTRY.implement("ut_inverse", "fused", FWD, _V + "stir_ut:ut_func")
REGISTRY.unsupported("ut_inverse", "split", FWD,
                     "the TVM UT stage is one kernel per chunk (stir_ut.ut_func: variant fused); it has no "
                     "three-launch form")
for _variant in ("fused", "split", "state_stored", "state_recomputed", "state_kept", "inter_state_kept"):
    REGISTRY.unsupported("ut_inverse", _variant, BWD, NO_BACKWARD)

REGISTRY.unsupported("blockwise_scan", "intra_inter_kernels", FWD,
                     "the TVM scan is one kernel per query chunk that walks both levels (variant one_kernel)")
REGISTRY.implement("blockwise_scan", "one_kernel", FWD, _V + "tc_scan:tc_scan_func", _V + "stir_scan:scan_func")
REGISTRY.implement("blockwise_scan", "tensor_core", FWD, _V + "tc_scan:tc_scan_func")
REGISTRY.implement("blockwise_scan", "cuda_core", FWD, _V + "stir_scan:scan_func", _V + "schedule:schedule_simt")
REGISTRY.implement("blockwise_scan", "transition_whole", FWD, _V + "stir_transport:transport_func",
                   _V + "tc_scan:tc_scan_func")
REGISTRY.unsupported("blockwise_scan", "transition_column_blocked", FWD,
                     "the TVM kernels stage whole D x D transitions in shared memory (stir_transport, tc_scan's "
                     "f16 hi/lo tiles); there is no column-blocked form, so wide head dims fail the build's "
                     "shared-memory check (UnsupportedConfig)")
for _variant in ("tensor_core", "transition_whole", "transition_column_blocked", "chain_kernel", "chain_blocked"):
    REGISTRY.unsupported("blockwise_scan", _variant, BWD, NO_BACKWARD)

REGISTRY.implement("fox_gate", "inside_scale", FWD, _V + "host:forward")
REGISTRY.implement("fox_gate", "inside_scale", DECODE, _V + "host:decode_step")
REGISTRY.unsupported("fox_gate", "outside_scale", FWD + DECODE,
                     "the TVM kernels take the gate's scale as an argument, but placement outside_scale has never "
                     "been checked against the reference on them; use backend='triton'")
for _placement in ("inside_scale", "outside_scale"):
    REGISTRY.unsupported("fox_gate", _placement, BWD, NO_BACKWARD)
