"""GPU dev probe: device time of single kernel launches of one fwd+bwd, next to variants of them.

Runs one forward+backward (heuristic config) with some launches captured (grid, arguments), then
times each captured launch again with ``triton.testing.do_bench`` (median), and the same launch
through variant kernels built from the kernel module's source with text replacements (written to
a temporary module, since ``triton.jit`` reads its source from a file).  Timing only: replayed
launches add into buffers that already hold results, so nothing here checks values.

    python benchmarks/dev_kernel_probe.py [--D 64,128] [--T 4096] [--old-intra FILE]

``--old-intra FILE``: a bwd_intra.py of an earlier commit (``git show REV:codegen/triton/bwd_intra.py``),
timed on the same arguments (without its newer trailing ones).  JSON rows on stdout and in $OUT.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import tempfile

import torch
import triton

from pathtune.codegen.triton import path_attention_triton
import pathtune.codegen.triton.backward as bwd_mod
import pathtune.codegen.triton.forward as fwd_mod
from pathtune.tuning.bench import make_inputs

OUT = os.environ.get("OUT", ".")
ROWS: list = []
_TMP = tempfile.mkdtemp(prefix="kprobe_")


def emit(row):
    print(json.dumps(row), flush=True)
    ROWS.append(row)
    with open(os.path.join(OUT, "kernel_probe.json"), "w") as fh:
        json.dump(ROWS, fh, indent=1)


class Capture:
    """Stands in for a jitted kernel in a launcher module; keeps the first launch's grid and args."""

    def __init__(self, module, name):
        self.module, self.name, self.real = module, name, getattr(module, name)
        self.calls = []

    def __getitem__(self, grid):
        def launch(*args, **kw):
            if not self.calls:
                self.calls.append((grid, args, kw))
            return self.real[grid](*args, **kw)
        return launch

    def __enter__(self):
        setattr(self.module, self.name, self)
        return self

    def __exit__(self, *exc):
        setattr(self.module, self.name, self.real)


def load_variant(src: str, kernel: str, tag: str, replacements=()):
    """The kernel ``kernel`` of module source ``src`` after the text replacements."""
    src = re.sub(r"^from \.(\w+) import", r"from pathtune.codegen.triton.\1 import", src, flags=re.M)
    for old, new in replacements:
        if old not in src:
            raise ValueError(f"variant {tag}: {old[:60]!r} not in the source")
        src = src.replace(old, new)
    path = os.path.join(_TMP, f"{tag}.py")
    with open(path, "w") as fh:
        fh.write(src)
    spec = importlib.util.spec_from_file_location(f"kprobe_{tag}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return getattr(mod, kernel)


def time_launch(kernel, grid, args, kw):
    fn = lambda: kernel[grid](*args, **kw)  # noqa: E731
    fn()
    torch.cuda.synchronize()
    return round(triton.testing.do_bench(fn, warmup=5, rep=40, return_mode="median"), 4)


def run_case(D, H, T, gate, old_intra_src):
    B = 32768 // T
    q, k, v, w, beta, g = make_inputs(B, T, H, H, D, D, gate, device="cuda", seed=0, dtype=torch.bfloat16)
    xs = [x.requires_grad_() for x in (q, k, v, w, beta)] + ([g.requires_grad_()] if gate else [])
    do = torch.randn_like(q)
    with Capture(bwd_mod, "bwd_transport_chain_kernel") as trc, Capture(bwd_mod, "bwd_transport_grads_kernel") as trg, \
            Capture(bwd_mod, "bwd_intra_kernel") as ia, \
            Capture(bwd_mod, "bwd_inter_dkv_kernel") as dkv, Capture(fwd_mod, "ut_chunk_kernel") as utc, \
            Capture(fwd_mod, "ut_apply_kernel") as uta, Capture(fwd_mod, "ut_diag_inverse_kernel") as utd:
        o, _ = path_attention_triton(*xs[:5], xs[5] if gate else None)
        torch.autograd.grad(o, xs, do)
        torch.cuda.synchronize()
    base = dict(D=D, H=H, T=T, B=B, gate=gate)

    # the UT stage's three kernels: warps and the products' precision (knob ut_precision)
    for cap, name in ((utd, "ut_diag_inverse"), (utc, "ut_chunk"), (uta, "ut_apply")):
        grid, args, kw = cap.calls[0]
        emit(dict(base, kernel=name, variant=f"as is (warps {kw['num_warps']}, UP {kw.get('UP')})",
                  ms=time_launch(cap.real, grid, args, kw)))
        for change in ([dict(num_warps=4), dict(UP="tf32"), dict(num_warps=4, UP="tf32")] if "UP" in kw else []):
            emit(dict(base, kernel=name, variant=str(change), ms=time_launch(cap.real, grid, args, dict(kw, **change))))

    # the transport backward's two kernels (chain: serial per row block; grads: per chunk) and their warps
    for cap, name in ((trc, "bwd_transport_chain"), (trg, "bwd_transport_grads")):
        grid, args, kw = cap.calls[0]
        emit(dict(base, kernel=name, variant=f"as is (warps {kw['num_warps']})", ms=time_launch(cap.real, grid, args, kw)))
        for nw in (4, 8):
            if nw != kw["num_warps"]:
                emit(dict(base, kernel=name, variant=f"warps {nw}", ms=time_launch(cap.real, grid, args, dict(kw, num_warps=nw))))

    # bwd_intra: this tree's kernel (chain states parked in scratch) vs an older file's
    grid, args, kw = ia.calls[0]
    emit(dict(base, kernel="bwd_intra", variant="as is", ms=time_launch(ia.real, grid, args, kw)))
    if old_intra_src:
        old = load_variant(old_intra_src, "bwd_intra_kernel", f"intra_old_{D}_{int(gate)}")
        i = ia.real.arg_names.index("xs_ptr")        # the old kernel has no chain-state scratch
        emit(dict(base, kernel="bwd_intra", variant="old (recomputes the chain)",
                  ms=time_launch(old, grid, args[:i] + args[i + 1:], kw)))

    # bwd_inter_dkv: the gate's column sums once per program instead of once per query step
    grid, args, kw = dkv.calls[0]
    emit(dict(base, kernel="bwd_inter_dkv", variant="as is", ms=time_launch(dkv.real, grid, args, kw)))
    if gate:
        emit(dict(base, kernel="bwd_inter_dkv", variant="gate off (same args)",
                  ms=time_launch(dkv.real, grid, args, dict(kw, USE_GATE=False))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--D", default="64,128")
    ap.add_argument("--T", type=int, default=4096)
    ap.add_argument("--old-intra", default=None)
    ap.add_argument("--gates", default="1,0")
    a = ap.parse_args()
    old_src = open(a.old_intra).read() if a.old_intra else None
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    for D in (int(x) for x in a.D.split(",")):
        H = 16 if D <= 64 else 8
        for gate in (bool(int(x)) for x in a.gates.split(",")):
            try:
                run_case(D, H, a.T, gate, old_src)
            except Exception as exc:
                emit(dict(D=D, gate=gate, error=f"{type(exc).__name__}: {str(exc)[:300]}"))


if __name__ == "__main__":
    main()
