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


# Which sources each pass's kernels and launchers are built from (module names in this folder): a
# perf_db record of a pass is keyed by the hash of its files only, so an edit of the forward kernels
# does not retire decode records.  SHARED modules count for every pass; a module listed nowhere
# (a new file) also counts for every pass until it is placed here.  compile_check and registry (which
# stage variants the launchers implement) run no kernel; heuristics reads the untuned config from the
# spec, whose hash keys every record.
# autograd imports backward (the custom op's registered backward), which a forward never runs.
SHARED_SOURCES = ("__init__", "_ops", "launch", "params")
PASS_SOURCES = {
    "fwd": ("autograd", "forward", "_layout", "scan_fwd", "transport", "ut"),
    "bwd": ("autograd", "forward", "_layout", "scan_fwd", "transport", "ut",
            "backward", "bwd_chain", "bwd_inter", "bwd_intra", "bwd_prep", "ut_bwd"),
    "decode": ("decode",),
}
_NOT_HASHED = ("compile_check", "heuristics", "registry")


def source_files(pass_: str | None = None):
    """The .py files ``source_hash(pass_)`` covers, sorted (pass_ None: every kernel and launcher file)."""
    from pathlib import Path

    if pass_ is not None and pass_ not in PASS_SOURCES:
        raise ValueError(f"pass {pass_!r} is not one of {', '.join(PASS_SOURCES)}")
    files = [p for p in sorted(Path(__file__).parent.glob("*.py")) if p.stem not in _NOT_HASHED]
    if pass_ is None:
        return files
    placed = {m for mods in PASS_SOURCES.values() for m in mods} | set(SHARED_SOURCES)
    mine = set(PASS_SOURCES[pass_]) | set(SHARED_SOURCES)
    return [p for p in files if p.stem in mine or p.stem not in placed]


def source_hash(pass_: str | None = None) -> str:
    """sha256 (16 hex) of the kernel and launcher sources of one pass (``fwd``, ``bwd``, ``decode``;
    see ``PASS_SOURCES``), or of all of them (``pass_`` None): a perf_db hard key.

    A measurement recorded under another hash was taken with different kernel code and is
    not served to the dispatcher.
    """
    import hashlib

    h = hashlib.sha256()
    for path in source_files(pass_):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


__all__ += ["source_hash", "source_files"]
