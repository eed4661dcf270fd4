"""Helpers of the interpreter tests of the candidate kernels in benchmarks/variants/ (tests/test_triton_forward.py,
tests/test_triton_backward.py): the grids a candidate's wrapper launches on, and a wrong program order for the
program-order candidates, which the tests put in place to show that their comparison with the shipped kernels
catches it."""
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


def break_program_order(monkeypatch, cand, wrapper_names):
    """Make a program-order candidate (benchmarks/variants/longest_first.py or heads_fastest.py) run a wrong order:
    one chunk twice and one never (the order table's last rank takes the first rank's chunk), or the flat grid's id
    split into heads wrongly (some (chunk, head) pairs twice, others never; every index stays in bounds)."""
    if hasattr(cand, "order_with_a_chunk_twice"):
        monkeypatch.setattr(cand, "longest_first_order", cand.order_with_a_chunk_twice)
        return
    import sys

    import pathtune.codegen.triton.bwd_intra as intra_mod
    import pathtune.codegen.triton.bwd_prep as prep_mod
    import pathtune.codegen.triton.scan_fwd as scan_mod

    kv = sys.modules["kernel_variants"]
    wrong = cand._FLAT.replace("hq = tl.program_id(0) % HQ", "hq = (tl.program_id(0) // 2) % HQ")
    assert wrong != cand._FLAT
    sources = {"scan_intra_kernel": (scan_mod, cand.SCAN_EDITS), "bwd_prep_kernel": (prep_mod, cand.PREP_EDITS),
               "bwd_intra_walk_kernel": (intra_mod, cand.WALK_EDITS)}
    for name in wrapper_names:
        mod, edits = sources[name]
        bad = kv.load_variant(kv.module_source(mod), name, f"wrong_{name}", [(old, wrong) for old, _ in edits])
        monkeypatch.setattr(getattr(cand, name), "kernel", bad)
