"""Decode dispatch between the Triton and the TVM step (runtime/decode_dispatch.py), TVM decode records
(tuning/decode_tvm.py), packs carrying them and their modules, and the bench CLI's --backends checks.

On the CPU: a fake H200 environment, a ``cuda:0`` key, synthetic perf_db records of both backends, a module
store of metadata files (modules are matched on it; loading is replaced by a fake step that runs the
reference decode step). The last test runs real prebuilt modules on a GPU host (PATHTUNE_TVM_MODULES).
"""
import json
import time

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from pathtune import _env
from pathtune.cli import app
from pathtune.codegen.tvm.build import source_hash as tvm_source_hash
from pathtune.codegen.tvm.params import KernelDims, TVMParams
from pathtune.perf_db import KernelKey, Measurement, PerfDB, load_pack
from pathtune.runtime import decode_dispatch, dispatch
from pathtune.runtime.dispatch import Dispatcher
from pathtune.runtime.environment import collect_env
from pathtune.runtime.reference import PaTHKVCache, path_attention_decode_step
from pathtune.specs import KnobSpace, Workload, load_spec
from pathtune.tuning.decode_tvm import TVMSet, record_config

CUDA0 = torch.device("cuda", 0)
REAL_TVM_RUNTIME_AVAILABLE = dispatch.tvm_runtime_available
BUILD_STORE = _env.CACHE_DIR.get() / "tvm" / "modules"      # the real compile cache (tests point theirs elsewhere)
GIVEN_STORE = _env.TVM_MODULES.get()                          # the GPU test's prebuilt modules (build_decode_bench)
LAYOUT = dict(decode_rows_per_thread=2, decode_num_warps=8, decode_splits=8, decode_prefetch=1)   # r2w8s8pf
SHAPE = dict(head_dim=128, head_dim_v=128, heads_q=8, heads_kv=8, dtype="bfloat16", use_gate=False)
DIMS = KernelDims(H=8, HQ=8, D=128, DV=128, dtype="bfloat16", gated=False)


@pytest.fixture(scope="module")
def env(fake_h200_env):
    return fake_h200_env


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """No module store but the test's own; a fresh process-wide dispatcher; messages printed again."""
    monkeypatch.delenv("PATHTUNE_TVM_MODULES", raising=False)
    monkeypatch.setenv("PATHTUNE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(decode_dispatch, "_told", set())
    monkeypatch.setattr(dispatch, "tvm_runtime_available", lambda: True)
    old = dispatch.set_dispatcher(None)
    yield
    dispatch.set_dispatcher(old)


def wl(seq=32768, **changes):
    return Workload(**{**SHAPE, **changes}, pass_="decode", seq_bucket=seq, batch_bucket=8)


def triton_cfg(**changes):
    return KnobSpace(load_spec(), "decode").default().replace(**changes)


def kernel(backend):
    return KernelKey(pass_="decode", backend=backend, spec_hash=load_spec().hash,
                     source_hash=dispatch.current_keys("path_attention", "decode", backend)["source_hash"])


def record(url, env, rows):
    """rows: (workload, backend, config, ms)"""
    with PerfDB(url) as db:
        for w, backend, cfg, ms in rows:
            db.record(env, kernel(backend), w, cfg, Measurement(status="ok", median_ms=ms))


def fake_store(root, dims=DIMS, knobs=LAYOUT, arch="sm_90", src=None):
    """A module set as build.py leaves it: <kernel>.so (empty here) beside its metadata."""
    params = json.loads(TVMParams.from_config(knobs).to_json())
    folder = root / f"set-{dims.D}-{int(dims.gated)}-{arch}"
    folder.mkdir(parents=True)
    for name in ("decode", "decode_merge"):
        (folder / f"{name}.so").write_bytes(b"")
        (folder / f"{name}.json").write_text(json.dumps(dict(
            kernel=name, pass_="decode", arch=arch, params=params, dims=dims.key(), spec=load_spec().hash,
            src=src or tvm_source_hash(), variant="simt")))
    return root


class RefStep:
    """Stands in for a loaded TVMDecode: the reference decode step, counting its calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self, q_t, k_t, v_t, w_t, beta_t, g_t, cache, *, scale=None):
        self.calls += 1
        return path_attention_decode_step(q_t, k_t, v_t, w_t, beta_t, g_t, cache, scale=scale, return_lse=True)


@pytest.fixture
def loaded(monkeypatch):
    """Replace module loading; returns the list of (paths, dims, params) it was asked to load."""
    seen = []

    def load(found, dims, params):
        seen.append((found, dims, params))
        return RefStep()
    monkeypatch.setattr(decode_dispatch, "_load_tvm_step", load)
    return seen


def use(env, url=None, pack=None):
    db = PerfDB(url, read_only=True, current_keys=dispatch.current_keys) if url else None
    d = Dispatcher(env_info=env, db=db, pack=pack)
    dispatch.set_dispatcher(d)
    return d


def plan(keys=32768, cache_dtype=torch.bfloat16, **changes):
    s = {**SHAPE, **changes}
    return decode_dispatch.plan_for(CUDA0, s["head_dim"], s["head_dim_v"], s["heads_q"], s["heads_kv"],
                                    torch.bfloat16, cache_dtype, s["use_gate"], keys, 8)


@pytest.fixture
def db_url(tmp_path):
    return f"sqlite:///{tmp_path / 'perf.sqlite3'}"


# -- the choice ------------------------------------------------------------------------------------

def test_faster_tvm_record_runs_when_its_modules_are_found(env, db_url, tmp_path, monkeypatch, loaded, capsys):
    record(db_url, env, [(wl(), "triton", triton_cfg(decode_block_n=256), 0.50),
                         (wl(), "tvm", record_config(LAYOUT), 0.40),
                         (wl(), "tvm", record_config(dict(LAYOUT, decode_prefetch=0)), 0.45)])
    monkeypatch.setenv("PATHTUNE_TVM_MODULES", str(fake_store(tmp_path / "store")))
    monkeypatch.setenv("PATHTUNE_PRINT_DISPATCH", "1")
    d = use(env, db_url)
    p = plan()
    assert (p.backend, p.choice.source, p.fallback) == ("tvm", "perf_db", "")
    assert isinstance(p.tvm_step, RefStep) and p.triton_params is None
    (found, dims, params), = loaded
    assert dims == DIMS and params.decode_dict() == TVMParams.from_config(LAYOUT).decode_dict()
    assert found.paths["decode"].parent.name == "set-128-0-sm_90"
    assert "0.4 ms" in p.describe() and "decode_prefetch=1" in p.describe()
    assert "-> tvm" in capsys.readouterr().err
    # cached per key: later calls cost a dict lookup and ask nothing
    queries = d.db_queries
    t0 = time.perf_counter()
    for _ in range(2000):
        assert plan() is p
    per_call = (time.perf_counter() - t0) / 2000
    assert d.db_queries == queries and len(loaded) == 1
    assert per_call < 50e-6, f"{per_call * 1e6:.1f} us per cached decode plan"
    # the other length bucket has its own key; clear_cache forgets plans
    assert plan(keys=4000) is not p
    d.clear_cache()
    assert plan() is not p


def test_faster_triton_record_never_loads_tvm(env, db_url, tmp_path, monkeypatch, loaded):
    record(db_url, env, [(wl(), "triton", triton_cfg(decode_block_n=256), 0.30),
                         (wl(), "tvm", record_config(LAYOUT), 0.40)])
    monkeypatch.setenv("PATHTUNE_TVM_MODULES", str(fake_store(tmp_path / "store")))
    use(env, db_url)
    p = plan()
    assert (p.backend, p.fallback, p.choice.config["decode_block_n"]) == ("triton", "", 256)
    assert p.triton_params.decode_block_n == 256 and not loaded


@pytest.mark.parametrize("case, reason", [
    ("no_modules", "no prebuilt TVM decode modules"),
    ("other_arch", "no prebuilt TVM decode modules"),
    ("stale_modules", "no prebuilt TVM decode modules"),
    ("no_runtime", "tvm_ffi"),
    ("cache_dtype", "keeps the cache in q's dtype"),
    ("load_fails", "did not load (OSError: no libcuda"),
])
def test_tvm_that_cannot_run_falls_back_to_triton_saying_why_once(env, db_url, tmp_path, monkeypatch, loaded,
                                                                 capsys, case, reason):
    record(db_url, env, [(wl(), "triton", triton_cfg(decode_block_n=256), 0.50),
                         (wl(), "tvm", record_config(LAYOUT), 0.40)])
    store = tmp_path / "store"
    store.mkdir()
    if case != "no_modules":
        fake_store(store, arch="sm_80" if case == "other_arch" else "sm_90",
                   src="0" * 16 if case == "stale_modules" else None)
    monkeypatch.setenv("PATHTUNE_TVM_MODULES", str(store))
    monkeypatch.setenv("PATHTUNE_PRINT_DISPATCH", "1")
    if case == "no_runtime":
        monkeypatch.setattr(dispatch, "tvm_runtime_available", lambda: False)
    if case == "load_fails":
        def broken(found, dims, params):
            raise OSError("no libcuda")
        monkeypatch.setattr(decode_dispatch, "_load_tvm_step", broken)
    d = use(env, db_url)
    dtype = torch.float32 if case == "cache_dtype" else torch.bfloat16
    p = plan(cache_dtype=dtype)
    assert p.backend == "triton" and p.choice.config["decode_block_n"] == 256 and p.choice.source == "perf_db"
    assert reason in p.fallback and p.triton_params.decode_block_n == 256
    d.clear_cache()
    assert plan(cache_dtype=dtype).backend == "triton"
    err = capsys.readouterr().err
    assert err.count("running the Triton step") == 1 and reason in err and "-> triton" in err


def test_tvm_decode_knobs_survive_validation(env, db_url):
    """The TVM-local layout knobs are kept (they pick the modules); invalid ones drop the record."""
    record(db_url, env, [(wl(), "tvm", record_config(LAYOUT), 0.4),
                         (wl(seq=4096), "tvm", dict(record_config(LAYOUT), decode_vec=-1), 0.1)])
    d = use(env, db_url)
    c = d.choose("decode", wl(), CUDA0, ("triton", "tvm"))
    assert c.backend == "tvm" and c.config["decode_rows_per_thread"] == 2 and c.config["decode_prefetch"] == 1
    c = d.choose("decode", wl(seq=4096), CUDA0, ("triton", "tvm"))
    assert (c.backend, c.source) == ("triton", "heuristic")


def test_multi_token_auto_decode_runs_the_tvm_step_per_token(monkeypatch):
    """runtime/decode.py with a TVM plan: one launch per new token, in order, equal to the reference."""
    from pathtune.runtime import decode as decode_mod
    from pathtune.runtime.reference import path_attention_decode, path_attention_prefill

    step = RefStep()
    monkeypatch.setattr(decode_mod, "_resolve", lambda backend, device: "triton" if backend == "auto" else backend)
    monkeypatch.setattr(decode_dispatch, "decode_plan",
                        lambda q, k, v, g, cache: decode_dispatch.DecodePlan("tvm", None, tvm_step=step))
    gen = torch.Generator().manual_seed(0)
    B, T0, T, H, D = 2, 9, 3, 2, 32

    def toks(n):
        q, k, v = (torch.randn(B, n, H, D, generator=gen) for _ in range(3))
        w = F.normalize(torch.randn(B, n, H, D, generator=gen), dim=-1)
        return q, k, v, w, torch.rand(B, n, H, generator=gen) + 0.5, F.logsigmoid(torch.randn(B, n, H, generator=gen))
    _, cache = path_attention_prefill(*toks(T0))
    new = toks(T)
    ref_cache = PaTHKVCache(cache.k.clone(), cache.v.clone(), cache.c.clone(), cache.length, cache.num_q_heads)
    o = decode_mod.path_attention_decode(*new, cache, backend="auto")
    ref = path_attention_decode(*new, ref_cache)
    assert step.calls == T and cache.length == T0 + T
    assert torch.allclose(o, ref, atol=1e-5) and torch.allclose(cache.k[:, :T0 + T], ref_cache.k[:, :T0 + T], atol=1e-5)


# -- packs -----------------------------------------------------------------------------------------

def test_pack_roundtrip_with_tvm_records_and_modules(env, db_url, tmp_path, loaded, capsys, monkeypatch):
    record(db_url, env, [(wl(), "triton", triton_cfg(decode_block_n=256), 0.50),
                         (wl(), "tvm", record_config(LAYOUT), 0.40),
                         (wl(seq=4096), "triton", triton_cfg(decode_splits=8), 0.06),
                         (wl(seq=4096), "tvm", record_config(LAYOUT), 0.05)])
    store = fake_store(tmp_path / "store")
    out = tmp_path / "packs" / "h200.json"
    res = CliRunner().invoke(app, ["export", "--gpu", "H200", "-o", str(out), "--db", db_url,
                                   "--tvm-modules", str(store)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "copied 1 TVM decode module sets" in res.output
    doc = json.loads(out.read_text())
    tvm = [e for e in doc["entries"] if e["backend"] == "tvm"]
    assert len(tvm) == 2 and tvm[0]["config"]["decode_rows_per_thread"] == 2
    assert tvm[0]["source_hash"] == tvm_source_hash()
    assert doc["default"]["decode"]["backend"] == "triton"       # defaults come from Triton results
    copied = list((out.parent / "tvm_modules").glob("*/decode.so"))
    assert len(copied) == 1
    # load_pack finds the modules beside it (no PATHTUNE_TVM_MODULES, empty cache dir)
    d = use(env)
    dispatch.load_pack(out)
    p = plan()
    assert (p.backend, p.choice.source) == ("tvm", "pack")
    assert loaded[-1][0].paths["decode"].parent.parent == (out.parent / "tvm_modules").resolve()
    # the same pack without its modules still loads; its TVM entries are skipped with a message
    import shutil

    shutil.rmtree(out.parent / "tvm_modules")
    monkeypatch.setenv("PATHTUNE_PRINT_DISPATCH", "1")
    d.clear_cache()
    p = plan()
    assert p.backend == "triton" and "no prebuilt TVM decode modules" in p.fallback
    assert p.choice.source == "pack" and p.choice.config["decode_block_n"] == 256
    assert "not run:" in capsys.readouterr().err


def test_export_without_tvm_modules_names_what_is_missing(env, db_url, tmp_path):
    record(db_url, env, [(wl(), "tvm", record_config(LAYOUT), 0.40), (wl(), "triton", triton_cfg(), 0.5)])
    out = tmp_path / "h200.json"
    empty = tmp_path / "empty"
    empty.mkdir()
    res = CliRunner().invoke(app, ["export", "--gpu", "H200", "-o", str(out), "--db", db_url,
                                   "--tvm-modules", str(empty)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "no prebuilt TVM modules for" in res.output and "skipped at runtime" in res.output
    assert load_pack(out).entries and not (tmp_path / "tvm_modules").exists()


# -- the bench -------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    (["--backends", "tvm"], "pass --tvm-modules DIR"),
    (["--backends", "triton,cuda"], "--backends takes triton and/or tvm"),
    (["--tvm-modules", "."], "only read with --backends ...,tvm"),
    (["--backends", "triton,tvm", "--tvm-modules", "{empty}"], "no manifest.json"),
])
def test_bench_decode_tvm_cli_errors(tmp_path, args, message):
    (tmp_path / "empty").mkdir()
    args = [a.replace("{empty}", str(tmp_path / "empty")) for a in args]
    res = CliRunner().invoke(app, ["bench", "--pass", "decode", *args], env={"COLUMNS": "300"})
    assert res.exit_code == 2, res.output
    assert message in " ".join(res.output.replace("│", " ").split()), res.output


def test_decode_bench_times_and_records_tvm_sets(monkeypatch, tmp_path):
    """run_decode_bench --backends tvm on the CPU: an injected step (the reference) for the TVM modules, the
    timer replaced by one call; every fitting set is checked and timed, the fastest is the row's, all are
    recorded as backend tvm with their layout knobs, and the dispatcher then serves that record."""
    from pathtune.tuning import decode_bench as db

    times = iter([0.3, 0.2, 0.9, 0.8])
    monkeypatch.setattr(db, "_median_ms", lambda fn: (fn(), next(times))[1])
    dims = dict(H=2, HQ=2, D=16, DV=16, dtype="bfloat16")
    sets = [TVMSet(f"s{i}-{g}", dict(LAYOUT, decode_splits=s), KernelDims(**dims, gated=g), {}, None)
            for g in (False, True) for i, s in enumerate((4, 8))]
    sets.append(TVMSet("other", LAYOUT, KernelDims(H=1, HQ=1, D=16, DV=16), {}, None))
    bad = TVMSet("bad", LAYOUT, KernelDims(H=2, HQ=2, D=32, DV=32), {}, None)

    def loader(s):
        if s.id == "s1-True":
            return lambda *a, **kw: (torch.zeros(a[0].shape[0], 2, 16, dtype=torch.bfloat16), None)
        return RefStep()
    rows = db.run_decode_bench(((2, 16),), (64,), (False, True), batch=2, baselines=(), device="cpu",
                               backends=("tvm",), tvm_sets=sets, tvm_loader=loader, log=lambda s: None)
    off, on = rows
    assert [e["set"] for e in off.tvm_sweep] == ["s0-False", "s1-False"] and off.times["tvm"] == 0.2
    assert off.tvm_params["set"] == "s1-False" and off.tvm_params["decode_splits"] == 8
    assert "pathtune" not in off.times and not off.params                  # Triton not asked for
    assert on.tvm_sweep[1]["ms"] is None and "accuracy check failed" in on.tvm_sweep[1]["error"]
    assert on.times["tvm"] == 0.9 and all(e["errors"].get("o", 1) < 2e-2 for e in off.tvm_sweep)
    assert db.format_decode_table(rows).row_count == 2
    rows_bad = db.run_decode_bench(((2, 16),), (64,), (False,), batch=2, baselines=(), device="cpu",
                                   backends=("tvm",), tvm_sets=[bad], tvm_loader=loader, log=lambda s: None)
    assert "no TVM module set built for H2 D16" in rows_bad[0].failures["tvm"]
    url = f"sqlite:///{tmp_path / 'perf.sqlite3'}"
    assert db.record_decode_rows(rows, url, "pathtune bench --pass decode --backends tvm (test)") == 4
    with PerfDB(url) as perf:
        got = perf.query(pass_="decode")
        assert {r["backend"] for r in got} == {"tvm"} and {r["source_hash"] for r in got} == {tvm_source_hash()}
        assert sorted(r["status"] for r in got) == ["crash", "ok", "ok", "ok"]
    here = collect_env()
    d = Dispatcher(env_info=here, db=PerfDB(url, read_only=True, current_keys=dispatch.current_keys), gpu_only=False)
    c = d.choose("decode", Workload(head_dim=16, head_dim_v=16, heads_q=2, heads_kv=2, dtype="bfloat16",
                                    use_gate=False, pass_="decode", seq_bucket=64, batch_bucket=2),
                 CUDA0, ("triton", "tvm"))
    assert (c.backend, c.source, c.config["decode_splits"]) == ("tvm", "perf_db", 8)


# -- the runtime-only path with real modules --------------------------------------------------------

def test_runtime_only_host_dispatches_to_real_prebuilt_modules(env, db_url):
    """A fresh process without the TVM compiler (tvm_ffi + the runtime libraries; the libcuda stub stands in
    for a driver): a faster TVM record is planned onto real modules found in the compile-cache layout of a
    store (decode and decode_merge in separate folders), loaded, and `import tvm` never happens."""
    import shutil
    import subprocess
    import sys

    pytest.importorskip("tvm", reason="apache-tvm builds the modules")
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc")
    from pathtune.codegen.tvm.build import build_kernels

    knobs = dict(decode_rows_per_thread=2, decode_num_warps=4, decode_splits=4)
    dims = KernelDims(H=2, HQ=2, D=64, DV=64, dtype="bfloat16", gated=True)
    build_kernels("decode", knobs, dims, cache_dir=BUILD_STORE)       # cached across runs
    shape = dict(head_dim=64, head_dim_v=64, heads_q=2, heads_kv=2, use_gate=True)
    record(db_url, env, [(wl(**shape), "triton", triton_cfg(), 0.2), (wl(**shape), "tvm", record_config(knobs), 0.1)])
    code = f"""
import ctypes, json, os, sys
from pathtune.codegen.tvm.toolchain import stub_path
ctypes.CDLL(str(stub_path()), mode=ctypes.RTLD_GLOBAL)
os.environ["PATHTUNE_TVM_MODULES"] = {str(BUILD_STORE)!r}
import torch
from pathtune.perf_db import PerfDB
from pathtune.runtime import decode_dispatch, dispatch
dispatch.set_dispatcher(dispatch.Dispatcher(env_info=json.loads({json.dumps(env)!r}),
                        db=PerfDB({db_url!r}, read_only=True, current_keys=dispatch.current_keys)))
p = decode_dispatch.plan_for(torch.device("cuda", 0), 64, 64, 2, 2, torch.bfloat16, torch.bfloat16, True, 30000, 8)
assert p.backend == "tvm", p.describe()
assert sorted(p.tvm_step.kernels) == ["decode", "decode_merge"] and p.tvm_step.params.decode_splits == 4
assert "tvm" not in sys.modules, "the runtime path must not import the TVM compiler"
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


# -- on a GPU host with prebuilt modules -----------------------------------------------------------

@pytest.mark.gpu
def test_gpu_auto_decode_runs_prebuilt_tvm_modules(tmp_path, monkeypatch):
    """With PATHTUNE_TVM_MODULES (build/tvm_decode_bench, H8 D128) and a faster TVM record, backend='auto' runs the TVM
    step (two tokens, two launches) and matches the float64 reference."""
    from pathtune import path_attention_decode
    from pathtune.runtime.reference import path_attention_decode as ref_decode
    from pathtune.tuning.decode_bench import make_cache

    if GIVEN_STORE is None or not REAL_TVM_RUNTIME_AVAILABLE():
        pytest.skip("set PATHTUNE_TVM_MODULES to a build_decode_bench folder and install apache-tvm-ffi")
    monkeypatch.setattr(dispatch, "tvm_runtime_available", REAL_TVM_RUNTIME_AVAILABLE)
    monkeypatch.setenv("PATHTUNE_TVM_MODULES", str(GIVEN_STORE))
    url = f"sqlite:///{tmp_path / 'perf.sqlite3'}"
    here = collect_env()
    record(url, here, [(wl(seq=1024), "triton", triton_cfg(), 1.0), (wl(seq=1024), "tvm", record_config(LAYOUT), 0.1)])
    use(here, url)
    gen = torch.Generator(device="cuda").manual_seed(0)
    cache = make_cache(8, 1000, 8, 128, False, device="cuda", gen=gen, extra=8)
    ref_cache = PaTHKVCache(cache.k.double(), cache.v.double(), None, cache.length, 8)
    q, k, v = (torch.randn(8, 2, 8, 128, device="cuda", generator=gen).bfloat16() for _ in range(3))
    w = F.normalize(torch.randn(8, 2, 8, 128, device="cuda", generator=gen), dim=-1)
    beta = torch.rand(8, 2, 8, device="cuda", generator=gen) + 0.5
    o = path_attention_decode(q, k, v, w, beta, None, cache)
    p = decode_dispatch.plan_for(CUDA0, 128, 128, 8, 8, torch.bfloat16, torch.bfloat16, False, 1002, 8)
    assert p.backend == "tvm", p.describe()
    ref = ref_decode(q.double(), k.double(), v.double(), w.double(), beta.double(), None, ref_cache)
    assert ((o.double() - ref).norm() / ref.norm()).item() < 4e-3


# -- filling the GPU -------------------------------------------------------------------------------

def _triton_plan(batch, keys=32768, heads=16, D=64):
    return decode_dispatch.plan_for(CUDA0, D, D, heads, heads, torch.bfloat16, torch.bfloat16, False, keys, batch)


def test_a_borrowed_or_untuned_decode_config_gets_splits_that_fill_the_gpu(env, db_url):
    """Batch 1 x 16 kv heads with the untuned config's 4 splits would run 64 programs on the H200's 132
    multiprocessors: the plan raises the splits to 16 (16 x 16 = 256 >= 132) and says so; at batch 8
    (128 rows x 4) the config stays; the splits never exceed the cache's key tiles; a record of the very
    key runs as measured, while its batch-8 record lent to batch 1 (source bucket) is raised."""
    use(env)
    heuristic = load_spec().backend_defaults("triton", 64, 64)
    base = heuristic.get("decode_splits", load_spec().knobs["decode_splits"].default)
    block = heuristic.get("decode_block_n", load_spec().knobs["decode_block_n"].default)
    p1 = _triton_plan(1)
    assert p1.backend == "triton" and p1.choice.source == "heuristic"
    assert base < 16 and p1.triton_params.decode_splits == 16
    assert f"decode_splits {base} -> 16" in p1.describe() and "132 multiprocessors" in p1.describe()
    p8 = _triton_plan(8)
    assert p8.triton_params.decode_splits == base and not p8.adjusted
    short = _triton_plan(1, keys=2 * block + 1)          # three key tiles: at most 2 splits of the domain
    assert short.triton_params.decode_splits == max(base, 2)
    gqa = _triton_plan(2, heads=4)                       # 8 rows: the domain's largest, 16
    assert gqa.triton_params.decode_splits == 16

    measured = triton_cfg(decode_splits=2)
    b1 = Workload(**{**SHAPE, "head_dim": 64, "head_dim_v": 64, "heads_q": 16, "heads_kv": 16},
                  pass_="decode", seq_bucket=32768, batch_bucket=1)
    record(db_url, env, [(b1, "triton", measured, 0.5)])
    use(env, db_url)
    exact = _triton_plan(1)
    assert exact.choice.source == "perf_db" and exact.triton_params.decode_splits == 2 and not exact.adjusted
    dispatch.get_dispatcher().decode_plans.clear()
    b8 = Workload(**{**SHAPE, "head_dim": 128, "head_dim_v": 128}, pass_="decode", seq_bucket=32768, batch_bucket=8)
    record(db_url, env, [(b8, "triton", measured, 0.5)])
    use(env, db_url)
    lent = _triton_plan(1, heads=8, D=128)
    assert lent.choice.source == "bucket" and lent.triton_params.decode_splits == 16, lent.describe()


def test_decode_records_serve_only_nearby_length_buckets(env, db_url):
    """A decode record lends its config to the next length bucket, not to one 8x longer: the steps' tiles,
    warps and splits follow the cache length (dispatch.DECODE_LENGTH_REACH)."""
    measured = triton_cfg(decode_block_n=256, decode_num_warps=8, decode_splits=2)
    record(db_url, env, [(wl(seq=4096), "triton", measured, 0.08)])
    use(env, db_url)
    exact, next_bucket, far = plan(keys=4000), plan(keys=8000), plan(keys=32000)
    assert exact.choice.source == "perf_db" and exact.triton_params.decode_num_warps == 8
    assert next_bucket.choice.source == "bucket" and next_bucket.triton_params.decode_num_warps == 8
    assert "length bucket 4096 for 8192" in next_bucket.choice.detail
    assert far.choice.source == "heuristic", far.describe()
    assert far.triton_params.decode_num_warps != 8
    # the forward keeps serving far buckets (its tiles do not follow the length as the decode split does)
    assert dispatch.within_reach("fwd", 4096, 32768) and not dispatch.within_reach("decode", 4096, 32768)
    assert dispatch.within_reach("decode", 16384, 32768) and dispatch.within_reach("decode", 65536, 32768)


def test_several_token_calls_are_served_their_token_count_records(env, db_url, tmp_path, monkeypatch, loaded):
    """A decode key has the call's token-count bucket: a call of 4 tokens runs the 4-token record (Triton: the
    TVM step decodes one token), one of 3 tokens shares that bucket, and one of 16 tokens (no record of its
    bucket) runs the untuned config, never the one-token pick; each bucket has its own cached plan."""
    record(db_url, env, [(wl(), "triton", triton_cfg(decode_block_n=256, decode_splits=2), 0.30),
                         (wl(), "tvm", record_config(LAYOUT), 0.20),
                         (wl(query_bucket=4), "triton", triton_cfg(decode_block_n=128, decode_splits=8), 0.40)])
    monkeypatch.setenv("PATHTUNE_TVM_MODULES", str(fake_store(tmp_path / "store")))
    use(env, db_url)
    one = plan()
    s = SHAPE

    def tokens(n):
        return decode_dispatch.plan_for(CUDA0, s["head_dim"], s["head_dim_v"], s["heads_q"], s["heads_kv"],
                                        torch.bfloat16, torch.bfloat16, s["use_gate"], 32768, 8, tokens=n)
    four = tokens(4)
    assert one.backend == "tvm" and one.choice.source == "perf_db"
    assert four.backend == "triton" and four.choice.source == "perf_db", four.describe()
    assert (four.triton_params.decode_block_n, four.triton_params.decode_splits) == (128, 8)
    assert tokens(3) is four and "tokens<=4" in decode_dispatch._key_text(next(
        k for k, v in dispatch.get_dispatcher().decode_plans.items() if v is four))
    sixteen = tokens(16)
    assert sixteen.backend == "triton" and sixteen.choice.source not in ("perf_db", "pack"), sixteen.describe()
    untuned = sixteen.triton_params
    assert (untuned.decode_block_n, untuned.decode_splits) not in ((256, 2), (128, 8))
    assert untuned.decode_block_n == load_spec().backend_defaults("triton", 128, 128)["decode_block_n"]
    assert len(loaded) == 1                        # only the one-token plan loaded TVM modules
    assert tokens(9) is sixteen
