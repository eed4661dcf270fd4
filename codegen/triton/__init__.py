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


def source_hash() -> str:
    """sha256 (16 hex) of this backend's kernel and launcher sources: a perf_db hard key.

    A measurement recorded under another hash was taken with different kernel code and is
    not served to the dispatcher.
    """
    import hashlib
    from pathlib import Path

    h = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        if path.name != "compile_check.py":
            h.update(path.name.encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


__all__.append("source_hash")
