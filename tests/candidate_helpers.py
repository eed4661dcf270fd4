"""Helpers of the interpreter tests of the kernels (tests/test_triton_forward.py, tests/test_triton_backward.py): the
grids a candidate's wrapper (benchmarks/variants/) launches on, and a wrong program order for the per-chunk kernels,
which the tests put in place to show that their comparison with the oracle catches it."""
from __future__ import annotations


def spy_grids(monkeypatch, wrapper) -> list:
    """The grids that a candidate's wrapper (``wrapper.kernel``: the kernel it launches) launches on, appended as
    they come; the kernel's attributes show through."""
    grids: list = []
    real = wrapper.kernel

    class Spy:
        def __getattr__(self, attr):
            return getattr(real, attr)

        def __getitem__(self, grid):
            grids.append(grid)
            return real[grid]
    monkeypatch.setattr(wrapper, "kernel", Spy())
    return grids


WRONG_ORDER = [("    n, hq = chunk_and_head(HQ)\n",
                 "    n, hq = tl.num_programs(0) // HQ - 1 - tl.program_id(0) // HQ, (tl.program_id(0) // 2) % HQ\n")]
"""An edit (``kernel_variants.load_variant``) giving a per-chunk kernel a wrong program order: the flat grid's id
split into heads wrongly, so some (chunk, head) pairs run twice and others never, every index in bounds."""
