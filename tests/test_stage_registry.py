"""The spec drives codegen: every (stage, variant, pass) of specs/path_attention.yaml is implemented by
each backend (``codegen/<backend>/registry.py``: code that exists) or declared unsupported with a reason,
and the runtime reports that reason when a call needs what a backend lacks."""
from __future__ import annotations

import copy
import json

import pytest
import torch

from pathtune.codegen._registry import (
    BACKENDS,
    Implemented,
    Unsupported,
    VariantUnsupported,
    call_unsupported,
    entry_exists,
    registry_for,
    require,
)
from pathtune.specs import Spec, load_spec

SPEC = load_spec()


def _walk():
    for name, stage in SPEC.stages.items():
        for variant, var in stage.variants.items():
            for pass_ in var.passes:
                yield name, variant, pass_


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("stage,variant,pass_", list(_walk()), ids=lambda x: str(x))
def test_every_spec_variant_is_implemented_or_declared_unsupported(backend, stage, variant, pass_):
    entry = registry_for(backend).lookup(stage, variant, pass_)
    assert entry is not None, f"{backend} registry lists nothing for {stage}.{variant} ({pass_})"
    if isinstance(entry, Implemented):
        missing = [e for e in entry.entries if not entry_exists(e)]
        assert not missing, f"{backend} {stage}.{variant} ({pass_}) names code that does not exist: {missing}"
    else:
        assert isinstance(entry, Unsupported) and len(entry.reason) > 20, entry


@pytest.mark.parametrize("backend", BACKENDS)
def test_registries_list_only_spec_variants(backend):
    walked = set(_walk())
    extra = [key for key, _ in registry_for(backend).items() if key not in walked]
    assert not extra, f"{backend} registers variants the spec does not name: {extra}"


@pytest.mark.parametrize("stage,variant,pass_", list(_walk()), ids=lambda x: str(x))
def test_every_spec_variant_has_an_implementation_somewhere(stage, variant, pass_):
    """A variant no backend implements would be an invented one."""
    assert any(isinstance(registry_for(b).lookup(stage, variant, pass_), Implemented) for b in BACKENDS)


def test_entry_exists_rejects_missing_code():
    assert entry_exists("pathtune.codegen.triton.forward:ut_fused")
    assert not entry_exists("pathtune.codegen.triton.forward:no_such_function")
    assert not entry_exists("pathtune.codegen.triton.no_such_module:ut_fused")


def _spec_with(**stage_changes) -> Spec:
    data = SPEC.model_dump(mode="json")
    data = copy.deepcopy(data)
    for stage, changes in stage_changes.items():
        data["stages"][stage].update(changes)
    return Spec.from_dict(data)


def test_tvm_has_no_backward_and_says_why():
    why = call_unsupported("tvm", SPEC, "bwd", gated=False)
    assert why is not None and "forward and decode kernels only" in why
    assert call_unsupported("triton", SPEC, "bwd", gated=True) is None
    assert call_unsupported("tvm", SPEC, "fwd", gated=True) is None


def test_unsupported_gate_placement_is_reported_with_the_backend_reason():
    outside = _spec_with(fox_gate={"placement": "outside_scale"})
    reason = registry_for("tvm").lookup("fox_gate", "outside_scale", "fwd").reason
    with pytest.raises(VariantUnsupported, match="fox_gate placement 'outside_scale'") as info:
        require("tvm", outside, "fwd", gated=True)
    assert reason in str(info.value)
    require("tvm", outside, "fwd", gated=False)      # no gate: the placement does not matter
    require("triton", outside, "decode", gated=True)


def test_path_attention_tvm_reports_the_registry_reason(monkeypatch):
    """backend='tvm' under a spec whose gate placement TVM does not implement: the error carries the
    registry's reason (checked before any TVM module is built)."""
    from pathtune.runtime import api
    from pathtune.runtime.validation import InputInfo

    outside = _spec_with(fox_gate={"placement": "outside_scale"})
    info = InputInfo(B=1, T=4, HQ=2, H=1, D=64, DV=64, num_seqs=1, max_seqlen=4, varlen=False,
                     device=torch.device("cuda", 0), values_checked=False, gated=True)
    reason = registry_for("tvm").lookup("fox_gate", "outside_scale", "fwd").reason
    with pytest.raises(NotImplementedError, match="backend 'tvm' cannot run the fwd pass") as err:
        api._check_backend(outside, info, "tvm", torch.device("cuda", 0))
    assert reason in str(err.value)


def test_dispatch_plan_says_why_the_backward_is_not_tvm(fake_h200_env, monkeypatch):
    from pathtune.runtime import dispatch

    monkeypatch.setattr(dispatch, "tvm_available", lambda: True)
    d = dispatch.Dispatcher(env_info=fake_h200_env, db=None, pack=None)
    p = d.plan(torch.device("cuda", 0), 64, 64, 4, 2, "bfloat16", True, 100, 1, False, backends=("tvm",), grad=True)
    assert p.backend == "tvm" and p.bwd.backend == "triton"
    assert "not tvm: the TVM backend has forward and decode kernels only" in p.bwd.detail
    assert json.loads(p.bwd_params_json)["bwd_block_n"] > 0
    # a forward-only plan skips nothing
    p = d.plan(torch.device("cuda", 0), 64, 64, 4, 2, "bfloat16", True, 100, 1, False, backends=("tvm",))
    assert p.bwd is None and "not " not in p.fwd.detail


def test_dispatch_leaves_out_a_backend_without_the_spec_gate_placement(fake_h200_env, monkeypatch):
    from pathtune.runtime import dispatch

    outside = _spec_with(fox_gate={"placement": "outside_scale"})
    monkeypatch.setattr(dispatch, "tvm_available", lambda: True)
    monkeypatch.setattr(dispatch, "load_spec", lambda: outside)
    d = dispatch.Dispatcher(env_info=fake_h200_env, db=None, pack=None)
    p = d.plan(torch.device("cuda", 0), 64, 64, 4, 2, "bfloat16", True, 100, 1, False, backends=("triton", "tvm"))
    assert p.backend == "triton" and "not tvm: fox_gate placement 'outside_scale'" in p.fwd.detail
    with pytest.raises(NotImplementedError, match="no requested backend can run this call: tvm: fox_gate"):
        d.plan(torch.device("cuda", 0), 64, 64, 4, 2, "bfloat16", True, 100, 1, False, backends=("tvm",))
    # ungated calls do not meet the gate
    assert d.plan(torch.device("cuda", 0), 64, 64, 4, 2, "bfloat16", False, 100, 1, False,
                  backends=("tvm",)).backend == "tvm"


def test_stage_documentation_is_not_hashed_but_variants_are():
    data = SPEC.model_dump(mode="json")
    assert "doc" not in data["stages"]["ut_inverse"] and "description" not in data["stages"]["ut_inverse"]
    redoc = _spec_with(ut_inverse={"doc": {"solve": "something else"}, "description": "other words"})
    assert redoc.hash == SPEC.hash
    fewer = copy.deepcopy(data)
    del fewer["stages"]["ut_inverse"]["variants"]["split"]
    assert Spec.from_dict(fewer).hash != SPEC.hash


def test_decode_dispatch_passes_over_tvm_with_the_registry_reason(monkeypatch):
    """A gated decode under a gate placement the TVM registry declares unsupported runs Triton, and the
    plan's fallback says why (an ungated call does not meet the placement)."""
    from pathtune.codegen.tvm.params import KernelDims
    from pathtune.runtime import decode_dispatch, dispatch
    from pathtune.runtime.dispatch import Choice
    from pathtune.specs import KnobSpace

    outside = _spec_with(fox_gate={"placement": "outside_scale"})
    monkeypatch.setattr(decode_dispatch, "_spec", lambda: outside)
    monkeypatch.setattr(dispatch, "tvm_runtime_available", lambda: True)
    choice = Choice("decode", "tvm", KnobSpace(SPEC, "decode").default(), "perf_db")
    dims = KernelDims(H=8, HQ=8, D=128, DV=128, dtype="bfloat16", gated=True)
    step, why = decode_dispatch._tvm_step_or_reason(None, choice, torch.device("cuda", 0), dims, torch.bfloat16,
                                                    torch.bfloat16)
    reason = registry_for("tvm").lookup("fox_gate", "outside_scale", "decode").reason
    assert step is None and "fox_gate placement 'outside_scale'" in why and reason in why


def test_registry_loads_without_the_backend_package(monkeypatch):
    """A registry is read without importing its backend's package (which needs triton), so the
    dispatcher can say what a backend lacks on a machine without that compiler."""
    import importlib

    from pathtune.codegen import _registry

    real = importlib.import_module

    def no_backend(name, *a, **kw):
        if name.startswith("pathtune.codegen.triton"):
            raise ImportError(f"No module named {name!r} (simulated: no triton)")
        return real(name, *a, **kw)

    monkeypatch.setattr(_registry, "_LOADED", {})
    monkeypatch.setattr(_registry.importlib, "import_module", no_backend)
    reg = _registry.registry_for("triton")
    assert isinstance(reg.lookup("ut_inverse", "fused", "fwd"), Implemented)
    assert "no CUDA-core form" in reg.lookup("blockwise_scan", "cuda_core", "fwd").reason
