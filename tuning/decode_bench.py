"""`pathtune bench --pass decode`: one decoding step of pathtune's fused Triton kernel (and, with
``--backends triton,tvm``, its TVM step from prebuilt modules: tuning/decode_tvm.py) vs SDPA and fla.

For each (heads, head dim, cache length, gate, new tokens per call): a bf16 cache of ``cache_len`` keys per
sequence (batch B) and ``tokens`` new tokens per call (1 by default; each count is its own decode key).
Timed with ``triton.testing.do_bench`` medians, all in one process:

* ``pathtune``: the public ``pathtune.path_attention_decode(..., backend="triton", config=...)`` (host work
  included) of the new tokens over a cache of ``cache_len`` keys kept in the frame of a base position with
  the last tokens pending (lazy rotation, ``decode_pending_window`` W).  A step whose pending rows
  would exceed W flushes (rotates every cached key), so one timed call runs a whole flush cycle --
  the cache set to ``cache_len`` rows of which 0, TN, 2 TN, .. are pending before each step
  (``flush_cycle``) -- and the reported time is the amortized step.
* ``sdpa_flash``: torch SDPA (flash backend) of the new queries over the same ``cache_len + tokens`` keys
  (plain attention, causal among the new queries: no key update, no gate) -- the speed of light of a
  decode step that reads K and V once; a plain call, the backend chosen once around the timing loop
  (``baselines.sdpa_backend``).
* ``fla`` (one token per call): flash-linear-attention's PaTH decode step as its ``PaTHAttention`` layer
  runs it: the rank-one update of the whole cache (a ``torch.compile``d elementwise kernel, fp32 math,
  written back in the cache dtype), then ``attn_decoding_one_step`` over the packed cache (FoX gate when
  gated).  The layer's ``torch.cat`` of the cache with the new token is not timed (it would add a full copy).

``graph=True`` (``--graph``): pathtune's flush cycle and SDPA's call are each captured in one CUDA graph and the
graph's replay is timed: the GPU time of the same public calls without their host work (at a 4K cache an eager
call is about as long on the host as on the GPU, so eager times compare configs through host jitter; the graph
times pick the config for graph-captured decoding and for short caches).  fla's step stays eager.

Before timing, one step on a copy of batch 0 (first 2048 keys) is checked against the float64
reference; a failed check or a crash is recorded instead of a time.  Rows go to a table, JSON and,
with ``--record``, perf_db (pass ``decode``, the key's ``query_bucket`` from the token count, baseline =
SDPA flash of the same run).
"""
from __future__ import annotations

import copy
import itertools
import json
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

import torch

from .baselines import keep_triton_toolchain, sdpa_backend

CACHE_LENS = (4096, 32768)
SHAPES = ((16, 64), (8, 128))   # (heads, head dim)
BATCH = 8
ACCURACY_LIMIT = 2e-2            # relative Frobenius error of o vs the float64 reference (bf16 cache)


@dataclass
class DecodeRow:
    head_dim: int
    heads: int
    cache_len: int
    batch: int
    gate: bool
    tokens: int = 1      # new tokens per call
    timing: str = "eager"   # "eager": the calls as a loop runs them; "graph": their CUDA-graph replay (no host work)
    times: dict[str, Optional[float]] = field(default_factory=dict)
    errors: dict[str, float] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)
    params: dict = field(default_factory=dict)
    sweep: list = field(default_factory=list)   # [{"config": {...}, "ms": float | None, "error": str}] with --sweep
    tvm_params: dict = field(default_factory=dict)   # the fastest TVM set's record config (+ its "set" id)
    tvm_sweep: list = field(default_factory=list)    # every TVM set timed: {"set", "config", "ms", "error", "errors"}

    def ratio(self, num: str, den: str) -> Optional[float]:
        a, b = self.times.get(num), self.times.get(den)
        return a / b if a and b else None

    @property
    def bytes_moved(self) -> int:
        """HBM bytes a fused step must move at least: K read + K written + V read (bf16)."""
        return 3 * self.batch * self.heads * self.cache_len * self.head_dim * 2


def knob_values(params) -> dict:
    """The decode pass's knob values (the spec's list of them) of a TritonParams, as the spec spells them
    (beta_clip_eps 'off'): the keys of a swept config (``sweep_configs``)."""
    from pathtune.codegen._knobs import config_of
    from pathtune.specs import load_spec

    values = config_of("triton", params)
    return {name: values[name] for name in load_spec().passes["decode"].knobs}


def _median_ms(fn: Callable[[], object]) -> float:
    """Median ms of one call; a callable with a ``steps`` attribute runs that many decode steps per call
    (a whole flush cycle), and the result is per step: the amortized step time.  A callable with ``parts``
    ([(callable, weight)], ``weighted_parts``) is timed part by part and reports the weighted mean of their per-step
    times (two frame levels: the cycles of a small and of a big flush, weighted by how often each occurs)."""
    import triton

    parts = getattr(fn, "parts", None)
    if parts is not None:
        return sum(weight * _median_ms(part) for part, weight in parts)
    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")) / getattr(fn, "steps", 1)


def graphed(fn: Callable[[], object]) -> Callable[[], object]:
    """``fn`` run once (compiling its kernels, allocating its buffers), then captured in a CUDA graph: the returned
    callable replays it (the same ``steps``; a callable with ``parts``: each part captured on its own)."""
    parts = getattr(fn, "parts", None)
    if parts is not None:
        return weighted_parts([(graphed(part), weight) for part, weight in parts])
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()

    def replay():
        graph.replay()

    replay.steps = getattr(fn, "steps", 1)
    replay.graph = graph   # kept alive with the callable
    return replay


def flush_cycle(window: int, tokens: int) -> list[int]:
    """The pending-row counts before each step of one flush cycle of ``tokens``-token steps with pending
    window ``window`` (the decode kernel's rule: a step flushes when more than ``window`` rows would be
    pending after it): e.g. window 16, one token: [0, 1, ..., 16] (17 steps, the last one flushes);
    window 0: [0] (every step rotates the cache)."""
    counts, p = [], 0
    while True:
        counts.append(p)
        if p + tokens > window:
            return counts
        p += tokens


def frame_plan(length: int, tokens: int, window: int, frame_bound: int = 0,
               align: int = 512) -> list[tuple[float, list[tuple[int, int, int, int]]]]:
    """The cache states a decode timing at a fixed key length runs through, as ``[(weight, states)]``: each part is a
    flush cycle (``flush_cycle``), ``states`` the ``set_state(length, frame, old, old_frame)`` arguments before each
    of its steps, and the amortized step is the weighted mean of the parts' per-step times.

    One frame level (``frame_bound`` 0): one part, every flush rotates every row.  Two levels: a flush cycle adds
    c = len(cycle) * tokens rows; after a big flush the old rows end at the length rounded down to ``align``, leaving
    r0 recent rows (1 .. c when the bound is a multiple of align: the big flush came at the first cycle end past the
    last F1 + bound; else taken as align / 2), and the k-th flush after it is big when r0 + k c > frame_bound, so of
    n = (frame_bound - r0) // c + 1 flush cycles one is big (weight 1 / n; its state leaves just over the bound
    past the old rows) and the others rotate the recent rows only (weight (n - 1) / n; their state leaves the mean
    recent count at the flush, r0 + n c / 2, to the nearest multiple of align within the bound, the cost being
    linear in it).  Old rows sit in an older frame in both (the frame map in use).  Where the length leaves no
    old rows, every flush rotates every row: one part."""
    cycle = flush_cycle(window, tokens)

    def states(old: int) -> list[tuple[int, int, int, int]]:
        return [(length, length - p, min(old, length - p), min(old, length - p)) for p in cycle]

    if frame_bound <= 0:
        return [(1.0, states(0))]
    c = len(cycle) * tokens
    end = length + tokens                     # the key count after the flush step
    # recent rows left by a big flush: for a bound that is a multiple of align (the spec's domain) the next big flush
    # comes at the first cycle end past F1 + bound, which leaves 1 .. c rows past the next multiple of align
    r0 = (c + 1) // 2 if frame_bound % align == 0 else align // 2
    n = max(1, (frame_bound - r0) // c + 1)
    recent = r0 + n * c // 2                  # mean recent rows at a small flush
    old_small = min(max((end - recent + align // 2) // align * align,   # the nearest multiple of align,
                        -(-(end - frame_bound) // align) * align),      # leaving at most the bound (not big)
                    (length - cycle[-1]) // align * align)              # and at most the frame base
    old_big = max(0, (end - frame_bound - 1) // align * align)
    if end <= frame_bound or old_small <= 0:
        return [(1.0, states(0 if end <= frame_bound else old_big))]
    if n == 1:
        return [(1.0, states(old_big))]
    return [((n - 1) / n, states(old_small)), (1 / n, states(old_big))]


def plan_callable(cache, plan: list, step: Callable[[], object]) -> Callable[[], object]:
    """The timed callable of a ``frame_plan``: per part, the cache set to each of its states and ``step()`` run
    (``steps`` of them); several parts as ``weighted_parts``.  Allocates the frame map a plan's states name."""
    if any(old > 0 and old_frame < frame for _, states in plan for _, frame, old, old_frame in states):
        cache.frame_map()

    def cycle_of(states):
        def run():
            out = None
            for st in states:
                cache.set_state(*st)
                out = step()
            return out
        run.steps = len(states)
        return run

    if len(plan) == 1:
        return cycle_of(plan[0][1])
    return weighted_parts([(cycle_of(states), weight) for weight, states in plan])


def weighted_parts(parts: list[tuple[Callable[[], object], float]]) -> Callable[[], object]:
    """One callable that runs every part (for a check or a warm-up) and carries ``parts`` for ``_median_ms``."""
    def run():
        out = None
        for part, _ in parts:
            out = part()
        return out

    run.parts = parts
    run.steps = sum(getattr(part, "steps", 1) for part, _ in parts)
    return run


def make_cache(B: int, T: int, H: int, D: int, gate: bool, *, device: str, gen: torch.Generator,
               dtype=torch.bfloat16, extra: int = 1):
    """A PaTHKVCache of length T (capacity T + extra) with random keys/values and real gate decay."""
    from pathtune.codegen.kv_cache import PaTHKVCache

    cache = PaTHKVCache.empty(B, H, D, D, H, max_len=T + extra, gated=gate, dtype=dtype, device=device)
    cache.k[:, :T] = torch.randn(B, T, H, D, device=device, generator=gen).to(dtype)
    cache.v[:, :T] = torch.randn(B, T, H, D, device=device, generator=gen).to(dtype)
    if gate:
        g = torch.log(torch.rand(B, T, H, device=device, generator=gen) * 0.05 + 0.95)
        cache.c[:, :T] = torch.cumsum(g, dim=1)
    cache.length = T
    return cache


def make_step(B: int, H: int, D: int, gate: bool, *, device: str, gen: torch.Generator, dtype=torch.bfloat16,
              tokens: int = 1):
    """``tokens`` new tokens (``inputs.make_inputs`` drawn from ``gen``): q/k/v in dtype, unit fp32 w, beta in
    [1.5, 2), log gate."""
    from .inputs import make_inputs

    return make_inputs(B, tokens, H, H, D, D, gate, device=device, dtype=dtype, generator=gen)


def accuracy(cache, step, config, prefix: int = 2048, decode: Optional[Callable] = None) -> dict[str, float]:
    """One step on a copy of batch 0's first `prefix` keys: Triton vs the float64 reference (o and K).

    ``decode(xs, sub_cache) -> o [1,1,HQ,DV]``: another step to check instead of Triton's (the TVM step)."""
    from pathtune.codegen.kv_cache import PaTHKVCache
    from pathtune.codegen.triton import path_decode_triton
    from pathtune.runtime.reference.recurrent import path_attention_decode

    n, tn = min(prefix, cache.length), step[0].shape[1]
    sub = PaTHKVCache(cache.k[:1, :n + tn].clone(), cache.v[:1, :n + tn].clone(),
                      None if cache.c is None else cache.c[:1, :n + tn].clone(), n, cache.num_q_heads)
    ref_cache = copy.deepcopy(sub)
    if ref_cache.c is not None:
        ref_cache.c = ref_cache.c.double()
    xs = [None if x is None else x[:1] for x in step]
    o = path_decode_triton(*xs, sub, config=config) if decode is None else decode(xs, sub)
    ref = path_attention_decode(*[None if x is None else x.double() for x in xs], ref_cache)

    def rel(a, b):
        return float((a.double() - b.double()).norm() / b.double().norm())
    return {"o": rel(o, ref), "k": rel(sub.k[:, :n + tn], ref_cache.k[:, :n + tn])}


def pathtune_callable(cache, step, config, graph: bool = False):
    """One call runs a whole flush cycle of the lazily rotated cache (``flush_cycle``) at a fixed key
    length T: before each step the cache is set to T rows of which the cycle's count are pending, so
    the cycle's one flush step is timed with the rest and ``_median_ms`` reports the amortized step.
    With two frame levels (``decode_frame_bound``) the call runs the cycles of ``frame_plan`` (a small and a big
    flush), which ``_median_ms`` weights.  The pending rows' window entries are the earlier calls', the frame map's
    entries whatever the buffer holds (their values do not change the time).
    ``graph``: each cycle captured in a CUDA graph (``graphed``), whose replay is the call."""
    from pathtune.codegen.triton.decode import FRAME_ALIGN, decode_params
    from pathtune.runtime.decode import path_attention_decode

    T = cache.length
    D, DV = cache.k_buffer.shape[-1], cache.v.shape[-1]
    params = decode_params(config, D, DV)
    plan = frame_plan(T, step[0].shape[1], params.decode_pending_window, params.decode_frame_bound, FRAME_ALIGN)
    path_attention_decode(*step, cache, backend="triton", config=config)   # allocates the window the cycle reuses
    run = plan_callable(cache, plan, lambda: path_attention_decode(*step, cache, backend="triton", config=config))
    return graphed(run) if graph else run


def sdpa_decode_callable(cache, step) -> Optional[Callable[[], object]]:
    """SDPA of the new queries over the cache's T + tokens keys (no update, no gate), [B,H,TN,D] layout
    from transposed views of the [B,T,H,D] cache (the layout flash attention reads natively); time it
    inside ``baselines.sdpa_backend``, which picks the backend once for the whole timing loop."""
    from .baselines import sdpa_decode_callable as plain_sdpa

    n = cache.length + step[0].shape[1]
    return plain_sdpa(step[0].transpose(1, 2), cache.k[:, :n].transpose(1, 2), cache.v[:, :n].transpose(1, 2))


def fla_decode_callable(cache, step) -> tuple[Optional[Callable[[], object]], str]:
    """fla's PaTH decode step (its layer's rank-one update + attn_decoding_one_step), or (None, why)."""
    try:
        from fla.ops.attn.decoding import attn_decoding_one_step
    except Exception as exc:
        return None, f"fla not importable ({type(exc).__name__}: {exc})"
    q, k_new, v_new, w, beta, g = step
    B, T, H, D = cache.k.shape[0], cache.length, cache.k.shape[2], cache.k.shape[3]
    n = T + 1
    K = cache.k[:, :n].clone()   # fla keeps its own cache: [B, T+1, H, D] packed as [1, B*(T+1), H, D]
    V = cache.v[:, :n].clone()
    K[:, T:] = k_new
    V[:, T:] = v_new
    G = None
    if g is not None:  # fla keeps the raw log gates and cumsums them inside the decode call
        G = torch.cat([torch.diff(cache.c[:, :T], dim=1, prepend=torch.zeros_like(cache.c[:, :1])), g], dim=1)
        G = G.reshape(1, B * n, H).contiguous()
    cu = torch.arange(0, B + 1, device=q.device, dtype=torch.long) * n
    qp = q.reshape(1, B, H, D)

    def rank_one_update(k, w, beta):  # as fla/layers/path_attn.py does it
        dt = k.dtype
        k = k.float()
        return (k - beta[..., None].float() * (k * w).sum(-1, keepdim=True) * w).to(dt)
    try:
        upd = torch.compile(rank_one_update)
    except Exception:  # pragma: no cover
        upd = rank_one_update
    past = K[:, :T]

    def run():
        past.copy_(upd(past, w, beta))
        return attn_decoding_one_step(qp, K.view(1, B * n, H, D), V.view(1, B * n, H, D), G, cu_seqlens=cu,
                                      do_gate_scale=True)

    try:
        run()
        torch.cuda.synchronize()
    except Exception as exc:
        return None, f"fla decode failed: {type(exc).__name__}: {str(exc)[:300]}"
    return run, ""


def sweep_configs(D: int, DV: int, only: Optional[dict] = None) -> list[dict]:
    """Every valid config of the spec's decode schedule knobs; the knobs of other roles (precision:
    beta_clip_eps, decode_pending_window) stay at their defaults unless ``only`` names them (every swept
    config passes the sweep's accuracy check before it is timed).

    ``only`` ({knob: [values]}, ``check_sweep_knobs``) keeps the configs whose knobs take those values."""
    from pathtune.specs import load_spec
    from pathtune.specs.knobs import KnobSpace

    spec = load_spec()
    space = KnobSpace(spec, "decode")
    default = space.default().to_dict()
    only = check_sweep_knobs(only or {})
    fixed = {name: default.get(name) for name in default if spec.knobs[name].role != "schedule" and name not in only}
    return [c.to_dict() for c in space.enumerate({"D": D, "DV": DV})
            if all(c.get(name) == value for name, value in fixed.items())
            and all(c.get(name) in values for name, values in only.items())]


def check_sweep_knobs(only: dict) -> dict:
    """{knob: [values]} restricting a decode sweep, checked against the spec: each knob a decode knob of
    role schedule or precision (a precision knob is swept only where named: its configs pass the sweep's
    accuracy check like every other), each value in its domain (ValueError, one line, otherwise)."""
    from pathtune.specs import load_spec
    from pathtune.specs.knobs import KnobSpace

    spec = load_spec()
    names = [n for n in KnobSpace(spec, "decode").knobs if spec.knobs[n].role in ("schedule", "precision")]
    if not isinstance(only, dict):
        raise ValueError(f"the sweep's knobs must be a JSON object {{knob: [values]}}, got {only!r}")
    out = {}
    for name, values in only.items():
        if name not in names:
            raise ValueError(f"{name!r} is not a decode knob the sweep can take; sweepable: {', '.join(names)}")
        values = values if isinstance(values, list) else [values]
        bad = [v for v in values if v not in spec.knobs[name].domain]
        if bad or not values:
            raise ValueError(f"{name} values {bad or values} are not in its domain {list(spec.knobs[name].domain)}")
        out[name] = values
    return out


def _sweep(row: DecodeRow, cache, step, D: int, log, keys0, only: Optional[dict] = None,
           graph: bool = False, timed: Optional[dict] = None) -> None:
    """Time every decode config (of ``only``'s values, ``sweep_configs``); the fastest accurate one becomes
    the row's pathtune time and params.  ``timed``: the entry of the config the row timed before the sweep (the
    untuned one, or the one given), a candidate like the swept ones (and recorded with them) where the sweep does
    not hold its config: a sweep that misses it never makes the records slower than what runs without them."""
    from pathtune.codegen.triton.decode import decode_params

    best = None
    for cfg in sweep_configs(D, D, only):
        cache.k.copy_(keys0)  # every config starts from the same keys (timed calls shrink them along w_t)
        cache.length = row.cache_len   # (and known host mirrors, after a config whose graph capture failed)
        entry = {"config": cfg, "ms": None, "error": ""}
        try:
            params = decode_params(cfg, D, D)
            err = accuracy(cache, step, params)["o"]
            if not err < ACCURACY_LIMIT:
                raise RuntimeError(f"o error {err:.3g}")
            entry["ms"] = _median_ms(pathtune_callable(cache, step, params, graph=graph))
        except Exception as exc:
            entry["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        row.sweep.append(entry)
        log(f"  sweep {cfg}: {entry['ms'] if entry['ms'] is not None else entry['error']}")
        if entry["ms"] is not None and (best is None or entry["ms"] < best["ms"]):
            best = entry
    if timed is not None and not any(e["config"] == timed["config"] for e in row.sweep):
        row.sweep.insert(0, timed)
        if timed["ms"] is not None and (best is None or timed["ms"] < best["ms"]):
            best = timed
    if best is not None:
        row.times["pathtune"] = best["ms"]
        row.params = knob_values(decode_params(best["config"], D, D))


def run_decode_bench(shapes=SHAPES, cache_lens=CACHE_LENS, gates=(False, True), *, batch: int = BATCH, config=None,
                     tokens=(1,), baselines=("sdpa", "fla"), device: str = "cuda", seed: int = 0, sweep: bool = False,
                     sweep_knobs: Optional[dict] = None, backends=("triton",), tvm_sets=None, tvm_loader=None,
                     graph: bool = False, log: Callable[[str], None] = print,
                     on_row: Optional[Callable[[DecodeRow], None]] = None) -> list[DecodeRow]:
    """Measure every (heads, D, cache length, gate, new tokens per call) point; see the module docstring.

    ``sweep``: also time every config of the decode knobs (spec domains; ``sweep_knobs``, {knob: [values]},
    restricts them) and report the fastest.
    ``backends``: which pathtune steps to time ("triton", "tvm"); "tvm" times every set of ``tvm_sets``
    (decode_tvm.load_sets) built for the row's shape, each loaded by ``tvm_loader`` (default: its modules).
    ``graph``: time pathtune's (Triton) flush cycle and SDPA from CUDA-graph replays (see the module docstring).
    ``on_row``: called with each row as soon as it is measured (an interrupted bench keeps what it measured).
    """
    from pathtune.codegen.triton.decode import decode_params

    if "tvm" in backends and not tvm_sets:
        raise ValueError("backend tvm needs prebuilt module sets (tvm_sets, from decode_tvm.load_sets)")
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("pathtune bench --pass decode needs a CUDA GPU (torch.cuda.is_available() is False)")
    if graph and device != "cuda":
        raise ValueError("graph timing (--graph) captures CUDA graphs: it needs device 'cuda'")
    if graph and "tvm" in backends:
        raise ValueError("graph timing (--graph) is for the Triton step (the TVM step runs from the host per token)")
    if sweep:
        check_sweep_knobs(sweep_knobs or {})
    tokens = tuple(tokens)
    if not tokens or min(tokens) < 1:
        raise ValueError(f"tokens per call must be >= 1, got {tokens}")
    if "tvm" in backends and max(tokens) > 1:
        raise ValueError(f"the TVM decode step takes one token per call; tokens {tokens} include more")
    rows = []
    for H, D in shapes:
        params = decode_params(config, D, D)
        for T, gate, TN in itertools.product(cache_lens, gates, tokens):
            row = DecodeRow(D, H, T, batch, gate, TN, timing="graph" if graph else "eager",
                            params=knob_values(params) if "triton" in backends else {})
            gen = torch.Generator(device=device).manual_seed(seed)
            cache = make_cache(batch, T, H, D, gate, device=device, gen=gen, extra=TN)
            keys0 = cache.k.clone()
            step = make_step(batch, H, D, gate, device=device, gen=gen, tokens=TN)
            if "tvm" in backends:
                from .decode_tvm import load_step, time_tvm

                time_tvm(row, cache, step, tvm_sets, keys0, median_ms=_median_ms, log=log,
                         accuracy=accuracy, limit=ACCURACY_LIMIT, loader=tvm_loader or load_step)
            if "triton" in backends:
                try:
                    row.errors = accuracy(cache, step, params)
                    if not row.errors["o"] < ACCURACY_LIMIT:
                        raise RuntimeError(f"accuracy check failed: o error {row.errors['o']:.3g} >= "
                                           f"{ACCURACY_LIMIT}")
                    row.times["pathtune"] = _median_ms(pathtune_callable(cache, step, params, graph=graph))
                except Exception as exc:  # a failing config is a recorded status, not a crash
                    row.failures["pathtune"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            cache.length = T   # also re-arms the host mirrors a failed graph capture leaves unknown
            if sweep and "triton" in backends:
                row.times["pathtune_default"] = row.times.get("pathtune")
                timed = {"config": knob_values(params), "ms": row.times.get("pathtune"),
                         "error": row.failures.get("pathtune", "")}
                _sweep(row, cache, step, D, log, keys0, sweep_knobs, graph, timed)
                if row.times.get("pathtune") is not None:
                    row.failures.pop("pathtune", None)
            cache.length = T
            cache.k.copy_(keys0)
            del keys0
            if "sdpa" in baselines:
                cache.length = T
                with sdpa_backend("flash"):
                    fn = sdpa_decode_callable(cache, step)
                    if fn is not None and graph:
                        fn = graphed(fn)
                    row.times["sdpa_flash"] = _median_ms(fn) if fn else None
            if "fla" in baselines and TN == 1:
                cache.length = T
                with keep_triton_toolchain():
                    fn, why = fla_decode_callable(cache, step)
                    row.times["fla"] = _median_ms(fn) if fn else None
                if fn is None:
                    row.failures["fla"] = why
            del cache
            if device == "cuda":
                torch.cuda.empty_cache()
            rows.append(row)
            log(json.dumps(asdict(row)))
            if on_row is not None:
                on_row(row)
    return rows


def record_decode_rows(rows: list[DecodeRow], db_url: Optional[str], command: str,
                       run_id: Optional[str] = None) -> int:
    """Store pathtune's decode times in perf_db (pass ``decode``, backend triton and, when timed, tvm) with
    SDPA flash of the same run as baseline.  ``run_id``: add to that run (started if new)."""
    from pathtune.codegen.triton import source_hash
    from pathtune.perf_db import KernelKey, Measurement, PerfDB
    from pathtune.runtime.environment import collect_env
    from pathtune.specs import Config, Workload, load_spec
    from pathtune.specs.workload import batch_bucket, query_bucket, seq_bucket

    spec = load_spec()
    env = collect_env()
    n = 0
    with PerfDB(db_url) as db:
        run_id = db.start_run(command=command, notes="pathtune bench --pass decode", run_id=run_id)
        kernel = KernelKey(pass_="decode", backend="triton", spec_hash=spec.pass_hash("decode"),
                           source_hash=source_hash("decode"))
        tvm_kernel = None
        if any(row.tvm_sweep for row in rows):
            from pathtune.codegen.tvm.build import source_hash as tvm_source_hash

            tvm_kernel = KernelKey(pass_="decode", backend="tvm", spec_hash=spec.pass_hash("decode"),
                                   source_hash=tvm_source_hash())
        for row in rows:
            wl = Workload(head_dim=row.head_dim, head_dim_v=row.head_dim, heads_q=row.heads, heads_kv=row.heads,
                          dtype="bfloat16", use_gate=row.gate, pass_="decode", seq_bucket=seq_bucket(row.cache_len),
                          batch_bucket=batch_bucket(row.batch), query_bucket=query_bucket(row.tokens))
            # one measurement per config: the swept ones, or the single timed config
            entries = ([(kernel, e["config"], e["ms"], e["error"], row.errors) for e in row.sweep] if row.sweep else
                       [(kernel, row.params, row.times.get("pathtune"), row.failures.get("pathtune"), row.errors)])
            entries += [(tvm_kernel, e["config"], e["ms"], e["error"], e["errors"]) for e in row.tvm_sweep]
            for kern, knobs, t, failed, errors in entries:
                if t is None and not failed:
                    continue
                cfg = Config(knobs)
                method = ("triton.testing.do_bench median of a CUDA-graph replay" if row.timing == "graph"
                          else "triton.testing.do_bench median")
                meas = (Measurement(status="ok", median_ms=t, bench_method=method,
                                    errors=dict(errors), baseline_ms=row.times.get("sdpa_flash"),
                                    baseline_name="sdpa_flash", command=command)
                        if t is not None else Measurement(status="crash", message=failed, command=command))
                db.record(env, kern, wl, cfg, meas, run_id=run_id, on_conflict="skip")
                n += 1
    return n


def format_decode_table(rows: list[DecodeRow]):
    from rich.table import Table

    graph = any(r.timing == "graph" for r in rows)
    table = Table(title="PaTH decode step (tokens per call, amortized over the flush cycle), ms (do_bench median"
                        + ("; pathtune and SDPA as CUDA-graph replays, fla eager" if graph else "")
                        + "); /flash: pathtune over SDPA flash of the same queries")
    for col in ("BxH", "D", "cache", "gate", "tokens", "sdpa flash", "fla", "pathtune", "/flash", "fla/ours", "GB/s",
                "o err", "k err", "block_n/warps/splits/stages"):
        table.add_column(col, justify="right")

    tvm = any(r.tvm_sweep or "tvm" in r.failures for r in rows)
    if tvm:
        for col in ("tvm", "tvm/flash", "tvm/triton", "tvm set"):
            table.add_column(col, justify="right")

    def f(x, fmt="{:.3f}"):
        return "-" if x is None else fmt.format(x)
    for r in rows:
        t = r.times.get("pathtune")
        cells = [f"{r.batch}x{r.heads}", str(r.head_dim), str(r.cache_len), "FoX" if r.gate else "-", str(r.tokens),
                 f(r.times.get("sdpa_flash")), f(r.times.get("fla")), f(t) if t else ("FAIL" if r.params else "-"),
                 f(r.ratio("pathtune", "sdpa_flash"), "{:.2f}"), f(r.ratio("fla", "pathtune"), "{:.2f}"),
                 f(r.bytes_moved / (t * 1e6) if t else None, "{:.0f}"),
                 f(r.errors.get("o"), "{:.1e}"), f(r.errors.get("k"), "{:.1e}"),
                 "/".join(str(r.params.get(k, "-")) for k in ("decode_block_n", "decode_num_warps",
                                                                "decode_splits", "decode_num_stages"))]
        if tvm:
            tv = r.times.get("tvm")
            cells += [f(tv) if tv else "FAIL", f(r.ratio("tvm", "sdpa_flash"), "{:.2f}"),
                      f(r.ratio("tvm", "pathtune"), "{:.2f}"), str(r.tvm_params.get("set", "-"))]
        table.add_row(*cells)
    return table
