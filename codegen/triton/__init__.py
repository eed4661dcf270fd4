"""Triton backend of pathtune: PaTH / PaTH-FoX forward and backward lowered from the spec.

Stages (one module each): ``ut`` (UT inverse + key boundary adjustment), ``transport``
(super-chunk key transport and transitions), ``scan_fwd`` (two-level right-to-left scan with
online softmax and the FoX gate), ``bwd_*`` (backward), ``forward``/``backward`` (launchers),
``autograd`` (custom ops + autograd), ``decode`` (fused decoding step on a current-frame KV
cache, and a GPU prefill that builds the cache).  Tile sizes, warps, stages and precisions come from
``TritonParams``, derived from the spec's knobs.
"""
from .autograd import KernelConfigError, path_attention_triton
from .decode import path_decode_triton, path_prefill_triton
from .params import TritonParams

__all__ = ["path_attention_triton", "path_decode_triton", "path_prefill_triton", "TritonParams",
           "KernelConfigError"]


# Which files key each pass's records (``_source_hash.PASS_SOURCES``), and their hash (comments and docstrings
# left out)
from ._source_hash import source_files, source_hash  # noqa: E402

__all__ += ["source_hash", "source_files"]
