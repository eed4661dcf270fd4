"""The TVM forward on the GPU (marked ``gpu``): each module set of a bench folder (``pathtune
bench-build-tvm``, built on a CPU host; the GPU host loads it with the TVM runtime only) against the
float64 oracle at the spec's output tolerance, on two sequences of a length that is a multiple of no
block and spans two super-chunks (so the transport kernel runs), β in [1.5, 2), real gate decay.

The folder: ``PATHTUNE_TVM_BENCH_MODULES``, else ``build/tvm_bench`` in the checkout.  The decode step's
GPU test is in test_decode_dispatch.py.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

FOLDER = Path(os.environ.get("PATHTUNE_TVM_BENCH_MODULES")
              or Path(__file__).resolve().parents[1] / "build" / "tvm_bench")


@pytest.mark.gpu
@pytest.mark.parametrize("gated", [False, True], ids=["path", "fox"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_tvm_forward_matches_the_float64_oracle(head_dim, gated):
    from pathtune.specs import load_spec
    from pathtune.tuning.bench import HEADS_FOR_DIM, make_inputs
    from pathtune.tuning.measure import oracle_errors, oracle_kv_heads
    from pathtune.tuning.tvm_bench import TVMBenchModules

    if not (FOLDER / "manifest.json").is_file():
        pytest.skip(f"no TVM bench modules at {FOLDER}: build them with `pathtune bench-build-tvm --head-dim "
                    f"64,128 --gate both --out {FOLDER}` and carry the folder to the GPU host")
    modules = TVMBenchModules.open(FOLDER)
    mset = modules.load(head_dim, gated)
    heads = HEADS_FOR_DIM[head_dim]
    T = mset.params.superchunk_size + 3 * mset.params.chunk_size // 2 + 7
    xs = make_inputs(2, T, heads, heads, head_dim, head_dim, gated, device="cuda", seed=5)
    err = oracle_errors(lambda *a: mset.forward(*a)[0], xs, backward=False,
                        heads=oracle_kv_heads(heads, 2), seed=1)["o"]
    tol = load_spec().numerics.accuracy.tolerances["o"]
    assert err <= tol, f"TVM forward D={head_dim} gate={gated}: o error {err:.3g} > {tol:g} (T={T}, B=2)"
