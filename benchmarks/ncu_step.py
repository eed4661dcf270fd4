"""One forward + backward of the public API at a bench shape, for a kernel profiler to attach to.

    ncu --kernel-name regex:bwd_intra_diag --launch-count 1 --section SpeedOfLight --section WarpStateStats \\
        python benchmarks/ncu_step.py --D 128 --T 4096

B = 32768 / T (``--tokens``), H = 1024 / D, bf16, random inputs (``tuning.inputs.make_inputs``) and output
gradient, ``backend="triton"`` (the dispatcher's config: a tuned record of this GPU, else the untuned one).  Two
steps run: the first compiles (and is what ``--launch-skip`` skips).  ``--device cpu`` with TRITON_INTERPRET=1
runs the same steps in Triton's interpreter (small ``--tokens``: a check that the script works).
"""
from __future__ import annotations

import argparse

import torch

import pathtune
from pathtune.tuning.inputs import HEADS_FOR_DIM, TOKENS, make_inputs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--D", type=int, default=128)
    ap.add_argument("--T", type=int, default=4096)
    ap.add_argument("--gate", action="store_true", help="PaTH-FoX (default: PaTH)")
    ap.add_argument("--tokens", type=int, default=TOKENS, help="B * T (a multiple of T)")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args(argv)
    if a.tokens % a.T:
        ap.error(f"--tokens {a.tokens} is not a multiple of --T {a.T}")
    H = HEADS_FOR_DIM[a.D]
    q, k, v, w, beta, g = make_inputs(a.tokens // a.T, a.T, H, H, a.D, a.D, a.gate, device=a.device, seed=0)
    for x in (q, k, v, w, beta):
        x.requires_grad_(True)
    do = torch.randn_like(q)
    for _ in range(2):
        pathtune.path_attention(q, k, v, w, beta, g, backend="triton").backward(do)
    if q.is_cuda:
        torch.cuda.synchronize()
    return q.grad


if __name__ == "__main__":
    main()
