"""Host cost of kernel dispatch: the first (uncached) decision and the cached path.

    python benchmarks/dispatch_overhead.py            # CPU or GPU host; no kernel is launched
    python benchmarks/dispatch_overhead.py --e2e      # GPU: also path_attention's whole host overhead
    python benchmarks/dispatch_overhead.py --decode   # CPU or GPU host: path_attention_decode's cached path
    python benchmarks/dispatch_overhead.py --fwd-bwd  # CPU or GPU host: the Triton fwd + bwd launchers' own work

Prints microseconds per call of ``select_plan`` (the per-call selection ``path_attention`` runs)
for a cached key, and the time of the first decision of a key (pack / perf_db lookup). With
``--e2e`` on a GPU: the median wall time of a tiny ``path_attention`` call with and without
``backend='auto'`` dispatch, both launching the same kernel (host-bound at that size).

``--decode``: the host work of a cached ``path_attention_decode`` call (B = 8, one new token, cache
4096, D 64 / 128, PaTH and PaTH-FoX) up to the Triton launch, which is replaced by a stub that takes the
launch's arguments and returns: the call key plus the prepared-step lookup, and the whole public call
(key, lookup, the prepared Triton step's Python: capacity check, scratch and pending-window lookups,
output allocation, the launch arguments, the host length mirrors). The tensors live on the ``meta``
device, which runs every line a CUDA call runs except the kernel (no value checks, as on the GPU
without PATHTUNE_CHECK_INPUTS); the compiled kernel's launcher (the driver call, ~15-20 us on an H200 host)
is not included.

``--fwd-bwd``: the host work of one forward + backward through the Triton launchers (``forward_op`` then
``backward_op``, the untuned config, B * T = 32768 tokens, D 64 / 128, T 2K / 4K / 16K, PaTH and PaTH-FoX) on
``meta`` tensors with every kernel launch stubbed, and the launches it makes: what the host spends per training
step besides the launches themselves (each ~15-20 us in Triton's launcher and the driver on an H200 host) and the
autograd engine.  Where that total nears the step's GPU time the step is host-bound.
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
    p.add_argument("--decode", action="store_true",
                   help="time the cached host path of path_attention_decode (the launch stubbed) instead")
    p.add_argument("--fwd-bwd", action="store_true",
                   help="time the Triton forward + backward launchers' host work (launches stubbed) instead")
    args = p.parse_args()
    if args.fwd_bwd:
        fwd_bwd_host()
        return
    if args.decode:
        decode_host(max(1, args.n // 10))
        return

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


class _NoLaunch:
    """Stands in for ``decode_kernel``: ``decode_kernel[grid](*args, **kwargs)`` takes the arguments, launches nothing
    and returns a compiled kernel whose launcher launches nothing either, so that the step's later calls take its
    repeat path (the kept compiled kernel's launcher) as they do on a GPU; the real kernel's attributes (its Python
    function) show through."""

    def __init__(self, real) -> None:
        self.real = real

    def __getattr__(self, attr):
        return getattr(self.real, attr)

    def __getitem__(self, grid):
        return self._launch

    @staticmethod
    def _launch(*args, **kwargs):
        return _no_run_kernel()


def _no_run_kernel():
    from triton.compiler import CompiledKernel

    class NoRun(CompiledKernel):
        def __init__(self) -> None:   # nothing to load
            pass

        def __getitem__(self, grid):
            return lambda *args: None

    return NoRun()


def decode_host(n: int, repeats: int = 7) -> dict:
    """us per call of the cached decode path's host work (see the module docstring); returns the numbers."""
    import os

    os.environ["TRITON_INTERPRET"] = "1"   # backend 'triton' accepts non-CUDA tensors; nothing is interpreted
    import pathtune
    from pathtune.codegen.triton import decode as tdecode
    from pathtune.runtime import decode as rdecode
    from pathtune.runtime import dispatch

    B, L0, dev, dt = 8, 4096, torch.device("meta"), torch.bfloat16
    real_kernel = tdecode.decode_kernel
    tdecode.decode_kernel = _NoLaunch(real_kernel)
    out = {}
    try:
        for D, H in ((64, 16), (128, 8)):
            for gated in (False, True):
                cache = pathtune.PaTHKVCache.empty(B, H, D, D, H, max_len=2 * L0, gated=gated, dtype=dt, device=dev)
                q, k, v = (torch.empty(B, 1, H, D, dtype=dt, device=dev) for _ in range(3))
                w = torch.empty(B, 1, H, D, device=dev)
                beta = torch.empty(B, 1, H, device=dev)
                g = torch.empty(B, 1, H, device=dev) if gated else None
                xs = (q, k, v, w, beta, g, cache)
                plans = dispatch.get_dispatcher().decode_plans

                def reset():
                    cache.set_state(L0, L0)   # the stub appends nothing: keep the length in one bucket

                def call():
                    pathtune.path_attention_decode(*xs, backend="triton")

                def lookup():   # the cached path's key and lookup, whatever it is built from
                    (dispatch._DISPATCHER or dispatch.get_dispatcher()).decode_plans.get(
                        rdecode._call_key(q, k, v, w, beta, g, cache, None, "triton", None))

                reset()
                call()   # prepares the step of this key
                before = len(plans)
                row = {}
                for name, fn in (("key_lookup", lookup), ("call", call)):
                    times = []
                    for _ in range(repeats):
                        reset()
                        t0 = time.perf_counter()
                        for _ in range(n):
                            fn()
                        times.append((time.perf_counter() - t0) / n * 1e6)
                    row[name] = min(times)
                assert len(plans) == before, "the timed calls prepared a new step (the key changed)"
                tag = f"D{D} H{H} {'PaTH-FoX' if gated else 'PaTH'}"
                out[tag] = row
                print(f"decode {tag:22s}: call key + step lookup {row['key_lookup']:6.2f} us/call; whole cached "
                      f"call, launch stubbed {row['call']:6.2f} us/call")
    finally:
        tdecode.decode_kernel = real_kernel
    return out


def fwd_bwd_host(repeats: int = 7, n: int = 5, shapes=((64, 16), (128, 8)), seq_lens=(2048, 4096, 16384),
                 tokens: int = 32768) -> dict:
    """ms per call of the Triton forward + backward launchers' host work and launches per call (module docstring);
    returns {tag: {"host_ms", "launches", "by_kernel"}}."""
    import collections
    import os
    import sys

    # the launchers take their GPU paths for non-CUDA tensors under the interpreter flag (the gate cumsum kernel,
    # not its float64 torch fallback); every launch is stubbed below, so nothing is interpreted
    os.environ["TRITON_INTERPRET"] = "1"
    from pathtune.codegen._knobs import config_json
    from pathtune.codegen.triton import backward, forward

    launched: collections.Counter = collections.Counter()

    class Stub:
        def __init__(self, kernel) -> None:
            self.name = getattr(getattr(kernel, "fn", kernel), "__name__", repr(kernel))

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launched[self.name] += 1
            return launch

    modules = [m for name, m in sys.modules.items()
               if name.startswith("pathtune.codegen.triton.") and callable(getattr(m, "compiled", None))]
    real = {m: m.compiled for m in modules}
    out = {}
    try:
        for m in modules:
            m.compiled = Stub
        for D, H in shapes:
            cj = config_json("triton", None, None, (D, D))
            for T in seq_lens:
                B = tokens // T
                q, k, v = (torch.empty(B, T, H, D, dtype=torch.bfloat16, device="meta") for _ in range(3))
                w = torch.empty(B, T, H, D, device="meta")
                beta = torch.empty(B, T, H, device="meta")
                for gated in (False, True):
                    g = torch.empty(B, T, H, device="meta") if gated else None

                    def step():
                        o, lse, kept = forward.forward_op(q, k, v, w, beta, g, None, D ** -0.5, cj, "inside_scale")
                        backward.backward_op(torch.empty_like(o), None, q, k, v, w, beta, g, o, lse, None, kept,
                                             D ** -0.5, cj, "inside_scale")

                    step()   # layout and range tables built once per shape, as on the GPU
                    launched.clear()
                    step()
                    by_kernel = dict(launched)
                    ms = per_call_us(step, n, repeats) / 1e3
                    tag = f"D{D} H{H} T{T} B{B} {'PaTH-FoX' if gated else 'PaTH'}"
                    out[tag] = {"host_ms": ms, "launches": sum(by_kernel.values()), "by_kernel": by_kernel}
                    print(f"fwd+bwd {tag:28s}: launchers' host work {ms:6.2f} ms/call (launches stubbed), "
                          f"{sum(by_kernel.values())} launches")
    finally:
        for m, fn in real.items():
            m.compiled = fn
    return out


if __name__ == "__main__":
    main()
