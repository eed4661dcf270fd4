"""Host cost of kernel dispatch: the first (uncached) decision and the cached path.

    python benchmarks/dispatch_overhead.py            # CPU or GPU host; no kernel is launched
    python benchmarks/dispatch_overhead.py --e2e      # GPU: also path_attention's whole host overhead

Prints microseconds per call of ``select_plan`` (the per-call selection ``path_attention`` runs)
for a cached key, and the time of the first decision of a key (pack / perf_db lookup). With
``--e2e`` on a GPU: the median wall time of a tiny ``path_attention`` call with and without
``backend='auto'`` dispatch, both launching the same kernel (host-bound at that size).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch


def per_call_us(fn, n: int, repeats: int = 7) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t0) / n * 1e6)
    return min(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=20000)
    p.add_argument("--e2e", action="store_true", help="GPU: time whole path_attention calls too")
    args = p.parse_args()

    from pathtune.runtime import dispatch

    device = torch.device("cuda", 0)   # a CUDA key; without a GPU nothing is launched, only looked up
    if torch.cuda.is_available():
        d = dispatch.Dispatcher()       # the real one: PATHTUNE_PACK, perf_db
    else:
        from pathtune.runtime.environment import collect_env

        d = dispatch.Dispatcher(env_info=collect_env(), db=None, pack=None)
    args_ = (device, 64, 64, 8, 2, "bfloat16", True, 4096, 2, False)
    t0 = time.perf_counter()
    plan = d.plan(*args_, backends=("triton", "tvm"), grad=False)
    first_ms = (time.perf_counter() - t0) * 1e3
    cached = per_call_us(lambda: d.plan(*args_, backends=("triton", "tvm"), grad=False), args.n)
    print(f"dispatch: first decision {first_ms:.2f} ms (source {plan.source}); cached select_plan "
          f"{cached:.2f} us/call")

    # the rest of path_attention's host work before the launch: spec, validation (shapes, dtypes,
    # devices, remembered per signature; the value checks are off for GPU inputs), backend resolution
    from pathtune.runtime.api import _validate, resolve_backend
    from pathtune.specs import load_spec

    B, T, HQ, H, D = 2, 4096, 8, 2, 64
    q = torch.empty(B, T, HQ, D, dtype=torch.bfloat16, device="meta")
    k, v = (torch.empty(B, T, H, D, dtype=torch.bfloat16, device="meta") for _ in range(2))
    w = torch.empty(B, T, H, D, device="meta")
    beta = torch.empty(B, T, H, device="meta")
    g = torch.empty(B, T, HQ, device="meta")

    def host_work():
        spec = load_spec()
        _validate(spec, q, k, v, w, beta, g, None, None)
        resolve_backend("auto", device)
        d.plan(*args_, backends=("triton", "tvm"), grad=False)

    print(f"path_attention host work before the launch (spec + validation + backend + cached plan): "
          f"{per_call_us(host_work, max(1, args.n // 10)):.2f} us/call")

    if args.e2e:
        if not torch.cuda.is_available():
            raise SystemExit("--e2e needs a CUDA GPU")
        import torch.nn.functional as F

        from pathtune import path_attention

        B, T, HQ, H, D = 1, 64, 2, 1, 64
        q = torch.randn(B, T, HQ, D, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        w = F.normalize(torch.randn(B, T, H, D, device="cuda"), dim=-1)
        beta = torch.rand(B, T, H, device="cuda") + 0.5
        for backend in ("triton", "auto"):
            path_attention(q, k, v, w, beta, backend=backend)
            torch.cuda.synchronize()
            us = []
            for _ in range(5):
                t0 = time.perf_counter()
                for _ in range(200):
                    path_attention(q, k, v, w, beta, backend=backend)
                torch.cuda.synchronize()
                us.append((time.perf_counter() - t0) / 200 * 1e6)
            print(f"path_attention(backend={backend!r}) T={T}: {statistics.median(us):.1f} us/call (host-bound)")


if __name__ == "__main__":
    main()
