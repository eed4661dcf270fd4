"""How much of a per-chunk kernel's time its program order wastes at the end of the launch (no GPU needed).

The forward's ``scan_intra_kernel`` and the backward's ``bwd_intra_walk_kernel`` / ``bwd_prep_kernel`` run one
program per (UT chunk, query head); a chunk at place ci of its super-chunk walks ci earlier chunks, so a program
takes about ``a + ci`` units (a: the work every program does, in walk steps).  The GPU starts programs in grid
order whenever a slot (programs per SM x SMs) frees: greedy list scheduling.  This prints the modelled launch
time of the shipped order (chunk axis fastest: a sawtooth of ci per super-chunk, head after head), of the
longest-first order of ``benchmarks/variants/longest_first.py`` (groups of whole super-chunks, heads fastest,
descending ci inside a group) and the lower bound (total work / slots).

    python benchmarks/tail_model.py                                   # the cases of the H200 (132 SMs) profiles
    python benchmarks/tail_model.py --group 1                         # heads_fastest.py's order (one super-chunk)
    python benchmarks/tail_model.py --superchunks 4 --chunks 16 --heads 8 --per-sm 1 --base 1,3

A model, not a measurement: programs of one place are taken as equally long, memory contention and the order's
effect on L2 reuse are left out (the longest-first groups keep the shipped order's working set).
"""
from __future__ import annotations

import argparse
import heapq

H200_SMS = 132


def launch_time(times: list[float], slots: int) -> float:
    """Makespan of programs started in list order on ``slots`` slots, each as soon as one frees."""
    free = [0.0] * slots
    end = 0.0
    for t in times:
        start = heapq.heappop(free)
        end = max(end, start + t)
        heapq.heappush(free, start + t)
    return end


def shipped_order(n_sc: int, s: int, heads: int, reverse: bool = True) -> list[int]:
    """Places ci in the shipped start order: per head, chunks of the stream (``reverse``: last chunk first)."""
    one = [ci for _ in range(n_sc) for ci in range(s)]
    return [ci for _ in range(heads) for ci in (one[::-1] if reverse else one)]


def longest_first(n_sc: int, s: int, heads: int, group_programs: int = 256) -> list[int]:
    """Places ci in the longest-first order: groups of whole super-chunks (at least ``group_programs`` programs),
    heads fastest, descending ci inside a group."""
    per_group = max(1, -(-group_programs // (s * heads)))
    out = []
    for g0 in range(0, n_sc, per_group):
        n = min(per_group, n_sc - g0)
        out += [ci for ci in range(s - 1, -1, -1) for _ in range(n * heads)]
    return out


def model(n_sc: int, s: int, heads: int, slots: int, base: float, reverse: bool = True,
          group_programs: int = 256) -> dict:
    """Modelled launch times (units of one walk step) of the two orders and the bound."""
    cost = [base + ci for ci in shipped_order(n_sc, s, heads, reverse)]
    bound = sum(cost) / slots
    shipped = launch_time(cost, slots)
    longest = launch_time([base + ci for ci in longest_first(n_sc, s, heads, group_programs)], slots)
    return dict(bound=bound, shipped=shipped, longest_first=longest, saving=1 - longest / shipped)


# (label, super-chunks per launch, chunks per super-chunk, query heads, programs per SM, shipped order reversed,
# programs per longest-first group as the variant builds them); B * T = 32768 tokens, C = 64, S = 1024; programs
# per SM from `compile_check` (sm_90, heuristic configs); the backward launches the walk once per token range
# (8 at T 4K)
CASES = [
    ("scan_intra D128 T2K (one launch)", 32, 16, 8, 2, True, 256),
    ("scan_intra D64 T2K (one launch)", 32, 16, 16, 2, True, 256),
    ("walk D128 T4K (one of 8 ranges)", 4, 16, 8, 1, True, 256),
    ("walk D64 T4K (one of 8 ranges)", 4, 16, 16, 2, True, 256),
    ("bwd_prep D128 T4K (one launch)", 32, 16, 8, 3, False, 512),
    ("bwd_prep D64 T4K (one launch)", 32, 16, 16, 5, False, 512),
]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sms", type=int, default=H200_SMS)
    ap.add_argument("--base", default="1,3", help="work of every program, in walk steps (comma-separated)")
    ap.add_argument("--superchunks", type=int, help="one case: super-chunks per launch")
    ap.add_argument("--chunks", type=int, default=16, help="one case: chunks per super-chunk")
    ap.add_argument("--heads", type=int, default=8, help="one case: query heads")
    ap.add_argument("--per-sm", type=int, default=1, help="one case: programs per SM")
    ap.add_argument("--group", type=int, default=None,
                    help="programs per longest-first group (1: one super-chunk, the order of "
                         "benchmarks/variants/heads_fastest.py; default: each case's, 256 for a given case)")
    args = ap.parse_args(argv)
    cases = CASES if args.superchunks is None else [
        ("given", args.superchunks, args.chunks, args.heads, args.per_sm, True, 256)]
    for label, n_sc, s, heads, per_sm, reverse, group in cases:
        group = group if args.group is None else args.group
        for base in map(float, args.base.split(",")):
            m = model(n_sc, s, heads, per_sm * args.sms, base, reverse, group)
            print(f"{label:34s} a={base:g}: shipped {100 * (m['shipped'] / m['bound'] - 1):5.1f} % over the bound, "
                  f"longest first {100 * (m['longest_first'] / m['bound'] - 1):4.1f} %: "
                  f"{100 * m['saving']:4.1f} % of the launch saved")


if __name__ == "__main__":
    main()
