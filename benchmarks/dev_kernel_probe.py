"""GPU dev probe: device time of single kernel launches of one fwd+bwd, next to variants of them.

Runs one forward+backward (heuristic config) with some launches captured (grid, arguments), then
times each captured launch again with ``triton.testing.do_bench`` (median), and the same launch
through variant kernels built from the kernel module's source with text replacements (written to
a temporary module, since ``triton.jit`` reads its source from a file).  Timing only: replayed
launches add into buffers that already hold results, so nothing here checks values.

    python benchmarks/dev_kernel_probe.py [--D 64,128] [--T 4096[,16384]] [--gates 1,0]
                          [--only ut,transport,intra,prep,dkv,dq,utbwd,variants,e2e,prepwarps,gatecumsum,keepstate]
                          [--old-intra FILE] [--intra-v2 FILE[,FILE]] [--dkv-v2 FILE[,FILE]]
                          [--dq-v2 FILE[,FILE]]
                          [--transport-v2 FILE[,FILE]] [--ut-bwd-v2 FILE[,FILE]]

``--old-intra FILE``: a bwd_intra.py of an earlier commit (``git show REV:codegen/triton/bwd_intra.py``),
timed on the walk kernel's arguments (without its newer trailing ones)
beside this tree's walk + diagonal kernels.  ``utbwd``: the UT backward's kernel at its warps, the other count
(4 / 8) and, where it runs tf32x3, at tf32.  ``--intra-v2 FILE[,FILE]``: candidate modules with a
``bwd_intra_walk_kernel`` and / or ``bwd_intra_diag_kernel`` of this tree's signature, each timed on its
kernel's captured arguments at the launch's warps and the other count (4 / 8) (``--old-intra``: a one-kernel
file; one that still has ``xs_ptr`` gets it); with ``prep``, their ``bwd_prep_kernel`` too.
``dkv`` with the gate: bwd_inter_dkv_kernel without the gate, with its key-side sums taken the other way
(``backward.gate_sums_by_mma``), and with one half of the gate's work dropped (its key-side row sums, its logit
bias; timing only).  ``--dkv-v2 FILE[,FILE]``: candidate modules with a ``bwd_inter_dkv_kernel`` of this tree's
signature, timed on the captured launch.  ``dq`` (not in the default set): bwd_inter_dq_kernel as is and without the
gate; ``--dq-v2 FILE[,FILE]``: candidate modules with a ``bwd_inter_dq_kernel`` of this tree's signature, timed on
the captured launch.  ``--transport-v2 FILE[,FILE]``: candidate modules with a
``bwd_transport_chain_kernel`` and / or ``bwd_transport_grads_kernel`` taking the shipped arguments and the
launcher's grid (a wrapper may launch it on its own grid), each timed on its captured launch. ``--ut-bwd-v2
FILE[,FILE]`` (with ``utbwd``): candidate modules with a ``ut_bwd_kernel`` of the shipped signature and grid,
timed on the captured launch.  ``--maxnreg 168,128``: the transport and UT backward kernels also under those
register caps (Triton's ``maxnreg``: more programs per multiprocessor).
``e2e``: one fwd+bwd through autograd, and with each candidate module of ``--intra-v2`` / ``--dkv-v2`` / ``--dq-v2``
/ ``--transport-v2`` swapped in (every kernel of forward.py / backward.py it defines, together), each with its host
time per call (5 calls queued) and each gradient's relative difference to the shipped kernels'; with each knob
config of ``--configs`` (JSON objects separated by ';') over the heuristic config, the same way; and with each
launcher predicate of ``--launcher-off`` (a function of backward.py / forward.py, e.g. ``gate_sums_by_mma``)
answering False, and of ``--launcher-on`` answering True. Not in the default set: ``prepwarps``, fwd+bwd at
bwd_num_warps 8 and 4, and at 4 with bwd_prep kept at 8 warps; ``gatecumsum``, the gate cumsum at shorter spans per
program; ``keepstate``, fwd+bwd at bwd_forward_state recompute, keep_inter and keep (the backward reuses the forward's
state), with time, extra peak memory and gradient differences.
JSON rows on stdout and in $OUT.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os

import torch
import triton
from fwd_probe import host_ms  # noqa: E402  (the host time per call of queued calls)
from kernel_variants import Capture, candidate_kernels, load_candidate, load_variant, module_source, swapped  # noqa: E402  (benchmarks/ is the script's folder)

import pathtune.codegen.triton.backward as bwd_mod
import pathtune.codegen.triton.bwd_inter as inter_mod
import pathtune.codegen.triton.forward as fwd_mod
from pathtune.codegen.triton import path_attention_triton
from pathtune.tuning.bench import make_inputs

OUT = os.environ.get("OUT", ".")
ROWS: list = []


def emit(row):
    print(json.dumps(row), flush=True)
    ROWS.append(row)
    with open(os.path.join(OUT, "kernel_probe.json"), "w") as fh:
        json.dump(ROWS, fh, indent=1)


def time_launch(kernel, grid, args, kw):
    fn = lambda: kernel[grid](*args, **kw)  # noqa: E731
    fn()
    torch.cuda.synchronize()
    return round(triton.testing.do_bench(fn, warmup=5, rep=40, return_mode="median"), 4)


# bwd_inter_dkv with one half of the FoX gate's work dropped (timing only: wrong gradients): the key-side
# row sums of dS^T, or the logit bias (the rows' lse shift and the keys' offset)
DKV_GATE_PARTS = (
    ("nosum", "gate without its row sums (timing only)",
     [("    if USE_GATE:\n        if GATE_SUM_MMA:\n            dck += mm(dsTd, ones, INTERP)\n"
       "        else:\n            dck += tl.sum(dsT, axis=1)\n", "")]),
    ("nobias", "gate without its logit bias (timing only)",
     [("        if ROW_MASK:\n            lse2 -= tl.load(gc_h + rows, mask=rmask, other=0.0) * gate_scale\n"
       "        else:\n            lse2 -= tl.load(gc_h + rows) * gate_scale\n"
       "        if not GATE_MMA:\n            sT -= ck_s[:, None]\n", "        lse2 += 0.0\n")]),
)


def run_case(D, H, T, gate, old_intra_src, only, intra_v2=(), dkv_v2=(), transport_v2=(),
             caps=(), ut_v2=(), configs=(), launcher_off=(), dq_v2=(), launcher_on=()):
    B = 32768 // T
    q, k, v, w, beta, g = make_inputs(B, T, H, H, D, D, gate, device="cuda", seed=0, dtype=torch.bfloat16)
    xs = [x.requires_grad_() for x in (q, k, v, w, beta)] + ([g.requires_grad_()] if gate else [])
    do = torch.randn_like(q)
    with Capture(bwd_mod, "bwd_transport_chain_kernel") as trc, Capture(bwd_mod, "bwd_transport_grads_kernel") as trg, \
            Capture(bwd_mod, "bwd_intra_walk_kernel") as ia, Capture(bwd_mod, "bwd_intra_diag_kernel") as ib, \
            Capture(bwd_mod, "bwd_inter_dkv_kernel") as dkv, Capture(bwd_mod, "bwd_inter_dq_kernel") as dqk, \
            Capture(fwd_mod, "ut_chunk_kernel") as utc, Capture(bwd_mod, "ut_recompute_kernel") as utr, \
            Capture(fwd_mod, "ut_apply_kernel") as uta, Capture(fwd_mod, "ut_diag_inverse_kernel") as utd, \
            Capture(bwd_mod, "ut_bwd_kernel") as ubk, Capture(bwd_mod, "bwd_prep_kernel") as prep:
        o, _ = path_attention_triton(*xs[:5], xs[5] if gate else None)
        torch.autograd.grad(o, xs, do)
        torch.cuda.synchronize()
    base = dict(D=D, H=H, T=T, B=B, gate=gate)

    # the backward's UT stage (one launch a range from padded head dim 64, else three): warps and the products'
    # precision (knob ut_precision)
    for cap, name in ((utr, "ut_recompute"), (utd, "ut_diag_inverse"), (utc, "ut_chunk"), (uta, "ut_apply")) \
            if "ut" in only else ():
        if not cap.calls:
            continue
        grid, args, kw = cap.calls[0]
        emit(dict(base, kernel=name, variant=f"as is (warps {kw['num_warps']}, UP {kw.get('UP')})",
                  ms=time_launch(cap.real, grid, args, kw)))
        for change in ([dict(num_warps=4), dict(UP="tf32"), dict(num_warps=4, UP="tf32")] if "UP" in kw else []):
            emit(dict(base, kernel=name, variant=str(change), ms=time_launch(cap.real, grid, args, dict(kw, **change))))

    # the transport backward's two kernels (chain: serial per row block; grads: per chunk) and their warps
    for cap, name in ((trc, "bwd_transport_chain"), (trg, "bwd_transport_grads")) if "transport" in only else ():
        grid, args, kw = cap.calls[0]
        emit(dict(base, kernel=name, variant=f"as is (warps {kw['num_warps']})",
                  ms=time_launch(cap.real, grid, args, kw)))
        for nw in (4, 8):
            if nw != kw["num_warps"]:
                emit(dict(base, kernel=name, variant=f"warps {nw}",
                          ms=time_launch(cap.real, grid, args, dict(kw, num_warps=nw))))
        # the serial walk waits on each step's W / U loads: pipelined loads; one tf32 pass instead of three
        for change in ([dict(num_stages=2), dict(num_stages=3)] if name == "bwd_transport_chain" else []) + (
                [dict(TP="tf32")] if kw.get("TP") == "tf32x3" else []) + [dict(TP="fp16")]:
            try:
                ms = time_launch(cap.real, grid, args, dict(kw, **change))
            except Exception as exc:     # e.g. out of shared memory
                ms = f"{type(exc).__name__}: {str(exc)[:200]}"
            emit(dict(base, kernel=name, variant=str(change), ms=ms))
        # fewer rows of the suffix product per program (the chain kernel's grid grows along its third axis; the
        # stored states' layout follows ROWS, so both kernels change together; the grads kernel's products need
        # ROWS >= 16): more programs on a serial chain
        for nw in (4, 8) if kw["ROWS"] > 16 else ():
            g = (grid[0], grid[1], kw["BD"] // 16) if name == "bwd_transport_chain" else grid
            try:
                ms = time_launch(cap.real, g, args, dict(kw, ROWS=16, num_warps=nw))
            except Exception as exc:     # e.g. out of resources
                ms = f"{type(exc).__name__}: {str(exc)[:200]}"
            emit(dict(base, kernel=name, variant=f"ROWS 16, warps {nw}", ms=ms))
        for cap_regs in caps:    # a register cap: more programs per multiprocessor on a latency-bound kernel
            try:
                ms = time_launch(cap.real, grid, args, dict(kw, maxnreg=cap_regs))
            except Exception as exc:
                ms = f"{type(exc).__name__}: {str(exc)[:200]}"
            emit(dict(base, kernel=name, variant=f"maxnreg {cap_regs}", ms=ms))
        # candidate chain kernels (their own grid from the shipped launcher's, as the launcher would launch them)
        # at the captured launch options, and at the warps / stages that let two programs share a multiprocessor
        # (the shipped chain's stages hold 96-160 KB of shared memory: one program per SM, so twice the programs
        # would run in two waves)
        for path in transport_v2:
            cand = candidate_kernels(path, [name + "_kernel"]).get(name + "_kernel")
            if cand is None:     # a candidate of the other kernel only
                continue
            changes = (dict(num_warps=nw, num_stages=st) for nw in (4, 8) for st in (1, 2))
            # and at 16 rows per program (both kernels; the chain's grid doubles along its third axis)
            for change in ({}, *(changes if name == "bwd_transport_chain" else ()), *(
                    [dict(ROWS=16, num_warps=nw) for nw in (4, 8)] if kw["ROWS"] > 16 else [])):
                g = (grid[0], grid[1], kw["BD"] // 16) if change.get("ROWS") and name == "bwd_transport_chain" else grid
                try:
                    ms = time_launch(cand, g, args, dict(kw, **change))
                except Exception as exc:     # e.g. out of resources
                    ms = f"{type(exc).__name__}: {str(exc)[:200]}"
                emit(dict(base, kernel=name, variant=f"candidate {os.path.basename(path)} {change or 'as launched'}",
                          ms=ms))

    # bwd_intra: this tree's two kernels (the walk, then the diagonal tile) vs an older file's one kernel
    if "intra" in only:
        grid, args, kw = ia.calls[0]
        t_walk = time_launch(ia.real, grid, args, kw)
        t_diag = time_launch(ib.real, *ib.calls[0])
        emit(dict(base, kernel="bwd_intra_walk", variant="as is", ms=t_walk))
        emit(dict(base, kernel="bwd_intra_diag", variant="as is", ms=t_diag))
        emit(dict(base, kernel="bwd_intra", variant="as is (walk + diag)", ms=round(t_walk + t_diag, 4)))
        for cap, name in ((ia, "bwd_intra_walk"), (ib, "bwd_intra_diag")):   # the other warp count, per kernel
            g_, a_, k_ = cap.calls[0]
            nw = 8 if k_["num_warps"] == 4 else 4
            try:
                ms = time_launch(cap.real, g_, a_, dict(k_, num_warps=nw))
            except Exception as exc:
                ms = f"{type(exc).__name__}: {str(exc)[:200]}"
            emit(dict(base, kernel=name, variant=f"warps {nw}", ms=ms))
        # what bounds the walk: its loads pipelined; its atomic adds as plain stores (wrong sums: timing only)
        g_, a_, k_ = ia.calls[0]
        walk_variants = [(f"num_stages {ns}", ia.real, dict(k_, num_stages=ns)) for ns in (2, 3)]
        try:
            stores = load_variant(_src("bwd_intra"), "bwd_intra_walk_kernel", f"walk_stores_{D}_{int(gate)}",
                                  [(_ATOMIC_ADD, _PLAIN_STORE)])
            walk_variants.append(("atomic adds as plain stores (timing only)", stores, k_))
        except ValueError as exc:
            emit(dict(base, kernel="bwd_intra_walk", variant="atomic adds as plain stores", ms=str(exc)[:200]))
        for what, kern, kw_ in walk_variants:
            try:
                ms = time_launch(kern, g_, a_, kw_)
            except Exception as exc:
                ms = f"{type(exc).__name__}: {str(exc)[:200]}"
            emit(dict(base, kernel="bwd_intra_walk", variant=what, ms=ms))
    if "intra" in only and old_intra_src:
        old = load_variant(old_intra_src, "bwd_intra_kernel", f"intra_old_{D}_{int(gate)}")
        if "xs_ptr" in old.arg_names:
            emit(dict(base, kernel="bwd_intra", variant="old (same signature)", ms=time_launch(old, grid, args, kw)))
        else:
            i = ia.real.arg_names.index("xs_ptr")        # the old kernel has no chain-state scratch
            emit(dict(base, kernel="bwd_intra", variant="old (recomputes the chain)",
                      ms=time_launch(old, grid, args[:i] + args[i + 1:], kw)))
    # candidate modules with a bwd_intra_walk_kernel and / or bwd_intra_diag_kernel of this tree's signature
    for path in intra_v2 if "intra" in only else ():
        try:   # the module's kernels of those names (defs, or built from this tree's source), loaded once
            found = candidate_kernels(path, ("bwd_intra_walk_kernel", "bwd_intra_diag_kernel"))
        except Exception as exc:   # a candidate that fails to build is a result too
            emit(dict(base, kernel="bwd_intra", variant=f"candidate {os.path.basename(path)}",
                      ms=f"{type(exc).__name__}: {str(exc)[:200]}"))
            continue
        for cap, name in ((ia, "bwd_intra_walk_kernel"), (ib, "bwd_intra_diag_kernel")):
            if name not in found:
                continue
            cand = found[name]
            grid, args, kw = cap.calls[0]
            for nw in (kw["num_warps"], 8 if kw["num_warps"] == 4 else 4):   # the launch's warps and the other
                try:
                    ms = time_launch(cand, grid, args, dict(kw, num_warps=nw))
                except Exception as exc:   # a candidate that fails to launch is a result too
                    ms = f"{type(exc).__name__}: {str(exc)[:200]}"
                emit(dict(base, kernel=name[:-7], variant=f"candidate {os.path.basename(path)} (warps {nw})", ms=ms))

    # bwd_prep (the queries carried to their super-chunk start, delta, the gate's d lse): its warps, which the
    # bwd_num_warps knob shares with the bwd_intra kernels
    if "prep" in only:
        grid, args, kw = prep.calls[0]
        emit(dict(base, kernel="bwd_prep", variant=f"as is (warps {kw['num_warps']})",
                  ms=time_launch(prep.real, grid, args, kw)))
        other = 8 if kw["num_warps"] == 4 else 4
        emit(dict(base, kernel="bwd_prep", variant=f"warps {other}",
                  ms=time_launch(prep.real, grid, args, dict(kw, num_warps=other))))
        for path in intra_v2:      # candidate modules with a bwd_prep_kernel of this tree's arguments
            try:
                cand = load_candidate(f"{path}:bwd_prep_kernel", "bwd_prep_kernel")
            except AttributeError:
                continue
            try:
                ms = time_launch(cand, grid, args, kw)
            except Exception as exc:   # a candidate that fails to build or launch is a result too
                ms = f"{type(exc).__name__}: {str(exc)[:200]}"
            emit(dict(base, kernel="bwd_prep", variant=f"candidate {os.path.basename(path)}", ms=ms))

    # bwd_inter_dkv as is, and on other key tiles / query steps / warps (its grid has S / BLOCK_N programs per
    # super-chunk: the knobs bwd_block_n, bwd_block_m and bwd_inter_num_warps, one launch each)
    if "dkv" in only:
        grid, args, kw = dkv.calls[0]
        emit(dict(base, kernel="bwd_inter_dkv", variant=f"as is (BLOCK_N {kw['BLOCK_N']}, BLOCK_M {kw['BLOCK_M']}, "
                                                        f"warps {kw['num_warps']})",
                  ms=time_launch(dkv.real, grid, args, kw)))
        # query steps of 32 rows: offline sm_90 the 128 / 8 step has no local loads or stores in its loop at 32 (948 ->
        # 916 B of spills, all outside it; 270 SASS instructions a 32-row step gated against 513 a 64-row one)
        for bn, bm, nw in ((128, 64, 8), (128, 32, 8), (128, 64, 4), (64, 128, 4), (64, 64, 8), (64, 32, 4)):
            if (bn, bm, nw) == (kw["BLOCK_N"], kw["BLOCK_M"], kw["num_warps"]) or bm > kw["S"]:
                continue
            g2 = (grid[0] * kw["BLOCK_N"] // bn, *grid[1:])
            try:
                ms = time_launch(dkv.real, g2, args, dict(kw, BLOCK_N=bn, BLOCK_M=bm, num_warps=nw))
            except Exception as exc:   # e.g. out of shared memory
                ms = f"{type(exc).__name__}: {str(exc)[:200]}"
            emit(dict(base, kernel="bwd_inter_dkv", variant=f"BLOCK_N {bn}, BLOCK_M {bm}, warps {nw}", ms=ms))
    if "dkv" in only and gate:
        emit(dict(base, kernel="bwd_inter_dkv", variant="gate off (same args)",
                  ms=time_launch(dkv.real, grid, args, dict(kw, USE_GATE=False))))
        flip = not kw["GATE_SUM_MMA"]
        emit(dict(base, kernel="bwd_inter_dkv", variant=f"gate sums by {'an MMA' if flip else 'row reductions'}",
                  ms=time_launch(dkv.real, grid, args, dict(kw, GATE_SUM_MMA=flip))))
        # where the gate's cost goes (timing only: each drops one half of the gate's work)
        src = module_source(inter_mod)
        for tag, label, reps in DKV_GATE_PARTS:
            try:
                part = load_variant(src, "bwd_inter_dkv_kernel", f"dkv_{tag}_{D}", reps)
                ms = time_launch(part, grid, args, kw)
            except Exception as exc:
                ms = f"{type(exc).__name__}: {str(exc)[:200]}"
            emit(dict(base, kernel="bwd_inter_dkv", variant=label, ms=ms))
    # candidate modules with a bwd_inter_dkv_kernel of this tree's signature, on the captured launch
    if "dkv" in only:
        time_candidates(base, "bwd_inter_dkv_kernel", dkv, dkv_v2)
    # bwd_inter_dq as is, without the gate, and candidate modules of its signature, on the captured launch (it
    # stores every row of dy: replays write what the first launch wrote)
    if "dq" in only:
        grid, args, kw = dqk.calls[0]
        emit(dict(base, kernel="bwd_inter_dq", variant=f"as is (BLOCK_N {kw['BLOCK_N']}, warps {kw['num_warps']})",
                  ms=time_launch(dqk.real, grid, args, kw)))
        if gate:
            emit(dict(base, kernel="bwd_inter_dq", variant="gate off (same args)",
                      ms=time_launch(dqk.real, grid, args, dict(kw, USE_GATE=False))))
        time_candidates(base, "bwd_inter_dq_kernel", dqk, dq_v2)
    if "utbwd" in only:
        ut_backward(base, ubk.calls[0], caps, ut_v2)
    if "variants" in only and utd.calls:     # the three-launch UT stage's diagonal kernel (padded head dims < 64)
        source_variants(base, utd.calls[0])
    if "e2e" in only:
        fn = lambda: torch.autograd.grad(path_attention_triton(*xs[:5], xs[5] if gate else None)[0], xs, do)  # noqa: E731
        shipped_grads = [gr.float() for gr in fn()]
        ms_shipped = round(triton.testing.do_bench(fn, warmup=3, rep=30, return_mode="median"), 3)
        emit(dict(base, kernel="fwd+bwd", variant="autograd, heuristic config", ms=ms_shipped,
                  host_ms=round(host_ms(fn, 5), 3)))
        # each candidate module's kernels swapped into the forward and backward launchers together
        for path in dict.fromkeys(intra_v2 + dkv_v2 + dq_v2 + transport_v2):
            names = []

            def swapped_in(path=path, names=names):
                stack = contextlib.ExitStack()
                for module in (fwd_mod, bwd_mod):
                    for name, kernel in launcher_kernels(path, module).items():
                        stack.enter_context(swapped(module, name, kernel))
                        names.append(name)
                return stack

            row = against_shipped(fn, shipped_grads, ms_shipped, swapped_in, host=True)
            emit(dict(base, kernel="fwd+bwd", variant=f"autograd, candidate {os.path.basename(path)} "
                                                      f"({', '.join(names)})", **row))
        # each knob config of --configs over the heuristic one, through the public call's config
        for cfg in configs:
            fc = lambda cfg=cfg: torch.autograd.grad(path_attention_triton(  # noqa: E731
                *xs[:5], xs[5] if gate else None, config=cfg)[0], xs, do)
            row = against_shipped(fc, shipped_grads, ms_shipped)
            emit(dict(base, kernel="fwd+bwd", variant=f"autograd, heuristic config with {json.dumps(cfg)}", **row))
        # each launcher choice of --launcher-off / --launcher-on (a predicate of backward.py / forward.py) answered
        # False / True
        for name, answer in [(n, False) for n in launcher_off] + [(n, True) for n in launcher_on]:
            module = bwd_mod if hasattr(bwd_mod, name) else fwd_mod
            row = against_shipped(fn, shipped_grads, ms_shipped,
                                  lambda module=module, name=name, answer=answer: swapped(
                                      module, name, lambda *a, **k: answer))
            emit(dict(base, kernel="fwd+bwd", variant=f"autograd, heuristic config with {name} "
                                                      f"{'on' if answer else 'off'}", **row))
    if "prepwarps" in only:
        prep_warps_e2e(base, xs, do, gate)
    if "gatecumsum" in only and gate:
        gate_cumsum_spans(base, xs[5].detach())
    if "keepstate" in only:
        kept_state_e2e(base, xs, do, gate)


def time_candidates(base, name: str, cap, paths) -> None:
    """Emit the time of ``name`` from each candidate module of ``paths`` (benchmarks/variants/, this tree's signature)
    on ``cap``'s captured launch; a candidate that fails to build or launch is a result too."""
    grid, args, kw = cap.calls[0]
    for path in paths:
        try:
            ms = time_launch(load_candidate(f"{path}:{name}", name), grid, args, kw)
        except Exception as exc:
            ms = f"{type(exc).__name__}: {str(exc)[:200]}"
        emit(dict(base, kernel=name.removesuffix("_kernel"), variant=f"candidate {os.path.basename(path)}", ms=ms))


def against_shipped(fc, shipped_grads, ms_shipped, context=contextlib.nullcontext, host: bool = False) -> dict:
    """{ms, over_shipped, (with ``host``) host_ms, d<name>_vs_shipped} of the fwd+bwd callable fc, run inside
    ``context()``; {ms: the error} where it fails to build or launch (a result too)."""
    try:
        with context():
            diff = grad_differences(fc(), shipped_grads)
            ms = round(triton.testing.do_bench(fc, warmup=3, rep=30, return_mode="median"), 3)
            extra = {"host_ms": round(host_ms(fc, 5), 3)} if host else {}
        return dict(ms=ms, over_shipped=round(ms / ms_shipped, 3), **extra, **diff)
    except Exception as exc:
        return dict(ms=f"{type(exc).__name__}: {str(exc)[:200]}")


def grad_differences(grads, shipped) -> dict:
    """{"d<name>_vs_shipped": relative difference} of each gradient (q, k, v, w, beta, g) to the shipped kernels'
    on the same inputs."""
    return {f"d{n}_vs_shipped": float(f"{float((a.float() - b).norm() / b.norm()):.2e}")
            for n, a, b in zip(("q", "k", "v", "w", "beta", "g"), grads, shipped)}


def launcher_kernels(path: str, module) -> dict:
    """{name: kernel} of the jitted kernels launcher ``module`` (forward.py / backward.py) calls that the candidate
    module ``path`` defines too (``e2e``: swapped in together)."""
    names = [name for name in dir(module) if name.endswith("_kernel") and not name.startswith("_")]
    return candidate_kernels(path, names)


def kept_state_e2e(base, xs, do, gate):
    """One fwd+bwd (autograd, heuristic config) at bwd_forward_state recompute (the spec's default: the
    backward recomputes the forward's UT / transport state) and keep (the forward's state kept for the
    backward): the time, the extra peak memory of one fwd+bwd above the inputs, and each gradient's
    relative difference to the recompute's (0 where the kept state is the one the backward would have
    recomputed)."""
    def fn(state):
        o = path_attention_triton(*xs[:5], xs[5] if gate else None, config={"bwd_forward_state": state})[0]
        return torch.autograd.grad(o, xs, do)

    ref = None
    for state in ("recompute", "keep_inter", "keep"):
        grads = fn(state)
        torch.cuda.synchronize()
        del grads
        base_mem = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        grads = fn(state)
        torch.cuda.synchronize()
        extra_mib = (torch.cuda.max_memory_allocated() - base_mem) / 2**20
        ms = round(triton.testing.do_bench(lambda: fn(state), warmup=3, rep=30, return_mode="median"), 3)
        if ref is None:
            ref, diffs = grads, {}
        else:
            diffs = {f"d{i}": float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))
                     for i, (a, b) in enumerate(zip(grads, ref))}
        emit(dict(base, kernel="fwd+bwd", variant=f"bwd_forward_state {state}", ms=ms,
                  extra_peak_mib=round(extra_mib, 1), grad_rel_diff=diffs))


def gate_cumsum_spans(base, g):
    """The forward's gate cumsum (head-major, both launches) and the backward's reverse cumsum (dg from dc,
    one launch of gate_grad_kernel) at the shipped span of tokens per program and at shorter ones (more
    programs: B * T / span of them), each with its largest difference to the shipped result (the (hi, lo)
    running sums make any span exact to float32 rounding)."""
    from pathtune.codegen.triton import _layout

    _time_spans(base, "gate_cumsum", _layout, "GATE_CUMSUM_SPAN", (512, 256, 128, 64),
                lambda: _layout.gate_cumsum(g, None, head_major=True))
    B, T, HQ = g.shape
    tables = _layout.build_tables(B, T, None, 64, 1024, g.device)
    dc = torch.randn(HQ, B * T, device=g.device)
    _time_spans(base, "gate_grad", bwd_mod, "GATE_GRAD_SPAN", (256, 64),
                lambda: bwd_mod._gate_grad(dc, tables, g.shape))


def _time_spans(base, kernel, module, constant, spans, fn):
    """``fn`` timed with ``module.constant`` (a span of tokens per program) as shipped and at each of ``spans``."""
    from kernel_variants import swapped

    ref = fn()
    for span in (getattr(module, constant), *spans):
        with swapped(module, constant, span):
            diff = float((fn() - ref).abs().max())
            ms = round(triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median"), 4)
        emit(dict(base, kernel=kernel, variant=f"span {span}", ms=ms, max_abs_diff=diff))


class _WarpsOverride:
    """Stands in for a kernel in a launcher module: every launch runs ``kernel`` at ``num_warps``."""

    def __init__(self, kernel, num_warps):
        self.kernel, self.num_warps = kernel, num_warps

    def __getitem__(self, grid):
        return lambda *args, **kw: self.kernel[grid](*args, **dict(kw, num_warps=self.num_warps))


def prep_warps_e2e(base, xs, do, gate):
    """One fwd+bwd (autograd) at bwd_num_warps 8 and 4, and at 4 with bwd_prep kept at 8 warps: what a knob of
    bwd_prep's own warps would give, before it exists (the heuristic config otherwise)."""
    from kernel_variants import swapped

    from pathtune.codegen.triton.params import TritonParams

    D = xs[0].shape[-1]
    heur = TritonParams.heuristic(D, D)
    for label, warps, prep_warps in (("bwd_num_warps 8", 8, None), ("bwd_num_warps 4", 4, None),
                                     ("bwd_num_warps 4, bwd_prep at 8", 4, 8)):
        cfg = dataclasses.replace(heur, bwd_num_warps=warps)
        override = _WarpsOverride(bwd_mod.bwd_prep_kernel, prep_warps) if prep_warps else None

        def fn():
            o = path_attention_triton(*xs[:5], xs[5] if gate else None, config=cfg)[0]
            return torch.autograd.grad(o, xs, do)

        with swapped(bwd_mod, "bwd_prep_kernel", override):
            fn()
            ms = round(triton.testing.do_bench(fn, warmup=3, rep=30, return_mode="median"), 3)
        emit(dict(base, kernel="fwd+bwd", variant=label, ms=ms))


def _src(module_name):
    import pathtune.codegen.triton as pkg
    with open(os.path.join(os.path.dirname(pkg.__file__), f"{module_name}.py")) as fh:
        return fh.read()


_ATOMIC_ADD = '    tl.atomic_add(ptr, val, mask=mask, sem="relaxed")'
_PLAIN_STORE = "    tl.store(ptr, val, mask=mask)"


# source variants of this tree's kernels not taken (still timed on request): text replacements (the ones
# that won, e.g. dkv's dKJ out of registers, are in the kernels).
def source_variants(base, diag_call):
    """Kernels of this tree (timed once each) next to variants of their source or launch (same arguments)."""
    cases = (
        ("ut_diag_inverse_kernel", "ut", diag_call, "warps 2", (), dict(num_warps=2)),
        ("ut_diag_inverse_kernel", "ut", diag_call, "warps 4", (), dict(num_warps=4)),
    )
    timed = set()
    for i, (kernel, module, (grid, args, kw), what, repl, kw_change) in enumerate(cases):
        tag = f"{kernel}_{base['D']}_{int(base['gate'])}"
        if kernel not in timed:
            timed.add(kernel)
            as_is = load_variant(_src(module), kernel, tag + "_asis")
            emit(dict(base, kernel=kernel, variant="as is", ms=time_launch(as_is, grid, args, kw)))
        var = load_variant(_src(module), kernel, f"{tag}_{i}", repl)
        emit(dict(base, kernel=kernel, variant=what, ms=time_launch(var, grid, args, dict(kw, **kw_change))))


def ut_backward(base, call, caps=(), ut_v2=()):
    """The UT backward's kernel on its captured launch: at its warps, the other count, tf32 for a tf32x3 stage and
    under the register caps ``caps``; candidate kernels of the shipped signature (``ut_v2``: their files)."""
    grid, args, kw = call
    t = time_launch(bwd_mod.ut_bwd_kernel, grid, args, kw)
    emit(dict(base, kernel="ut_bwd", variant=f"as is (warps {kw['num_warps']}, UP {kw['UP']})", ms=t))
    changes = [dict(num_warps=8 if kw["num_warps"] == 4 else 4)] + ([dict(UP="tf32")] if kw["UP"] != "tf32" else [])
    for change in changes + [dict(maxnreg=c) for c in caps]:
        emit(dict(base, kernel="ut_bwd", variant=str(change),
                  ms=time_launch(bwd_mod.ut_bwd_kernel, grid, args, dict(kw, **change))))
    for path in ut_v2:
        try:
            ms = time_launch(load_candidate(path, "ut_bwd_kernel"), grid, args, kw)
            row = dict(ms=ms, over_shipped=round(ms / t, 3))
        except Exception as exc:     # a candidate that fails to build or launch is a result too
            row = dict(ms=f"{type(exc).__name__}: {str(exc)[:200]}")
        emit(dict(base, kernel="ut_bwd", variant=f"candidate {os.path.basename(path)}", **row))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--D", default="64,128")
    ap.add_argument("--T", default="4096", help="sequence lengths (comma-separated), B = 32768 / T each")
    ap.add_argument("--old-intra", default=None)
    ap.add_argument("--gates", default="1,0")
    ap.add_argument("--only", default="ut,transport,intra,prep,dkv,utbwd,variants,e2e")
    ap.add_argument("--intra-v2", default="", help="candidate bwd_intra files (comma-separated), shipped signature")
    ap.add_argument("--dkv-v2", default="", help="candidate bwd_inter_dkv files (comma-separated), shipped signature")
    ap.add_argument("--dq-v2", default="", help="candidate bwd_inter_dq files (comma-separated), shipped signature")
    ap.add_argument("--maxnreg", default="",
                    help="register caps (comma-separated) to time the transport and UT backward kernels under")
    ap.add_argument("--transport-v2", default="",
                    help="candidate bwd_transport_chain files (comma-separated): shipped arguments, launcher's grid")
    ap.add_argument("--ut-bwd-v2", default="",
                    help="candidate ut_bwd_kernel files (comma-separated), shipped signature and grid")
    ap.add_argument("--configs", default="",
                    help="e2e: knob configs (JSON objects separated by ';') timed over the heuristic config, e.g. "
                         '\'{"bwd_transition_precision": "fp16"}\'')
    ap.add_argument("--launcher-off", default="",
                    help="e2e: launcher predicates of backward.py / forward.py (comma-separated), each timed answering "
                         "False, e.g. gate_sums_by_mma (dkv's gate sums by a product)")
    ap.add_argument("--launcher-on", default="",
                    help="e2e: launcher predicates of backward.py / forward.py (comma-separated), each timed answering "
                         "True")
    a = ap.parse_args()
    old_src = open(a.old_intra).read() if a.old_intra else None
    only = set(a.only.split(","))
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    for T in (int(x) for x in a.T.split(",")):
        for D in (int(x) for x in a.D.split(",")):
            H = 16 if D <= 64 else 8
            for gate in (bool(int(x)) for x in a.gates.split(",")):
                try:
                    run_case(D, H, T, gate, old_src, only,
                             tuple(x for x in a.intra_v2.split(",") if x), tuple(x for x in a.dkv_v2.split(",") if x),
                             tuple(x for x in a.transport_v2.split(",") if x),
                             tuple(int(x) for x in a.maxnreg.split(",") if x),
                             tuple(x for x in a.ut_bwd_v2.split(",") if x),
                             tuple(json.loads(x) for x in a.configs.split(";") if x.strip()),
                             tuple(x for x in a.launcher_off.split(",") if x),
                             tuple(x for x in a.dq_v2.split(",") if x),
                             tuple(x for x in a.launcher_on.split(",") if x))
                except Exception as exc:
                    emit(dict(D=D, T=T, gate=gate, error=f"{type(exc).__name__}: {str(exc)[:300]}"))


if __name__ == "__main__":
    main()
