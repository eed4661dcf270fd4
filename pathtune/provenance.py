"""Provenance hashes: which code a measurement was taken with, and which records are current here.

``kernel_source_hash(backend, pass_)`` is the hash that perf_db records of ``pass_`` on ``backend`` carry
(Triton: the files of that pass, ``codegen.triton.source_hash``; TVM: the backend's kernel sources),
None where the backend cannot be imported. ``current_keys(op, pass_, backend)`` is the perf_db
``current_keys`` of the code that would run here: the spec hashes (the pass's, or the full spec hash of
an older record) and that source hash. It is the one rule the runtime dispatcher and the CLI's export,
query and gc apply; a record under other keys is retired (not served, not exported).

Layer: above codegen and perf_db, which it reads, and below the runtime (``runtime.dispatch`` re-exports
``current_keys``).
"""
from __future__ import annotations

import logging
from typing import Optional

__all__ = ["kernel_source_hash", "current_keys"]

_log = logging.getLogger("pathtune.provenance")
_SOURCE_HASHES: dict[tuple[str, str], Optional[str]] = {}


def kernel_source_hash(backend: str, pass_: str) -> Optional[str]:
    """The kernel source hash records of ``pass_`` on ``backend`` must carry (Triton: per pass); cached."""
    key = (backend, pass_)
    if key not in _SOURCE_HASHES:
        value: Optional[str] = None
        try:
            if backend == "triton":
                from pathtune.codegen.triton import source_hash as fn
                value = fn(pass_)
            elif backend == "tvm":
                from pathtune.codegen.tvm.build import source_hash as fn
                value = fn()
        except Exception as e:  # noqa: BLE001 - an unimportable backend has no current results
            _log.debug("source hash of %s (%s) unavailable: %s", backend, pass_, e)
        _SOURCE_HASHES[key] = value
    return _SOURCE_HASHES[key]


def current_keys(op: str, pass_: str, backend: str) -> Optional[dict[str, Optional[str]]]:
    """perf_db ``current_keys`` of the code that would run here: the spec hashes and the backend's
    kernel source hash of the pass (results measured with other kernel sources are stale and not served)."""
    from pathtune.perf_db import default_current_keys

    keys = default_current_keys(op, pass_, backend)
    if keys is None:
        return None
    return {**keys, "source_hash": kernel_source_hash(backend, pass_)}
