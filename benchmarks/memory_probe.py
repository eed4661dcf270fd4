"""CPU-side memory probe of the Triton PaTH forward + backward (no GPU needed).

Runs ``path_attention_triton`` forward and ``torch.autograd.grad`` at the real shapes on CPU
tensors with every Triton launch replaced by a no-op, and counts the bytes of every tensor
storage created during the call while it is alive (a TorchDispatchMode; frees are seen through
weak storage references).  Each storage is rounded the way the CUDA caching allocator counts
``memory_allocated`` (512-byte blocks; a large block fills its 2 MiB-rounded segment when less
than 1 MiB would be left over), so the peak is comparable to ``default_extra_peak_GiB`` of
``benchmarks/dev_gpu_run2.py``: memory_allocated before (inputs and the upstream gradient,
not counted here) vs max_memory_allocated during one fwd+bwd (outputs, autograd-saved tensors,
the backward's buffers and the returned gradients).  Temporaries inside one aten op (none of
the backward's large buffers) are not seen.

    python benchmarks/memory_probe.py                 # D=64 H=16 and D=128 H=8, B=2, T=16384, gated
    python benchmarks/memory_probe.py --D 64 --H 16 --T 16384 --B 2 --top 20
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import traceback

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

MiB = 1 << 20
GiB = 1 << 30


def cuda_allocated_bytes(nbytes: int) -> int:
    """Bytes the CUDA caching allocator's ``allocated_bytes`` counts for one fresh request.

    Requests round up to 512 bytes.  Up to 1 MiB they come from the small pool (split off
    2 MiB segments, counted at the rounded size).  Larger ones get a segment of 20 MiB (under
    10 MiB) or the request rounded up to 2 MiB; the block is split only when more than 1 MiB
    would remain, otherwise the whole segment counts as allocated.
    """
    if nbytes <= 0:
        return 0
    size = 512 * math.ceil(nbytes / 512)
    if size <= MiB:
        return size
    segment = 20 * MiB if size < 10 * MiB else 2 * MiB * math.ceil(size / (2 * MiB))
    return size if segment - size > MiB else segment


def _where() -> str:
    """The innermost frame in pathtune's own code (codegen/, runtime/, ...) or the probe's caller."""
    for fr in reversed(traceback.extract_stack()[:-3]):
        f = fr.filename.replace("\\", "/")
        if "/torch/" in f or f.endswith("memory_probe.py") or "/triton/" in f and "/codegen/" not in f:
            continue
        return f"{os.path.basename(f)}:{fr.lineno} {fr.name}"
    return "?"


def _custom_impl(func):
    """The Python body of a ``torch.library.custom_op`` (pathtune's ops), else None."""
    if getattr(func, "namespace", None) != "pathtune":
        return None
    from torch._library.custom_ops import OPDEFS

    opdef = OPDEFS.get(func._schema.name)
    return getattr(opdef, "_init_fn", None)


class LiveMemory(TorchDispatchMode):
    """Counts the storages created while active (rounded by ``rounding``) and their peak.

    A storage counts from the op that creates it until its last reference dies.  Views and
    in-place results share an input's storage and are not new.  Custom ops (``pathtune::``) are
    re-entered with the mode active so that the host code inside them is counted too.
    """

    def __init__(self, rounding=cuda_allocated_bytes, min_record: int = 0):
        super().__init__()
        self.rounding = rounding
        self.min_record = min_record
        self.live = {}          # cdata -> [weakref, bytes, label]
        self.current = 0
        self.peak = 0
        self.peak_live = []     # (bytes, label) of the live storages at the peak
        self.timeline = []      # (event, MiB after, bytes, label)
        self.n_alloc = 0

    def _sweep(self):
        for key, (ref, nb, label) in list(self.live.items()):
            if ref.expired():
                del self.live[key]
                self.current -= nb
                if nb >= self.min_record:
                    self.timeline.append(("free", self.current / MiB, nb, label))

    def sweep(self):
        self._sweep()
        return self.current

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self._sweep()
        flat_in, _ = tree_flatten((args, kwargs))
        in_storages = {StorageWeakRef(t.untyped_storage()).cdata for t in flat_in if isinstance(t, torch.Tensor)}
        impl = _custom_impl(func)
        if impl is not None:
            with self:          # run the op's Python body with the mode active: its ops count too
                out = impl(*args, **kwargs)
        else:
            out = func(*args, **kwargs)
        self._sweep()
        flat_out, _ = tree_flatten(out)
        grew = False
        for t in flat_out:
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                continue
            st = t.untyped_storage()
            ref = StorageWeakRef(st)
            if ref.cdata in in_storages or ref.cdata in self.live:
                continue
            nb = self.rounding(st.nbytes())
            label = f"{tuple(t.shape)} {str(t.dtype).replace('torch.', '')} <- {func.__name__} @ {_where()}"
            self.live[ref.cdata] = [ref, nb, label]
            self.current += nb
            self.n_alloc += 1
            grew = True
            if nb >= self.min_record:
                self.timeline.append(("alloc", self.current / MiB, nb, label))
        if grew and self.current > self.peak:
            self.peak = self.current
            self.peak_live = sorted(((nb, label) for _, nb, label in self.live.values()), reverse=True)
        return out


@contextlib.contextmanager
def no_triton_launches():
    """Every ``kernel[grid](...)`` becomes a no-op (JIT and interpreter kernels alike)."""
    from triton.runtime.jit import KernelInterface

    classes = {KernelInterface}
    try:
        from triton.runtime.interpreter import InterpretedFunction
        classes.add(InterpretedFunction)
    except ImportError:  # pragma: no cover
        pass
    saved = {c: c.__dict__.get("__getitem__") for c in classes}
    for c in classes:
        c.__getitem__ = lambda self, grid: (lambda *a, **k: None)
    try:
        yield
    finally:
        for c, fn in saved.items():
            if fn is None:
                delattr(c, "__getitem__")
            else:
                c.__getitem__ = fn


def probe_inputs(B, T, H, D, DV=None, HQ=None, gate=True, dtype=torch.bfloat16):
    """Inputs like ``tuning.bench.make_inputs`` (q, k, v in dtype; w, beta, g float32), no random fill."""
    HQ, DV = HQ or H, DV or D
    q = torch.zeros(B, T, HQ, D, dtype=dtype)
    k = torch.zeros(B, T, H, D, dtype=dtype)
    v = torch.zeros(B, T, H, DV, dtype=dtype)
    w = torch.zeros(B, T, H, D)
    w[..., 0] = 1.0
    beta = torch.full((B, T, H), 1.75)
    g = torch.full((B, T, HQ), -0.01) if gate else None
    return q, k, v, w, beta, g


def measure(q, k, v, w, beta, g=None, *, config=None, backward=True, rounding=cuda_allocated_bytes,
            min_record: int = MiB) -> LiveMemory:
    """Extra peak of one forward (+ backward through torch.autograd.grad), as dev_gpu_run2's bench."""
    from pathtune.codegen.triton import path_attention_triton

    xs = [x.detach().requires_grad_(backward) for x in (q, k, v, w, beta)]
    gg = g.detach().requires_grad_(backward) if g is not None else None
    do = torch.zeros_like(q[..., : v.shape[-1]])
    mode = LiveMemory(rounding=rounding, min_record=min_record)
    with no_triton_launches(), mode:
        o, _ = path_attention_triton(*xs, gg, config=config)
        if backward:
            torch.autograd.grad(o, xs + ([gg] if gg is not None else []), do)
        del o
    return mode


def report(mode: LiveMemory, top: int = 12, timeline: bool = True, file=sys.stdout):
    print(f"extra peak {mode.peak / GiB:.3f} GiB ({mode.peak / MiB:.0f} MiB), {mode.n_alloc} storages", file=file)
    print("live at the peak (largest first):", file=file)
    for nb, label in mode.peak_live[:top]:
        print(f"  {nb / MiB:8.1f} MiB  {label}", file=file)
    rest = mode.peak_live[top:]
    if rest:
        print(f"  {sum(nb for nb, _ in rest) / MiB:8.1f} MiB  ({len(rest)} smaller)", file=file)
    if timeline:
        print("timeline (buffers >= 1 MiB; MiB live after each event):", file=file)
        for ev, cur, nb, label in mode.timeline:
            print(f"  {ev:5s} {nb / MiB:7.1f} -> {cur:7.1f}  {label}", file=file)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--D", type=int, nargs="*", default=None)
    ap.add_argument("--H", type=int, nargs="*", default=None)
    ap.add_argument("--T", type=int, default=16384)
    ap.add_argument("--B", type=int, default=2)
    ap.add_argument("--no-gate", action="store_true")
    ap.add_argument("--top", type=int, default=14)
    ap.add_argument("--no-timeline", action="store_true")
    a = ap.parse_args(argv)
    cases = list(zip(a.D, a.H)) if a.D else [(64, 16), (128, 8)]
    for D, H in cases:
        print(f"=== D={D} H={H} B={a.B} T={a.T} gate={not a.no_gate} bf16, default config ===")
        mode = measure(*probe_inputs(a.B, a.T, H, D, gate=not a.no_gate))
        report(mode, top=a.top, timeline=not a.no_timeline)
        print()


if __name__ == "__main__":
    main()
