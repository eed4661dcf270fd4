"""Runtime dispatch: source order, per-key caching, packs (hard / soft mismatch), broken perf_db fallbacks.

The dispatcher is exercised on the CPU with a fake H200 environment (``env_info``) and a
``torch.device("cuda", 0)`` key: nothing here launches a kernel except the interpreter test at the end.
"""
import dataclasses
import json
import sqlite3
import time
import warnings

import pytest
import torch

from pathtune.codegen._knobs import config_of, resolve
from pathtune.perf_db import KernelKey, Measurement, Pack, PackMismatch, PerfDB, SoftMismatchWarning, export_pack
from pathtune.runtime import dispatch
from pathtune.runtime.dispatch import Dispatcher, DispatchWarning, PackRefusedWarning
from pathtune.runtime.environment import collect_env
from pathtune.specs import KnobSpace, Workload, load_spec

CUDA0 = torch.device("cuda", 0)
SHAPE = dict(head_dim=64, head_dim_v=64, heads_q=4, heads_kv=2, dtype="bfloat16", use_gate=True)


@pytest.fixture(scope="module")
def env(fake_h200_env):
    return fake_h200_env


def fwd_cfg(**changes):
    return KnobSpace(load_spec(), "fwd").default().replace(**changes)


def bwd_cfg(**changes):
    return KnobSpace(load_spec(), "bwd").default().replace(**changes)


def wl(pass_="fwd", seq=1024, batch_bucket=1, **changes):
    return Workload(**{**SHAPE, **changes}, pass_=pass_, seq_bucket=seq, batch_bucket=batch_bucket)


def kernel(pass_="fwd", backend="triton"):
    return KernelKey(pass_=pass_, backend=backend, spec_hash=load_spec().hash,
                     source_hash=dispatch.current_keys("path_attention", pass_, backend)["source_hash"])


@pytest.fixture
def db_url(tmp_path):
    return f"sqlite:///{tmp_path / 'perf.sqlite3'}"


def record(url, env, rows):
    """rows: (workload, config, median_ms[, kernel])"""
    with PerfDB(url) as db:
        for row in rows:
            w, cfg, ms = row[:3]
            k = row[3] if len(row) > 3 else kernel(w.pass_)
            db.record(env, k, w, cfg, Measurement(status="ok", median_ms=ms))


def make_pack(env, entries=(), default=None, **meta_changes):
    meta = {"gpu_name": env["gpu_name"], "cc": env["compute_capability"], "spec_hash": load_spec().hash,
            "triton": env["triton"], "tvm": env["tvm"], "torch": env["torch"], "cuda": env["cuda_runtime"],
            "ptxas": env["ptxas"], "driver": env["driver"], "pathtune": env["pathtune"], "env_hash": "x" * 64}
    meta.update(meta_changes)
    doc = {"format": "pathtune-pack", "version": 1, "_metadata": meta,
           "entries": [{"workload": w.to_dict(), "pass": w.pass_, "backend": "triton", "config": c.to_dict(),
                        "median_ms": ms, "source_hash": kernel(w.pass_).source_hash} for w, c, ms in entries],
           "default": {} if default is None else {"fwd": {"backend": "triton", "config": default.to_dict()}}}
    return Pack(doc, "test-pack.json")


def dispatcher(env, url=None, pack=None):
    db = PerfDB(url, read_only=True, current_keys=dispatch.current_keys) if url else None
    return Dispatcher(env_info=env, db=db, pack=pack)


def plan(d, seq=1000, grad=False, **changes):
    s = {**SHAPE, **changes}
    return d.plan(CUDA0, s["head_dim"], s["head_dim_v"], s["heads_q"], s["heads_kv"], s["dtype"], s["use_gate"],
                  seq, 1, False, backends=("triton",), grad=grad)


# -- order -----------------------------------------------------------------------------------------

def test_pack_exact_beats_perf_db_exact(env, db_url):
    record(db_url, env, [(wl(), fwd_cfg(chunk_size=32), 0.4)])
    pack = make_pack(env, [(wl(), fwd_cfg(superchunk_size=512), 0.5)])
    d = dispatcher(env, db_url, pack)
    p = plan(d)
    assert (p.source, p.fwd.config) == ("pack", fwd_cfg(superchunk_size=512))
    assert json.loads(p.params_json)["superchunk_size"] == 512
    assert d.db_queries == 0  # an exact pack hit never asks the database


def test_perf_db_exact_beats_pack_bucket(env, db_url):
    record(db_url, env, [(wl(seq=1024), fwd_cfg(chunk_size=32), 0.4),
                         (wl(seq=1024), fwd_cfg(block_n=32), 0.3)])       # the faster one is served
    pack = make_pack(env, [(wl(seq=4096), fwd_cfg(superchunk_size=512), 0.5)])
    p = plan(dispatcher(env, db_url, pack))
    assert (p.source, p.fwd.config) == ("perf_db", fwd_cfg(block_n=32))


def test_bucket_pack_then_perf_db(env, db_url):
    record(db_url, env, [(wl(seq=256), fwd_cfg(chunk_size=32), 0.4)])
    pack = make_pack(env, [(wl(seq=4096), fwd_cfg(superchunk_size=512), 0.5)], default=fwd_cfg(num_warps=8))
    p = plan(dispatcher(env, db_url, pack))
    assert (p.source, p.fwd.config) == ("bucket", fwd_cfg(superchunk_size=512))
    assert "4096" in p.fwd.detail
    p = plan(dispatcher(env, db_url, None))
    assert (p.source, p.fwd.config) == ("bucket", fwd_cfg(chunk_size=32))


def test_other_batch_bucket_before_default(env, db_url):
    record(db_url, env, [(wl(batch_bucket=8), fwd_cfg(chunk_size=32), 0.4),
                         (wl(batch_bucket=32), fwd_cfg(block_n=32), 0.2)])
    pack = make_pack(env, [(wl(head_dim=128, head_dim_v=128, batch_bucket=4), fwd_cfg(num_warps=2), 0.5)],
                     default=fwd_cfg(num_warps=8))
    d = dispatcher(env, db_url, pack)
    p = plan(d)                                     # batch bucket 1: nearest measured bucket is 8
    assert (p.source, p.fwd.config) == ("bucket", fwd_cfg(chunk_size=32)) and "batch bucket 8 for 1" in p.fwd.detail
    p = d.plan(CUDA0, 64, 64, 4, 2, "bfloat16", True, 1000, 16, False)   # 16: 8 and 32 tie -> the larger
    assert p.fwd.config == fwd_cfg(block_n=32)
    p = d.plan(CUDA0, 64, 64, 4, 2, "bfloat16", True, 1000, 8, False)    # its own bucket: exact
    assert (p.source, p.fwd.config) == ("perf_db", fwd_cfg(chunk_size=32))
    p = plan(d, head_dim=128, head_dim_v=128, seq=100)    # the pack's entry at batch bucket 4, length 1024
    assert (p.source, p.fwd.config) == ("bucket", fwd_cfg(num_warps=2))
    assert "batch bucket 4 for 1, length bucket 1024 for 128" in p.fwd.detail
    p = plan(d, head_dim=96, head_dim_v=96)               # nothing of that shape anywhere: the pack default
    assert (p.source, p.fwd.config) == ("default", fwd_cfg(num_warps=8))


def test_other_gpu_of_the_same_architecture_serves_its_config(env, db_url):
    """A GPU without records of a key (here the fake H200) runs another GPU's result for it when that GPU has
    this one's compute capability, CUDA and Triton (source "gpu", the GPU named), after every result, gate
    transfer and pack entry of its own and before the heuristic; a GPU of another compute capability or Triton
    serves nothing; of two GPUs, the one with a record at the call's length bucket wins."""
    h100 = {**env, "gpu_name": "NVIDIA H100 80GB HBM3", "sm_count": 132}
    gh200 = {**env, "gpu_name": "NVIDIA GH200 480GB"}
    record(db_url, {**env, "gpu_name": "NVIDIA A100-SXM4-80GB", "compute_capability": "8.0"},
           [(wl(), fwd_cfg(num_warps=2), 0.1)])
    record(db_url, {**env, "gpu_name": "NVIDIA H20", "triton": "0.0.1"}, [(wl(), fwd_cfg(num_warps=2), 0.1)])
    p = plan(dispatcher(env, db_url))
    assert p.source == "heuristic"
    record(db_url, h100, [(wl(batch_bucket=8), fwd_cfg(chunk_size=32), 0.4),
                          (wl(batch_bucket=8), fwd_cfg(block_n=32), 0.3),
                          (wl(batch_bucket=8, seq=4096), fwd_cfg(num_stages=3), 0.2)])
    p = plan(dispatcher(env, db_url))
    assert (p.source, p.fwd.config) == ("gpu", fwd_cfg(block_n=32))
    assert "on NVIDIA H100 80GB HBM3" in p.fwd.detail and "batch bucket 8 for 1" in p.fwd.detail
    record(db_url, gh200, [(wl(batch_bucket=8, seq=4096), fwd_cfg(num_warps=8), 0.1)])
    assert plan(dispatcher(env, db_url)).fwd.config == fwd_cfg(block_n=32)     # the H100 has the call's bucket
    p = plan(dispatcher(env, db_url), seq=4000)                                  # both have 4096: more records
    assert (p.source, p.fwd.config) == ("gpu", fwd_cfg(num_stages=3))
    # this GPU's own result (the other gate's schedule, the pack's default) comes first
    pack = make_pack(env, [], default=fwd_cfg(num_warps=8))
    assert plan(dispatcher(env, db_url, pack)).source == "default"
    record(db_url, env, [(wl(use_gate=False, seq=256), fwd_cfg(chunk_size=32), 0.3)])
    assert plan(dispatcher(env, db_url)).source == "gate"
    with PerfDB(db_url) as db:
        with pytest.raises(Exception, match="collect_env"):
            db.best("f" * 64, "fwd", wl(), other_gpus=True)


def test_other_gate_lends_its_schedule_only(env, db_url):
    """A PaTH call (gate off) with results only for PaTH-FoX (gate on, the shipped H200 tune) runs their
    tiles, warps and stages with the heuristic's precision and beta clip (those passed the gate on the
    other function only), before the pack default; an own-gate result at any bucket wins over it."""
    tuned = fwd_cfg(block_n=128, num_stages=3, superchunk_size=256, ut_precision="tf32", beta_clip_eps=0.015625,
                    scan_precision="bf16")
    record(db_url, env, [(wl(), tuned, 0.4)])
    pack = make_pack(env, [(wl(head_dim=128, head_dim_v=128), fwd_cfg(num_warps=2), 0.5)],
                     default=fwd_cfg(num_warps=8))
    d = dispatcher(env, db_url, pack)
    p = plan(d, use_gate=False)
    cfg = p.fwd.config
    assert p.source == "gate" and "schedule knobs of the PaTH-FoX result" in p.fwd.detail
    assert (cfg["block_n"], cfg["num_stages"], cfg["superchunk_size"]) == (128, 3, 256)
    heuristic = dispatch.untuned_choice("fwd", wl(use_gate=False), "triton", "").config
    for name in ("ut_precision", "beta_clip_eps", "scan_precision", "transition_precision"):
        assert cfg[name] == heuristic[name], name
    assert json.loads(p.params_json)["beta_clip_eps"] == "off"
    # the pack's other-gate entry too (D = 128)
    p = plan(d, use_gate=False, head_dim=128, head_dim_v=128)
    assert p.source == "gate" and p.fwd.config["num_warps"] == 2 and "pack" in p.fwd.detail
    # a result of the call's own gate setting, even at another length bucket, comes first
    record(db_url, env, [(wl(use_gate=False, seq=4096), fwd_cfg(chunk_size=32), 0.3)])
    p = plan(dispatcher(env, db_url, pack), use_gate=False)
    assert (p.source, p.fwd.config) == ("bucket", fwd_cfg(chunk_size=32))


def test_pack_default_then_heuristic(env, db_url):
    other_shape = wl(head_dim=128, head_dim_v=128)
    record(db_url, env, [(other_shape, fwd_cfg(chunk_size=32), 0.4)])      # another head dim: not served
    pack = make_pack(env, [(other_shape, fwd_cfg(superchunk_size=512), 0.5)], default=fwd_cfg(num_warps=8))
    p = plan(dispatcher(env, db_url, pack))
    assert (p.source, p.fwd.config) == ("default", fwd_cfg(num_warps=8))
    p = plan(dispatcher(env, db_url, None))
    assert p.source == "heuristic"
    # the plan carries the untuned config (spec spelling); the op resolves it to the forward's params of the head
    # dim's untuned config (a forward-only plan: bwd_forward_state recompute, no state kept for a backward)
    assert resolve("triton", "fwd", json.loads(p.params_json), (64, 64)) == dataclasses.replace(
        resolve("triton", "fwd", None, (64, 64)), bwd_forward_state="recompute")
    assert plan(dispatcher(env, db_url, None), head_dim=128, head_dim_v=128).fwd.config == fwd_cfg(chunk_size=32)


def test_stale_source_hash_is_not_served(env, db_url):
    stale = KernelKey(pass_="fwd", backend="triton", spec_hash=load_spec().hash, source_hash="0123456789abcdef")
    record(db_url, env, [(wl(), fwd_cfg(chunk_size=32), 0.4, stale)])
    d = dispatcher(env, db_url)
    with pytest.warns(DispatchWarning, match=r"perf_db holds 1 fwd results for NVIDIA H200 measured with other "
                                             r"kernel code \(source_hash 0123456789ab != current"):
        assert plan(d).source == "heuristic"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert plan(d, seq=5000).source == "heuristic"     # warned once per process
    record(db_url, env, [(wl(seq=4096), fwd_cfg(block_n=32), 0.4)])   # one current result: no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert plan(dispatcher(env, db_url), seq=100, head_dim=128, head_dim_v=128).source == "heuristic"


def test_other_architecture_results_are_not_served(env, db_url):
    """Another GPU's results serve only GPUs of its compute capability (see the same-architecture test)."""
    record(db_url, {**env, "gpu_name": "NVIDIA A100", "compute_capability": "8.0"},
           [(wl(), fwd_cfg(chunk_size=32), 0.4)])
    assert plan(dispatcher(env, db_url)).source == "heuristic"


def test_training_plan_merges_backward_knobs(env, db_url):
    record(db_url, env, [(wl("fwd"), fwd_cfg(chunk_size=32, superchunk_size=512, block_n=128, ut_precision="tf32",
                                             beta_clip_eps=0.015625), 0.4),
                         (wl("bwd"), bwd_cfg(chunk_size=64, bwd_block_n=128, bwd_num_warps=8), 0.9)])
    p = plan(dispatcher(env, db_url), grad=True)
    params = json.loads(p.params_json)
    assert p.fwd.source == "perf_db" and p.bwd.source == "perf_db"
    # the knobs both passes share come from the bwd choice (its gate checked them on the gradients: a
    # forward-gated tf32 UT or beta clip passes o and fails dbeta), the forward-only ones from the fwd choice
    assert (params["chunk_size"], params["superchunk_size"]) == (64, 1024)
    assert (params["ut_precision"], params["beta_clip_eps"]) == ("tf32x3", "off")   # the bwd config's (spec defaults)
    assert (params["bwd_block_n"], params["bwd_num_warps"], params["block_n"]) == (128, 8, 128)
    inference = json.loads(plan(dispatcher(env, db_url), grad=False).params_json)
    assert (inference["bwd_block_n"], inference["chunk_size"], inference["ut_precision"]) == (64, 32, "tf32")


def test_tvm_candidates(env, db_url, monkeypatch):
    d = Dispatcher(env_info=env, db=None, pack=None)
    monkeypatch.setattr(dispatch, "tvm_available", lambda: False)
    with pytest.raises(NotImplementedError, match=r"backend 'tvm' cannot run this call: its runtime \(tvm, "
                                                  r"tvm_ffi\) is not importable"):
        d.plan(CUDA0, 64, 64, 4, 2, "bfloat16", True, 100, 1, False, backends=("tvm",))
    with pytest.raises(NotImplementedError, match="inputs are not on CUDA"):
        d.plan(torch.device("cpu"), 64, 64, 4, 2, "bfloat16", True, 100, 1, False, backends=("tvm",))
    assert d.plan(CUDA0, 64, 64, 4, 2, "bfloat16", True, 100, 1, False, backends=("triton", "tvm")).backend == "triton"
    monkeypatch.setattr(dispatch, "tvm_available", lambda: True)
    p = d.plan(CUDA0, 64, 64, 4, 2, "bfloat16", True, 100, 1, False, backends=("tvm",))
    assert p.backend == "tvm" and json.loads(p.params_json) == KnobSpace(load_spec(), "fwd").default().to_dict()
    assert p.bwd_params_json is None
    # auto: a faster TVM forward wins; with a backward, the Triton backward keeps the bwd choice's own knobs
    record(db_url, env, [(wl("fwd"), fwd_cfg(chunk_size=32), 0.5),
                         (wl("fwd"), fwd_cfg(chunk_size=64), 0.3, kernel("fwd", "tvm")),
                         (wl("bwd"), bwd_cfg(chunk_size=32, bwd_block_n=128), 0.9)])
    for grad in (False, True):
        p = plan_auto = dispatcher(env, db_url).plan(CUDA0, 64, 64, 4, 2, "bfloat16", True, 1000, 1, False,
                                                     backends=("triton", "tvm"), grad=grad)
        assert (p.backend, p.fwd.config["chunk_size"], p.source) == ("tvm", 64, "perf_db")
    bwd = json.loads(plan_auto.bwd_params_json)
    assert (bwd["chunk_size"], bwd["bwd_block_n"]) == (32, 128)


def test_tvm_forward_triton_backward_gradients(monkeypatch):
    """The mixed op: o/lse from the (here: emulated) TVM forward, gradients from the Triton backward."""
    import torch.nn.functional as F

    from pathtune.codegen.tvm import runtime as tvm_runtime
    from pathtune.codegen.tvm.training import path_attention_tvm_trainable
    from pathtune.runtime.reference import blockwise_path_attention, naive_path_attention

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    calls = []

    def fake_tvm(q, k, v, w, beta, g=None, *, scale=None, cu_seqlens=None, config=None):
        assert not any(t.requires_grad for t in (q, k, v, w, beta, g) if t is not None)  # as the real one
        calls.append(config)
        return blockwise_path_attention(q, k, v, w, beta, g, scale=scale, chunk_size=16, superchunk_size=32)

    monkeypatch.setattr(tvm_runtime, "path_attention_tvm", fake_tvm)
    gen = torch.Generator().manual_seed(4)
    B, T, HQ, H, D = 1, 40, 2, 1, 32
    q, k, v = (torch.randn(B, T, n, D, generator=gen) for n in (HQ, H, H))
    w = F.normalize(torch.randn(B, T, H, D, generator=gen), dim=-1)
    beta = torch.rand(B, T, H, generator=gen) + 0.5
    g = F.logsigmoid(torch.randn(B, T, HQ, generator=gen) + 3)
    xs = [t.requires_grad_() for t in (q, k, v, w, beta, g)]
    params = json.dumps({**config_of("triton", None, (32, 32)), "chunk_size": 16,
                         "superchunk_size": 32, "block_n": 16, "bwd_block_n": 16, "scan_precision": "tf32"})
    o, lse = path_attention_tvm_trainable(*xs, scale=D ** -0.5, cu_seqlens=None, config=fwd_cfg(),
                                          bwd_config_json=params, gate_placement="inside_scale")
    assert calls == [fwd_cfg()]
    (o.square().sum() + lse.sum()).backward()
    got = [t.grad.clone() for t in xs]
    ref_xs = [t.detach().double().requires_grad_() for t in xs]
    ref_o = naive_path_attention(*ref_xs, return_lse=True)
    (ref_o[0].square().sum() + ref_o[1].sum()).backward()
    for name, a, b in zip("q k v w beta g".split(), got, ref_xs):
        err = ((a.double() - b.grad).norm() / b.grad.norm()).item()
        assert err < 1e-2, (name, err)


# -- caching ---------------------------------------------------------------------------------------

def test_cached_decision_does_not_query_again_and_is_fast(env, db_url):
    record(db_url, env, [(wl(), fwd_cfg(chunk_size=32), 0.4)])
    d = dispatcher(env, db_url)
    first = plan(d, seq=1000)
    assert d.db_queries == 1
    assert plan(d, seq=700) is first       # same length bucket (1024): same key
    assert d.db_queries == 1
    plan(d, seq=1500)                      # bucket 2048: a new key, one more lookup
    assert d.db_queries == 2
    n = 2000
    args = (CUDA0, 64, 64, 4, 2, "bfloat16", True, 1000, 1, False)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            d.plan(*args, backends=("triton",), grad=False)
        times.append((time.perf_counter() - t0) / n)
    assert min(times) < 200e-6, f"cached dispatch took {min(times) * 1e6:.1f} us"
    assert d.db_queries == 2


def test_load_pack_clears_cached_decisions(env):
    d = dispatcher(env)
    assert plan(d).source == "heuristic"
    d.install_pack(make_pack(env, [(wl(), fwd_cfg(superchunk_size=512), 0.5)]))
    assert plan(d).source == "pack"
    d.uninstall_pack()
    assert plan(d).source == "heuristic"


# -- packs -----------------------------------------------------------------------------------------

def test_pack_of_another_gpu_is_refused(env, db_url, tmp_path):
    record(db_url, env, [(wl(), fwd_cfg(chunk_size=32), 0.4)])
    foreign = make_pack(env, [(wl(), fwd_cfg(superchunk_size=512), 0.5)], gpu_name="NVIDIA A100", cc="8.0")
    d = dispatcher(env, db_url)
    with pytest.warns(PackRefusedWarning, match=r"pack refused: pack test-pack.json was tuned for GPU name "
                                                r"'NVIDIA A100', but this machine has 'NVIDIA H200'"):
        assert d.install_pack(foreign) is None
    assert d.pack is None and plan(d).source == "perf_db"
    with pytest.raises(PackMismatch, match="Triton major.minor '0.1'"):
        d.install_pack(make_pack(env, triton="0.1.0"), strict=True)


def test_pack_soft_mismatch_is_served_with_one_warning(env):
    pack = make_pack(env, [(wl(), fwd_cfg(superchunk_size=512), 0.5), (wl(seq=4096), fwd_cfg(num_warps=8), 0.5)],
                     torch="1.0.0", driver="1.0")
    d = Dispatcher(env_info=env, db=None, pack=None)
    with pytest.warns(SoftMismatchWarning, match=r"torch 1.0.0 \(now"):
        d.install_pack(pack)
    with warnings.catch_warnings():
        warnings.simplefilter("error")    # no second warning for the lookups
        assert plan(d).source == "pack"
        assert plan(d, seq=4000).fwd.config == fwd_cfg(num_warps=8)


def test_pathtune_pack_env_is_read_on_first_lookup(env, tmp_path, monkeypatch):
    path = tmp_path / "h200.json"
    make_pack(env, [(wl(), fwd_cfg(superchunk_size=512), 0.5)]).save(path)
    monkeypatch.setenv("PATHTUNE_PACK", str(path))
    d = Dispatcher(env_info=env, db=None)
    assert plan(d).source == "pack"
    monkeypatch.setenv("PATHTUNE_PACK", str(tmp_path / "missing.json"))
    with pytest.warns(DispatchWarning, match=r"PATHTUNE_PACK=.*missing.json is not used: cannot read pack"):
        assert plan(Dispatcher(env_info=env, db=None)).source == "heuristic"


def test_public_load_pack(env, tmp_path, monkeypatch):
    import pathtune

    old = dispatch.set_dispatcher(Dispatcher(env_info=env, db=None, pack=None))
    try:
        path = tmp_path / "h200.json"
        make_pack(env, [(wl(), fwd_cfg(superchunk_size=512), 0.5)]).save(path)
        installed = pathtune.load_pack(path)
        assert installed is not None and dispatch.loaded_pack() is installed
        assert dispatch.select_plan(CUDA0, 64, 64, 4, 2, "bfloat16", True, 1000, 1, False).source == "pack"
        pathtune.unload_pack()
        assert dispatch.loaded_pack() is None
        assert dispatch.select_plan(CUDA0, 64, 64, 4, 2, "bfloat16", True, 1000, 1, False).source == "heuristic"
        (tmp_path / "bad.json").write_text("{not json")
        with pytest.raises(Exception, match="not a valid pathtune pack: not JSON"):
            pathtune.load_pack(tmp_path / "bad.json")
    finally:
        dispatch.set_dispatcher(old)


def test_export_writes_metadata_and_source_hash(env, db_url, tmp_path):
    record(db_url, env, [(wl(), fwd_cfg(chunk_size=32), 0.4)])
    with PerfDB(db_url) as db:
        doc = export_pack(db, "H200", tmp_path / "p.json")
    meta = doc["_metadata"]
    for key in ("gpu_name", "cc", "spec_hash", "triton", "tvm", "torch", "cuda", "ptxas", "driver", "env_hash"):
        assert key in meta, key
    assert meta["gpu_name"] == "NVIDIA H200" and meta["cc"] == "9.0" and meta["spec_hash"] == load_spec().hash
    assert doc["entries"][0]["source_hash"] == kernel().source_hash
    d = Dispatcher(env_info=env, db=None, pack=None)
    d.install_pack(tmp_path / "p.json")
    assert plan(d).fwd.config == fwd_cfg(chunk_size=32)


# -- broken databases ------------------------------------------------------------------------------

def _lazy(env, monkeypatch, url):
    monkeypatch.setenv("PATHTUNE_DB_URL", url)
    return Dispatcher(env_info=env, pack=None)


def _one_warning_then_heuristic(d):
    with pytest.warns(DispatchWarning) as caught:
        assert plan(d).source == "heuristic"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert plan(d, seq=5000).source == "heuristic"   # a new key: no second warning, no new attempt
    return [str(w.message) for w in caught if issubclass(w.category, DispatchWarning)]


def test_missing_db_falls_back(env, tmp_path, monkeypatch):
    msgs = _one_warning_then_heuristic(_lazy(env, monkeypatch, f"sqlite:///{tmp_path / 'none.sqlite3'}"))
    assert len(msgs) == 1 and "no database at" in msgs[0] and "load a pack" in msgs[0]
    assert not (tmp_path / "none.sqlite3").exists()   # read-only use: nothing created


def test_corrupt_db_falls_back(env, tmp_path, monkeypatch):
    path = tmp_path / "perf.sqlite3"
    path.write_bytes(b"this is not a database" * 100)
    msgs = _one_warning_then_heuristic(_lazy(env, monkeypatch, f"sqlite:///{path}"))
    assert len(msgs) == 1 and "cannot read" in msgs[0]


def test_db_at_other_schema_revision_falls_back(env, db_url, monkeypatch):
    record(db_url, env, [(wl(), fwd_cfg(chunk_size=32), 0.4)])
    con = sqlite3.connect(db_url.removeprefix("sqlite:///"))
    con.execute("UPDATE perf_alembic_version SET version_num = '0000_older'")
    con.commit()
    con.close()
    msgs = _one_warning_then_heuristic(_lazy(env, monkeypatch, db_url))
    assert "'0000_older'" in msgs[0] and "this pathtune does not know" in msgs[0] and "upgrade pathtune" in msgs[0]


def test_locked_db_falls_back_quickly(env, db_url, monkeypatch):
    record(db_url, env, [(wl(), fwd_cfg(chunk_size=32), 0.4)])
    con = sqlite3.connect(db_url.removeprefix("sqlite:///"), isolation_level=None)
    con.execute("PRAGMA locking_mode = EXCLUSIVE")
    con.execute("BEGIN EXCLUSIVE")
    con.execute("DELETE FROM perf_measurement WHERE id < 0")   # take and hold the lock
    try:
        t0 = time.perf_counter()
        msgs = _one_warning_then_heuristic(_lazy(env, monkeypatch, db_url))
        assert time.perf_counter() - t0 < 10      # the read-only engine waits 200 ms, not 30 s
        assert "locked" in msgs[0]
    finally:
        con.execute("ROLLBACK")
        con.close()
    assert plan(_lazy(env, monkeypatch, db_url)).source == "perf_db"   # unlocked: served again


def test_dispatch_db_can_be_switched_off(env, db_url, monkeypatch):
    record(db_url, env, [(wl(), fwd_cfg(chunk_size=32), 0.4)])
    monkeypatch.setenv("PATHTUNE_DISPATCH_DB", "0")
    d = _lazy(env, monkeypatch, db_url)
    assert plan(d).source == "heuristic" and d.database() is None


def test_print_dispatch_once_per_key(env, db_url, monkeypatch, capsys):
    record(db_url, env, [(wl(), fwd_cfg(chunk_size=32), 0.4)])
    monkeypatch.setenv("PATHTUNE_PRINT_DISPATCH", "1")
    monkeypatch.setattr(dispatch, "_printed", set())
    d = dispatcher(env, db_url)
    for _ in range(3):
        plan(d)
    plan(d, seq=100)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2
    assert "seq<=1024" in err[0] and "chunk_size=32" in err[0] and "(source: perf_db;" in err[0]
    assert "seq<=128" in err[1] and "(source: bucket;" in err[1]


def test_cpu_calls_use_the_heuristic_without_lookups(env, db_url):
    record(db_url, env, [(wl(), fwd_cfg(chunk_size=32), 0.4)])
    d = dispatcher(env, db_url, make_pack(env, [(wl(), fwd_cfg(superchunk_size=512), 0.5)]))
    p = d.plan(torch.device("cpu"), 64, 64, 4, 2, "bfloat16", True, 1000, 1, False)
    assert p.source == "heuristic" and d.db_queries == 0 and d.pack_queries == 0


def test_path_attention_runs_the_dispatched_config(env, monkeypatch):
    """End to end in the Triton interpreter: a pack's config reaches the kernel launch."""
    import torch.nn.functional as F

    from pathtune import path_attention
    from pathtune.runtime.reference import naive_path_attention

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    small = fwd_cfg(chunk_size=32, superchunk_size=256, block_n=32, scan_precision="tf32")
    shape = dict(head_dim=32, head_dim_v=32, heads_q=2, heads_kv=1, dtype="float32", use_gate=False)
    pack = make_pack(env, [(Workload(**shape, pass_="fwd", seq_bucket=64), small, 0.1)])
    d = Dispatcher(env_info=env, db=None, pack=pack, gpu_only=False)   # answer the CPU key from the pack
    seen = []
    real = torch.ops.pathtune.path_attn_fwd

    def spy(*args):
        seen.append(json.loads(args[8]))
        return real(*args)

    old = dispatch.set_dispatcher(d)
    try:
        from pathtune.runtime import api

        monkeypatch.setattr(api.torch.ops.pathtune, "path_attn_fwd", spy, raising=False)
        gen = torch.Generator().manual_seed(3)
        B, T, HQ, H, D = 1, 40, 2, 1, 32
        q, k, v = (torch.randn(B, T, n, D, generator=gen) for n in (HQ, H, H))
        w = F.normalize(torch.randn(B, T, H, D, generator=gen), dim=-1)
        beta = torch.rand(B, T, H, generator=gen) + 0.5
        o = path_attention(q, k, v, w, beta, backend="triton")
    finally:
        dispatch.set_dispatcher(old)
    assert seen and seen[0]["chunk_size"] == 32 and seen[0]["superchunk_size"] == 256
    ref = naive_path_attention(q.double(), k.double(), v.double(), w.double(), beta.double())
    assert ((o.double() - ref).norm() / ref.norm()).item() < 1e-2


@pytest.mark.gpu
def test_gpu_auto_dispatch_serves_perf_db(tmp_path, monkeypatch):
    """On a GPU: a config recorded for this machine is what backend='auto' launches, and it is right."""
    import torch.nn.functional as F

    from pathtune import path_attention
    from pathtune.runtime.reference import naive_path_attention

    url = f"sqlite:///{tmp_path / 'perf.sqlite3'}"
    here = collect_env()
    shape = dict(head_dim=64, head_dim_v=64, heads_q=4, heads_kv=2, dtype="bfloat16", use_gate=True)
    record(url, here, [(Workload(**shape, pass_="fwd", seq_bucket=1024, batch_bucket=2),
                        fwd_cfg(chunk_size=32, block_n=32), 0.1)])
    monkeypatch.setenv("PATHTUNE_DB_URL", url)
    old = dispatch.set_dispatcher(Dispatcher())
    try:
        B, T = 2, 1000
        q = torch.randn(B, T, 4, 64, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(B, T, 2, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        w = F.normalize(torch.randn(B, T, 2, 64, device="cuda"), dim=-1)
        beta = torch.rand(B, T, 2, device="cuda") + 0.5
        g = F.logsigmoid(torch.randn(B, T, 4, device="cuda") + 4)
        o = path_attention(q, k, v, w, beta, g)
        p = dispatch.select_plan(q.device, 64, 64, 4, 2, "bfloat16", True, T, B, False, backends=("triton", "tvm"))
        assert p.source == "perf_db" and json.loads(p.params_json)["chunk_size"] == 32
        t0 = time.perf_counter()
        for _ in range(1000):
            dispatch.select_plan(q.device, 64, 64, 4, 2, "bfloat16", True, T, B, False, backends=("triton", "tvm"))
        print(f"cached select_plan on the GPU host: {(time.perf_counter() - t0) * 1e3:.2f} us/call")
    finally:
        dispatch.set_dispatcher(old)
    ref = naive_path_attention(*(t.double() for t in (q, k, v, w, beta, g)))
    assert ((o.double() - ref).norm() / ref.norm()).item() < 4e-3


def test_validation_is_remembered_per_signature_without_value_checks(monkeypatch):
    """GPU-like calls (no value checks): a repeated signature skips validate_inputs; errors still raise."""
    import torch.nn.functional as F

    from pathtune import path_attention
    from pathtune.runtime import api

    calls = []
    real = api.validate_inputs

    def counting(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(api, "validate_inputs", counting)
    monkeypatch.setattr(api, "value_checks_enabled", lambda device: False)
    monkeypatch.setattr(api, "_VALIDATED", {})
    q, k, v = torch.randn(1, 20, 2, 16), torch.randn(1, 20, 1, 16), torch.randn(1, 20, 1, 16)
    w, beta = F.normalize(torch.randn(1, 20, 1, 16), dim=-1), torch.rand(1, 20, 1) + 0.5
    o1 = path_attention(q, k, v, w, beta, backend="reference")
    o2 = path_attention(q, k, v, w, beta, backend="reference")
    assert len(calls) == 1 and torch.equal(o1, o2)
    path_attention(q, k, v, w, beta, backend="reference", scale=0.3)        # another signature
    assert len(calls) == 2
    with pytest.raises(ValueError, match=r"k.shape\[3\] = 8 does not match D = 16"):
        path_attention(q, k[..., :8], v, w, beta, backend="reference")
    with pytest.raises(ValueError, match=r"k.shape\[3\] = 8 does not match D = 16"):
        path_attention(q, k[..., :8], v, w, beta, backend="reference")   # failures are not remembered
    spec = load_spec()
    t0 = time.perf_counter()
    for _ in range(2000):
        api._validate(spec, q, k, v, w, beta, None, None, None)
    assert (time.perf_counter() - t0) / 2000 < 200e-6


def test_dispatch_db_reads_shipped_results_without_writing(tmp_path, monkeypatch):
    """The runtime's lookups open perf_db as the read commands do: on a machine without a database the
    shipped results answer and no user database is created; a user's database that lacks the shipped files
    is read unchanged (its bytes) while the shipped records are still served."""
    from pathtune.perf_db import PerfDB
    from pathtune.perf_db._shipped import SHIPPED_DIR
    from pathtune.runtime.dispatch import open_dispatch_db

    monkeypatch.delenv("PATHTUNE_DB_URL", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("PATHTUNE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PATHTUNE_SHIPPED_DIR", str(SHIPPED_DIR))
    db = open_dispatch_db()
    try:
        assert db.query(gpu="H200", status="ok", limit=1)
    finally:
        db.close()
    assert not (tmp_path / "data").exists()

    mine = tmp_path / "mine.sqlite3"
    PerfDB(f"sqlite:///{mine}").close()                  # an empty database of the user's, no shipped files
    before = mine.read_bytes()
    db = open_dispatch_db(f"sqlite:///{mine}")
    try:
        assert db.query(gpu="H200", status="ok", limit=1)
    finally:
        db.close()
    assert mine.read_bytes() == before


def test_fwd_bwd_host_probe_counts_every_launch(monkeypatch):
    """benchmarks/dispatch_overhead.py --fwd-bwd: the launchers' host work with every launch stubbed (meta tensors)
    counts the launches of one forward + backward: one per token range of each per-range kernel (8 ranges at
    B * T = 32K, the default budget), the gate's kernels only for PaTH-FoX, and none slips past the stub (a real
    launch on meta tensors would raise)."""
    from repo_scripts import load_benchmark_script

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    probe = load_benchmark_script(monkeypatch, "benchmarks/dispatch_overhead.py")
    out = probe.fwd_bwd_host(repeats=1, n=1, shapes=((64, 16),), seq_lens=(4096,))
    path, fox = out["D64 H16 T4096 B8 PaTH"], out["D64 H16 T4096 B8 PaTH-FoX"]
    for row in (path, fox):
        assert row["launches"] == sum(row["by_kernel"].values()) and row["host_ms"] > 0
        assert row["by_kernel"]["bwd_intra_walk_kernel"] == 8 and row["by_kernel"]["scan_intra_kernel"] == 1
    assert "gate_cumsum_kernel" in fox["by_kernel"] and "gate_cumsum_kernel" not in path["by_kernel"]
    assert "gate_grad_kernel" in fox["by_kernel"]
