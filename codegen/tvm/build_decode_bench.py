"""Build, on a machine without a GPU, the TVM decode modules that `pathtune bench --pass decode --backends
triton,tvm --tvm-modules DIR` times on the GPU host (which has the TVM runtime but no compiler).

    python -m pathtune.codegen.tvm.build_decode_bench [--out build/tvm_decode_bench] [--arch sm_90] [--jobs 1]

One module set (decode.so + decode_merge.so, with their .json build metadata) per decode-bench shape
(tuning/decode_bench.py SHAPES: H16 D64 and H8 D128, bf16, one query head per kv head), FoX gate off and on,
and layout: the fastest layouts measured on the H200 (codegen/tvm/README.md) and the spec default. Same bundle
layout as build_gpu_check.py: OUT/manifest.json, OUT/modules/<set>/,
OUT/tvm_runtime/ (libtvm_runtime{,_cuda}.so from the installed apache-tvm wheel). The folder is also a
module store the runtime dispatcher can search (PATHTUNE_TVM_MODULES=OUT). Needs apache-tvm 0.27 + nvcc.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from .build_gpu_check import DEC_KNOBS, _build_one, _init_worker
from .runtime import copy_runtime_libs

# the layouts timed: the three that won a (shape, length) of the H200's G = 1 decode runs, and the spec default
LAYOUTS = ("r2w8s8pf", "r4w4s8", "r2w4s8pf", "N128s4w4")
# (heads, head dim) of `pathtune bench --pass decode` (tuning/decode_bench.py SHAPES; a test keeps them equal:
# codegen does not import the bench)
BENCH_SHAPES = ((16, 64), (8, 128))


def plan(shapes=None, layouts=LAYOUTS) -> list[dict]:
    """The module sets: every (decode-bench shape, gate, layout)."""
    if shapes is None:
        shapes = BENCH_SHAPES
    sets = []
    for H, D in shapes:
        for gated in (False, True):
            for name in layouts:
                sets.append(dict(id=f"dec-H{H}-D{D}-{'fox' if gated else 'path'}-{name}", pass_="decode",
                                 variant="simt", knobs=DEC_KNOBS[name], layout=name,
                                 dims=dict(H=H, HQ=H, D=D, DV=D, dtype="bfloat16", gated=gated)))
    return sets


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="build/tvm_decode_bench")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--jobs", type=int, default=1, help="parallel build workers (each holds a TVM import)")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    jobs = [(e, str(out), a.arch) for e in plan()]
    if a.jobs > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(a.jobs, initializer=_init_worker) as ex:
            built = list(ex.map(_build_one, jobs))
    else:
        _init_worker()
        built = [_build_one(j) for j in jobs]
    for b in built:
        print(f"[build] {b['id']}: {b['build_seconds']} s {b.get('build_error', '')}", flush=True)
    copy_runtime_libs(out / "tvm_runtime")
    import tvm

    manifest = dict(arch=a.arch, tvm=str(tvm.__version__), sets=built, built_seconds=round(time.time() - t0, 1))
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"[build] {len(built)} decode module sets in {manifest['built_seconds']} s -> {out} ({size / 2**20:.1f} MiB)")
    return 1 if any(b.get("build_error") for b in built) else 0


if __name__ == "__main__":
    sys.exit(main())
