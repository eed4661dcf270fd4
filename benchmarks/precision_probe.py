"""GPU probe: which of the UT stage's products moves the backward's gradients when the stage runs one tf32 pass.

At D128 the PaTH-FoX backward keys cannot take ``ut_precision`` tf32 (fwd+bwd 0.95-0.98x the time of tf32x3 on the
H100): the accuracy gate fails on dg alone (0.0125 against 1.2e-2; tf32x3 0.0033; dbeta and dw 1.8e-3 -> 5.3e-3).
This probe runs the tuner's gate (one sequence of 2048 tokens, the workload's heads, kv heads 0 and H - 1 against
the float64 oracle; ``tuning.measure.oracle_errors``) and times one fwd+bwd (B * T = 32768, ``do_bench`` median) for
the untuned config at ``ut_precision`` tf32x3, at tf32, and at tf32 with one group of products put back to tf32x3
by text replacements of ut.py / ut_bwd.py swapped into the launchers (``kernel_variants``):

* ``inverse``: the block merges of the inverse (forward and the backward's per-range recompute: one body);
* ``m``: M = A strictLower(W K^T) (forward and recompute);
* ``tinv``: the UT backward's T^{-1} = I - A strictLower(W W^T);
* ``diag_fp16``: no UT product; the backward's diagonal tile takes Q W^T M on fp16 operands, as the forward's scan
  does at transition_precision fp16 (the backward's own transition products run tf32 there), so that its logits
  are the forward's.

    python benchmarks/precision_probe.py [--D 128] [--gates 1] [--T 4096] [--variants inverse,m,tinv,diag_fp16]
    python benchmarks/precision_probe.py --cpu [--seeds 11,13] ...     # no GPU: the gate only, ~2 min a case

JSON rows on stdout and in $OUT/precision_probe.json: the errors of o and every gradient, each over its tolerance
flagged, and ms.  ``--cpu`` runs the gate in Triton's interpreter with the GPU's roundings
(``gpu_roundings.py``: bf16 casts to nearest even, one-pass tf32 products on truncated operands) and times
nothing; ``--seeds`` draws the gate's inputs from other seeds too (the tuner's is 11): dg's error moves by 2-3x
between input draws.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys

if "--cpu" in sys.argv:     # before the kernels are imported: Triton picks interpreter or compiler then
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402
from kernel_variants import load_variant, module_source, swapped  # noqa: E402  (benchmarks/ is the script's folder)

import pathtune.codegen.triton.backward as bwd_mod
import pathtune.codegen.triton.bwd_intra as intra_mod
import pathtune.codegen.triton.forward as fwd_mod
import pathtune.codegen.triton.ut as ut_mod
import pathtune.codegen.triton.ut_bwd as ut_bwd_mod
from pathtune.codegen.triton import path_attention_triton
from pathtune.specs import load_spec
from pathtune.tuning import measure
from pathtune.tuning.bench import make_inputs
from pathtune.tuning.measure import oracle_errors, oracle_kv_heads, over_tolerance, triton_params

OUT = os.environ.get("OUT", ".")
ROWS: list = []
GATE_TOKENS = 2048       # the tuner's gate at T 4K / 16K with 1024-token super-chunks (tuning.measure.gate_tokens)

# (module, launcher module, kernel name, [(old, new)]) per variant: each edit must still find its text
_INVERSE = ("A = _finish_inverse(N, Dinv, C, UP, SB) * beta[None, :]",
            'A = _finish_inverse(N, Dinv, C, "tf32x3", SB) * beta[None, :]')
_M = ("M = _pdot(A, tl.where(strict, L, 0.0), UP)", 'M = _pdot(A, tl.where(strict, L, 0.0), "tf32x3")')
VARIANTS = {
    "inverse": [(ut_mod, fwd_mod, "ut_fused_kernel", [_INVERSE]),
                (ut_mod, bwd_mod, "ut_recompute_kernel", [_INVERSE])],
    "m": [(ut_mod, fwd_mod, "ut_fused_kernel", [_M]), (ut_mod, bwd_mod, "ut_recompute_kernel", [_M])],
    "tinv": [(ut_bwd_mod, bwd_mod, "ut_bwd_kernel",
              [("tl.where(r[:, None] == r[None, :], 1.0, 0.0) - _pdot(A, tl.where(strict, Gm, 0.0), UP)",
                'tl.where(r[:, None] == r[None, :], 1.0, 0.0) - _pdot(A, tl.where(strict, Gm, 0.0), "tf32x3")')])],
    "diag_fp16": [(intra_mod, bwd_mod, "bwd_intra_diag_kernel",
                   [("s = mm(Q, tl.trans(K), INTERP) - tl.dot(QW, M, input_precision=TP)",
                     "s = mm(Q, tl.trans(K), INTERP) - mm(QW.to(tl.float16), M.to(tl.float16), INTERP)")])],
}

LABELS = {"inverse": "the inverse's merges at tf32x3", "m": "M at tf32x3", "tinv": "the backward's T^-1 at tf32x3",
          "diag_fp16": "the backward's diagonal Q W^T M on fp16 operands"}


def emit(row):
    print(json.dumps(row), flush=True)
    ROWS.append(row)
    with open(os.path.join(OUT, "precision_probe.json"), "w") as fh:
        json.dump(ROWS, fh, indent=1)


def variant_context(name: str, tag: str):
    """The launchers with the variant's kernels in place of their own (built once per call)."""
    stack = contextlib.ExitStack()
    for module, launcher, kernel, edits in VARIANTS[name]:
        stack.enter_context(swapped(launcher, kernel, load_variant(module_source(module), kernel,
                                                                  f"{tag}_{kernel}", edits)))
    return stack


def run_case(D: int, H: int, T: int, gate: bool, variants: list[str], *, device: str, seeds: list[int]) -> None:
    """The gate's errors on the inputs of each seed and, on a GPU, one fwd+bwd's time, per case."""
    tol = load_spec().numerics.accuracy.tolerances
    timed = device == "cuda"
    if timed:
        B = 32768 // T
        xs = [x.requires_grad_() for x in make_inputs(B, T, H, H, D, D, gate, device=device, seed=0,
                                                      dtype=torch.bfloat16) if x is not None]
        do = torch.randn(B, T, H, D, device=device, dtype=torch.bfloat16)
    cases = [("tf32x3", None), ("tf32", None)] + [("tf32", v) for v in variants]
    for seed in seeds:
        gate_xs = make_inputs(1, GATE_TOKENS, H, H, D, D, gate, device=device, seed=seed, dtype=torch.bfloat16)
        base = dict(D=D, H=H, T=T, gate=gate, gate_seed=seed, device=device)
        with _one_oracle_per_draw():
            for up, variant in cases:
                params = triton_params({"ut_precision": up}, D, D, "bwd")

                def run(q, k, v, w, beta, g, params=params):
                    return path_attention_triton(q, k, v, w, beta, g, config=params)[0]

                def step(params=params):
                    o = path_attention_triton(*xs[:5], xs[5] if gate else None, config=params)[0]
                    return torch.autograd.grad(o, xs, do)

                label = f"ut_precision {up}" + (f", {LABELS[variant]}" if variant else "")
                try:
                    with variant_context(variant, f"{variant}_{D}_{int(gate)}") if variant else \
                            contextlib.nullcontext():
                        errors = oracle_errors(run, gate_xs, backward=True, heads=oracle_kv_heads(H, 2), seed=12)
                        ms = round(triton.testing.do_bench(step, warmup=3, rep=30, return_mode="median"), 3) \
                            if timed else None
                    emit(dict(base, variant=label, ms=ms, errors={k: round(v, 5) for k, v in errors.items()},
                              over_tolerance=over_tolerance(errors, tol)))
                except Exception as exc:     # a variant that fails to build or launch is a result too
                    emit(dict(base, variant=label, error=f"{type(exc).__name__}: {str(exc)[:300]}"))


@contextlib.contextmanager
def _one_oracle_per_draw():
    """``measure.oracle_by_kv_head`` computed once while inside: every case of one draw of the gate's inputs
    (the same tensors, the same upstream gradient of seed 12) shares its float64 oracle (on the CPU ~25 s of a
    case's ~2 min).  Keyed by the oracle heads; a new draw enters anew."""
    oracle, memo = measure.oracle_by_kv_head, {}

    @functools.wraps(oracle)
    def once(xs, heads, do=None, **kw):
        key = (tuple(heads), tuple(sorted(kw.items())))
        if key not in memo:
            memo[key] = oracle(xs, heads, do, **kw)
        return memo[key]
    measure.oracle_by_kv_head = once
    try:
        yield
    finally:
        measure.oracle_by_kv_head = oracle


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--D", default="128")
    ap.add_argument("--T", default="4096", help="sequence lengths of the timed fwd+bwd (B = 32768 / T)")
    ap.add_argument("--gates", default="1", help="1: PaTH-FoX, 0: PaTH (comma-separated)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--seeds", default="11", help="seeds of the gate's inputs (the tuner's: 11)")
    ap.add_argument("--cpu", action="store_true", help="no GPU: the gate in the interpreter with the GPU's roundings")
    a = ap.parse_args()
    variants = [v for v in a.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variant(s) {', '.join(unknown)}: choose from {', '.join(VARIANTS)}")
    if a.cpu:
        import gpu_roundings  # benchmarks/ is the script's folder

        gpu_roundings.install()
        device = "cpu"
        print("CPU interpreter with the GPU's roundings", torch.__version__, triton.__version__, flush=True)
    elif not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU: run with --cpu for the gate's errors in the interpreter (nothing is timed)")
    else:
        device = "cuda"
        print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    seeds = [int(x) for x in a.seeds.split(",")]
    for T in (int(x) for x in a.T.split(",")):
        for D in (int(x) for x in a.D.split(",")):
            for gate in (bool(int(x)) for x in a.gates.split(",")):
                run_case(D, 16 if D <= 64 else 8, T, gate, variants, device=device, seeds=seeds)


if __name__ == "__main__":
    main()
