"""Build, on a machine without a GPU, every TVM module that benchmarks/tvm_gpu_check.py runs on the GPU host.

    python codegen/tvm/build_gpu_check.py [--out build/tvm_gpu_check] [--quick] [--jobs 1] [--arch sm_90]
                                          [--only dec-]

Writes OUT/modules/<set id>/{ut,transport,scan | decode,decode_merge}.so (+ .json build metadata),
OUT/manifest.json (what each set is: pass, kernel variant, knobs, dims, whether gpu_check times it) and
OUT/tvm_runtime/{libtvm_runtime.so,libtvm_runtime_cuda.so} (from the installed apache-tvm wheel).
Every module carries sm_XX machine code (a source-only build is an error). Needs apache-tvm 0.27 + nvcc.
Decode sets also record ptxas registers / spills per kernel (manifest "ptxas"; gpu_check prints them next to
the timings). A set whose knobs the kernel cannot tile is recorded with "build_error" and skipped on the GPU.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

# the knob sets timed on the GPU (forward): the spec default, a longer super-chunk, a 128-row chunk
FWD_KNOBS = {
    "C64S1024N64w4": dict(chunk_size=64, superchunk_size=1024, block_n=64, num_warps=4),
    "C64S2048N64w4": dict(chunk_size=64, superchunk_size=2048, block_n=64, num_warps=4),
    "C128S2048N64w8": dict(chunk_size=128, superchunk_size=2048, block_n=64, num_warps=8),
}
# decode: the spec default, then the bandwidth layouts (stir_decode.py): rows per thread (r), warps (w),
# splits (s), prefetch (pf), twice the lanes per row with 8-byte vectors (t32v4 at D=128, t16v4 at D=64) instead
# of the auto 16 B per lane
DEC_KNOBS = {
    "N128s4w4": dict(decode_block_n=128, decode_splits=4, decode_num_warps=4),
    "r4w4s8": dict(decode_rows_per_thread=4, decode_num_warps=4, decode_splits=8),
    "r2w4s16": dict(decode_rows_per_thread=2, decode_num_warps=4, decode_splits=16),
    "r2w4s8pf": dict(decode_rows_per_thread=2, decode_num_warps=4, decode_splits=8, decode_prefetch=1),
    "r4w4s8pf": dict(decode_rows_per_thread=4, decode_num_warps=4, decode_splits=8, decode_prefetch=1),
    "r2w8s8pf": dict(decode_rows_per_thread=2, decode_num_warps=8, decode_splits=8, decode_prefetch=1),
    "r8w4s4": dict(decode_rows_per_thread=8, decode_num_warps=4, decode_splits=4),
    "t32v4r4w4s8": dict(decode_threads_per_row=32, decode_vec=4, decode_rows_per_thread=4, decode_num_warps=4,
                        decode_splits=8),
    "t16v4r4w4s8": dict(decode_threads_per_row=16, decode_vec=4, decode_rows_per_thread=4, decode_num_warps=4,
                        decode_splits=8),
}
# the decode workloads: a GQA shape (G=4), and the two MHA shapes the Triton decode was tuned on
DEC_DIMS = {
    "D128-G4": dict(H=8, HQ=32, D=128, DV=128, dtype="bfloat16"),
    "D128-G1": dict(H=8, HQ=8, D=128, DV=128, dtype="bfloat16"),
    "D64-G1": dict(H=16, HQ=16, D=64, DV=64, dtype="bfloat16"),
}
# which layouts each workload times (8 rows per thread spill at G=4: 4 query heads of q and acc in registers)
_D128 = [k for k in DEC_KNOBS if k != "t16v4r4w4s8"]
DEC_PLAN = {
    "D128-G4": [k for k in _D128 if k != "r8w4s4"],
    "D128-G1": _D128,
    "D64-G1": [k for k in DEC_KNOBS if k != "t32v4r4w4s8"],      # half the lanes per row of D=128
}


def plan(quick: bool = False):
    """The module sets: forward (tensor-core scan, CUDA-core cross-check, correctness-only extras) and decode."""
    sets = []
    dims_t = [dict(H=16, HQ=16, D=64, DV=64, dtype="bfloat16"), dict(H=8, HQ=8, D=128, DV=128, dtype="bfloat16")]
    knobs = list(FWD_KNOBS.items())[:1] if quick else list(FWD_KNOBS.items())
    for d in dims_t:
        for gated in (False, True):
            for kname, kn in knobs:
                sets.append(dict(id=f"fwd-tc-D{d['D']}-{'fox' if gated else 'path'}-{kname}", pass_="fwd",
                                 variant="tc", knobs=kn, dims=dict(d, gated=gated), timing=True,
                                 default=kname == "C64S1024N64w4"))
    # correctness extras: GQA + D != DV + fp16 q/k/v with a bf16 scan; short super-chunks (many transitions)
    sets.append(dict(id="fwd-tc-gqa-fp16-bf16scan", pass_="fwd", variant="tc",
                     knobs=dict(chunk_size=64, superchunk_size=256, block_n=64, num_warps=4, scan_precision="bf16"),
                     dims=dict(H=2, HQ=8, D=128, DV=64, dtype="float16", gated=True), timing=False, diag=True))
    sets.append(dict(id="fwd-simt-D64-fox", pass_="fwd", variant="simt",
                     knobs=dict(chunk_size=64, superchunk_size=256, block_n=64, num_warps=4),
                     dims=dict(H=2, HQ=4, D=64, DV=64, dtype="bfloat16", gated=True), timing=True, diag=True))
    for dname, d in DEC_DIMS.items():
        dknobs = [(k, DEC_KNOBS[k]) for k in DEC_PLAN[dname]][:2 if quick else None]
        for gated in ((False, True) if dname == "D128-G4" else (False,)):
            for i, (kname, kn) in enumerate(dknobs):
                # every decode set is timed (choosing the layout is the point); the first of each workload also
                # times the baselines (the Triton decode over a few configs, SDPA, the torch reference step)
                sets.append(dict(id=f"dec-{dname}-{'fox' if gated else 'path'}-{kname}", pass_="decode",
                                 variant="simt", knobs=kn, dims=dict(d, gated=gated), timing=True,
                                 default=kname == "N128s4w4", baselines=i == 0))
    return sets


def _build_one(args):
    entry, out_dir, arch = args
    from pathtune.codegen.tvm.build import build_kernels
    from pathtune.codegen.tvm.params import KernelDims, UnsupportedConfig

    t0 = time.time()
    try:
        paths = build_kernels(entry["pass_"], entry["knobs"], KernelDims(**entry["dims"]), arch=arch,
                              variant=entry["variant"], ptxas=entry["pass_"] == "decode")
    except UnsupportedConfig as e:          # recorded, not fatal: gpu_check reports the set as not built
        return dict(entry, kernels={}, build_error=f"UnsupportedConfig: {e}", build_seconds=round(time.time() - t0, 1))
    dst = Path(out_dir) / "modules" / entry["id"]
    dst.mkdir(parents=True, exist_ok=True)
    kernels = {}
    for name, p in paths.items():
        shutil.copy2(p, dst / f"{name}.so")
        shutil.copy2(Path(p).with_suffix(".json"), dst / f"{name}.json")
        kernels[name] = f"modules/{entry['id']}/{name}.so"
    ptx = {n: json.loads(Path(p).with_suffix(".json").read_text()).get("ptxas") for n, p in paths.items()}
    return dict(entry, kernels=kernels, build_seconds=round(time.time() - t0, 1),
                ptxas={n: v for n, v in ptx.items() if v})


def _init_worker():
    from pathtune.codegen.tvm.toolchain import ensure_cuda_build_env

    ensure_cuda_build_env()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="build/tvm_gpu_check")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--quick", action="store_true", help="one knob set per workload (faster build)")
    ap.add_argument("--jobs", type=int, default=1, help="parallel build workers (each holds a TVM import)")
    ap.add_argument("--only", default=None, help="build only the sets whose id contains this (e.g. dec-)")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    entries = [e for e in plan(a.quick) if not a.only or a.only in e["id"]]
    t0 = time.time()
    jobs = [(e, str(out), a.arch) for e in entries]
    if a.jobs > 1:
        with ProcessPoolExecutor(a.jobs, initializer=_init_worker) as ex:
            built = list(ex.map(_build_one, jobs))
    else:
        _init_worker()
        built = []
        for j in jobs:
            built.append(_build_one(j))
            b = built[-1]
            regs = " ".join(f"{k}: {v.get('registers')} regs, {v.get('spill_stores', 0)} B spilled"
                            for st in b.get("ptxas", {}).values() for k, v in st.items())
            print(f"[build] {b['id']}: {b['build_seconds']} s {b.get('build_error', '')}{regs}", flush=True)
    # the TVM runtime libraries the GPU host loads (no compiler there)
    import tvm

    from .runtime import copy_runtime_libs

    copy_runtime_libs(out / "tvm_runtime")
    manifest = dict(arch=a.arch, tvm=str(tvm.__version__), sets=built, built_seconds=round(time.time() - t0, 1))
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"[build] {len(built)} module sets in {manifest['built_seconds']} s -> {out} ({size / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
