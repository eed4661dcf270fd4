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


class Rows64Launch:
    """``kernel[grid](*args, **kw)`` of a shipped transport launch (ROWS in ``kw``): the kernel at ``min(BD, ROWS)``
    rows with ``options`` replacing the launch's; ``row_axis``: the grid axis that counts row blocks (doubled where
    ``split``), None where the grid does not depend on the rows (benchmarks/variants/bwd_transport_rows64.py
    launches the transport backward's kernels so)."""

    def __init__(self, kernel, options: dict | None = None, row_axis=2, split: bool = False) -> None:
        self.kernel, self.options, self.row_axis, self.split = kernel, dict(options or {}), row_axis, split

    def __getattr__(self, attr):
        return getattr(self.kernel, attr)

    def __getitem__(self, grid):
        def launch(*args, **kw):
            rows = min(kw["BD"], ROWS)
            g = list(grid)
            if self.row_axis is not None:
                g[self.row_axis] = (kw["BD"] // rows) * (2 if self.split else 1)
            return self.kernel[tuple(g)](*args, **dict(kw, ROWS=rows, **self.options))
        return launch


superchunk_transport_kernel = Rows64Launch(fwd_mod.superchunk_transport_kernel)
