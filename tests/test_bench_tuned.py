"""`pathtune bench --config tuned`: each row runs what the runtime's dispatch picks for its shape (fwd
knobs for the forward timing, fwd + bwd knobs for forward+backward), reports where they came from,
and records those knobs (not the heuristic's) in perf_db. Timer, accuracy check and kernels stubbed:
the plumbing is under test here; the kernels have their own interpreter tests."""
from __future__ import annotations

import torch

from pathtune.perf_db import KernelKey, Measurement, PerfDB
from pathtune.runtime.environment import collect_env
from pathtune.specs import Config, Workload, load_spec


def test_bench_tuned_uses_and_records_dispatch_choices(tmp_path, monkeypatch):
    from pathtune.codegen.triton import source_hash
    from pathtune.runtime import dispatch
    from pathtune.tuning import bench

    url = f"sqlite:///{tmp_path / 'perf.sqlite3'}"
    spec = load_spec()
    env = collect_env()
    D, T, B, H = 32, 64, 1, bench.HEADS_FOR_DIM[32]
    # a tuned forward row and a tuned backward row for the bench's shape
    tuned = {"fwd": {"superchunk_size": 512, "block_n": 128, "inter_num_warps": 4},
             "bwd": {"bwd_block_n": 32, "bwd_num_warps": 8}}
    with PerfDB(url) as db:
        for pass_, knobs in tuned.items():
            wl = Workload(head_dim=D, head_dim_v=D, heads_q=H, heads_kv=H, dtype="bfloat16", use_gate=True,
                          pass_=pass_, seq_bucket=T, batch_bucket=B)
            kernel = KernelKey(pass_=pass_, backend="triton", spec_hash=spec.hash, source_hash=source_hash(pass_))
            db.record(env, kernel, wl, Config(knobs), Measurement(status="ok", median_ms=1.0, errors={"o": 1e-3}))
    db = PerfDB(url)
    old = dispatch.set_dispatcher(dispatch.Dispatcher(env_info=env, db=db, pack=None, gpu_only=False))

    seen = []
    monkeypatch.setattr(bench, "_median_ms", lambda fn: 2.0)
    monkeypatch.setattr(bench, "_accuracy",
                        lambda *a, **kw: {"o": 1e-3, **({"dq": 2e-3} if kw.get("backward") else {})})
    monkeypatch.setattr(bench, "_pathtune_callable",
                        lambda q, k, v, w, beta, g, config, bw: seen.append((bw, config)) or (lambda: None))
    rows = bench.run_bench((D,), (T,), (True,), tokens=T, config="tuned", baselines=(), device="cpu",
                           log=lambda s: None)
    (row,) = rows
    assert not row.failures, row.failures
    assert row.errors == {"o": 1e-3, "dq": 2e-3}
    (_, f_cfg), (_, fb_cfg) = seen
    for name, value in tuned["fwd"].items():
        assert f_cfg[name] == value
    # fwd+bwd: forward-only knobs from the fwd row, the shared ones (superchunk_size) from the bwd row
    # (spec defaults there), whose gate checked them on the gradients
    assert (fb_cfg["block_n"], fb_cfg["inter_num_warps"], fb_cfg["superchunk_size"]) == (128, 4, 1024)
    for name, value in tuned["bwd"].items():
        assert fb_cfg[name] == value
    assert row.configs == {"f": f_cfg, "fb": fb_cfg}
    assert "perf_db" in row.dispatch["f"] and "perf_db" in row.dispatch["fb"]

    dispatch.set_dispatcher(old)
    db.close()
    bench.record_rows(rows, url, "tuned", "pathtune bench --config tuned")
    with PerfDB(url, current_keys=None) as db:
        recorded = [r for r in db.query() if r["command"] == "pathtune bench --config tuned"]
    assert len(recorded) == 2
    by_pass = {r["pass"]: r["config"] for r in recorded}
    assert by_pass["fwd"]["superchunk_size"] == 512 and by_pass["bwd"]["bwd_block_n"] == 32


def test_bench_accuracy_check_runs_the_kernel_against_the_oracle():
    """bench's accuracy column: the Triton kernel (interpreter here) on batch 0's first tokens vs the
    float64 oracle on the first and last kv heads."""
    from pathtune.tuning import bench

    q, k, v, w, beta, g = bench.make_inputs(2, 40, 4, 2, 16, 16, True, device="cpu", seed=5, dtype=torch.float32)
    cfg = dict(chunk_size=16, superchunk_size=32, block_m=16, block_n=16, bwd_block_n=16)
    errors = bench._accuracy(q, k, v, w, beta, g, cfg, check_len=24)
    assert list(errors) == ["o"] and errors["o"] < 1e-3
    # with the backward: o and every gradient of the fwd+bwd config
    errors = bench._accuracy(q, k, v, w, beta, g, cfg, check_len=24, backward=True)
    assert set(errors) == {"o", "dq", "dk", "dv", "dw", "dbeta", "dg"}
    assert max(errors.values()) < 1e-3, errors
    # a wrong kernel shows: beta clipped where beta > 2 - 2^-4 changes dbeta (the tuner's gate rejects it)
    errors = bench._accuracy(q, k, v, w, beta, g, {**cfg, "beta_clip_eps": 0.0625}, check_len=24, backward=True)
    assert errors["dbeta"] > 1e-2, errors
