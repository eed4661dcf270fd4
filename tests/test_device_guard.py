"""The public entry points run their kernels on the tensors' CUDA device (runtime/device_guard.py): Triton launches
on the current device, which need not be the tensors'.

CPU: ``on_device`` for CUDA / other devices, and that ``path_attention`` and ``path_attention_decode`` run their
kernel plans inside it (the plans stand in for the kernels).  GPU (``-m gpu``, two or more GPUs): a forward +
backward and decode steps on ``cuda:1`` while ``cuda:0`` is current equal the same calls with ``cuda:1`` current.
"""
from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F

import pathtune
from pathtune.runtime import api, device_guard
from pathtune.runtime import decode as rdecode


def test_on_device_makes_an_indexed_cuda_device_current_and_leaves_others_alone():
    guard = device_guard.on_device(torch.device("cuda", 1))
    assert isinstance(guard, torch.cuda.device) and guard.idx == 1
    for dev in (torch.device("cpu"), torch.device("cuda"), torch.device("meta")):
        assert isinstance(device_guard.on_device(dev), contextlib.nullcontext), dev


def _recording_guard(monkeypatch, module, entered: list):
    @contextlib.contextmanager
    def guard(device):
        entered.append(device)
        yield
        entered.append(None)
    monkeypatch.setattr(module, "on_device", guard)


def _inputs(B=1, T=8, HQ=2, H=2, D=32):
    q, k, v = torch.randn(B, T, HQ, D), torch.randn(B, T, H, D), torch.randn(B, T, H, D)
    w = F.normalize(torch.randn(B, T, H, D), dim=-1)
    beta = torch.rand(B, T, H) + 1.0
    return q, k, v, w, beta


def test_path_attention_runs_its_kernel_plan_on_the_inputs_device(monkeypatch):
    entered: list = []
    _recording_guard(monkeypatch, api, entered)
    q, k, v, w, beta = _inputs()

    class Plan:
        def run(self, q, *args):
            assert entered == [q.device], "the kernel plan ran outside on_device(q.device)"
            return torch.zeros_like(q), torch.zeros(q.shape[:3])

    monkeypatch.setattr(api, "resolve_backend", lambda backend, device: ("triton", "test"))
    monkeypatch.setattr(api, "_check_backend", lambda *a: None)
    monkeypatch.setattr(api, "select_plan", lambda *a, **kw: Plan())
    pathtune.path_attention(q, k, v, w, beta)
    assert entered == [q.device, None]


def test_decode_steps_run_on_the_inputs_device(monkeypatch):
    entered: list = []
    _recording_guard(monkeypatch, rdecode, entered)
    q, k, v, w, beta = _inputs(T=1)
    _, cache = pathtune.path_attention_prefill(*_inputs(T=6), backend="reference")

    def run(q, *args):
        assert entered and entered[-1] == q.device, "the decode step ran outside on_device(q.device)"
        return torch.zeros_like(q)

    monkeypatch.setattr(rdecode, "_prepare", lambda *a, **kw: rdecode._Step(run, None, False))
    for _ in range(2):     # the new step, then its cached repeat
        rdecode.path_attention_decode(q, k, v, w, beta, None, cache, backend="reference")
    assert entered == [q.device, None] * 2


@pytest.mark.gpu
def test_gpu_calls_on_a_device_that_is_not_current():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA GPUs")
    gen = torch.Generator().manual_seed(5)

    def inputs(T):
        def r(*s):
            return torch.randn(*s, generator=gen)
        xs = [r(2, T, 4, 64).bfloat16(), r(2, T, 2, 64).bfloat16(), r(2, T, 2, 64).bfloat16(),
              F.normalize(r(2, T, 2, 64), dim=-1), torch.rand(2, T, 2, generator=gen) * 0.5 + 1.5,
              F.logsigmoid(r(2, T, 4) + 3.0)]
        return xs

    def fwd_bwd(xs):
        o = pathtune.path_attention(*xs)
        return [o, *torch.autograd.grad(o, xs, torch.ones_like(o))]

    def decode(prompt, steps):
        o0, cache = pathtune.path_attention_prefill(*prompt, max_len=600)
        return [o0] + [pathtune.path_attention_decode(*s, cache) for s in steps]

    xs = inputs(1100)
    prompt = inputs(500)
    steps = [inputs(1) for _ in range(20)]
    results = {}
    for current in (1, 0):
        with torch.cuda.device(current):
            on1 = [x.to("cuda:1").requires_grad_() for x in xs]
            results[current] = (fwd_bwd(on1), decode([x.to("cuda:1") for x in prompt],
                                                    [[x.to("cuda:1") for x in s] for s in steps]))
        torch.cuda.synchronize(1)
    assert torch.cuda.current_device() == 0
    for a, b in zip(results[1][0] + results[1][1], results[0][0] + results[0][1]):
        assert a.device == b.device == torch.device("cuda", 1)
        assert float((a.double() - b.double()).norm() / a.double().norm()) < 2e-3
