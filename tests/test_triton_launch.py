"""Repeat launches that skip the JIT's argument binding (codegen/triton/launch.py).

CPU: ``KernelLauncher``'s bookkeeping against a stand-in JIT function whose ``[grid]`` returns a compiled-kernel
object (the first call of a key goes through the JIT, later ones to the kept launcher with the constexprs in
the kernel's parameter order; no key, an unaligned pointer, a JIT pre-run hook or a stand-in kernel put in
the module sends a call to the JIT; at most ``MAX_KEYS`` kept), the real decode kernel's parameter split and its
step's int-pointer repeats; ``signature_and_args`` against Triton's own specialisation; ``compiled``'s keyed
repeats (int pointers) and that every forward / backward launch goes through it.  GPU (``-m gpu``): decode steps
and a fwd+bwd through the repeat path equal the same through the JIT, and an unaligned input is launched through
the JIT.
"""
from __future__ import annotations

import copy

import pytest
import torch
import triton.language as tl
from triton.compiler import CompiledKernel

from pathtune.codegen.triton import launch as launch_mod
from pathtune.codegen.triton.launch import KernelLauncher, pointers_and_key


def _kernel(a_ptr, b_ptr, n, X: tl.constexpr, Y: tl.constexpr, Z: tl.constexpr = 7):
    pass


class _Compiled(CompiledKernel):
    """A compiled kernel as the JIT returns it: ``[grid]`` gives its launcher, which records what it ran."""

    def __init__(self, log):   # noqa: D107 - no module to load
        self.log = log

    def __getitem__(self, grid):
        def run(*args):
            self.log.append(("direct", grid, args))
        return run


class _Jit:
    """Stands in for a ``triton.jit`` function: ``fn`` the Python function, ``[grid](...)`` the JIT launch."""

    def __init__(self, returns_compiled=True):
        self.fn, self.pre_run_hooks, self.log = _kernel, [], []
        self.returns_compiled = returns_compiled

    def __getitem__(self, grid):
        def launch(*args, **kw):
            self.log.append(("jit", grid, args, kw))
            return _Compiled(self.log) if self.returns_compiled else None
        return launch


class _Module:
    """A launcher module holding one kernel, ``kernel``."""

    def __init__(self, kernel):
        self.kernel = kernel


def _launcher(jit):
    return KernelLauncher(_Module(jit), "kernel")


def test_first_launch_of_a_key_goes_through_the_jit_then_to_the_compiled_launcher():
    jit = _Jit()
    launch = _launcher(jit)
    args = ("a", "b", 5)
    assert not launch.repeat("k1", args)                      # nothing kept yet
    launch((4, 2), args, dict(X=1, Y=2), dict(num_warps=4), "k1")
    assert jit.log == [("jit", (4, 2), args, dict(X=1, Y=2, num_warps=4))]
    assert launch.repeat("k1", ("c", "d", 6))
    assert jit.log[-1] == ("direct", (4, 2, 1), ("c", "d", 6, 1, 2, 7))   # constexprs in order, Z's default
    assert launch.hits == 1
    assert not launch.repeat("k2", args) and not launch.repeat(None, args)
    assert len(jit.log) == 2


def test_no_key_no_compiled_kernel_or_a_pre_run_hook_means_the_jit():
    jit = _Jit()
    launch = _launcher(jit)
    launch((1,), (1, 2, 3), dict(X=0, Y=0), {}, None)         # no key: nothing kept
    assert not launch.repeat(None, (1, 2, 3))
    interp = _Jit(returns_compiled=False)                     # the interpreter returns no compiled kernel
    launch_i = _launcher(interp)
    launch_i((1,), (1, 2, 3), dict(X=0, Y=0), {}, "k")
    assert not launch_i.repeat("k", (1, 2, 3))
    launch((1,), (1, 2, 3), dict(X=0, Y=0), {}, "k")
    jit.pre_run_hooks.append(lambda *a, **k: None)            # a hook the JIT must run
    assert not launch.repeat("k", (1, 2, 3))
    jit.pre_run_hooks.clear()
    assert launch.repeat("k", (1, 2, 3))
    launch.module.kernel = _Jit()                             # a stand-in put in the module: it sees the launch
    assert not launch.repeat("k", (1, 2, 3))


def test_wrong_argument_count_and_constexpr_before_a_runtime_parameter_are_refused():
    launch = _launcher(_Jit())
    with pytest.raises(TypeError, match="takes 3 runtime arguments, got 2"):
        launch((1,), (1, 2), dict(X=0, Y=0), {}, "k")
    with pytest.raises(TypeError, match="constexpr Y"):
        launch.constexpr_values(dict(X=0))

    def mixed(a_ptr, X: tl.constexpr, n):
        pass

    jit = _Jit()
    jit.fn = mixed
    with pytest.raises(ValueError, match="must follow every runtime parameter"):
        _launcher(jit)


def test_pointers_and_key_is_the_pointers_and_the_dtypes_when_every_pointer_is_16_byte_aligned():
    a = torch.zeros(64, dtype=torch.float32)
    b = torch.zeros(8, dtype=torch.bfloat16)
    assert pointers_and_key([a, b]) == ((a.data_ptr(), b.data_ptr()), (torch.float32, torch.bfloat16))
    assert pointers_and_key([a[4:], b])[1] == (torch.float32, torch.bfloat16)    # 16 bytes in
    assert pointers_and_key([a[1:], b]) == ((a.data_ptr() + 4, b.data_ptr()), None)   # 4 bytes in: the JIT's call


class _RecordingLauncher:
    """Stands in for a decode step's ``KernelLauncher``: records the repeat attempts and the JIT calls."""

    def __init__(self, kept: bool):
        self.kept, self.repeats, self.calls = kept, [], []

    def repeat(self, key, args):
        self.repeats.append((key, args))
        return self.kept and key is not None

    def __call__(self, grid, args, constexprs, options, key=None):
        self.calls.append((grid, args, key))


def _launches_of_a_step(dec, gate):
    """What a prepared step of module ``dec`` launches with: (the repeat's (key, args), the JIT call's (grid, args,
    key)) of a first step; then the repeat of a kept key and that of a q 2 bytes into its storage."""
    import torch.nn.functional as F

    from pathtune.codegen.kv_cache import PaTHKVCache

    gen = torch.Generator().manual_seed(5)
    B, T0, HQ, H, D = 2, 40, 4, 2, 16
    cache = PaTHKVCache(torch.randn(B, 64, H, D, generator=gen).bfloat16(),
                        torch.randn(B, 64, H, D, generator=gen).bfloat16(),
                        torch.randn(B, 64, HQ, generator=gen).cumsum(1) if gate else None, T0, HQ)
    q = torch.randn(B, 1, HQ, D, generator=gen).bfloat16()
    k, v = torch.randn(B, 1, H, D, generator=gen).bfloat16(), torch.randn(B, 1, H, D, generator=gen).bfloat16()
    w = F.normalize(torch.randn(B, 1, H, D, generator=gen), dim=-1)
    beta = torch.rand(B, 1, H, generator=gen) + 1.0
    g = F.logsigmoid(torch.randn(B, 1, HQ, generator=gen)) if gate else None
    step = dec.prepare(q, k, v, w, beta, g, cache)
    first = step._launch = _RecordingLauncher(kept=False)
    step(q, k, v, w, beta, g, cache)
    kept = step._launch = _RecordingLauncher(kept=True)
    step(q, k, v, w, beta, g, cache)
    flat = torch.empty(q.numel() + 1, dtype=q.dtype)
    q_odd = flat[1:].view_as(q)
    q_odd.copy_(q)
    step(q_odd, k, v, w, beta, g, cache)
    return first, kept, q


def _int_pointer_launches_hold(first, kept, q):
    (key, fast_args), = first.repeats
    (_grid, jit_args, jit_key), = first.calls
    assert key is not None and jit_key == key
    assert len(jit_args) == len(fast_args) == 24
    tensors, scalars = jit_args[:20], jit_args[20:]
    assert all(isinstance(t, torch.Tensor) for t in tensors) and jit_args[0] is q
    assert fast_args[20:] == scalars
    assert kept.repeats[0][0] is not None and len(kept.calls) == 1     # a kept key: no JIT call
    assert kept.repeats[1][0] is None and kept.calls[-1][2] is None     # unaligned q: the JIT's call, no key
    assert all(type(p) is int for p in fast_args[:20]), [type(p).__name__ for p in fast_args[:20]]
    assert fast_args[:20] == tuple(t.data_ptr() for t in tensors)


@pytest.mark.parametrize("gate", [False, True])
def test_decode_step_repeats_with_int_pointers_and_calls_the_jit_with_tensors(gate):
    """A prepared step hands a repeat the data pointers of its 20 tensors as ints (then the scalars) and the JIT's
    call the tensors themselves, in the kernel's runtime order; a q 2 bytes into its storage gives no key."""
    from pathtune.codegen.triton import decode

    _int_pointer_launches_hold(*_launches_of_a_step(decode, gate))


def test_decode_kernel_runtime_parameters_precede_its_constexprs():
    from pathtune.codegen.triton import decode

    launch = KernelLauncher(decode, "decode_kernel")
    names = [n for n, _ in launch._const_names]
    assert launch._n_runtime == 24 and names[0] == "H" and names[-1] == "STAGES"


def test_at_most_max_keys_compiled_kernels_are_kept(monkeypatch):
    """A varlen layout gives a new grid per call: past MAX_KEYS the oldest key's kernel is dropped."""
    monkeypatch.setattr(launch_mod, "MAX_KEYS", 2)
    launch = _launcher(_Jit())
    for key in ("k1", "k2", "k3"):
        launch((1,), (1, 2, 3), dict(X=0, Y=0), {}, key)
    assert not launch.repeat("k1", (1, 2, 3))
    assert launch.repeat("k2", (1, 2, 3)) and launch.repeat("k3", (1, 2, 3))


# ---- compiled(kernel): the forward / backward launchers' repeat path -------------------------------------------

def test_signature_is_at_least_as_fine_as_tritons_specialisation():
    """Any two arguments Triton's runtime specialisation tells apart (``native_specialize_impl``: dtype and 16-byte
    alignment of a pointer, an int's value class and width, a descriptor's block) get different signatures from
    ``signature_and_args``, which hands each tensor over as its data pointer and everything else as it is;
    arguments of a kind it does not cover give no signature (the JIT's call)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend
    from triton.runtime.jit import native_specialize_impl
    from triton.tools.tensor_descriptor import TensorDescriptor

    backend = make_backend(GPUTarget("cuda", 90, 32))
    t = torch.zeros(64, 64, dtype=torch.bfloat16)
    f = torch.zeros(64, 64, dtype=torch.float32)
    args = [t, t[1:], t.view(-1)[3:], t.view(-1)[8:], f, f.view(-1)[1:], f.view(-1)[4:], 0, 1, 2, 15, 16, 17, 48,
            -16, -3, (1 << 31) - 16, 1 << 31, (1 << 31) + 3, 1 << 40, 0.5, 2.0, True, False, None,
            TensorDescriptor.from_tensor(t, [16, 16]), TensorDescriptor.from_tensor(t, [32, 16]),
            TensorDescriptor.from_tensor(f, [16, 16])]
    for i, a in enumerate(args):
        sa, out = launch_mod.signature_and_args((a,))
        assert out == ((a.data_ptr(),) if isinstance(a, torch.Tensor) else (a,))
        for b in args[i + 1:]:
            if native_specialize_impl(backend, a, False, True, True) != native_specialize_impl(backend, b, False,
                                                                                               True, True):
                assert sa != launch_mod.signature_and_args((b,))[0], (a, b)
    assert launch_mod.signature_and_args((t, 3, object()))[0] is None


def _first_call_then_repeat(launch, jit):
    """A key's first call (through the JIT, with the tensors) and its repeat with new tensors of the same kind; returns
    the first call's tensors and the repeat's, the repeat's launch in ``jit.log[-1]``."""
    a, b = torch.zeros(16), torch.zeros(16)
    launch[(4, 2)](a, b, 32, X=1, Y=2, num_warps=4)
    assert jit.log[-1] == ("jit", (4, 2), (a, b, 32), dict(X=1, Y=2, num_warps=4))
    a2, b2 = torch.zeros(16), torch.zeros(16)
    launch[(4, 2)](a2, b2, 48, X=1, Y=2, num_warps=4)               # 48: a multiple of 16 again
    return a, b, a2, b2


def _other_specialisations(a, b) -> list:
    """(grid, args, kwargs) of calls that differ from the first call of ``_first_call_then_repeat`` in the grid, a
    pointer's alignment, an int's class, a constexpr or an option: each a key of its own, for the JIT."""
    return [((4, 3), (a, b, 32), dict(X=1, Y=2, num_warps=4)),
            ((4, 2), (a[1:], b, 32), dict(X=1, Y=2, num_warps=4)),
            ((4, 2), (a, b, 33), dict(X=1, Y=2, num_warps=4)),
            ((4, 2), (a, b, 32), dict(X=1, Y=3, num_warps=4)),
            ((4, 2), (a, b, 32), dict(X=1, Y=2, num_warps=8))]


def test_repeat_launch_repeats_with_int_pointers_and_sends_other_specialisations_to_the_jit():
    """The repeat path around a stand-in JIT function: the first call of a key goes through the JIT with the
    tensors, its repeat (new tensors, same kind) to the kept compiled kernel with each tensor as its data pointer and
    the constexprs in parameter order; another grid, an unaligned pointer, another dtype, int class, constexpr,
    option or keyword order, or an unhashable constexpr go through the JIT (a new keyword order is a key of its own,
    launched right)."""
    jit = _Jit()
    launch = launch_mod._RepeatLaunch(jit)
    a, b, a2, b2 = _first_call_then_repeat(launch, jit)
    assert jit.log[-1] == ("direct", (4, 2, 1), (a2.data_ptr(), b2.data_ptr(), 48, 1, 2, 7))
    assert launch.launcher.hits == 1
    for grid, args, kw in _other_specialisations(a, b) + [((4, 2), (a.double(), b, 32), dict(X=1, Y=2, num_warps=4)),
                                                          ((4, 2), (a, b, 32), dict(Y=2, X=1, num_warps=4))]:
        launch[grid](*args, **kw)
        assert jit.log[-1][0] == "jit" and isinstance(jit.log[-1][2][0], torch.Tensor), (grid, kw)
    assert launch.launcher.hits == 1
    launch[(4, 2)](a2, b2, 48, Y=2, X=1, num_warps=4)                # the new order's repeat: same constexprs
    assert jit.log[-1] == ("direct", (4, 2, 1), (a2.data_ptr(), b2.data_ptr(), 48, 1, 2, 7))
    assert launch.launcher.hits == 2
    launch[(1,)](a, b, 32, X=[1], Y=2)                              # an unhashable constexpr: the JIT's call
    assert jit.log[-1][0] == "jit"


def test_repeat_launcher_in_place_swaps_and_restores():
    """``kernel_variants.repeat_launcher_in_place(cls)`` (what a probe's ``--launch-candidate`` module uses):
    ``compiled`` builds ``cls`` launchers inside, the shipped ones after."""
    import sys
    from pathlib import Path

    from triton.runtime.jit import JITFunction

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from kernel_variants import repeat_launcher_in_place

    class Other(launch_mod._RepeatLaunch):
        pass

    jf = JITFunction(_kernel)
    with repeat_launcher_in_place(Other):
        assert type(launch_mod.compiled(jf)) is Other
    assert type(launch_mod.compiled(jf)) is launch_mod._RepeatLaunch


def test_compiled_wraps_jit_kernels_only():
    """A ``triton.jit`` kernel gets one repeat launcher (the same on every call); anything else (the interpreter's
    kernels, a test's spy, a probe's candidate) is returned as it is."""
    from triton.runtime.jit import JITFunction

    jf = JITFunction(_kernel)
    rep = launch_mod.compiled(jf)
    assert isinstance(rep, launch_mod._RepeatLaunch) and rep.kernel is jf and launch_mod.compiled(jf) is rep
    stand_in = _Jit()
    assert launch_mod.compiled(stand_in) is stand_in


def test_every_forward_and_backward_launch_goes_through_compiled():
    """No launcher module launches a kernel as ``kernel[grid]`` itself (it would skip the repeat path)."""
    import re
    from pathlib import Path

    import pathtune.codegen.triton as tri

    folder = Path(tri.__file__).parent
    for name in ("forward", "backward", "_layout"):
        src = (folder / f"{name}.py").read_text()
        direct = re.findall(r"\b\w+_kernel\[", src)     # compiled(x_kernel)[grid] has no "x_kernel["
        assert not direct and "compiled(" in src, (name, direct)


# ---- GPU ------------------------------------------------------------------------------------------------------

def _inputs(B, T, HQ, H, D, gate, gen):
    import torch.nn.functional as F

    def r(*s):
        return torch.randn(*s, device="cuda", generator=gen)
    q, k, v = (r(B, T, HQ, D).bfloat16(), r(B, T, H, D).bfloat16(), r(B, T, H, D).bfloat16())
    w = F.normalize(r(B, T, H, D), dim=-1)
    beta = torch.rand(B, T, H, device="cuda", generator=gen) * 0.5 + 1.5
    g = F.logsigmoid(r(B, T, HQ) + 3.0) if gate else None
    return q, k, v, w, beta, g


@pytest.mark.gpu
@pytest.mark.parametrize("gate, HQ, H, TN", [(False, 8, 8, 1), (True, 8, 2, 4)])
def test_gpu_repeat_launches_equal_jit_launches(monkeypatch, gate, HQ, H, TN):
    """12 steps with a 16-row pending window (flushes included) on twin caches: through the repeat path and with
    it switched off (every launch through the JIT) the outputs and caches are equal bit for bit."""
    from pathtune.codegen.triton import decode as dec
    from pathtune.runtime.reference.recurrent import path_attention_prefill as ref_prefill

    gen = torch.Generator(device="cuda").manual_seed(7 + TN)
    B, T0, D = 2, 700, 64
    xs0 = [None if x is None else x.double() for x in _inputs(B, T0, HQ, H, D, gate, gen)]
    ref = ref_prefill(*xs0, cache_dtype=torch.bfloat16, max_len=900)[1]
    from pathtune.codegen.kv_cache import PaTHKVCache

    fast = PaTHKVCache(ref.k.clone(), ref.v.clone(), None if ref.c is None else ref.c.float(), T0, HQ)
    slow = copy.deepcopy(fast)
    steps = [_inputs(B, TN, HQ, H, D, gate, gen) for _ in range(12)]
    cfg = dict(decode_pending_window=16)
    outs = [dec.path_decode_triton(*xs, fast, config=cfg) for xs in steps]
    step = dec.prepare(*steps[0], fast, config=cfg)
    assert step._launch.hits >= 10
    monkeypatch.setattr(KernelLauncher, "repeat", lambda self, key, args: False)
    for xs, o in zip(steps, outs):
        assert torch.equal(dec.path_decode_triton(*xs, slow, config=cfg), o)
    n = T0 + 12 * TN
    assert fast.length == slow.length == n
    assert torch.equal(fast.k[:, :n], slow.k[:, :n]) and torch.equal(fast.v[:, :n], slow.v[:, :n])


@pytest.mark.gpu
def test_gpu_unaligned_input_goes_through_the_jit_and_is_right():
    """q as a view 2 bytes into its storage (not 16-byte aligned): the step is launched through the JIT and
    equals the same step with an aligned copy of q."""
    from pathtune.codegen.kv_cache import PaTHKVCache
    from pathtune.codegen.triton import decode as dec

    gen = torch.Generator(device="cuda").manual_seed(3)
    B, HQ, H, D, T0 = 2, 4, 4, 64, 300
    k0 = torch.randn(B, 400, H, D, device="cuda", generator=gen).bfloat16()
    v0 = torch.randn(B, 400, H, D, device="cuda", generator=gen).bfloat16()
    a = PaTHKVCache(k0.clone(), v0.clone(), None, T0, HQ)
    b = PaTHKVCache(k0.clone(), v0.clone(), None, T0, HQ)
    xs = _inputs(B, 1, HQ, H, D, False, gen)
    dec.path_decode_triton(*xs, a)                    # the aligned key is kept
    dec.path_decode_triton(*xs, b)
    flat = torch.empty(xs[0].numel() + 1, device="cuda", dtype=torch.bfloat16)
    q_odd = flat[1:].view_as(xs[0])
    q_odd.copy_(xs[0])
    assert pointers_and_key([q_odd])[1] is None
    step = dec.prepare(*xs, a)
    hits = step._launch.hits
    o_odd = dec.path_decode_triton(q_odd, *xs[1:], a)
    assert step._launch.hits == hits                  # not the kept launcher
    assert torch.equal(o_odd, dec.path_decode_triton(*xs, b))


def _fwd_bwd_over_ranges(monkeypatch, gate: bool, seed: int):
    """A callable returning [o, *gradients] of one fwd+bwd through the Triton launchers at the heuristic config, on
    fixed CUDA inputs (the shapes of tests/test_triton_gpu.py's CUDA-graph tests: compiled kernels shared), the
    backward split into several token ranges."""
    import pathtune.codegen.triton.backward as bwd_mod
    from pathtune.codegen.triton import path_attention_triton

    gen = torch.Generator(device="cuda").manual_seed(seed)
    xs = [x.requires_grad_() if x is not None else None for x in _inputs(2, 2500, 4, 4, 64, gate, gen)]
    do = torch.randn(2, 2500, 4, 64, device="cuda", generator=gen).bfloat16()
    monkeypatch.setattr(bwd_mod, "_range_budget", lambda params: 1 << 20)

    def run():
        o, _ = path_attention_triton(*xs)
        live = [x for x in xs if x is not None]
        return [o, *torch.autograd.grad(o, live, do)]
    return run


@pytest.mark.gpu
@pytest.mark.parametrize("gate", [False, True])
def test_gpu_repeat_launches_of_fwd_bwd_equal_jit_launches(monkeypatch, gate):
    """A forward + backward (several token ranges) twice through the repeat path (the second call's launches skip
    the JIT), then with it switched off: o equal bit for bit, the gradients up to the order of the backward's
    atomic adds."""
    run = _fwd_bwd_over_ranges(monkeypatch, gate, seed=11)
    hits = launch_mod.repeat_hits()
    first, second = run(), run()
    assert launch_mod.repeat_hits() - hits >= 10
    monkeypatch.setattr(KernelLauncher, "repeat", lambda self, key, args: False)
    jit = run()
    assert torch.equal(jit[0], first[0]) and torch.equal(jit[0], second[0])
    # the gradients: equal up to the order the backward's float32 atomic adds land in (not fixed between runs)
    for a, b, c in zip(jit[1:], first[1:], second[1:]):
        for x in (b, c):
            assert float((x.double() - a.double()).norm() / a.double().norm()) < 2e-3
