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
    # the timed callables are the public API's (they dispatch themselves); the row keeps what they dispatch
    assert seen == [(False, "tuned"), (True, "tuned")]
    f_cfg, fb_cfg = row.configs["f"], row.configs["fb"]
    for name, value in tuned["fwd"].items():
        assert f_cfg[name] == value
    # fwd+bwd: forward-only knobs from the fwd row, the shared ones (superchunk_size) from the bwd row
    # (spec defaults there), whose gate checked them on the gradients
    assert (fb_cfg["block_n"], fb_cfg["inter_num_warps"], fb_cfg["superchunk_size"]) == (128, 4, 1024)
    for name, value in tuned["bwd"].items():
        assert fb_cfg[name] == value
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


def _fake_callables(monkeypatch, callable_named):
    """The bench's pathtune, SDPA and fla callables replaced by ``callable_named(name)`` (names pathtune,
    sdpa_flash, sdpa_cudnn, fla), its accuracy check by a passing one."""
    from pathtune.tuning import baselines, bench

    monkeypatch.setattr(bench, "_accuracy", lambda *a, **kw: {"o": 1e-3})
    monkeypatch.setattr(bench, "_pathtune_callable", lambda *a: callable_named("pathtune"))
    monkeypatch.setattr(baselines, "sdpa_callable", lambda q, k, v, kind, backward: callable_named(f"sdpa_{kind}"))
    monkeypatch.setattr(baselines, "fla_path_callable", lambda *a, backward: callable_named("fla"))


def test_bench_rounds_interleave_and_keep_the_median(tmp_path, monkeypatch):
    """rounds=3: every callable of a row is timed once per round, the rounds interleaved (pathtune, SDPA,
    fla, then again); the row keeps each key's median over rounds (a slow first sample of pathtune, as a
    transient slowdown gives, moves nothing) and each round's time; the perf_db record names the method;
    a baseline that raises is a failure of its own key, the others keep their times."""
    from pathtune.tuning import bench

    names = {}

    def callable_named(name):
        def fn():
            return None
        names[fn] = name
        return fn

    _fake_callables(monkeypatch, callable_named)
    order, samples = [], {"pathtune": [9.0, 2.0, 2.2], "sdpa_flash": [1.0, 1.1, 0.9], "sdpa_cudnn": [0.5] * 3}

    def timer(fn):
        name = names[fn]
        order.append(name)
        if name == "fla":
            raise RuntimeError("fla broke")
        return samples[name][sum(1 for n in order if n == name) - 1]

    monkeypatch.setattr(bench, "_median_ms", timer)
    (row,) = bench.run_bench((32,), (64,), (False,), tokens=64, config={"chunk_size": 16}, backward=False,
                             device="cpu", rounds=3, log=lambda s: None)
    assert order == ["pathtune", "sdpa_flash", "sdpa_cudnn", "fla"] + ["pathtune", "sdpa_flash", "sdpa_cudnn"] * 2
    assert row.times["pathtune_f"] == 2.2 and row.rounds["pathtune_f"] == [9.0, 2.0, 2.2]
    assert row.times["sdpa_flash_f"] == 1.0 and row.times["sdpa_cudnn_f"] == 0.5
    assert "fla_f" not in row.times and row.failures == {"fla_f": "RuntimeError: fla broke"}
    url = f"sqlite:///{tmp_path / 'perf.sqlite3'}"
    assert bench.record_rows([row], url, {"chunk_size": 16}, "pathtune bench --rounds 3") == 1
    with PerfDB(url, current_keys=None) as db:
        (rec,) = db.query()
    assert rec["median_ms"] == 2.2
    assert bench.bench_method(3) == "median of 3 interleaved rounds of triton.testing.do_bench medians"
    for bad in (0, -1, 1.5, True):
        try:
            bench.run_bench((32,), (64,), (False,), device="cpu", rounds=bad)
        except ValueError as e:
            assert "rounds must be an integer >= 1" in str(e)
        else:
            raise AssertionError(f"rounds={bad!r} accepted")


class _FakeCudaMemory:
    """torch.cuda's memory counters for CPU tests: callables allocate through ``alloc`` / ``free``."""

    def __init__(self, allocated: int = 0) -> None:
        self.allocated = self.peak = allocated
        self.synced = 0

    def alloc(self, nbytes: int) -> None:
        self.allocated += nbytes
        self.peak = max(self.peak, self.allocated)

    def free(self, nbytes: int) -> None:
        self.allocated -= nbytes

    def synchronize(self) -> None:
        self.synced += 1

    def reset_peak_memory_stats(self) -> None:
        self.peak = self.allocated

    def memory_allocated(self) -> int:
        return self.allocated

    def max_memory_allocated(self) -> int:
        return self.peak


def test_bench_memory_is_the_peak_above_what_was_allocated_before(monkeypatch):
    """extra_peak_gib: a call that holds 3 GiB of temporaries and keeps 1 GiB, on top of 5 GiB of inputs and
    of an earlier call's higher peak, allocates 3 GiB at its peak (its own, from a reset peak); with
    ``memory`` the bench measures each timed forward+backward callable once (the gated row takes SDPA's from
    its ungated twin, as its times), a callable that raises there is its own failure, and the table shows
    the column; without the backward there is nothing to measure."""
    from pathtune.tuning import bench

    gib = 2 ** 30
    mem = _FakeCudaMemory(allocated=5 * gib)
    mem.peak = 40 * gib     # an earlier call's peak: reset before the measured call

    def call():
        mem.alloc(3 * gib)
        mem.free(2 * gib)
        return "o"

    assert bench.extra_peak_gib(call, mem=mem) == 3.0 and mem.synced == 2

    costs = {"pathtune": 1.5, "sdpa_flash": 0.25, "sdpa_cudnn": 0.5, "fla": 4.0}
    names = {}

    def callable_named(name):
        def fn():
            if name == "sdpa_cudnn":
                raise RuntimeError("cudnn broke")
            mem.alloc(int(costs[name] * gib))
            mem.free(int(costs[name] * gib))
        names[fn] = name
        return fn

    _fake_callables(monkeypatch, callable_named)
    monkeypatch.setattr(bench, "_median_ms", lambda fn: 1.0)
    real_measure = bench._measure_memory
    monkeypatch.setattr(bench, "_measure_memory", lambda row, timed: real_measure(row, timed, mem))
    plain, gated = bench.run_bench((32,), (64,), (False, True), tokens=64, config={"chunk_size": 16}, device="cpu",
                                   memory=True, log=lambda s: None)
    assert plain.memory_gib == {"pathtune_fb": 1.5, "sdpa_flash_fb": 0.25, "fla_fb": 4.0}
    assert plain.failures == {"sdpa_cudnn_fb": "RuntimeError: cudnn broke"}   # raised while measured (timer faked)
    assert gated.memory_gib == {"pathtune_fb": 1.5, "fla_fb": 4.0, "sdpa_flash_fb": 0.25}
    from rich.console import Console

    console = Console(width=400, record=True)
    console.print(bench.format_table([plain, gated]))
    text = console.export_text()
    assert "extra GiB ours" in text and "4.00" in text and "0.25" in text
    try:
        bench.run_bench((32,), (64,), (False,), device="cpu", backward=False, memory=True)
    except ValueError as e:
        assert "backward=True" in str(e)
    else:
        raise AssertionError("memory without the backward accepted")


def test_cli_memory_needs_the_forward_backward_bench():
    """`pathtune bench --memory` measures forward+backward calls: with --forward-only or --pass decode it
    stops before any GPU work and says what to drop."""
    from typer.testing import CliRunner

    from pathtune.cli import app

    for args in (["--forward-only"], ["--pass", "decode"]):
        res = CliRunner().invoke(app, ["bench", "--memory", *args], env={"COLUMNS": "250"})
        out = " ".join(res.output.split())
        assert res.exit_code == 2 and "--memory measures forward+backward calls" in out, res.output


def test_bench_times_the_public_api_when_tuned(monkeypatch):
    """With ``config="tuned"`` the timed callable is ``pathtune.path_attention(backend="auto")`` (host work and
    dispatch included, as users call it), forward and forward+backward; a given config times
    ``path_attention_triton`` at that config."""
    import pathtune.codegen.triton as tri
    from pathtune.runtime import api
    from pathtune.tuning import bench

    calls = []

    def out(q, k, v, w, beta, g):      # an output that uses every input (the backward's gradients flow)
        s = (q * k * w).sum(-1) * beta + g
        return v * s[..., None]

    def fake_public(q, k, v, w, beta, g=None, **kw):
        calls.append(("public", kw))
        return out(q, k, v, w, beta, g)

    def fake_triton(q, k, v, w, beta, g=None, **kw):
        calls.append(("triton", kw))
        return out(q, k, v, w, beta, g), None

    monkeypatch.setattr(api, "path_attention", fake_public)
    monkeypatch.setattr(tri, "path_attention_triton", fake_triton)
    xs = bench.make_inputs(1, 8, 2, 2, 4, 4, True, device="cpu", seed=0, dtype=torch.float32)
    bench._pathtune_callable(*xs, "tuned", False)()
    bench._pathtune_callable(*xs, "tuned", True)()
    bench._pathtune_callable(*xs, {"block_n": 32}, False)()
    assert calls[0] == ("public", {"backend": "auto"}) and calls[1] == ("public", {"backend": "auto"}), calls
    assert calls[2] == ("triton", {"config": {"block_n": 32}}), calls
