"""GPU probe of the forward's two scan kernels: the shipped ``scan_intra_kernel`` and ``scan_inter_kernel``
against the candidates in ``benchmarks/variants/`` (same arguments), each timed alone on the launch one
forward makes, with its outputs compared to the shipped kernel's (the inter kernel's in-place inputs, the
carried queries and the partial lse, are restored before every run).

    python benchmarks/scan_probe.py [--head-dims 64,128] [--seq-len 4096] [--out scan_probe.json]
                                    [--candidates benchmarks/variants/FILE.py[,...]]
    TRITON_INTERPRET=1 python benchmarks/scan_probe.py --head-dims 32 --seq-len 192 --tokens 192 \
        --config '{"chunk_size": 32, "superchunk_size": 64, "block_m": 32, "block_n": 16}'    # CPU smoke run

Inputs: ``tuning.inputs.make_inputs`` (bf16 q/k/v, float32 unit w, beta in [1.5, 2), real gate decay),
B * T = 32768, the heuristic config.  Times are ``do_bench`` medians (ms) of the kernel launch alone.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_variants import Capture, load_candidate  # noqa: E402

import pathtune.codegen.triton.forward as fwd  # noqa: E402
from pathtune.codegen.triton.params import TritonParams  # noqa: E402
from pathtune.tuning.inputs import HEADS_FOR_DIM, TOKENS, make_inputs  # noqa: E402

# per shipped kernel: its outputs and the inputs it overwrites (argument positions)
KERNELS = {
    "scan_intra_kernel": dict(outputs={"o_part": 7, "lse": 8, "x": 9}, inplace=()),
    "scan_inter_kernel": dict(outputs={"o": 7, "lse": 8}, inplace=(0, 8)),     # x, and lse (partial in, final out)
}


def candidates(name: str, shipped, kw: dict, files=()) -> list[tuple[str, object, dict]]:
    """(label, kernel, launch keyword overrides) timed next to the shipped launch of kernel ``name``: the
    shipped kernel at the other warp count, the intra kernel's walk at the other number of pipelining stages,
    the inter kernel at 2 and 3 stages, and the kernel ``name`` of each candidate module in ``files``
    (benchmarks/variants/, with the launch arguments of the kernel it would replace; a module without
    that kernel is skipped)."""
    rows = [("shipped", shipped, dict(num_warps=8 if kw["num_warps"] == 4 else 4))]
    if name == "scan_intra_kernel":
        other = 1 if kw.get("WALK_STAGES", 1) == 2 else 2
        rows.append((f"shipped, walk stages {other}", shipped, dict(WALK_STAGES=other)))
    if name == "scan_inter_kernel":
        other = 3 if kw["num_stages"] != 3 else 2
        rows.append((f"shipped, {other} stages", shipped, dict(num_stages=other)))
    for file in files:
        kernel = _candidate_kernel(file, name)
        if kernel is not None:
            rows.append((f"candidate {os.path.basename(file)}", kernel, {}))
    return rows


@functools.lru_cache(maxsize=None)
def _candidate_kernel(file: str, name: str):
    """Kernel ``name`` of candidate module ``file`` (None where it has none), loaded once per run."""
    try:
        return load_candidate(f"{file}:{name}", name)
    except AttributeError:
        return None


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def probe(D: int, T: int, gate: bool, dev, tokens: int = TOKENS, config: dict | None = None,
          files=()) -> list[dict]:
    H = HEADS_FOR_DIM[D]
    B = max(1, tokens // T)
    q, k, v, w, beta, g = make_inputs(B, T, H, H, D, D, gate, device=dev, seed=0)
    params = TritonParams.from_config(config or {}, TritonParams.heuristic(D))
    with Capture(fwd, "scan_intra_kernel") as intra, Capture(fwd, "scan_inter_kernel") as inter:
        fwd.path_attention_fwd(q, k, v, w, beta, g, scale=D ** -0.5, cu_seqlens=None, params=params)
    rows = []
    for cap in (intra, inter):
        if not cap.calls:
            continue
        spec = KERNELS[cap.name]
        grid, args, kw = cap.calls[0]
        saved = {i: args[i].clone() for i in spec["inplace"]}

        def restore():
            for i, t in saved.items():
                args[i].copy_(t)

        restore()
        cap.real[grid](*args, **kw)
        ref = {n: args[i].clone() for n, i in spec["outputs"].items()}
        base = dict(D=D, T=T, B=B, H=H, gate=gate, kernel=cap.name, grid=list(grid))
        for label, kernel, over in [("shipped", cap.real, {})] + candidates(cap.name, cap.real, kw, files):
            kw2 = dict(kw, **over)
            row = dict(base, candidate=label, num_warps=kw2["num_warps"], num_stages=kw2["num_stages"])
            if "WALK_STAGES" in kw2:
                row.update(walk_stages=kw2["WALK_STAGES"], tma=bool(kw2["TMA"]))
            try:
                restore()
                for i in spec["outputs"].values():
                    if i not in spec["inplace"]:
                        args[i].fill_(float("nan"))
                kernel[grid](*args, **kw2)
                row["diff"] = {n: rel(args[i], ref[n]) for n, i in spec["outputs"].items()}
                row["finite"] = all(bool(torch.isfinite(args[i]).all()) for i in spec["outputs"].values())
                if dev.type == "cuda":
                    row["ms"] = triton.testing.do_bench(lambda: kernel[grid](*args, **kw2), warmup=25, rep=200)
            except Exception as exc:     # a candidate that fails to compile or launch is a result too
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--tokens", type=int, default=TOKENS, help="B * T")
    ap.add_argument("--config", default="{}", help="knob overrides of the heuristic config (JSON)")
    ap.add_argument("--candidates", default="", help="FILE[,FILE]: benchmarks/variants/ modules with a "
                    "scan_intra_kernel and / or scan_inter_kernel of this tree's launch arguments")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "scan_probe.json"))
    args = ap.parse_args(argv)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")   # cpu: TRITON_INTERPRET=1, tiny shapes
    rows = []
    for D in map(int, args.head_dims.split(",")):
        for gate in (False, True):
            rows += probe(D, args.seq_len, gate, dev, args.tokens, json.loads(args.config),
                          [f for f in args.candidates.split(",") if f])
            with open(args.out, "w") as fh:
                json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
