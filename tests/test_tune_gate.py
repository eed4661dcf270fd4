"""The tuner's accuracy gate (tuning/measure.py): how long its sequence is, which heads the float64
oracle checks, and that a wrong head or a wrong gradient is caught (the kernel stood in for by the
PyTorch reference, so this runs in seconds on the CPU)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pathtune.runtime.reference import naive_path_attention
from pathtune.tuning import measure as M


def test_gate_tokens_cover_two_superchunks_when_the_timed_shape_does():
    assert M.gate_tokens(1024, 1024, 1024) == 1024           # one super-chunk at the timed shape too
    assert M.gate_tokens(1024, 4096, 1024) == 2048           # two super-chunks, aligned
    assert M.gate_tokens(512, 16384, 1024) == 2048           # rounded up to the alignment
    assert M.gate_tokens(2048, 16384, 1024) == 4096
    assert M.gate_tokens(4096, 16384, 1024) == 8192
    assert M.gate_tokens(1024, 4096, 4096) == 4096           # check_len wins when longer
    assert M.gate_tokens(0, 4096, 48) == 48                  # no super-chunk knob (TVM without it)
    assert all(M.gate_tokens(s, 32768, 1024) % M.GATE_ALIGN == 0 for s in (256, 512, 1024, 2048, 4096))


def test_oracle_kv_heads():
    assert M.oracle_kv_heads(16, 2) == [0, 15]
    assert M.oracle_kv_heads(8, 3) == [0, 4, 7]
    assert M.oracle_kv_heads(4, 1) == [0]
    assert M.oracle_kv_heads(4, 0) == [0, 1, 2, 3] == M.oracle_kv_heads(4, 9)


def _inputs(B=1, T=40, HQ=6, H=3, D=8, gate=True):
    torch.manual_seed(1)
    q, k, v = torch.randn(B, T, HQ, D), torch.randn(B, T, H, D), torch.randn(B, T, H, D)
    w = F.normalize(torch.randn(B, T, H, D), dim=-1)
    beta = 1.5 + 0.5 * torch.rand(B, T, H)
    g = torch.log(0.95 + 0.05 * torch.rand(B, T, HQ)) if gate else None
    return [q, k, v, w, beta, g]


@pytest.mark.parametrize("gate", [True, False])
def test_oracle_by_kv_head_equals_the_full_oracle(gate):
    xs = _inputs(gate=gate)
    do = torch.randn(1, 40, 6, 8)
    heads = [0, 2]
    o, grads = M.oracle_by_kv_head(xs, heads, do, checkpoint_steps=16)
    leaves = [x.double().requires_grad_() for x in xs if x is not None]
    full = naive_path_attention(*leaves, *([] if gate else [None]))
    full_grads = torch.autograd.grad(full, leaves, do.double())
    names = [i for i, x in enumerate(xs) if x is not None]
    assert torch.allclose(o, M._head_slice(full.detach(), 0, heads, 2), rtol=0, atol=1e-12)
    for i, got, ref in zip(names, grads, full_grads):
        assert torch.allclose(got, M._head_slice(ref, i, heads, 2), rtol=0, atol=1e-12)
    o_nograd, none = M.oracle_by_kv_head(xs, heads)
    assert none is None and torch.allclose(o_nograd, o, rtol=0, atol=1e-12)


def _task(pass_, check_heads=2):
    wl = dict(head_dim=8, head_dim_v=8, heads_q=6, heads_kv=3, dtype="float32", use_gate=True)
    return M.MeasureTask(pass_=pass_, backend="reference", workload=wl, config={}, batch=1, seq_len=40,
                         check_len=40, check_heads=check_heads)


def _reference_run(corrupt_head=None, corrupt_grad=False):
    """The PyTorch reference as the 'kernel' (float32); optionally wrong on one query head, or with a
    wrong gradient of w (a backward bug the forward cannot show)."""
    class WrongW(torch.autograd.Function):
        @staticmethod
        def forward(ctx, w):
            return w.view_as(w)

        @staticmethod
        def backward(ctx, grad):
            return grad * 1.5

    def run(q, k, v, w, beta, g):
        o = naive_path_attention(q, k, v, WrongW.apply(w) if corrupt_grad else w, beta, g)
        if corrupt_head is not None:
            o = o.clone()
            o[:, :, corrupt_head] = o[:, :, corrupt_head] * 1.1
        return o
    return run


@pytest.mark.parametrize("pass_", ["fwd", "bwd"])
def test_gate_errors_small_for_a_correct_kernel(pass_):
    errors = M._check_fwd_bwd(_task(pass_), _reference_run())
    assert set(errors) == ({"o"} if pass_ == "fwd" else {"o", "dq", "dk", "dv", "dw", "dbeta", "dg"})
    assert max(errors.values()) < 1e-5


def test_gate_checks_the_last_head_and_the_gradients():
    # query heads 4, 5 belong to kv head 2 (G = 2): the last head, checked by default
    assert M._check_fwd_bwd(_task("fwd"), _reference_run(corrupt_head=5))["o"] > 1e-2
    # kv head 1 (query heads 2, 3) is not among [0, 2]: only check_heads=0 (all) sees it
    assert M._check_fwd_bwd(_task("fwd"), _reference_run(corrupt_head=3))["o"] < 1e-5
    assert M._check_fwd_bwd(_task("fwd", check_heads=0), _reference_run(corrupt_head=3))["o"] > 1e-2
    errs = M._check_fwd_bwd(_task("bwd"), _reference_run(corrupt_grad=True))
    assert errs["o"] < 1e-5 and errs["dw"] > 0.1


def test_decode_timing_runs_the_configs_flush_cycle_and_reports_per_step(monkeypatch):
    """The tuner's decode timing (interpreter, tiny cache): one call of the timed callable runs the config's flush
    cycle (W plain steps with 0 .. W-1 rows pending, then the one that rotates the cache: the frame moves to the
    end), and ``_time_decode`` divides the call's times by its steps; ``cycle=False`` is one plain step."""
    from pathtune.codegen.triton.decode import decode_params

    wl = dict(head_dim=16, head_dim_v=16, heads_q=2, heads_kv=2, dtype="float32", use_gate=True)
    task = M.MeasureTask(pass_="decode", backend="triton", workload=wl, config={}, batch=1, seq_len=24)
    params = decode_params(dict(decode_pending_window=3, decode_block_n=16), 16, 16)
    fn, q_t, ck, cv = M._decode_timed_callable(task, params)
    assert fn.steps == 4 and q_t.shape == (1, 2, 16) and ck.shape[1] == cv.shape[1] == 24
    fn()
    assert (fn.cache.length, fn.cache.frame) == (25, 25)        # the last step of the cycle flushed
    plain, *_ = M._decode_timed_callable(task, params, cycle=False)
    assert plain.steps == 1

    monkeypatch.setattr(M, "_time", lambda f, t: dict(median_ms=8.0, p20_ms=4.0, p80_ms=12.0, bench_method="x"))
    out = M._time_decode(fn, task)
    assert (out["median_ms"], out["p20_ms"], out["p80_ms"]) == (2.0, 1.0, 3.0)
    assert out["bench_method"] == "x, eager of a 4-step flush cycle, per step"


def test_decode_measurement_gates_then_times_one_step_on_the_cpu():
    """measure() of a decode candidate in the interpreter: the gate against the float64 reference step passes and
    the timing is one plain step (the flush cycle and its CUDA graph are the GPU's: the GPU test of
    tests/test_decode_lazy.py)."""
    wl = dict(head_dim=16, head_dim_v=16, heads_q=2, heads_kv=2, dtype="float32", use_gate=True)
    task = M.MeasureTask(pass_="decode", backend="triton", workload=wl, batch=1, seq_len=24, check_len=32,
                         config=dict(decode_pending_window=3, decode_block_n=16))
    out = M.measure(task)
    assert out["status"] == "ok" and out["errors"]["o"] < 1e-4, out
    assert out["bench_method"].endswith(", eager, one step") and out["median_ms"] > 0
