"""One knob contract: a knob goes from the spec to a kernel launch one way, changing form once
(Config -> kernel params, ``resolve``); kernel params repeat none of the spec's defaults or checks.
See codegen/triton/README.md, "From the spec to a launch"."""
from __future__ import annotations

import ast
import copy
import dataclasses
import json
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from pathtune.codegen import _knobs
from pathtune.codegen._knobs import config_of, resolve
from pathtune.codegen.triton.params import TritonParams
from pathtune.codegen.tvm.params import TVMParams
from pathtune.specs import Spec, SpecError, load_spec

SPEC = load_spec()
CODEGEN = Path(_knobs.__file__).parent


@pytest.mark.parametrize("path,cls", [("triton/params.py", "TritonParams"), ("tvm/params.py", "TVMParams")])
def test_params_defaults_come_from_the_spec_not_literals(path, cls):
    """Every field of a params class defaults to ``spec_default(<its own name>)``: no default is written
    in code, so the spec's YAML is the only place a default lives."""
    tree = ast.parse((CODEGEN / path).read_text())
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    fields = [n for n in body if isinstance(n, ast.AnnAssign) and "ClassVar" not in ast.unparse(n.annotation)]
    assert fields
    for f in fields:
        call = f.value
        assert isinstance(call, ast.Call) and ast.unparse(call.func) == "spec_default", ast.unparse(f)
        assert isinstance(call.args[0], ast.Constant) and call.args[0].value == f.target.id, ast.unparse(f)


def test_params_checks_come_from_the_spec():
    with pytest.raises(ValueError, match=r"scan_precision must be one of \['fp16', 'bf16', 'tf32'\]"):
        TritonParams(scan_precision="fp8")
    with pytest.raises(ValueError, match=r"superchunk_size must be a multiple of the forward key tile block_n"):
        TritonParams(superchunk_size=1024, block_n=96)
    with pytest.raises(ValueError, match=r"a super-chunk must hold at least two UT chunks"):
        TVMParams(chunk_size=64, superchunk_size=64, block_n=64)
    with pytest.raises(ValueError, match=r"decode_vec must be >= 0"):
        TVMParams(decode_vec=-1)
    with pytest.raises(ValueError, match=r"beta_clip_eps='off' is the spec's spelling"):
        TritonParams(beta_clip_eps="off")
    TritonParams(chunk_size=16, superchunk_size=32, block_n=16, bwd_block_n=16)   # small tiles: tests, probes


def test_resolve_spelling_defaults_and_errors():
    p = resolve("triton", "fwd", {"beta_clip_eps": "off", "superchunk_size": 512}, (64, 64))
    untuned = SPEC.backend_defaults("triton", 64, 64)
    assert p.beta_clip_eps is None and p.superchunk_size == 512 and p.block_n == untuned["block_n"]
    assert resolve("triton", "fwd", {"beta_clip_eps": 0.015625}, None).beta_clip_eps == 0.015625
    assert resolve("triton", None, None, (256, 256)) == TritonParams.heuristic(256, 256)
    assert resolve("triton", None, None) == TritonParams()
    assert resolve("triton", "fwd", p, (256, 256)) is p
    back = config_of("triton", p)
    assert back["beta_clip_eps"] == "off" and back["superchunk_size"] == 512
    assert resolve("triton", "fwd", back, (64, 64)) == p
    tvm = resolve("tvm", "decode", {"decode_splits": 8, "decode_prefetch": 1, "block_m": 64}, (64, 64))
    assert (tvm.decode_splits, tvm.decode_prefetch) == (8, 1)        # block_m: not read by TVM, ignored
    with pytest.raises(ValueError, match=r"unknown knob 'superchunk' for backend 'triton'") as err:
        resolve("triton", "fwd", {"superchunk": 512}, (64, 64))
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="unknown pass 'forward'"):
        resolve("triton", "forward", {}, (64, 64))
    with pytest.raises(ValueError, match="unknown knob 'decode_vec' for backend 'triton'"):
        resolve("triton", "decode", {"decode_vec": 4}, (64, 64))


def _spec_problems(mutate) -> dict:
    data = copy.deepcopy(SPEC.model_dump(mode="json"))
    mutate(data)
    with pytest.raises(SpecError) as err:
        Spec.from_dict(data)
    return dict(err.value.problems)


def test_head_dim_defaults_table_is_validated():
    rows = "backends.triton.head_dim_defaults"
    p = _spec_problems(lambda d: d["backends"]["triton"]["head_dim_defaults"][0]["knobs"].update(blok_n=64))
    assert "unknown knob 'blok_n'" in p[f"{rows}[0].knobs.blok_n"]
    p = _spec_problems(lambda d: d["backends"]["triton"]["head_dim_defaults"][0]["knobs"].update(block_n=48))
    assert "not in the domain" in p[f"{rows}[0].knobs.block_n"]
    p = _spec_problems(lambda d: d["backends"]["triton"]["head_dim_defaults"][1].update(up_to=32))
    assert "increasing up_to" in p[f"{rows}[1].up_to"]
    p = _spec_problems(lambda d: d["backends"]["triton"]["head_dim_defaults"][2].update(up_to=192))
    assert "go to 256" in p[rows]
    # chunk_size 128 at head dim 256 breaks chunk_size * max(D, DV) <= 16384
    p = _spec_problems(lambda d: d["backends"]["triton"]["head_dim_defaults"][2]["knobs"].update(chunk_size=128))
    assert "UT chunk tile" in p[f"{rows}[2]"]
    p = _spec_problems(lambda d: d["backends"]["tvm"]["knobs"].update(
        chunk_size=dict(d["knobs"]["chunk_size"], passes=["fwd"])))
    assert "its own identifier name (not a spec knob" in p["backends.tvm.knobs.chunk_size"]


def test_backend_only_knobs_are_declared_in_the_spec():
    from pathtune.codegen.tvm.params import DECODE_LOCAL_KNOBS

    assert DECODE_LOCAL_KNOBS == tuple(SPEC.backend_knobs("tvm", "decode"))
    assert SPEC.backend_knobs("triton") == {}


def test_superchunk_size_from_the_plan_to_the_launch(monkeypatch, fake_h200_env):
    """The plan carries the Config (spec spelling); the custom op resolves it once; the forward's launch
    reads the resolved superchunk_size."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from pathtune.codegen.triton import autograd, forward
    from pathtune.runtime import dispatch

    d = dispatch.Dispatcher(env_info=fake_h200_env, db=None, pack=None)
    plan = d.plan(torch.device("cuda", 0), 64, 64, 4, 2, "bfloat16", True, 100, 1, False)
    carried = json.loads(plan.params_json)
    # every knob, the spec's spelling; a forward-only plan keeps no state for a backward
    assert carried == {**config_of("triton", None, (64, 64)), "bwd_forward_state": "recompute"}
    trained = json.loads(d.plan(torch.device("cuda", 0), 64, 64, 4, 2, "bfloat16", True, 100, 1, False,
                                grad=True).params_json)
    assert trained == config_of("triton", None, (64, 64))             # the spec's default bwd_forward_state
    assert carried["superchunk_size"] == SPEC.backend_defaults("triton", 64, 64)["superchunk_size"]

    seen = {}
    real_resolve, real_tables = forward.resolve_json, forward.build_tables

    def spy_resolve(backend, pass_, text, D, DV):
        seen.setdefault("configs", []).append(json.loads(text))
        return real_resolve(backend, pass_, text, D, DV)

    def spy_tables(B, T, cu, C, S, *a, **kw):
        seen.setdefault("S", []).append(S)
        return real_tables(B, T, cu, C, S, *a, **kw)

    monkeypatch.setattr(forward, "resolve_json", spy_resolve)
    monkeypatch.setattr(forward, "build_tables", spy_tables)
    gen = torch.Generator().manual_seed(0)
    B, T, H, D = 1, 40, 1, 32
    q, k, v = (torch.randn(B, T, H, D, generator=gen) for _ in range(3))
    w = F.normalize(torch.randn(B, T, H, D, generator=gen), dim=-1)
    beta = torch.rand(B, T, H, generator=gen) + 0.5
    config = {"chunk_size": 16, "superchunk_size": 32, "block_n": 16, "bwd_block_n": 16, "scan_precision": "tf32"}
    o, _ = autograd.path_attention_triton(q, k, v, w, beta, config=config)
    assert torch.isfinite(o).all()
    assert seen["S"] == [32]
    assert [c["superchunk_size"] for c in seen["configs"]] == [32] and seen["configs"][0]["beta_clip_eps"] == "off"


# -- one conversion path: checked over the sources -------------------------------------------------------

ROOT = CODEGEN.parent
PACKAGE_DIRS = ("pathtune", "specs", "codegen", "runtime", "tuning", "perf_db")
PARAMS_CLASSES = {"TritonParams", "TVMParams"}
# params -> params adjustments (not a Config conversion): (file, function)
PARAMS_REPLACED_IN = {("runtime/decode_dispatch.py", "_fill_gpu")}
# where the text a launch carries (Plan.params_json) is parsed back into knob values, besides resolve_json
PARAMS_JSON_PARSED_IN = {("runtime/decode_dispatch.py", "tuned_triton_params"), ("tuning/bench.py", "_tuned")}


def _sources():
    for d in PACKAGE_DIRS:
        for path in sorted((ROOT / d).rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), ast.parse(path.read_text())


def _calls(tree):
    """(enclosing function name or '', the called name, the call) for every call in ``tree``."""
    def walk(node, fn):
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else fn
            if isinstance(child, ast.Call):
                f = child.func
                name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
                yield inner, name, child
            yield from walk(child, inner)
    yield from walk(tree, "")


def test_kernel_params_are_built_in_one_function():
    """Knob values become kernel params in ``codegen/_knobs._construct`` only (``resolve``, ``resolve_json``,
    ``params_from_config`` / ``TritonParams.from_config`` and ``heuristic`` all end there): a second
    Config -> params conversion anywhere in the package fails here."""
    seen = []
    for rel, tree in _sources():
        for fn, name, call in _calls(tree):
            where = (rel, fn)
            if name in PARAMS_CLASSES:
                seen.append(f"{rel}:{call.lineno} {fn}() calls {name}(...): build params with _knobs.resolve")
            if name in ("_to_params", "_construct") and where not in {("codegen/_knobs.py", "_construct"),
                                                                    ("codegen/_knobs.py", "spec_default"),
                                                                    ("codegen/_knobs.py", "resolve"),
                                                                    ("codegen/_knobs.py", "params_from_config")}:
                seen.append(f"{rel}:{call.lineno} {fn}() calls {name}")
            if name == "cls" and rel == "codegen/_knobs.py" and fn != "_construct":
                seen.append(f"{rel}:{call.lineno} {fn}() constructs params outside _construct")
            if (name == "replace" and call.args and "params" in ast.unparse(call.args[0])
                    and where not in PARAMS_REPLACED_IN):
                seen.append(f"{rel}:{call.lineno} {fn}() replaces fields of params")
            if (name == "loads" and call.args and "params_json" in ast.unparse(call.args[0])
                    and where not in PARAMS_JSON_PARSED_IN):
                seen.append(f"{rel}:{call.lineno} {fn}() parses a launch's config text: use _knobs.resolve_json")
    assert not seen, "\n".join(seen)


def test_the_dispatcher_only_carries_the_config():
    """runtime/ picks Configs and hands the launch text over; it converts nothing itself (no resolve, no
    JSON of its own: ``_knobs.config_json`` builds the text)."""
    for rel, tree in _sources():
        if not rel.startswith("runtime/") or rel.startswith("runtime/decode"):
            continue
        for fn, name, call in _calls(tree):
            assert name not in ("resolve", "canonical_json", "dumps", "resolve_json"), f"{rel}:{call.lineno} {fn}()"


def test_the_plan_text_is_config_json_and_resolves_like_the_ops(fake_h200_env):
    from pathtune.codegen._knobs import config_json, resolve_json
    from pathtune.codegen.triton.autograd import _resolve_params_json
    from pathtune.runtime import dispatch

    d = dispatch.Dispatcher(env_info=fake_h200_env, db=None, pack=None)
    for D in (64, 128, 256):
        plan = d.plan(torch.device("cuda", 0), D, D, 4, 2, "bfloat16", True, 4096, 1, False, grad=True)
        assert plan.params_json == config_json("triton", "fwd", {**plan.fwd.config, **plan.bwd.config}, (D, D))
        op_text = _resolve_params_json(None, D, D)        # what path_attention_triton(config=None) carries
        assert resolve_json("triton", "fwd", op_text, D, D) == resolve_json("triton", "fwd", plan.params_json, D, D)
    # block_m 64 > 32: the launch takes the whole super-chunk
    cfg = {"superchunk_size": 32, "chunk_size": 16, "block_n": 16, "bwd_block_n": 16}
    text = config_json("triton", None, cfg, (64, 64))
    assert json.loads(text)["superchunk_size"] == 32
    assert resolve_json("triton", "fwd", text, 64, 64) == resolve_json("triton", "fwd",
                                                                       _resolve_params_json(cfg, 64, 64), 64, 64)
    with pytest.raises(ValueError, match="multiple of the forward key tile"):
        config_json("triton", "fwd", {"superchunk_size": 1024, "block_n": 96}, (64, 64))


# -- the modules a knob crosses, traced -------------------------------------------------------------------

KNOB = "superchunk_size"
# the representation types and generic helpers a value lives in on its way (not steps of the path):
# the Config mapping, its canonical JSON, the kernel params record, the constraint expression evaluator
REPRESENTATION_MODULES = {"pathtune.specs.config", "pathtune.specs.canonical", "pathtune.codegen.triton.params",
                          "pathtune.specs.expr"}


def _carries(name, value) -> bool:
    """Does an argument hold the knob: by name (``superchunk_size``, the launchers' ``S``), as a mapping key
    (a Config, the spec's knob table), in a config's JSON text, or as a field (kernel params, a plan)?"""
    if name in (KNOB, "S"):
        return True
    if isinstance(value, str):
        return f'"{KNOB}"' in value
    if isinstance(value, dict) or hasattr(value, "keys") and hasattr(value, "__getitem__"):
        try:
            return KNOB in value or any(isinstance(v, dict) and KNOB in v for v in value.values())
        except TypeError:
            return False
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return any(f.name == KNOB or _carries(f.name, getattr(value, f.name, None))
                   for f in dataclasses.fields(value) if isinstance(getattr(value, f.name, None), (str, dict)))
    return False


def _trace_modules(run) -> tuple[dict[str, set[str]], str]:
    """Run ``run()`` under a profiler: {pathtune module: functions called with the knob in an argument}, up
    to the first Triton kernel launch, and the module that launched it."""
    seen: dict[str, set[str]] = {}
    launch = []

    def profile(frame, event, _arg):
        if event != "call" or launch:
            return
        module = frame.f_globals.get("__name__") or ""
        if module.startswith("triton.runtime.interpreter") and frame.f_code.co_name == "__call__":
            caller = frame.f_back
            while caller is not None and not (caller.f_globals.get("__name__") or "").startswith("pathtune."):
                caller = caller.f_back
            launch.append(caller.f_globals["__name__"])
            return
        if not module.startswith("pathtune.") or module in REPRESENTATION_MODULES:
            return
        code = frame.f_code
        for name in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]:
            if name in frame.f_locals and _carries(name, frame.f_locals[name]):
                seen.setdefault(module, set()).add(code.co_name)
                break

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return seen, (launch[0] if launch else "")


def test_superchunk_size_crosses_five_modules_from_the_yaml_to_the_launch(monkeypatch, tmp_path):
    """Traced, not listed: parse the spec's YAML, then a public call (the dispatcher's plan, the custom op,
    the launch).  Modules that read or convert the value: specs/schema (the YAML's knob), runtime/dispatch
    (picks the Config; its plan runs the op), codegen/_knobs (Config -> kernel params, once),
    codegen/triton/forward (the launch) and its table builder _layout: five.  runtime/api only validates and
    asks for the plan; the custom op module (autograd) is not crossed: the op's body is the launcher's entry
    point."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    import pathtune
    from pathtune.specs.loader import load_spec as load

    yaml_copy = tmp_path / "path_attention.yaml"
    yaml_copy.write_text((ROOT / "specs" / "path_attention.yaml").read_text())
    spec_side, _ = _trace_modules(lambda: load(yaml_copy))
    gen = torch.Generator().manual_seed(0)
    B, T, H, D = 1, 40, 1, 32
    q, k, v = (torch.randn(B, T, H, D, generator=gen) for _ in range(3))
    w = F.normalize(torch.randn(B, T, H, D, generator=gen), dim=-1)
    beta = 1.5 + 0.5 * torch.rand(B, T, H, generator=gen)
    from pathtune.runtime import dispatch

    _knobs.resolve_json.cache_clear()           # caches of earlier tests would skip the steps traced here
    old = dispatch.set_dispatcher(None)
    try:
        call_side, launcher = _trace_modules(lambda: pathtune.path_attention(q, k, v, w, beta, backend="triton"))
    finally:
        dispatch.set_dispatcher(old)
    crossed = set(spec_side) | set(call_side)
    assert launcher == "pathtune.codegen.triton.forward"
    assert "pathtune.codegen.triton.autograd" not in crossed
    assert crossed == {"pathtune.specs.schema", "pathtune.runtime.dispatch", "pathtune.codegen._knobs",
                       "pathtune.codegen.triton.forward", "pathtune.codegen.triton._layout"}, sorted(crossed)
    assert "run" in call_side["pathtune.runtime.dispatch"]        # the plan runs itself: api never holds it
    # one representation change: only _knobs turns the Config / its text into kernel params
    assert {"resolve", "resolve_json", "_construct"} <= call_side["pathtune.codegen._knobs"]


def test_a_bwd_trial_launches_the_knobs_only_the_backward_declares(monkeypatch):
    """A tuner candidate of the bwd pass runs its forward + backward with every knob of its config, those only
    ``TritonBwdParams`` declares too (dk / dv's key tile and warps): resolved with the base params class they were
    dropped, so the launch ran the head-dim defaults and the record named the candidate's config."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from pathtune.codegen.triton import backward
    from pathtune.tuning.measure import MeasureTask, _forward_fn

    launched = []
    real = backward.dkv_launch
    monkeypatch.setattr(backward, "dkv_launch", lambda params: launched.append(real(params)) or launched[-1])
    config = {"chunk_size": 16, "superchunk_size": 32, "block_n": 16, "bwd_block_n": 16, "scan_precision": "tf32",
              "bwd_dkv_block_n": 32, "bwd_dkv_num_warps": 8}
    task = MeasureTask(pass_="bwd", backend="triton", workload={"head_dim": 32, "head_dim_v": 32}, config=config,
                       batch=1, seq_len=40)
    run = _forward_fn(task)
    gen = torch.Generator().manual_seed(0)
    B, T, H, D = 1, 40, 1, 32
    q, k, v = (torch.randn(B, T, H, D, generator=gen).requires_grad_() for _ in range(3))
    w = F.normalize(torch.randn(B, T, H, D, generator=gen), dim=-1).requires_grad_()
    beta = (torch.rand(B, T, H, generator=gen) + 1.5).clamp(max=1.99).requires_grad_()
    o = run(q, k, v, w, beta, None)
    grads = torch.autograd.grad(o, (q, k, v, w, beta), torch.randn_like(o))
    assert all(torch.isfinite(gr).all() for gr in grads)
    assert launched == [(32, 8)]
