"""path_attention: argument validation (ValueError naming the argument), backend choice, env knobs."""
import logging

import pytest
import torch
import torch.nn.functional as F

from pathtune import path_attention
from pathtune.runtime import resolve_backend

B, T, HQ, H, D, DV = 2, 8, 4, 2, 32, 32


def make(dtype=torch.float32, B=B, T=T, HQ=HQ, H=H, D=D, DV=DV, gate=True):
    q = torch.randn(B, T, HQ, D, dtype=dtype)
    k = torch.randn(B, T, H, D, dtype=dtype)
    v = torch.randn(B, T, H, DV, dtype=dtype)
    w = F.normalize(torch.randn(B, T, H, D), dim=-1)
    beta = torch.rand(B, T, H) * 0.5 + 1.5
    g = F.logsigmoid(torch.randn(B, T, HQ) + 4) if gate else None
    return dict(q=q, k=k, v=v, w=w, beta=beta, g=g)


def call(args, **kw):
    return path_attention(args["q"], args["k"], args["v"], args["w"], args["beta"], args["g"], **kw)


def expect(args, match, exc=ValueError, **kw):
    with pytest.raises(exc, match=match):
        call(args, **kw)


def with_(**changes):
    args = make()
    args.update(changes)
    return args


def test_reference_runs_and_matches_naive():
    from pathtune.runtime.reference import naive_path_attention

    args = make(torch.float64, T=70, D=24, DV=40)    # any head dim on the reference
    o, lse = call(args, return_lse=True)
    assert o.shape == (B, 70, HQ, 40) and o.dtype == torch.float64
    assert lse.shape == (B, 70, HQ) and lse.dtype == torch.float64
    ref = naive_path_attention(*(args[n] for n in ("q", "k", "v", "w", "beta", "g")))
    assert ((o - ref).norm() / ref.norm()).item() < 1e-10
    assert call(make(torch.bfloat16), return_lse=True)[1].dtype == torch.float32


def test_varlen_matches_separate_sequences():
    args = make(torch.float64, B=1, T=12, gate=False)
    cu = torch.tensor([0, 5, 12])
    o = call(args, cu_seqlens=cu)
    first = {n: (t[:, :5] if t is not None else None) for n, t in args.items()}
    torch.testing.assert_close(o[:, :5], call(first))


@pytest.mark.parametrize("name, shape, match", [
    ("q", (B, T, HQ), r"q must be 4-D \[B, T, HQ, D\], got shape \(2, 8, 4\)"),
    ("beta", (B, T, H, 1), r"beta must be 3-D \[B, T, H\]"),
    ("k", (B, T + 1, H, D), r"k.shape\[1\] = 9 does not match T = 8 from q.shape\[1\]"),
    ("v", (B + 1, T, H, DV), r"v.shape\[0\] = 3 does not match B = 2 from q.shape\[0\]"),
    ("k", (B, T, H, D + 1), r"k.shape\[3\] = 33 does not match D = 32 from q.shape\[3\]"),
    ("v", (B, T, H + 1, DV), r"v.shape\[2\] = 3 does not match H = 2 from k.shape\[2\]"),
    ("w", (B, T, H, D + 2), r"w.shape\[3\] = 34 does not match D = 32 .*w must be \[B, T, H, D\]"),
    ("w", (B, T, H + 1, D), r"w.shape\[2\] = 3 does not match H = 2 from k.shape\[2\]"),
    ("beta", (B, T, HQ), r"beta.shape\[2\] = 4 does not match H = 2 from k.shape\[2\]"),
    ("g", (B, T, H), r"g.shape\[2\] = 2 does not match HQ = 4 from q.shape\[2\]"),
])
def test_bad_shapes(name, shape, match):
    args = make()
    args[name] = torch.randn(shape) if name in ("beta", "g") else F.normalize(torch.randn(shape), dim=-1)
    expect(args, match)


def test_gqa_heads_must_divide():
    args = make(HQ=3, H=2)
    expect(args, r"HQ must be a multiple of .* H .*got H = 2 \(k.shape\[2\]\), HQ = 3 \(q.shape\[2\]\)")


def test_empty_inputs():
    expect(make(T=0), r"empty inputs: T \(q.shape\[1\]\) is 0")


@pytest.mark.parametrize("name, dtype, match", [
    ("q", torch.int64, r"q.dtype is int64; allowed: bfloat16, float16, float32, float64"),
    ("k", torch.float64, r"k.dtype is float64 but must equal q.dtype \(float32\)"),
    ("v", torch.float16, r"v.dtype is float16 but must equal q.dtype"),
    ("w", torch.float16, r"w.dtype is float16; allowed: float32, float64 \(float32 preferred\)"),
    ("beta", torch.int32, r"beta.dtype is int32; allowed"),
    ("g", torch.bfloat16, r"g.dtype is bfloat16; allowed"),
])
def test_bad_dtypes(name, dtype, match):
    args = make()
    args[name] = args[name].to(dtype)
    expect(args, match)


def test_aux_tensors_may_use_q_dtype():
    args = make(torch.bfloat16)
    for name in ("w", "beta", "g"):
        args[name] = args[name].to(torch.bfloat16)
    assert call(args).dtype == torch.bfloat16


def test_non_tensor_argument():
    expect(with_(k=[[1.0]]), r"k must be a torch.Tensor, got list", exc=TypeError)


def test_bad_scale_and_backend():
    expect(make(), r"scale must be a positive finite float", scale=-1.0)
    expect(make(), r"scale must be a positive finite float", scale=float("nan"))
    expect(make(), r"backend must be one of 'auto', 'reference', 'triton', 'tvm', got 'cuda'", backend="cuda")


@pytest.mark.parametrize("scale", [-1.0, 0.0, float("nan")])
def test_bad_scale_is_refused_under_torch_compile(scale):
    """The traced path checks scale like an eager call (it is a constant of the trace)."""
    args = make()
    torch._dynamo.reset()
    fn = torch.compile(lambda a: call(a, scale=scale), fullgraph=True, backend="eager")
    with pytest.raises(Exception, match=r"scale must be a positive finite float"):
        fn(args)


@pytest.mark.parametrize("cu, match", [
    (torch.tensor([[0, 8]]), r"cu_seqlens must be 1-D \[N \+ 1\]"),
    (torch.tensor([0.0, 8.0]), r"cu_seqlens.dtype is float32; allowed: int32, int64"),
    (torch.tensor([1, 8]), r"cu_seqlens must start at 0, got cu_seqlens\[0\] = 1"),
    (torch.tensor([0, 5, 5, 8]), r"strictly increasing .* cu_seqlens\[1\] = 5 and cu_seqlens\[2\] = 5"),
    (torch.tensor([0, 6, 4, 8]), r"strictly increasing"),
    (torch.tensor([0, 4, 7]), r"cu_seqlens must end at T = 8 \(q.shape\[1\]\), got cu_seqlens\[-1\] = 7"),
    (torch.tensor([0]), r"at least 2 entries"),
])
def test_bad_cu_seqlens(cu, match):
    expect(make(B=1), match, cu_seqlens=cu)


def test_cu_seqlens_needs_batch_one():
    expect(make(B=2), r"needs batch size B == 1.*got B = 2", cu_seqlens=torch.tensor([0, 4, 8]))


@pytest.mark.parametrize("value, match", [
    (2.5, r"beta must lie in \(0, 2\]; 1 of 32 values do not, e.g. beta\[0, 3, 1\] = 2.5"),
    (0.0, r"beta must lie in \(0, 2\]"),
    (float("nan"), r"beta must lie in \(0, 2\]"),
])
def test_beta_outside_interval(value, match):
    args = make()
    args["beta"][0, 3, 1] = value
    expect(args, match)


def test_beta_two_is_allowed():
    args = make()
    args["beta"].fill_(2.0)
    call(args)


def test_w_not_unit_norm():
    args = make()
    args["w"][1, 2, 0] *= 1.01
    expect(args, r"w must have unit L2 norm .*normalize\(w, dim=-1\).*w\[1, 2, 0, :\] exceeds 0.001 .*float32")
    args["w"] = F.normalize(args["w"], dim=-1) * (1 + 5e-4)        # within the float32 tolerance
    call(args)
    half = make(torch.bfloat16)
    half["w"] = (F.normalize(half["w"], dim=-1) * 1.005).to(torch.bfloat16)   # within 1e-2 for bf16
    call(half)


def test_value_checks_gating(monkeypatch):
    from pathtune.runtime.validation import value_checks_enabled

    monkeypatch.delenv("PATHTUNE_CHECK_INPUTS", raising=False)
    assert value_checks_enabled(torch.device("cpu"))
    assert not value_checks_enabled(torch.device("cuda", 0))
    monkeypatch.setenv("PATHTUNE_CHECK_INPUTS", "1")
    assert value_checks_enabled(torch.device("cuda", 0))
    monkeypatch.setenv("PATHTUNE_CHECK_INPUTS", "maybe")
    with pytest.raises(ValueError, match="PATHTUNE_CHECK_INPUTS='maybe' is not a boolean"):
        value_checks_enabled(torch.device("cuda", 0))


def test_auto_picks_reference_on_cpu_and_logs(caplog):
    assert resolve_backend("auto", torch.device("cpu"))[0] == "reference"
    with caplog.at_level(logging.DEBUG, logger="pathtune.dispatch"):
        call(make())
    assert any("path_attention -> reference" in r.getMessage() for r in caplog.records)


def test_print_dispatch(monkeypatch, capsys):
    from pathtune.runtime import api

    monkeypatch.setenv("PATHTUNE_PRINT_DISPATCH", "1")
    monkeypatch.setattr(api, "_printed", set())
    call(make())
    call(make())
    err = capsys.readouterr().err
    assert err.count("[pathtune] path_attention -> reference") == 1


def test_unavailable_backends_say_what_is_missing(monkeypatch):
    expect(make(), r"backend 'tvm' needs CUDA tensors, but q is on cpu", exc=ValueError, backend="tvm")
    from pathtune.runtime import api

    monkeypatch.setattr(api, "_triton_entry", lambda: (None, "pathtune.codegen.triton does not provide it"))
    expect(make(), r"backend 'triton' is unavailable: pathtune.codegen.triton does not provide it",
           exc=NotImplementedError, backend="triton")


def test_triton_backend_checks_device_and_head_dim(monkeypatch):
    from pathtune.runtime import api

    monkeypatch.setattr(api, "_triton_entry", lambda: (lambda *a, **k: None, ""))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    expect(make(), r"backend 'triton' needs CUDA tensors, but q is on cpu", backend="triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    expect(make(D=48), r"head dim D = 48 \(q.shape\[3\]\) is not supported by backend 'triton'; "
                       r"supported: 32, 64, 96, 128, 192, 256 \(backend='reference' accepts any head dim\)",
           backend="triton")
    expect(make(DV=40), r"head dim DV = 40 \(v.shape\[3\]\)", backend="triton")


def test_devices_must_match():
    expect(with_(k=make()["k"].to("meta")), r"k is on meta but q is on cpu; put all inputs on one device")
    expect(make(B=1), r"cu_seqlens is on meta but q is on cpu", cu_seqlens=torch.tensor([0, 8], device="meta"))


def test_malformed_or_unknown_pathtune_variables_are_reported(monkeypatch):
    """A malformed PATHTUNE_* value fails the first public call with its name and what it accepts, even
    on a path that never reads it (CPU inputs never read PATHTUNE_CHECK_INPUTS); an unknown name (a typo)
    warns; `pathtune env` lists both."""
    from typer.testing import CliRunner

    from pathtune import _env
    from pathtune.cli import app

    monkeypatch.setattr(_env, "_CHECKED", False)
    monkeypatch.setenv("PATHTUNE_CHECK_INPUTS", "maybe")
    monkeypatch.setenv("PATHTUNE_CHECK_INPUT", "1")
    with pytest.raises(ValueError, match=r"PATHTUNE_CHECK_INPUTS='maybe' is not a boolean"):
        call(make())
    out = CliRunner().invoke(app, ["env"]).output
    assert "PATHTUNE_CHECK_INPUTS='maybe' is not a boolean" in out
    assert "PATHTUNE_CHECK_INPUT is not a pathtune variable" in out
    monkeypatch.setenv("PATHTUNE_CHECK_INPUTS", "1")
    with pytest.warns(UserWarning, match=r"PATHTUNE_CHECK_INPUT is not a pathtune variable"):
        call(make())
    call(make())                                   # checked once: no second warning, no cost


def test_a_retired_variable_names_what_replaced_it(monkeypatch):
    """PATHTUNE_BWD_RANGE_MIB (now the knob bwd_range_budget_mib) still set: the warning says so instead of
    calling it a typo."""
    from pathtune import _env

    monkeypatch.setattr(_env, "_CHECKED", False)
    monkeypatch.setenv("PATHTUNE_BWD_RANGE_MIB", "512")
    assert _env.problems() == [f"PATHTUNE_BWD_RANGE_MIB is no longer read: {_env.RETIRED['PATHTUNE_BWD_RANGE_MIB']}"]
    with pytest.warns(UserWarning, match=r"PATHTUNE_BWD_RANGE_MIB is no longer read: .*bwd_range_budget_mib"):
        call(make())


@pytest.mark.parametrize("value, match", [
    (0.5, r"g must lie in \(-inf, 0\]; 1 of 64 values do not, e.g. g\[1, 2, 3\] = 0.5"),
    (float("-inf"), r"g must lie in \(-inf, 0\]; 1 of 64 values do not, e.g. g\[1, 2, 3\] = -inf"),
    (float("nan"), r"g must lie in \(-inf, 0\]"),
])
def test_g_outside_interval(value, match):
    """g is a log forget gate (<= 0, the spec's interval): a positive, -inf or NaN entry is one line that
    names the interval and the first bad entry, never a NaN output."""
    args = make()
    args["g"][1, 2, 3] = value
    with pytest.raises(ValueError, match=match) as info:
        call(args)
    assert "\n" not in str(info.value)


def test_g_zero_and_large_negative_are_allowed():
    args = make()
    args["g"].fill_(0.0)
    call(args)
    args["g"].fill_(-1e4)
    o = call(args)
    assert torch.isfinite(o).all()


def test_g_outside_interval_is_refused_by_the_decode_step():
    """The decode step runs the same value checks as path_attention (per call, CPU inputs)."""
    from pathtune.runtime.decode import path_attention_decode, path_attention_prefill

    args = make(B=1)
    _, cache = path_attention_prefill(*(args[n] for n in ("q", "k", "v", "w", "beta", "g")), backend="reference")
    step = make(B=1, T=1)
    step["g"][0, 0, 1] = float("-inf")
    with pytest.raises(ValueError, match=r"g must lie in \(-inf, 0\]; .* g\[0, 0, 1\] = -inf"):
        path_attention_decode(*(step[n] for n in ("q", "k", "v", "w", "beta", "g")), cache, backend="reference")
