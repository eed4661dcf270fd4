"""Build, on a machine without a GPU, every TVM module that gpu_check.py runs on the GPU host.

    python codegen/tvm/build_gpu_check.py [--out build/tvm_gpu_check] [--quick] [--jobs 1] [--arch sm_90]

Writes OUT/modules/<set id>/{ut,transport,scan | decode,decode_merge}.so (+ .json build metadata),
OUT/manifest.json (what each set is: pass, kernel variant, knobs, dims, whether gpu_check times it) and
OUT/tvm_runtime/{libtvm_runtime.so,libtvm_runtime_cuda.so} (from the installed apache-tvm wheel).
Every module carries sm_XX machine code (a source-only build is an error). Needs apache-tvm 0.27 + nvcc.
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
DEC_KNOBS = {
    "N128s4w4": dict(decode_block_n=128, decode_splits=4, decode_num_warps=4),
    "N256s8w4": dict(decode_block_n=256, decode_splits=8, decode_num_warps=4),
    "N64s16w2": dict(decode_block_n=64, decode_splits=16, decode_num_warps=2),
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
    dec_dims = dict(H=8, HQ=32, D=128, DV=128, dtype="bfloat16")
    dknobs = list(DEC_KNOBS.items())[:1] if quick else list(DEC_KNOBS.items())
    for gated in (False, True):
        for kname, kn in dknobs:
            sets.append(dict(id=f"dec-D128-G4-{'fox' if gated else 'path'}-{kname}", pass_="decode", variant="simt",
                             knobs=kn, dims=dict(dec_dims, gated=gated), timing=True, default=kname == "N128s4w4"))
    return sets


def _build_one(args):
    entry, out_dir, arch = args
    from pathtune.codegen.tvm.build import build_kernels
    from pathtune.codegen.tvm.params import KernelDims

    t0 = time.time()
    paths = build_kernels(entry["pass_"], entry["knobs"], KernelDims(**entry["dims"]), arch=arch,
                          variant=entry["variant"])
    dst = Path(out_dir) / "modules" / entry["id"]
    dst.mkdir(parents=True, exist_ok=True)
    kernels = {}
    for name, p in paths.items():
        shutil.copy2(p, dst / f"{name}.so")
        shutil.copy2(Path(p).with_suffix(".json"), dst / f"{name}.json")
        kernels[name] = f"modules/{entry['id']}/{name}.so"
    return dict(entry, kernels=kernels, build_seconds=round(time.time() - t0, 1))


def _init_worker():
    from pathtune.codegen.tvm.toolchain import ensure_cuda_build_env

    ensure_cuda_build_env()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="build/tvm_gpu_check")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--quick", action="store_true", help="one knob set per workload (faster build)")
    ap.add_argument("--jobs", type=int, default=1, help="parallel build workers (each holds a TVM import)")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    entries = plan(a.quick)
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
            print(f"[build] {built[-1]['id']}: {built[-1]['build_seconds']} s", flush=True)
    # the TVM runtime libraries the GPU host loads (no compiler there)
    import tvm

    lib = Path(tvm.__file__).resolve().parent / "lib"
    (out / "tvm_runtime").mkdir(exist_ok=True)
    for name in ("libtvm_runtime.so", "libtvm_runtime_cuda.so"):
        shutil.copy2(lib / name, out / "tvm_runtime" / name)
    manifest = dict(arch=a.arch, tvm=str(tvm.__version__), sets=built, built_seconds=round(time.time() - t0, 1))
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"[build] {len(built)} module sets in {manifest['built_seconds']} s -> {out} ({size / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
