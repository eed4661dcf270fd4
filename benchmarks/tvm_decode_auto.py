"""GPU host: show ``backend="auto"`` decoding choosing between the Triton and the TVM step from perf_db records.

    PATHTUNE_DB_URL=sqlite:///.../perf.sqlite3 PATHTUNE_TVM_MODULES=build/tvm_decode_bench \\
        python benchmarks/tvm_decode_auto.py [--head-dim 128] [--cache-len 32767] [--json out.json]

Run after `pathtune bench --pass decode --backends triton,tvm --tvm-modules DIR --record` filled the database
(benchmarks/gpu_session.sh step tvmdecodebench). For one decode key (B 8, H from the bench's shapes, bf16,
no gate; a cache of 32767 keys plus the new token: the 32768 length bucket the bench recorded) it prints the
dispatcher's plan (backend, config, source, and why TVM was passed over if it was), then times one decode
step through the public API: ``pathtune.path_attention_decode(backend="auto")``, ``backend="triton"`` with the
Triton record's knobs, and SDPA flash over the same keys. Exit status 1 when auto did not pick TVM.
"""
from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--cache-len", type=int, default=32767)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)

    import torch
    import triton

    import pathtune
    from pathtune.runtime import decode_dispatch, dispatch
    from pathtune.specs import Workload
    from pathtune.specs.workload import batch_bucket, seq_bucket
    from pathtune.tuning.baselines import sdpa_backend
    from pathtune.tuning.bench import HEADS_FOR_DIM
    from pathtune.tuning.decode_bench import make_cache, make_step, sdpa_decode_callable

    D, B, L = a.head_dim, a.batch, a.cache_len
    H = HEADS_FOR_DIM.get(D, max(1, 1024 // D))
    gen = torch.Generator(device="cuda").manual_seed(0)
    cache = make_cache(B, L, H, D, False, device="cuda", gen=gen)
    step = make_step(B, H, D, False, device="cuda", gen=gen)

    def call(backend, config=None):
        def run():
            cache.length = L     # fixed key length: the new token lands on row L every call
            return pathtune.path_attention_decode(*step, cache, backend=backend, config=config)
        return run

    call("auto")()                                       # the first call looks the plan up (and loads modules)
    plan = decode_dispatch.plan_for(torch.device("cuda", 0), D, D, H, H, torch.bfloat16, cache.k.dtype, False, L + 1, B)
    wl = Workload(head_dim=D, head_dim_v=D, heads_q=H, heads_kv=H, dtype="bfloat16", use_gate=False, pass_="decode",
                  seq_bucket=seq_bucket(L + 1), batch_bucket=batch_bucket(B))
    triton_choice = dispatch.get_dispatcher().choose("decode", wl, torch.device("cuda", 0), ("triton",))
    print(f"auto decode plan: {plan.backend}: {plan.describe()}")
    print(f"triton's own choice: {triton_choice.describe()}")

    def ms(fn):
        return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))

    out = dict(D=D, H=H, B=B, keys=L + 1, backend=plan.backend, plan=plan.describe(), fallback=plan.fallback,
               auto_ms=ms(call("auto")), triton_ms=ms(call("triton", dict(triton_choice.config))))
    cache.length = L
    with sdpa_backend("flash"):
        sdpa = sdpa_decode_callable(cache, step)
        out["sdpa_flash_ms"] = ms(sdpa) if sdpa else None
    if out["sdpa_flash_ms"]:
        out["auto_over_sdpa"] = out["auto_ms"] / out["sdpa_flash_ms"]
        out["triton_over_sdpa"] = out["triton_ms"] / out["sdpa_flash_ms"]
    print(json.dumps(out, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if plan.backend == "tvm" else 1


if __name__ == "__main__":
    sys.exit(main())
