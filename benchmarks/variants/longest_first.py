"""Candidate program order for the per-chunk kernels whose work grows with the chunk's place in its super-chunk:
``scan_intra_kernel`` (forward), ``bwd_intra_walk_kernel`` and ``bwd_prep_kernel`` (backward), built from this
tree's kernel sources by text replacement (``kernel_variants``); same arguments as the shipped kernels.

A query chunk at position ci of its super-chunk walks ci earlier chunks, so a program's time is about a + b * ci
(ci = 0 .. S / C - 1).  The shipped grids are (chunks, query heads) with the chunk axis fastest: the hardware
starts programs in a sawtooth of ci that repeats every super-chunk, and the last programs it starts include
long ones, which run on after most multiprocessors have gone idle.  Here the grid is one axis, query heads
fastest, and program p runs chunk ``order[p // HQ]``: groups of whole super-chunks (at least ``GROUP_PROGRAMS``
programs each, so that a group spans the GPU's program slots) in stream order, inside a group every chunk at
position S / C - 1 first, then S / C - 2, ... (longest first).  A group reads the same key chunks as the shipped
order's in-flight programs do (one or two super-chunks times the heads), so L2 reuse stays; the last programs
started are the short ones.  benchmarks/tail_model.py models the saving (greedy list scheduling of programs
a + b * ci in start order): walk at D 128, T 4K (one range launch, one program per SM) 18-21 % of the kernel,
scan_intra at T 2K 5-6 % (D 128) and 2-3 % (D 64), bwd_prep 4-8 %.

``kernel[grid](*args, **constexprs)`` with the shipped launcher's grid and arguments works: each kernel here is a
wrapper that builds the order table (cached per chunk table and head count; the probes time the cached launch)
and launches the variant on the flat grid.

    python benchmarks/scan_probe.py --candidates benchmarks/variants/longest_first.py
    python benchmarks/dev_kernel_probe.py --only intra,prep --intra-v2 benchmarks/variants/longest_first.py

tests/test_triton_forward.py and tests/test_triton_backward.py check the outputs against the shipped kernels'.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

import pathtune.codegen.triton.bwd_intra as intra_mod
import pathtune.codegen.triton.bwd_prep as prep_mod
import pathtune.codegen.triton.scan_fwd as scan_mod

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))      # benchmarks/: kernel_variants
from kernel_variants import load_variant, module_source  # noqa: E402

# programs per group of super-chunks, at least: about the program slots of the GPU (132 SMs of the H200 at one to
# two walk / scan programs each) while a group's key chunks (one to two super-chunks of every head) stay in L2, as
# the shipped order's in-flight programs' do; bwd_prep (3-5 programs per SM) reads w and u only: larger groups
GROUP_PROGRAMS = 256
PREP_GROUP_PROGRAMS = 512


def longest_first_order(chunk_tok0: torch.Tensor, chunk_seq: torch.Tensor, seq_start: torch.Tensor, C: int, S: int,
                        heads: int, group_programs: int = GROUP_PROGRAMS) -> torch.Tensor:
    """int64 [n_chunks]: the chunk each rank runs.  Super-chunks in stream order, grouped by whole super-chunks
    into groups of at least ``group_programs`` programs (chunks times ``heads``); inside a group by descending
    place in the super-chunk, then stream order.  Any layout of the chunk tables (varlen, partial super-chunks):
    a super-chunk starts at each chunk of place 0."""
    s = S // C
    place = torch.div(chunk_tok0 - seq_start[chunk_seq], C, rounding_mode="floor") % s
    superchunk = torch.cumsum((place == 0).to(torch.int64), 0) - 1
    per_group = max(1, -(-group_programs // (s * heads)))
    key = torch.div(superchunk, per_group, rounding_mode="floor") * s + (s - 1 - place)
    return torch.sort(key, stable=True).indices


def order_with_a_chunk_twice(*args, _right=longest_first_order, **kw) -> torch.Tensor:
    """``longest_first_order`` with its last rank running the first rank's chunk (one chunk twice, one never): the
    wrong table the tests put in its place to show that their comparison catches it."""
    order = _right(*args, **kw).clone()
    order[-1] = order[0]
    return order


class _FlatGrid:
    """``kernel[grid](*args, **kw)`` of a shipped (chunks, query heads) launch: the variant on (chunks * heads,)
    with the order table appended to the runtime arguments."""

    def __init__(self, kernel, chunk_tables: tuple[str, str, str], group_programs: int = GROUP_PROGRAMS):
        self.kernel, self.group_programs = kernel, group_programs
        self._names = chunk_tables            # the argument names of chunk_tok0, chunk_seq, seq_start
        # (id of chunk_tok0, heads, C, S) -> (chunk_tok0, its order, the function that made it)
        self._orders: dict = {}

    def __getattr__(self, attr):
        return getattr(self.kernel, attr)

    def order(self, args: tuple, kw: dict) -> torch.Tensor:
        names = self.kernel.arg_names
        tok0, seq, start = (args[names.index(n)] for n in self._names)
        key = (id(tok0), kw["HQ"], kw["C"], kw["S"])
        hit = self._orders.get(key)
        if hit is None or hit[0] is not tok0 or hit[2] is not longest_first_order:
            # the table is kept alive with its order, so its id is not reused while cached; varlen tables are
            # built per call: the oldest entries go
            while len(self._orders) >= 64:
                self._orders.pop(next(iter(self._orders)))
            hit = self._orders[key] = (tok0, longest_first_order(tok0, seq, start, kw["C"], kw["S"], kw["HQ"],
                                                                         self.group_programs), longest_first_order)
        return hit[1]

    def __getitem__(self, grid):
        n_chunks, heads = grid[0], grid[1]

        def launch(*args, **kw):
            return self.kernel[(n_chunks * heads,)](*args, self.order(args, kw), **kw)
        return launch


def _remap(params_tail: str, old_ids: str, new_ids: str) -> list[tuple[str, str]]:
    """The edits of one kernel: a ``chunk_order`` argument after ``params_tail`` (its last runtime parameters) and
    the program ids ``old_ids`` replaced by ``new_ids``."""
    return [(params_tail + "\n    HQ: tl.constexpr", params_tail + " chunk_order,\n    HQ: tl.constexpr"),
            (old_ids, new_ids)]


_FLAT = ("    rank = tl.program_id(0) // HQ\n"
         "    hq = tl.program_id(0) % HQ\n"
         "    n = tl.load(chunk_order + rank).to(tl.int32)\n")

SCAN_EDITS = _remap("    n_chunks, qk_scale, gate_scale, gc_hs,",
                    "    n = n_chunks - 1 - tl.program_id(0)\n    hq = tl.program_id(1)\n", _FLAT)
PREP_EDITS = _remap("    chunk_tok0, chunk_seq, seq_start, seq_end, gate_nat, dc_hs,",
                    "    n = tl.program_id(0)\n    hq = tl.program_id(1)\n", _FLAT)
# the walk takes its tile from _program_tile (shared with the diagonal kernel): the walk's call goes to an ordered
# copy of that helper
WALK_EDITS = [
    ("    n_chunks, qk_scale, gate_scale, scale, gate_nat, gc_hs,\n    HQ: tl.constexpr, H: tl.constexpr, D: "
     "tl.constexpr, DV: tl.constexpr,\n    BD: tl.constexpr, BDV: tl.constexpr, C: tl.constexpr, S: tl.constexpr,\n"
     "    DT: tl.constexpr, TP: tl.constexpr, USE_GATE: tl.constexpr, INTERP: tl.constexpr,\n):\n"
     "    n, hq, h, ci, tokI,",
     "    n_chunks, qk_scale, gate_scale, scale, gate_nat, gc_hs, chunk_order,\n    HQ: tl.constexpr, H: "
     "tl.constexpr, D: tl.constexpr, DV: tl.constexpr,\n    BD: tl.constexpr, BDV: tl.constexpr, C: tl.constexpr, "
     "S: tl.constexpr,\n    DT: tl.constexpr, TP: tl.constexpr, USE_GATE: tl.constexpr, INTERP: tl.constexpr,\n):\n"
     "    n, hq, h, ci, tokI,"),
    ("    n, hq, h, ci, tokI, rows, rmask, dmask, dvmask, m2, koff, qoff, voff = _program_tile(\n"
     "        n_chunks, chunk_tok0,",
     "    n, hq, h, ci, tokI, rows, rmask, dmask, dvmask, m2, koff, qoff, voff = _program_tile_ordered(\n"
     "        chunk_order, n_chunks, chunk_tok0,"),
]
_TILE_SRC = module_source(intra_mod).split("@triton.jit\ndef _program_tile(", 1)[1].split("\n\n\n@triton.jit", 1)[0]
_SHIPPED_IDS = ("    n = n_chunks - 1 - tl.program_id(0)     # latest chunks of a super-chunk (most work) first\n"
                "    hq = tl.program_id(1)\n")
if _SHIPPED_IDS not in _TILE_SRC:
    raise ValueError("variant longest_first: _program_tile's program ids changed in bwd_intra.py")
_WALK_HELPER = ("\n\n@triton.jit\ndef _program_tile_ordered(chunk_order, "
                + _TILE_SRC.replace(_SHIPPED_IDS, _FLAT) + "\n")

_TABLES = ("chunk_tok0", "chunk_seq", "seq_start")
scan_intra_kernel = _FlatGrid(load_variant(module_source(scan_mod), "scan_intra_kernel", "longest_first_scan",
                                           SCAN_EDITS), _TABLES)
bwd_prep_kernel = _FlatGrid(load_variant(module_source(prep_mod), "bwd_prep_kernel", "longest_first_prep",
                                         PREP_EDITS), _TABLES, PREP_GROUP_PROGRAMS)
bwd_intra_walk_kernel = _FlatGrid(load_variant(module_source(intra_mod), "bwd_intra_walk_kernel",
                                               "longest_first_walk", WALK_EDITS, append=_WALK_HELPER), _TABLES)
