"""Candidate super-chunk transport on 64-row programs: the shipped ``superchunk_transport_kernel`` (forward, and the
backward's recompute of the forward state) launched with ROWS = 64 rows of the running D x D suffix product per
program instead of ``forward.transport_rows`` (32), on half the programs.

At 32 rows the two Suf products of a step (Suf W^T, then (Suf W^T) U) have 32-row tiles, which Triton lowers to
sm_90's mma.sync (offline: D128 64 mma.sync sites of 72, D64 32 of 36); at 64 rows every product is a wgmma, with 0
spills and 3 (D128) / 4 (D64) programs per SM at 4 warps (``python -m pathtune.codegen.triton.compile_check``
numbers for the kernel at ROWS 64).  Each row of Suf evolves on its own, so the outputs are the shipped launch's up
to the products' tiling.  The wrapper takes the shipped launcher's grid and keyword arguments and launches the
same kernel on the grid of ROWS = 64 (head dims whose padded width is 32 keep one 32-row block).

    python benchmarks/fwd_probe.py --seq-lens 2048,4096 --no-fla --candidates benchmarks/variants/transport_rows64.py

tests/test_triton_forward.py checks a forward with it against the shipped one and the float64 oracle.
"""
from __future__ import annotations

import pathtune.codegen.triton.forward as fwd_mod

ROWS = 64


class Rows64:
    """``kernel[grid](*args, **kw)`` with the shipped grid (super-chunks, kv heads, BD // ROWS) and ROWS in ``kw``:
    the kernel at ``min(BD, 64)`` rows on the matching grid."""

    def __init__(self, kernel) -> None:
        self.kernel = kernel

    def __getattr__(self, attr):
        return getattr(self.kernel, attr)

    def __getitem__(self, grid):
        def launch(*args, **kw):
            rows = min(kw["BD"], ROWS)
            return self.kernel[(grid[0], grid[1], kw["BD"] // rows)](*args, **dict(kw, ROWS=rows))
        return launch


superchunk_transport_kernel = Rows64(fwd_mod.superchunk_transport_kernel)
