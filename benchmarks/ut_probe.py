"""GPU probe of the forward's UT stage: the one-launch kernel (``forward.ut_fused``) per precision, apply
mode and diagonal block size (the spec's ut_diag_block), against the three-launch path
(``forward.ut_forward``), with each variant's error on U, K~ and M against a float64 evaluation of the
same formulas.

    python benchmarks/ut_probe.py [--head-dims 64,128] [--tokens 32768] [--paths three_launch,fused]
                                  [--candidate FILE[:NAME],...] [--precisions P,...] [--diag-blocks SB,...]
                                  [--out F]

``--candidate FILE[:NAME],...``: kernels with the shipped ``ut_fused_kernel``'s signature (NAME default
``ut_fused_kernel``); their rows (``kernel``: NAME, or ``candidate``) time each on the fused path at each
precision and diagonal block size (the spec's, and half and all of a chunk), beside the shipped kernel's
rows of the same process.  ``--precisions`` / ``--diag-blocks`` keep only those rows.

Precisions (the spec's ut_precision): fp16x3 (three fp16 passes of a scaled hi + lo split), tf32x3, tf32.

Inputs as the bench's: bf16 keys, float32 unit-norm w and beta in [1.5, 2); plus a stress input whose w are nearly
parallel inside each chunk at beta = 2 (errors only).  Times are ``do_bench`` medians (ms).
"""
from __future__ import annotations

import argparse
import json
import os

import torch
import triton
from kernel_variants import load_candidate, swapped  # benchmarks/ (this script's folder) is on sys.path

from pathtune.codegen.triton import forward as fwd
from pathtune.codegen.triton._layout import build_tables
from pathtune.codegen.triton.params import TritonParams
from pathtune.runtime.reference.blockwise import ut_stage_tokens
from pathtune.specs import load_spec
from pathtune.tuning.inputs import HEADS_FOR_DIM


def rel(a, b) -> float:
    return float((a.double() - b).norm() / b.norm())


def inputs(N, H, D, stress, dev):
    g = torch.Generator(device=dev).manual_seed(1)
    if stress:
        base = torch.randn(N // 64, 1, H, D, device=dev, generator=g)
        w = (base + 0.02 * torch.randn(N // 64, 64, H, D, device=dev, generator=g)).reshape(N, H, D)
        beta = torch.full((N, H), 2.0, device=dev)
    else:
        w = torch.randn(N, H, D, device=dev, generator=g)
        beta = 1.5 + 0.5 * torch.rand(N, H, device=dev, generator=g)
    w = torch.nn.functional.normalize(w, dim=-1)
    k = torch.randn(N, H, D, device=dev, generator=g).to(torch.bfloat16)
    return w, k, beta


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--paths", default="three_launch,fused", help="the variants' paths to time")
    ap.add_argument("--candidate", default="",
                    help="FILE[:NAME],...: candidate kernels (NAME default ut_fused_kernel) with its signature")
    ap.add_argument("--diag-blocks", default="", help="only these diagonal block sizes (comma-separated)")
    ap.add_argument("--precisions", default="", help="only these ut_precision values (comma-separated)")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "ut_probe.json"))
    args = ap.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")   # cpu: TRITON_INTERPRET=1 smoke run
    kernels = {"shipped": fwd.ut_fused_kernel}
    for entry in filter(None, args.candidate.split(",")):
        kernels[entry.partition(":")[2] or "candidate"] = load_candidate(entry, "ut_fused_kernel")
    rows = []
    for D in map(int, args.head_dims.split(",")):
        H = HEADS_FOR_DIM[D]
        N = args.tokens
        base = TritonParams.heuristic(D)
        C = base.chunk_size
        tables = build_tables(1, N, None, C, base.superchunk_size, dev, block_m=base.block_m)
        timed_dtype = base.scan_torch_dtype   # the forward's compact state
        data = {s: inputs(N, H, D, s, dev) for s in (False, True)}
        # the reference takes w as the kernels do: rounded to the 16-bit state's type for the forward
        refs = {s: ut_stage_tokens(data[s][0].to(timed_dtype).float(), data[s][1], data[s][2], C)
                for s in (False, True)}
        variants = [dict(path="three_launch", up=up) for up in ("fp16x3", "tf32x3", "tf32")]
        variants += [dict(path="fused", up=up, apply=a, warps=4, diag_block=sb)
                     for up, a in (("tf32x3", None), ("tf32", None), ("tf32x3", "tf32"))
                     for sb in sorted(load_spec().knobs["ut_diag_block"].domain, reverse=True)]
        variants += [dict(path="fused", up="fp16x3", apply=None, warps=4, diag_block=16)]
        variants = [dict(v, kernel="shipped") for v in variants]
        variants += [dict(path="fused", up=up, apply=None, warps=4, diag_block=sb, kernel=name)
                     for name in kernels if name != "shipped" for up in ("tf32x3", "tf32")
                     for sb in sorted({*load_spec().knobs["ut_diag_block"].domain, C // 2, C}, reverse=True)]
        keep_sb = {int(x) for x in args.diag_blocks.split(",") if x}
        keep_up = set(filter(None, args.precisions.split(",")))
        variants = [v for v in variants if (not keep_sb or v.get("diag_block") in keep_sb)
                    and (not keep_up or v["up"] in keep_up)]
        for v in [v for v in variants if v["path"] in args.paths.split(",")]:
            params = TritonParams.from_config(dict(ut_precision=v["up"], ut_diag_block=v.get("diag_block", 16)), base)
            def call(s, out_dtype=timed_dtype):
                w, k, beta = data[s]
                if v["path"] == "fused":
                    mode = v["apply"] or fwd.ut_apply_mode(params, timed_dtype)   # as timed
                    with swapped(fwd, "ut_fused_kernel", kernels[v["kernel"]]):
                        return fwd.ut_fused(k, w, beta, tables, H, D, C, params, out_dtype=out_dtype,
                                            write_w=True, apply_mode=mode, num_warps=v["warps"])[:3]
                return fwd.ut_forward(k, w, beta, tables, H, D, C, params, out_dtype=out_dtype, write_w=True)[:3]
            row = dict(D=D, H=H, tokens=N, **v)
            try:
                if dev.type == "cuda":
                    row["ms"] = triton.testing.do_bench(lambda: call(False), warmup=25, rep=200)
                for s in (False, True):
                    u, kt, m = call(s)
                    U, Kt, M = refs[s]
                    tag = "stress_" if s else ""
                    row.update({f"{tag}u_err": rel(u, U), f"{tag}kt_err": rel(kt, Kt), f"{tag}m_err": rel(m, M)})
            except Exception as exc:   # a variant that fails to compile or launch is a result too
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            print(json.dumps(row), flush=True)
            rows.append(row)
            with open(args.out, "w") as fh:
                json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
