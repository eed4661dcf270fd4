"""The parameterised CUDA-core schedule of the S-TIR stages (threads, tiles, unrolling from the Config).

Every S-TIR prim_func of this package has the same shape (stir_common.py): program loops around one
``program`` block, and leaf blocks inside it whose own loops are their innermost ones (spatial first,
reductions last). ``schedule_simt`` turns that into a CUDA kernel:

* the program loops become blockIdx.x / .y / .z (one thread block per program);
* in every leaf block the spatial loops are fused, split by the thread count and bound to
  threadIdx.x (the leftover outer part stays a serial loop, unrolled when short);
* reduction loops stay sequential inside a thread; the innermost ``unroll`` iterations are unrolled
  and, when possible, the accumulator lives in a register (cache_write to "local");
* scratch buffers are in dynamic shared memory (the stage is generated with smem="shared.dyn"); TVM
  merges them into one allocation and inserts the barriers.

Threads and unroll factors come from TVMParams (num_warps, decode_num_warps); nothing is per-GPU.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List

__all__ = ["SimtSchedule", "schedule_simt"]

_AXES = ("blockIdx.x", "blockIdx.y", "blockIdx.z")


@dataclass(frozen=True)
class SimtSchedule:
    threads: int = 128      # threads per block (num_warps * 32)
    unroll: int = 4         # inner unroll of reduction loops (1 = none)
    max_unroll_outer: int = 8  # fully unroll an outer serial loop of at most this many iterations
    local_accum: bool = True   # accumulate reductions in registers


def _leaves(sch, blk) -> List:
    out = []
    for c in sch.get_child_blocks(blk):
        kids = sch.get_child_blocks(c)
        out += _leaves(sch, c) if kids else [c]
    return out


def _const_extent(sch, loop):
    ext = sch.get(loop).extent
    try:
        return int(ext)
    except TypeError:
        return None


def _schedule_leaf(sch, b, cfg: SimtSchedule, notes: list) -> None:
    blk = sch.get(b)
    own = [iv for iv in blk.iter_vars if int(iv.iter_type) in (0, 2)]  # DataPar, CommReduce
    if not own:
        return
    loops = sch.get_loops(b)[-len(own):]
    spatial = [lp for lp, iv in zip(loops, own) if int(iv.iter_type) == 0]
    reduce_ = [lp for lp, iv in zip(loops, own) if int(iv.iter_type) == 2]
    if not spatial:
        return
    fused = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
    # always split by the thread count: the split predicate (o * threads + t < extent) guards the
    # spare threads. (Binding a shorter loop directly to threadIdx.x is NOT guarded by TVM: the extra
    # threads would run past the loop's end.)
    outer, tx = sch.split(fused, [None, cfg.threads])
    n_outer = _const_extent(sch, outer)
    if n_outer is not None and 1 < n_outer <= cfg.max_unroll_outer:
        sch.unroll(outer)
    sch.bind(tx, "threadIdx.x")
    if reduce_:
        if cfg.local_accum:
            try:
                wb = sch.cache_write(b, 0, "local")
                sch.reverse_compute_at(wb, tx)
            except Exception as e:  # keep the shared-memory accumulation, but say so
                notes.append(f"{blk.name_hint}: no register accumulator ({type(e).__name__})")
        if cfg.unroll > 1 and len(reduce_) == 1:
            ext = _const_extent(sch, reduce_[0])
            if ext is not None and ext % cfg.unroll == 0 and ext > cfg.unroll:
                _, ri = sch.split(reduce_[0], [None, cfg.unroll])
                sch.unroll(ri)


def schedule_simt(func, cfg: SimtSchedule):
    """Return an IRModule with ``func`` (an S-TIR stage built with smem="shared.dyn") scheduled for CUDA."""
    import tvm
    from tvm import s_tir

    name = func.attrs["global_symbol"] if func.attrs and "global_symbol" in func.attrs else "main"
    # enable_check=False: bind's dataflow check rejects leaves that update a scratch buffer in place
    # (acc = acc * alpha + PV, ...), although their iterations are independent by construction
    sch = s_tir.Schedule(tvm.IRModule({name: func}), enable_check=False)
    prog = sch.get_sblock("program", func_name=name)
    ploops = sch.get_loops(prog)
    if len(ploops) > len(_AXES):
        raise ValueError(f"{name}: {len(ploops)} program loops, at most {len(_AXES)} supported")
    for lp, ax in zip(ploops, _AXES):
        sch.bind(lp, ax)
    notes: list = []
    for b in _leaves(sch, prog):
        _schedule_leaf(sch, b, cfg, notes)
    mod = sch.mod
    mod = mod.with_attr("pathtune.schedule_notes", notes) if notes else mod
    return mod
