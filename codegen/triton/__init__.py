"""Triton backend of pathtune: PaTH / PaTH-FoX forward and backward lowered from the spec.

Stages (one module each): ``ut`` (UT inverse + key boundary adjustment), ``transport``
(super-chunk key transport and transitions), ``scan_fwd`` (two-level right-to-left scan with
online softmax and the FoX gate), ``bwd_*`` (backward), ``forward``/``backward`` (launchers),
``autograd`` (custom ops + autograd).  Tile sizes, warps, stages and precisions come from
``TritonParams``, derived from the spec's knobs.
"""
from .autograd import path_attention_triton
from .params import TritonParams

__all__ = ["path_attention_triton", "TritonParams"]
