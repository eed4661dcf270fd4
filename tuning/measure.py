"""Measure one candidate: accuracy gate first, then ``triton.testing.do_bench`` of the pass.

``measure(task) -> dict`` is the only entry point the tuner and the bundle runner call. It needs
torch and triton (plus the TVM runtime for ``backend="tvm"``), never Optuna or SQLAlchemy, so a GPU
host can run it from a bundle. The dict holds perf_db ``Measurement`` fields:

* ``status``: ``ok``; ``wrong`` (over the spec's accuracy tolerance, or non-finite);
  ``compile_error``; ``out_of_resources`` (shared memory / registers / GPU memory); ``crash``
  (anything else);
* ``median_ms``, ``p20_ms``, ``p80_ms``, ``bench_method`` (ok only), ``errors`` (relative
  Frobenius error per output vs the float64 naive reference), ``message`` (failures),
  ``baseline_ms`` / ``baseline_name`` (SDPA flash on the same shapes, same process; CUDA only);
* ``fatal``: True when the CUDA context is unusable afterwards (illegal address, ...): the caller
  records the result and stops the worker (``--resume`` continues in a fresh process).

The accuracy gate runs the candidate on one sequence (B=1) with the workload's heads, head dims,
dtype and gate, on fresh inputs from ``task.seed`` (beta in [1.5, 2), real gate decay:
``tuning.inputs.make_inputs``): ``check_len`` tokens, or, when the timed shape spans several
super-chunks, at least two super-chunks of the config (``gate_len``), so the inter-super-chunk
kernels are checked too. The float64 naive oracle runs on ``check_heads`` kv heads (first and last by
default; heads are independent) and each error is taken over those heads. ``fwd`` checks o; ``bwd``
checks o and all six gradients. Timing runs at the key's shape (B*T = 32768 tokens by default):
``fwd`` = the forward; ``bwd`` = forward + backward (what a training step pays, as ``pathtune
bench`` records it); ``decode`` = the amortized one-token step over a key cache of T tokens per sequence: the
config's whole flush cycle (``decode_bench.flush_cycle``: W plain steps with 0 .. W-1 rows pending, then the
step that rotates the cache) timed as one CUDA-graph replay and divided by its steps, as ``pathtune bench
--pass decode --graph`` times it (gate: see ``_measure_decode``).

Tests inject a cost model instead: ``pathtune tune --measure-with module:function`` (or
``path/to/file.py:function``), any callable taking a ``MeasureTask`` and returning such a dict.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import math
import statistics
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

__all__ = ["MeasureTask", "measure", "prepare", "load_measure_fn", "DecodeUnavailable", "decode_available",
           "triton_params", "classify_exception", "FATAL_MARKERS"]

MeasureFn = Callable[["MeasureTask"], dict]

FATAL_MARKERS = ("illegal memory access", "illegal address", "unspecified launch failure", "device-side assert",
                 "misaligned address", "an illegal instruction")


class DecodeUnavailable(RuntimeError):
    """The fused Triton decode kernel is not in this pathtune yet."""


@dataclass
class MeasureTask:
    """Everything needed to measure one candidate, JSON round-trippable (bundles carry these)."""

    pass_: str
    backend: str
    workload: dict                      # Workload.to_dict()
    config: dict                        # the pass's knobs
    batch: int
    seq_len: int
    seed: int = 0
    check_len: int = 1024               # gate tokens (more when the timed shape spans super-chunks: gate_len)
    check_heads: int = 2                # kv heads the float64 oracle checks (0: all; the kernel runs all)
    tolerances: dict = field(default_factory=dict)
    warmup_ms: int = 25
    rep_ms: int = 100
    module_dir: Optional[str] = None    # TVM: prebuilt modules (bundle)
    task_id: str = ""
    study_name: str = ""
    trial_number: Optional[int] = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "MeasureTask":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def load_measure_fn(spec: Optional[str]) -> MeasureFn:
    """``None`` -> the real ``measure``; ``"pkg.mod:fn"`` or ``"path/file.py:fn"`` -> that callable."""
    if not spec:
        return measure
    target, _, name = spec.rpartition(":")
    if not target or not name:
        raise ValueError(f"--measure-with wants module:function or file.py:function, got {spec!r}")
    if target.endswith(".py"):
        path = Path(target).resolve()
        mod_spec = importlib.util.spec_from_file_location(f"_pathtune_measure_{path.stem}", path)
        if mod_spec is None or mod_spec.loader is None:
            raise ValueError(f"cannot load {path}")
        module = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"{target} has no callable {name!r}")
    return fn


# ---------------------------------------------------------------------------------------------------
# helpers

def decode_available() -> bool:
    try:
        importlib.import_module("pathtune.codegen.triton.decode")
    except ImportError:
        return False
    return True


def triton_params(config: dict, head_dim: int, head_dim_v: int, pass_: Optional[str]) -> Any:
    """Kernel params of a candidate of ``pass_`` (``resolve`` with the pass's params class: ``TritonBwdParams`` for
    "bwd", which a forward + backward runs, ``TritonDecodeParams`` for "decode"): the untuned config for the head
    dims, overridden by the pass's knobs (so a bwd candidate's forward runs the untuned forward knobs, and vice
    versa).  The pass matters: the base class drops the knobs only a pass's subclass declares (dk / dv's key tile
    and warps, the range budget), and the launch then runs the head-dim defaults instead of the candidate's."""
    from pathtune.codegen._knobs import resolve

    return resolve("triton", pass_, config, (head_dim, head_dim_v))


def classify_exception(exc: BaseException) -> tuple[str, str]:
    """(status, message) of a failed candidate."""
    name = type(exc).__name__
    text = f"{name}: {exc}"
    chain = [exc]
    cause = exc.__cause__ or exc.__context__
    while cause is not None and len(chain) < 5:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    names = {type(e).__name__ for e in chain}
    lowered = text.lower()
    if names & {"KernelConfigError", "OutOfResources", "OutOfMemoryError"} or "out of memory" in lowered \
            or "out of resource" in lowered:
        status = "out_of_resources"
    elif names & {"CompilationError", "CompileTimeAssertionFailure", "BuildError", "UnsupportedConfig",
                  "PTXASError"}:
        status = "compile_error"
    else:
        status = "crash"
    return status, text[:2000]


def _rel(a: Any, b: Any) -> float:
    import torch

    a, b = a.detach().to(torch.float64), b.detach().to(torch.float64)
    if not torch.isfinite(a).all():
        return math.inf
    den = b.norm().item()
    return float((a - b).norm().item() / (den if den > 0 else 1.0))


def _device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _time(fn: Callable[[], Any], task: MeasureTask) -> dict:
    """p20 / median / p80 in ms: ``triton.testing.do_bench`` on CUDA; a few wall-clock reps on the CPU
    (Triton's interpreter; those numbers only order configs within one CPU run)."""
    import torch

    if torch.cuda.is_available():
        import triton

        p20, med, p80 = triton.testing.do_bench(fn, warmup=task.warmup_ms, rep=task.rep_ms, quantiles=[0.2, 0.5, 0.8])
        return {"median_ms": float(med), "p20_ms": float(min(p20, med)), "p80_ms": float(max(p80, med)),
                "bench_method": f"triton.testing.do_bench(warmup={task.warmup_ms},rep={task.rep_ms})"}
    fn()
    samples = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    samples.sort()
    return {"median_ms": statistics.median(samples), "p20_ms": samples[0], "p80_ms": samples[-1],
            "n_reps": len(samples), "bench_method": "perf_counter x3 (CPU interpreter)"}


_BASELINES: dict[tuple, tuple[Optional[float], Optional[str]]] = {}


def _baseline(task: MeasureTask, q: Any, k: Any, v: Any) -> tuple[Optional[float], Optional[str]]:
    """SDPA flash on the same shapes (no gate: SDPA has none), once per shape and process."""
    import torch

    if not torch.cuda.is_available():
        return None, None
    key = (task.pass_, tuple(q.shape), tuple(k.shape), tuple(v.shape), str(q.dtype))
    if key in _BASELINES:
        return _BASELINES[key]
    out: tuple[Optional[float], Optional[str]] = (None, None)
    try:
        from .baselines import sdpa_backend, sdpa_callable

        decode = task.pass_ == "decode"
        # decode: the backend chosen once around the timing loop (a decode call is ~50 us); the others
        # choose it inside each call (sdpa_callable)
        with sdpa_backend("flash") if decode else contextlib.nullcontext():
            fn = (_sdpa_decode_callable(q, k, v) if decode
                  else sdpa_callable(q, k, v, "flash", backward=task.pass_ == "bwd"))
            if fn is not None:
                out = (_time(fn, task)["median_ms"], "sdpa_flash")
    except Exception:  # a baseline that cannot run is simply absent
        out = (None, None)
    _BASELINES[key] = out
    return out


def _sdpa_decode_callable(q_t: Any, k: Any, v: Any) -> Optional[Callable[[], Any]]:
    """One query token [B,HQ,D] over a cache [B,T,H,D]: a plain SDPA call (time it inside
    ``baselines.sdpa_backend``)."""
    from .baselines import sdpa_decode_callable

    return sdpa_decode_callable(q_t[:, :, None, :], k.transpose(1, 2), v.transpose(1, 2))


# ---------------------------------------------------------------------------------------------------
# the passes

def _inputs(task: MeasureTask, B: int, T: int, HQ: int, H: int, seed: int) -> tuple:
    import torch

    from .inputs import make_inputs

    wl = task.workload
    return make_inputs(B, T, HQ, H, wl["head_dim"], wl["head_dim_v"], wl["use_gate"], device=_device(), seed=seed,
                       dtype=getattr(torch, wl["dtype"]))


GATE_ALIGN = 2048       # gate lengths past one super-chunk: multiples of this, like the timed shapes,
                        # so every token count a kernel receives has the same divisibility (Triton
                        # specialises integer arguments on it) and the gate compiles nothing extra
ORACLE_CHECKPOINT = 256  # the float64 oracle's sweep checkpoint (memory ~ T / 256 under autograd)
INPUTS = ("q", "k", "v", "w", "beta", "g")   # path_attention's inputs, in order
_PER_QUERY_HEAD = (0, 5)                     # q and g have a query-head axis; k, v, w, beta a kv-head axis


def _superchunk(task: MeasureTask) -> int:
    if task.backend == "triton":
        wl = task.workload
        return int(triton_params(task.config, wl["head_dim"], wl["head_dim_v"], task.pass_).superchunk_size)
    return int(task.config.get("superchunk_size") or 0)


def gate_tokens(superchunk: int, seq_len: int, check_len: int) -> int:
    """Tokens of the gate's one sequence. ``check_len``, unless the timed shape spans several
    super-chunks: then at least two of them (so the inter-super-chunk kernels run and are checked),
    rounded up to a multiple of ``GATE_ALIGN``."""
    if not superchunk or seq_len <= superchunk:
        return check_len
    n = max(check_len, 2 * superchunk)
    return -(-n // GATE_ALIGN) * GATE_ALIGN


def gate_len(task: MeasureTask) -> int:
    return gate_tokens(_superchunk(task), task.seq_len, task.check_len)


def oracle_kv_heads(heads_kv: int, n: int) -> list[int]:
    """The kv heads the float64 oracle checks: ``n`` spread from the first to the last (0 or >= heads: all)."""
    if n <= 0 or n >= heads_kv:
        return list(range(heads_kv))
    if n == 1:
        return [0]
    return sorted({round(i * (heads_kv - 1) / (n - 1)) for i in range(n)})


def oracle_by_kv_head(xs: list, heads: list[int], do: Any = None, *, checkpoint_steps: Optional[int] = None,
                      cu_seqlens: Any = None) -> tuple:
    """Float64 naive oracle on the kv heads ``heads`` (and their query groups), one head at a time.

    xs: (q, k, v, w, beta, g-or-None) in the kernel layout. Heads are independent, so each head's
    output and gradients equal the full call's. Returns (o, grads): o [B, T, len(heads)*G, DV] and,
    when ``do`` (the full [B, T, HQ, DV] upstream gradient) is given, the gradients of the present
    inputs in order, each sliced to the same heads; else grads is None.
    """
    import torch

    from pathtune.runtime.reference import naive_path_attention

    q, k = xs[0], xs[1]
    G = q.shape[2] // k.shape[2]
    outs, grads = [], None
    present = [i for i, x in enumerate(xs) if x is not None]
    for h in heads:
        qs = slice(h * G, (h + 1) * G)
        part = [_head_slice(x, i, [h], G) for i, x in enumerate(xs) if x is not None]
        if do is None:
            with torch.no_grad():
                outs.append(naive_path_attention(*_six([x.double() for x in part], present), cu_seqlens=cu_seqlens))
            continue
        leaves = [x.detach().double().requires_grad_(True) for x in part]
        o = naive_path_attention(*_six(leaves, present), checkpoint_steps=checkpoint_steps, cu_seqlens=cu_seqlens)
        gr = torch.autograd.grad(o, leaves, do[:, :, qs].double())
        grads = [[] for _ in leaves] if grads is None else grads
        for acc, g_ in zip(grads, gr):
            acc.append(g_)
        outs.append(o.detach())
    return torch.cat(outs, dim=2), (None if grads is None else [torch.cat(g_, dim=2) for g_ in grads])


def _six(present_values: list, present: list[int]) -> list:
    """(q, k, v, w, beta, g) with None where an input is absent."""
    out = [None] * 6
    for i, x in zip(present, present_values):
        out[i] = x
    return out


def _head_slice(x: Any, index: int, heads: list[int], G: int) -> Any:
    """x (input ``index`` of q, k, v, w, beta, g) restricted to the oracle's heads, concatenated."""
    import torch

    per_query = index in _PER_QUERY_HEAD
    return torch.cat([x[:, :, h * G:(h + 1) * G] if per_query else x[:, :, h:h + 1] for h in heads], dim=2)


def _forward_fn(task: MeasureTask) -> Callable[..., Any]:
    """(q, k, v, w, beta, g) -> o for the task's backend and config."""
    wl = task.workload
    if task.backend == "triton":
        from pathtune.codegen.triton import path_attention_triton

        params = triton_params(task.config, wl["head_dim"], wl["head_dim_v"], task.pass_)

        def run(q, k, v, w, beta, g):
            return path_attention_triton(q, k, v, w, beta, g, config=params)[0]
        return run
    if task.backend == "tvm":
        if task.pass_ != "fwd":
            raise NotImplementedError(f"the TVM backend has no {task.pass_} pass to tune (forward only)")
        from pathtune.codegen.tvm import path_attention_tvm

        def run_tvm(q, k, v, w, beta, g):
            return path_attention_tvm(q, k, v, w, beta, g, config=task.config, module_dir=task.module_dir)[0]
        return run_tvm
    raise ValueError(f"unknown backend {task.backend!r}")


def _gate_inputs(task: MeasureTask) -> tuple:
    """One sequence of ``gate_len`` tokens with the workload's heads (kernels are specialised on the
    head counts: the gate compiles nothing the timed shape does not)."""
    wl = task.workload
    return _inputs(task, 1, gate_len(task), wl["heads_q"], wl["heads_kv"], task.seed)


def _run_gate_shape(task: MeasureTask, run: Callable[..., Any], xs: tuple) -> tuple:
    """The candidate at the gate shape: (o, live leaves [(name, tensor)], do, grads); no grads for fwd."""
    return _run_candidate(run, xs, task.pass_ != "fwd", task.seed + 1)


def _run_candidate(run: Callable[..., Any], xs: Sequence[Any], backward: bool, seed: int) -> tuple:
    """run(*xs) -> (o, live leaves [(name, tensor)], do, grads); with ``backward`` the gradients of
    o under an upstream gradient ``do`` drawn from ``seed``, else no grads (and no autograd)."""
    import torch

    if not backward:
        with torch.no_grad():
            return run(*xs), [], None, None
    live = [(n, x.detach().clone().requires_grad_(True)) for n, x in zip(INPUTS, xs) if x is not None]
    args = dict(live)
    o = run(*[args.get(n) for n in INPUTS])
    gen = torch.Generator(device=o.device).manual_seed(seed)
    do = torch.randn(o.shape, device=o.device, generator=gen, dtype=torch.float32).to(o.dtype)
    return o, live, do, torch.autograd.grad(o, [x for _, x in live], do)


def oracle_errors(run: Callable[..., Any], xs: Sequence[Any], *, backward: bool, heads: list[int],
                  seed: int) -> dict[str, float]:
    """Relative errors of run(*xs) -> o (and, with ``backward``, of every gradient) against the
    float64 oracle on the kv heads ``heads``. xs: (q, k, v, w, beta, g-or-None)."""
    o, live, do, grads = _run_candidate(run, xs, backward, seed)
    G = xs[0].shape[2] // xs[1].shape[2]
    o_ref, ref_grads = oracle_by_kv_head(list(xs), heads, do, checkpoint_steps=ORACLE_CHECKPOINT)
    errors = {"o": _rel(_head_slice(o, 0, heads, G), o_ref)}
    for (n, _), gr, gref in zip(live, grads or (), ref_grads or ()):
        errors["d" + n] = _rel(_head_slice(gr, INPUTS.index(n), heads, G), gref)
    return errors


def _check_fwd_bwd(task: MeasureTask, run: Callable[..., Any]) -> dict[str, float]:
    """Relative errors of o (and, for bwd, every gradient) on the oracle's kv heads (``check_heads``)."""
    return oracle_errors(run, _gate_inputs(task), backward=task.pass_ != "fwd",
                         heads=oracle_kv_heads(task.workload["heads_kv"], task.check_heads), seed=task.seed + 1)


def over_tolerance(errors: dict[str, float], tolerances: dict[str, float]) -> list[str]:
    """The accuracy gate: "name err > tol" for each error above its tolerance (or not finite); [] passes."""
    bad = []
    for name, err in errors.items():
        tol = tolerances.get(name)
        if not math.isfinite(err) or (tol is not None and err > tol):
            bad.append(f"{name} {err:.3g} > {tol:g}" if tol is not None else f"{name} {err}")
    return bad


def _timed_callable(task: MeasureTask, run: Callable[..., Any]) -> tuple:
    """(fn, q, k, v): one call of the timed pass at the key's shape, and its q/k/v for the baseline."""
    import torch

    wl = task.workload
    xs = _inputs(task, task.batch, task.seq_len, wl["heads_q"], wl["heads_kv"], task.seed + 7)
    q, k, v = xs[:3]
    if task.pass_ == "fwd":
        def fn():
            with torch.no_grad():
                return run(*xs)
    else:
        live = [x.detach().requires_grad_(True) if x is not None else None for x in xs]
        leaves = [x for x in live if x is not None]
        do = torch.randn(q.shape[:-1] + (v.shape[-1],), device=q.device, dtype=q.dtype)

        def fn():
            o = run(*live)
            return torch.autograd.grad(o, leaves, do)
    return fn, q, k, v


def _time_fwd_bwd(task: MeasureTask, run: Callable[..., Any]) -> dict:
    fn, q, k, v = _timed_callable(task, run)
    timing = _time(fn, task)
    base, name = _baseline(task, q, k, v)
    if base is not None:
        timing.update(baseline_ms=base, baseline_name=name)
    return timing


def _decode_cache(k: Any, v: Any, w: Any, beta: Any, g: Any, HQ: int, dtype: Any) -> Any:
    """A current-frame cache of a prompt (keys transported in float64 by the reference), one row spare."""
    import torch

    from pathtune.runtime.reference.recurrent import PaTHKVCache, current_frame_keys

    B, T, H, D = k.shape
    cache = PaTHKVCache.empty(B, H, D, v.shape[-1], HQ, max_len=T + 1, gated=g is not None, dtype=dtype,
                              gate_dtype=torch.float32, device=k.device)
    cache.k[:, :T] = current_frame_keys(k.double(), w.double(), beta.double()).to(dtype)
    cache.v[:, :T] = v.to(dtype)
    if g is not None:
        cache.c[:, :T] = torch.cumsum(g.double(), dim=1).float()
    cache.length = T
    return cache


def _decode_gate_setup(task: MeasureTask) -> tuple:
    """Gate shape of the decode pass: (prompt + token inputs, the step's inputs, a cache of the prompt)."""
    import torch

    wl = task.workload
    dtype = getattr(torch, wl["dtype"])
    HQ, H = wl["heads_q"], wl["heads_kv"]
    q, k, v, w, beta, g = _inputs(task, 1, task.check_len + 1, HQ, H, task.seed)
    T = task.check_len
    cache = _decode_cache(k[:, :T], v[:, :T], w[:, :T], beta[:, :T], None if g is None else g[:, :T], HQ, dtype)
    step = [x[:, T:] if x is not None else None for x in (q, k, v, w, beta, g)]
    return (q, k, v, w, beta, g), step, cache


def _decode_timed_callable(task: MeasureTask, params: Any, *, cycle: bool = True) -> tuple:
    """(fn, q [B,HQ,D], cached k, cached v): one call of fn runs ``fn.steps`` one-token decoding steps per
    sequence over a cache of seq_len tokens: the config's flush cycle (before each step the cache is set to
    seq_len rows, of which the cycle's count are pending; the last step flushes), or with ``cycle`` False one
    step with nothing pending."""
    import torch

    from pathtune.codegen.triton.decode import FRAME_ALIGN, decode_params, path_decode_triton
    from pathtune.runtime.reference.recurrent import PaTHKVCache

    from .decode_bench import frame_plan, plan_callable

    wl = task.workload
    dtype = getattr(torch, wl["dtype"])
    B, T = task.batch, task.seq_len
    HQ, H = wl["heads_q"], wl["heads_kv"]
    q, k, v, w, beta, g = _inputs(task, B, 1, HQ, H, task.seed + 7)
    gen = torch.Generator(device=q.device).manual_seed(task.seed + 11)
    ck = torch.randn(B, T + 1, H, wl["head_dim"], device=q.device, generator=gen).to(dtype)
    cv = torch.randn(B, T + 1, H, wl["head_dim_v"], device=q.device, generator=gen).to(dtype)
    cc = None
    if g is not None:
        cc = torch.cumsum(torch.log(torch.rand(B, T + 1, HQ, device=q.device, generator=gen) * 0.05 + 0.95), dim=1)
    cache = PaTHKVCache(ck, cv, cc, T, HQ)
    dparams = decode_params(params, wl["head_dim"], wl["head_dim_v"])
    plan = (frame_plan(T, 1, dparams.decode_pending_window, dparams.decode_frame_bound, FRAME_ALIGN) if cycle
            else [(1.0, [(T, T, 0, T)])])
    path_decode_triton(q, k, v, w, beta, g, cache, config=params)   # allocates the window the cycle's states use
    fn = plan_callable(cache, plan, lambda: path_decode_triton(q, k, v, w, beta, g, cache, config=params))
    fn.cache = cache
    return fn, q[:, 0], ck[:, :T], cv[:, :T]


def _time_decode(fn: Callable[[], Any], task: MeasureTask) -> dict:
    """``_time`` of the flush cycle ``fn`` (``_decode_timed_callable``), per step: on CUDA the cycle captured in one
    CUDA graph (its GPU time; a short cache's eager step is host-bound), eager when the capture fails (said in
    ``bench_method``)."""
    import torch

    steps = fn.steps
    how = "eager"
    if torch.cuda.is_available():
        from .decode_bench import graphed

        try:
            fn = graphed(fn)
            how = "CUDA-graph replay"
        except RuntimeError as exc:   # keep the eager timing; the method says so
            how = f"eager (graph capture failed: {str(exc).splitlines()[0][:120]})"
            torch.cuda.synchronize()
    parts = getattr(fn, "parts", None) or [(fn, 1.0)]
    timed = [(_time(part, task), part.steps, weight) for part, weight in parts]
    out = dict(timed[0][0])
    for key in ("median_ms", "p20_ms", "p80_ms"):
        out[key] = sum(weight * t[key] / n for t, n, weight in timed)
    if len(parts) > 1:
        cycles = " and ".join(f"{n}-step (weight {weight:.3g})" for _, n, weight in timed)
        out["bench_method"] += f", {how} of the {cycles} flush cycles of two frame levels, per step"
    else:
        out["bench_method"] += (f", {how} of a {steps}-step flush cycle, per step" if steps > 1
                                else f", {how}, one step")
    return out


def _measure_decode(task: MeasureTask) -> dict:
    """Gate: a prompt of check_len tokens in a cache (keys transported in float64, stored in the
    workload dtype), one decoding step by the kernel; its output vs the float64 reference step on the
    same cache (``o``, gated) and vs the float64 naive attention over prompt + token (``o_vs_naive``,
    reported: it adds the cache's storage rounding, which no config changes). Timing: the amortized step of the
    config's flush cycle over a cache of seq_len tokens, batch sequences (``_time_decode``)."""
    if task.backend != "triton":
        raise NotImplementedError(f"decode tuning runs the Triton decode kernel; backend {task.backend!r} "
                                  "is not supported for the decode pass")
    if not decode_available():
        raise DecodeUnavailable(
            "decode pass: the fused Triton decode kernel (pathtune.codegen.triton.decode.path_decode_triton) is not "
            "available in this pathtune yet, so there is nothing to tune; tune fwd and bwd for now")
    import torch

    from pathtune.codegen.triton.decode import path_decode_triton
    from pathtune.runtime.reference import naive_path_attention

    wl = task.workload
    params = triton_params(task.config, wl["head_dim"], wl["head_dim_v"], "decode")
    (q, k, v, w, beta, g), step, cache = _decode_gate_setup(task)
    T = task.check_len
    import copy

    from pathtune.runtime.reference.recurrent import path_attention_decode

    ref_cache = copy.deepcopy(cache)
    if ref_cache.c is not None:
        ref_cache.c = ref_cache.c.double()
    with torch.no_grad():
        o = path_decode_triton(*step, cache, config=params)
        # gated: vs the float64 reference step on the same stored cache (the config's own error); also
        # reported: vs the float64 naive attention over prompt + token (adds the cache's storage rounding)
        ref = path_attention_decode(*[None if x is None else x.double() for x in step], ref_cache)
        naive = naive_path_attention(*[None if x is None else x.double() for x in (q, k, v, w, beta, g)])[:, T:]
    errors = {"o": _rel(o, ref), "o_vs_naive": _rel(o, naive)}
    bad = over_tolerance(errors, task.tolerances)
    if bad:
        return {"status": "wrong", "errors": errors,
                "message": "accuracy gate (decode step vs the float64 reference): " + ", ".join(bad)}
    # the whole flush cycle on CUDA; one plain step in the CPU interpreter (its times only order configs)
    fn, q_t, ck, cv = _decode_timed_callable(task, params, cycle=torch.cuda.is_available())
    with torch.no_grad():
        timing = _time_decode(fn, task)
    out = {"status": "ok", "errors": errors, **timing}
    base, name = _baseline(task, q_t, ck, cv)
    if base is not None:
        out.update(baseline_ms=base, baseline_name=name)
    return out


def measure(task: MeasureTask) -> dict:
    """Accuracy gate, then timing; every failure is a status, never an exception (see module doc).
    Only ``DecodeUnavailable`` propagates: it is a property of this pathtune, not of a config."""
    try:
        if task.pass_ == "decode":
            return _measure_decode(task)
        run = _forward_fn(task)
        errors = _check_fwd_bwd(task, run)
        bad = over_tolerance(errors, task.tolerances)
        if bad:
            return {"status": "wrong", "errors": errors,
                    "message": "accuracy gate (relative Frobenius error vs the float64 reference): " + ", ".join(bad)}
        out = {"status": "ok", "errors": errors}
        out.update(_time_fwd_bwd(task, run))
        return out
    except DecodeUnavailable:
        raise
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # noqa: BLE001 -- a failing config is a recorded status
        return _failure(exc)


def _failure(exc: BaseException) -> dict:
    """A failed candidate's result: its status and message, ``fatal`` when the CUDA context is gone."""
    status, message = classify_exception(exc)
    out = {"status": status, "message": message}
    if any(m in message.lower() for m in FATAL_MARKERS):
        out["fatal"] = True
    return out


def prepare(task: MeasureTask) -> dict:
    """Compile every kernel a ``measure(task)`` will launch, without the reference or the timing.

    Runs the candidate once at the gate shape and once at the timed shape, so Triton compiles (and
    caches on disk, ``TRITON_CACHE_DIR``) exactly the specialisations the measurement launches; the
    measuring process then loads them in milliseconds. The tuner runs this in child processes
    (``tuning.prepare``): many configs compile at once on a many-core GPU host, and a config that
    faults the GPU never touches the measuring process. Returns ``{"status": "prepared", "seconds"}``
    or a failure dict as ``measure`` returns it (a recorded status, never an exception).
    """
    import torch

    t0 = time.perf_counter()
    phases: dict[str, float] = {}      # seconds per phase (where a slow compile goes)

    def lap(name: str, t: float) -> float:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        now = time.perf_counter()
        phases[name] = round(now - t, 3)
        return now

    try:
        if task.pass_ == "decode":
            if task.backend != "triton":
                raise NotImplementedError(f"decode tuning runs the Triton decode kernel, not {task.backend!r}")
            from pathtune.codegen.triton.decode import path_decode_triton

            wl = task.workload
            params = triton_params(task.config, wl["head_dim"], wl["head_dim_v"], "decode")
            _, step, cache = _decode_gate_setup(task)
            t = lap("setup", t0)
            with torch.no_grad():
                path_decode_triton(*step, cache, config=params)
                t = lap("gate_shape", t)
                _decode_timed_callable(task, params)[0]()
                lap("timed_shape", t)
        else:
            run = _forward_fn(task)
            xs = _gate_inputs(task)
            t = lap("setup", t0)
            _run_gate_shape(task, run, xs)
            t = lap("gate_shape", t)
            _timed_callable(task, run)[0]()
            lap("timed_shape", t)
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # noqa: BLE001 -- a failing config is a recorded status
        return {**_failure(exc), "seconds": time.perf_counter() - t0, "phases": phases}
    return {"status": "prepared", "seconds": time.perf_counter() - t0, "phases": phases}
