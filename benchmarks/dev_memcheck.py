"""Bisect an illegal memory access: each case in its own process with CUDA_LAUNCH_BLOCKING=1,
so the faulting launch raises (the traceback names the kernel).

    python benchmarks/dev_memcheck.py            # all cases
    python benchmarks/dev_memcheck.py D T S gate # one case (child)
"""
import os
import subprocess
import sys
import traceback

CASES = [(32, 1300, 512, 1), (64, 1300, 512, 1), (32, 1536, 512, 1), (64, 1300, 1024, 1), (128, 1300, 512, 1)]


def child(D, T, S, gate):
    import torch
    import torch.nn.functional as F

    from pathtune.codegen.triton import path_attention_triton
    B, HQ, H = 2, 4, 4
    dev = "cuda"
    q, k, v = (torch.randn(B, T, h, D, device=dev).bfloat16() for h in (HQ, H, H))
    w = F.normalize(torch.randn(B, T, H, D, device=dev), dim=-1)
    beta = 1.5 + 0.5 * torch.rand(B, T, H, device=dev)
    g = torch.log(0.95 + 0.05 * torch.rand(B, T, HQ, device=dev)) if gate else None
    xs = [x.requires_grad_() for x in (q, k, v, w, beta)] + ([g.requires_grad_()] if gate else [])
    stage = "forward"
    try:
        o, _ = path_attention_triton(*xs[:5], g, config=dict(superchunk_size=S))
        torch.cuda.synchronize()
        stage = "backward"
        torch.autograd.grad(o, xs, torch.randn_like(o))
        torch.cuda.synchronize()
        print(f"OK   D={D} T={T} S={S} gate={gate}", flush=True)
    except Exception as exc:
        tb = traceback.extract_tb(exc.__traceback__)
        where = [f"{f.filename.split('/')[-1]}:{f.lineno} {f.line}" for f in tb if "pathtune" in f.filename][-3:]
        print(f"FAIL D={D} T={T} S={S} gate={gate} in {stage}: {type(exc).__name__}: {str(exc)[:120]} | {where}",
              flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        child(*map(int, sys.argv[1:]))
    else:
        env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
        for c in CASES:
            subprocess.run([sys.executable, __file__, *map(str, c)], env=env, timeout=120)
