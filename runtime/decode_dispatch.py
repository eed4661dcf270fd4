"""Which kernel runs a decode step with ``backend="auto"``: the Triton step or the TVM step.

Per key -- CUDA device, head dims, heads, q and cache dtypes, FoX gate, the power-of-two bucket of the
keys attended (cache length + new tokens) and the batch bucket -- the dispatcher's "decode" choice over
both backends decides (runtime/dispatch.py: pack, perf_db, length / batch buckets, ...; a record is the
fastest of its key whatever its backend). A TVM choice runs only when the TVM step can run here:

* it comes from a measured record of this shape (source pack, perf_db or bucket; a gate transfer or a
  default cannot name a module built for this shape);
* the TVM runtime (``tvm_ffi``) is importable -- the compiler is not needed;
* the spec's gate placement is ``inside_scale`` (the only one the TVM step implements), the cache holds
  k/v in q's dtype (bf16, fp16 or fp32);
* its prebuilt modules are in a module store (codegen/tvm/module_store.py: ``PATHTUNE_TVM_MODULES``,
  ``tvm_modules/`` beside a loaded pack, ``<PATHTUNE_CACHE_DIR>/tvm/modules``), matched by knobs, dims,
  spec and kernel source hashes and the GPU's arch, and they load.

Otherwise the Triton step runs with Triton's own best record, and why is logged once (INFO on the
``pathtune.dispatch`` logger; printed to stderr with ``PATHTUNE_PRINT_DISPATCH=1``). The plan is cached per
key on the dispatcher (``clear_cache()`` forgets it): after the first call a step pays one dict lookup.

A Triton config that is not a record of this very key (a nearer batch or length bucket's record, the
untuned config) gets more splits when its (batch x kv head) rows times ``decode_splits`` would leave
multiprocessors idle (``_fill_gpu``): the decode sweeps run at batch 8, where 128 rows fill the GPU with
2-4 splits; at batch 1 the same splits ran 16 heads as 32-64 programs on 132 multiprocessors.
"""
from __future__ import annotations

import dataclasses
import logging
import sys
from dataclasses import dataclass
from typing import Any

import torch

from pathtune import _env

from . import dispatch

__all__ = ["DecodePlan", "decode_plan", "plan_for", "tuned_triton_params"]

_log = logging.getLogger("pathtune.dispatch")
_MEASURED = ("pack", "perf_db", "bucket")    # sources that name a config measured for this shape
_KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# A decode key has the call's token-count bucket (Workload.query_bucket): a call of several tokens is served
# the records of its own bucket (timed with that many tokens per step), never a one-token pick.  On the H200
# the D 128 one-token picks (2 splits, 256-row tiles) ran calls of 4 / 16 tokens 1.14-1.43x slower than the
# untuned config (benchmarks/results/H200-20261203T173100Z-decode-swept-probe.json against
# -171000Z-decode-probe.json): without records of its bucket a several-token call runs the untuned config.


@dataclass(frozen=True)
class DecodePlan:
    """What a decode call runs: ``backend`` "triton" (``triton_params``) or "tvm" (``tvm_step``, a
    codegen.tvm.runtime.TVMDecode). ``choice``: the dispatcher's answer that runs; ``fallback``: why a
    TVM choice was not run (empty when none was passed over)."""

    backend: str
    choice: Any
    triton_params: Any = None
    tvm_step: Any = None
    fallback: str = ""
    adjusted: str = ""     # how the Triton params differ from the choice's config (``_fill_gpu``)

    def describe(self) -> str:
        out = self.choice.describe()
        for extra in (self.adjusted, self.fallback):
            if extra:
                out += f"; {extra}"
        return out


def _dtype_name(dt: torch.dtype) -> str:
    return str(dt).replace("torch.", "")


def _spec():
    from pathtune.specs import load_spec

    return load_spec()


def _placement() -> str:
    return _spec().gate_placement


def _load_tvm_step(found, dims, params):
    """The TVM decode step from prebuilt modules (a hook: tests replace it with a fake)."""
    from pathtune.codegen.tvm.runtime import TVMDecode, load_kernels

    return TVMDecode(load_kernels(found.paths, found.runtime_dir), dims, params, _placement())


def _tvm_step_or_reason(d: "dispatch.Dispatcher", choice, device: torch.device, dims, cache_dtype: torch.dtype,
                        q_dtype: torch.dtype) -> tuple[Any, str]:
    """(the loaded TVM step, "") or (None, why it cannot run here)."""
    if choice.source not in _MEASURED:
        return None, f"the TVM config comes from a {choice.source} answer, not a record of this shape"
    if device.type != "cuda":
        return None, f"inputs are on {device.type}, the TVM step runs on CUDA"
    if not dispatch.tvm_runtime_available():
        return None, "the TVM runtime (tvm_ffi, from the apache-tvm-ffi wheel) is not importable"
    from pathtune.codegen._registry import call_unsupported

    why = call_unsupported("tvm", _spec(), "decode", gated=dims.gated)
    if why is not None:
        return None, f"the TVM step cannot run this call: {why}"
    if cache_dtype != q_dtype or cache_dtype not in _KERNEL_DTYPES:
        return None, (f"the TVM step keeps the cache in q's dtype (bf16/fp16/fp32); q is {_dtype_name(q_dtype)}, "
                      f"the cache {_dtype_name(cache_dtype)}")
    from pathtune.codegen._knobs import resolve
    from pathtune.codegen.tvm.module_store import arch_of, find_decode_modules, store_roots
    from pathtune.codegen.tvm.params import UnsupportedConfig

    try:
        params = resolve("tvm", "decode", choice.config, (dims.D, dims.DV))
    except (TypeError, ValueError, UnsupportedConfig) as e:
        return None, f"the TVM config does not make TVM params ({e})"
    arch = arch_of(d.env_for(device).get("compute_capability"))
    pack = d.pack
    roots = store_roots(getattr(pack, "source", None))
    found = find_decode_modules(params, dims, arch, roots) if arch else None
    if found is None:
        where = ", ".join(map(str, roots)) or "no module store exists"
        return None, (f"no prebuilt TVM decode modules for {dims} with {params.decode_dict()} ({arch}) in {where}; "
                      f"set {_env.TVM_MODULES.name} to a folder built by "
                      "`python -m pathtune.codegen.tvm.build_decode_bench`, or export the pack with --tvm-modules")
    try:
        return _load_tvm_step(found, dims, params), ""
    except Exception as e:  # noqa: BLE001 - a module that does not load must not fail the decode call
        return None, f"the TVM modules in {found.paths['decode'].parent} did not load ({type(e).__name__}: {e})"


def plan_for(device: torch.device, head_dim: int, head_dim_v: int, heads_q: int, heads_kv: int,
             q_dtype: torch.dtype, cache_dtype: torch.dtype, gated: bool, keys: int, batch: int,
             triton_params=None, tokens: int = 1) -> DecodePlan:
    """The plan of a decode step (cached per key on the process-wide dispatcher).

    ``keys``: cache length + new tokens; ``tokens``: new tokens per call; ``triton_params``: a callable
    giving the TritonParams of the Triton step (asked only when Triton runs and the dispatcher's choice
    applies; default: the decode pass's choice merged with the heuristic).  A call of several tokens is
    served the records of its token-count bucket (Triton only: the TVM step decodes one token), else the
    untuned config.
    """
    from pathtune.specs import Workload
    from pathtune.specs.workload import batch_bucket, query_bucket, seq_bucket

    d = dispatch.get_dispatcher()
    key = (device.type, device.index, head_dim, head_dim_v, heads_q, heads_kv, q_dtype, cache_dtype, gated,
           seq_bucket(keys), batch_bucket(batch), query_bucket(tokens))
    plan = d.decode_plans.get(key)
    if plan is not None:
        return plan
    wl = Workload(head_dim=head_dim, head_dim_v=head_dim_v, heads_q=heads_q, heads_kv=heads_kv,
                  dtype=_dtype_name(q_dtype), use_gate=gated, pass_="decode", seq_bucket=key[9], batch_bucket=key[10],
                  query_bucket=key[11])
    plan, fallback = None, ""
    if wl.query_bucket > 1:
        choice = d.choose("decode", wl, device, ("triton",))
        params = _triton_params(choice, head_dim, head_dim_v)
    else:
        best = d.choose("decode", wl, device, ("triton", "tvm"))
        if best.backend == "tvm":
            from pathtune.codegen.tvm.params import KernelDims

            dims = KernelDims(H=heads_kv, HQ=heads_q, D=head_dim, DV=head_dim_v, dtype=_dtype_name(q_dtype),
                              gated=gated)
            step, why = _tvm_step_or_reason(d, best, device, dims, cache_dtype, q_dtype)
            if step is not None:
                plan = DecodePlan("tvm", best, tvm_step=step)
            else:
                fallback = f"TVM decode ({best.detail or best.source}) not run: {why}"
                _tell(f"pathtune: decode {_key_text(key)}: {fallback}; running the Triton step")
        if plan is None:
            choice = d.choose("decode", wl, device, ("triton",))
            params = triton_params() if triton_params is not None else _triton_params(choice, head_dim, head_dim_v)
    if plan is None:
        params, adjusted = _fill_gpu(params, choice, d.env_for(device).get("sm_count"), batch * heads_kv, keys)
        plan = DecodePlan("triton", choice, triton_params=params, fallback=fallback, adjusted=adjusted)
    d.decode_plans[key] = plan
    _report(key, plan)
    return plan


def decode_plan(q, k, v, g, cache) -> DecodePlan:
    """``plan_for`` of a ``path_attention_decode`` call (q [B,T,HQ,D], k [B,T,H,D], v [B,T,H,DV])."""
    B, T, HQ, D = q.shape

    keys = cache._hint + T   # the host's last known length: no device read

    def triton_params():
        return tuned_triton_params("decode", q, k, v, g, keys, "triton")

    return plan_for(q.device, D, v.shape[-1], HQ, k.shape[2], q.dtype, cache.k_buffer.dtype, g is not None,
                    keys, B, triton_params, tokens=T)


def tuned_triton_params(pass_: str, q, k, v, g, keys: int, backend: str):
    """TritonParams for a prefill ("fwd") or decode step on CUDA from the dispatcher (pack / perf_db /
    heuristic): the forward plan's knobs, plus the "decode" pass's choice for a decode step; None (heuristic
    inside the launcher) off CUDA or for other backends. ``keys``: tokens attended (length bucket)."""
    if q.device.type != "cuda" or backend not in ("auto", "triton"):
        return None
    from pathtune.specs.canonical import dtype_name
    from pathtune.specs.workload import batch_bucket, seq_bucket

    B, _, HQ, D = q.shape
    H, DV = k.shape[2], v.shape[-1]
    key = (pass_, q.device.index, D, DV, HQ, H, q.dtype, g is not None, seq_bucket(keys), batch_bucket(B))
    cached = dispatch.get_dispatcher().decode_plans   # forgotten by dispatch.clear_cache()
    params = cached.get(("params", key))
    if params is None:
        import json

        from pathtune.codegen._knobs import resolve

        plan = dispatch.select_plan(q.device, D, DV, HQ, H, dtype_name(q.dtype), g is not None, keys, B, False)
        merged = json.loads(plan.params_json)
        if pass_ == "decode":
            from pathtune.specs import Workload

            wl = Workload(head_dim=D, head_dim_v=DV, heads_q=HQ, heads_kv=H, dtype=dtype_name(q.dtype),
                          use_gate=g is not None, pass_="decode", seq_bucket=key[8], batch_bucket=key[9])
            merged.update(dispatch.select_config("decode", wl, q.device).config.to_dict())
        params = cached[("params", key)] = resolve("triton", pass_, merged, (D, DV))
    return params


def _fill_gpu(params, choice, sm_count, rows: int, keys: int):
    """(params, "") or (params with more ``decode_splits``, what changed and why).

    Only for a config that is not a record of this key (``choice.source`` neither pack nor perf_db): a
    measured config stays as measured.  ``rows``: batch x kv heads (the decode grid's first axis).  The
    splits rise to the smallest value of their spec domain with rows x splits >= ``sm_count``, at most
    the number of key tiles (``keys`` / decode_block_n), never below the config's own."""
    if params is None or not sm_count or rows <= 0 or choice.source in ("pack", "perf_db"):
        return params, ""
    domain = sorted(_spec().knobs["decode_splits"].domain)
    tiles = -(-keys // params.decode_block_n)
    wanted = next((s for s in domain if rows * s >= sm_count), domain[-1])
    splits = min(wanted, max([s for s in domain if s <= tiles] or [domain[0]]))
    if splits <= params.decode_splits:
        return params, ""
    note = (f"decode_splits {params.decode_splits} -> {splits} (a {choice.source} config: {rows} batch x kv-head rows "
            f"x {params.decode_splits} splits would leave some of the {sm_count} multiprocessors idle)")
    return dataclasses.replace(params, decode_splits=splits), note


def _triton_params(choice, D: int, DV: int):
    from pathtune.codegen._knobs import resolve

    return resolve("triton", "decode", choice.config, (D, DV))


def _key_text(key: tuple) -> str:
    (dev_type, dev_index, D, DV, HQ, H, qdt, cdt, gated, sb, bb, qb) = key
    dev = dev_type if dev_index is None else f"{dev_type}:{dev_index}"
    return (f"{dev} D={D} DV={DV} HQ={HQ} H={H} {_dtype_name(qdt)} cache {_dtype_name(cdt)} gate={int(gated)} "
            f"keys<={sb} seqs<={bb} tokens{'=1' if qb == 1 else f'<={qb}'}")


_told: set[str] = set()


def _tell(line: str) -> None:
    """Log (INFO) and, with PATHTUNE_PRINT_DISPATCH=1, print a line once per process."""
    if line in _told:
        return
    _told.add(line)
    _log.info("%s", line)
    if _env.PRINT_DISPATCH.get():
        print(f"[pathtune] {line}", file=sys.stderr)


def _report(key: tuple, plan: DecodePlan) -> None:
    dispatch.report_choice(f"dispatch decode {_key_text(key)} -> {plan.backend}: {plan.describe()}")
