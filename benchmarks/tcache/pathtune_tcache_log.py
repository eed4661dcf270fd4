"""A Triton cache manager that notes each cache entry a process opens, so that a GPU call brings back only the
compiled kernels it used (benchmarks/gpu_session.sh).

    TRITON_CACHE_MANAGER=pathtune_tcache_log:LoggingCacheManager   (this folder on PYTHONPATH)
    TRITON_CACHE_USED_LOG=/path/to/used.txt                          (one entry name a line, appended)

Triton opens a cache entry (a folder of ``TRITON_CACHE_DIR`` named after the compilation's hash) through its cache
manager for every kernel it compiles or finds compiled, and for every launcher module it builds or loads; this
manager is Triton's file cache with that one line added.  Entries of kernels a call never ran (earlier kernel
sources, other configs) are left out of what comes back, so the carried cache stays small.
"""
from __future__ import annotations

import os

from triton.runtime.cache import FileCacheManager

__all__ = ["LoggingCacheManager"]


class LoggingCacheManager(FileCacheManager):
    """``FileCacheManager`` that appends the entry's name to ``$TRITON_CACHE_USED_LOG`` (if set) when opened."""

    def __init__(self, key, override=False, dump=False):
        super().__init__(key, override=override, dump=dump)
        log = os.environ.get("TRITON_CACHE_USED_LOG")
        if log and not (override or dump):
            with open(log, "a") as fh:     # one short line per open: appends from several processes stay whole
                fh.write(f"{key}\n")
