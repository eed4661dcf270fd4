"""Runtime dispatch: which kernel (backend + tuned config) runs a ``path_attention`` call.

Per call the dispatcher answers one key -- (device, pass, ``Workload``: head dims, heads (GQA),
dtype, gate, power-of-two length and batch buckets, varlen; which backends may run; whether a
backward will follow) -- with a ``Plan``. The answer comes, in this order, from

1. the loaded **pack**, exact workload key                           (source ``pack``)
2. **perf_db** (``PerfDB.best``), exact workload key                  (source ``perf_db``)
3. the nearest length bucket, pack first, then perf_db (decode: at most ``DECODE_LENGTH_REACH``
   powers of two away); then the same shape at the nearest other batch bucket (tuners fix a
   token budget)                                                     (source ``bucket``)
4. a result of the same shape with the FoX gate the other way: its schedule knobs (tiles, warps,
   stages), precision and beta-clip knobs from the heuristic         (source ``gate``)
5. the pack's per-pass default config                               (source ``default``)
6. the backend's untuned config (the spec's ``head_dim_defaults``)   (source ``heuristic``)

and is cached per key, so only the first call of a shape pays for the lookup; later calls cost a
dict lookup (``benchmarks/dispatch_overhead.py`` prints the number). The dispatcher never
benchmarks: tuning is ``pathtune tune`` / ``pathtune bench --record``, and the results reach the
runtime through perf_db or an exported pack.

Candidates for the forward are Triton and, on CUDA when its runtime is importable, TVM; the
backward always runs Triton. A differentiated call whose forward is Triton runs one Triton op for
both passes: its params take every knob of the bwd pass's choice (the knobs both passes share, e.g.
``chunk_size``, ``ut_precision`` or ``beta_clip_eps``, decide the gradients, and only the bwd tune's
accuracy gate checked them on gradients: a forward-gated ``ut_precision=tf32`` or β clip passes o but
fails dβ by ~0.2) and the forward-only schedule knobs (tiles, warps, stages) of the fwd choice. When the
forward is TVM, the Triton backward (which recomputes its chunk state from q, k, w, beta and the
saved o, lse) runs with the bwd choice's own knobs. Under torch.compile only Triton is traced.

Packs: ``load_pack(path)`` (or ``PATHTUNE_PACK``, read on the first lookup) installs a read-only
pack; a pack measured under other hard keys (GPU, compute capability, Triton major.minor, spec)
is refused with a warning naming the mismatch, and lookups go on with perf_db and the heuristic;
soft differences (driver, torch, CUDA patch) are served with one warning. perf_db is opened
lazily, read-only (``PerfDB(read_only=True)``: no migration, a 200 ms lock wait); a database that
is missing, locked, at another schema revision or corrupt gives one warning and is not asked
again in this process (the heuristic answers). ``PATHTUNE_DISPATCH_DB=0`` never opens it.

``PATHTUNE_PRINT_DISPATCH=1`` prints each new key -> plan with its source once (always logged at
DEBUG on the ``pathtune.dispatch`` logger).
"""
from __future__ import annotations

import functools
import importlib.util
import logging
import sys
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

import torch

from pathtune import _env
from pathtune.provenance import current_keys  # what is current: defined there, exported here too
from pathtune.specs import Config, KnobSpace, Workload, load_spec
from pathtune.specs.workload import batch_bucket, seq_bucket

__all__ = ["Choice", "Plan", "Dispatcher", "SOURCES", "get_dispatcher", "load_pack", "unload_pack", "loaded_pack",
           "select_plan", "select_config", "clear_cache", "PackRefusedWarning", "DispatchWarning",
           "current_keys", "tvm_available", "tvm_runtime_available"]

_log = logging.getLogger("pathtune.dispatch")

SOURCES = ("pack", "perf_db", "bucket", "gate", "default", "gpu", "heuristic")
_MAX_BATCH_LOG2 = 10   # batch buckets 1 .. 1024 are searched when the caller's own has no result
_UNSET: Any = object()
# Decode records serve other length buckets at most this many powers of two away: a decode step's tiles,
# warps and splits follow the cache length.  On the H200 (perf_db/shipped/H200-20261203T202551Z-decode-sweep.json,
# every schedule timed per key) the 4K pick run at 32K, or the reverse, was slower than the untuned config
# in 4 of 8 keys (by 21-41 %), faster in 2 (by 2-9 %).
DECODE_LENGTH_REACH = 1


def within_reach(pass_: str, served_bucket: int, wanted_bucket: int) -> bool:
    """May a record of length bucket ``served_bucket`` serve a call of ``wanted_bucket``?  Always for the
    forward and backward; within ``DECODE_LENGTH_REACH`` powers of two for decode."""
    if pass_ != "decode":
        return True
    return abs(int(served_bucket).bit_length() - int(wanted_bucket).bit_length()) <= DECODE_LENGTH_REACH


class DispatchWarning(RuntimeWarning):
    """The dispatcher could not use a tuning source (perf_db, a pack) and fell back."""


class PackRefusedWarning(DispatchWarning):
    """A pack measured under other hard keys (GPU, cc, Triton major.minor, spec) was not installed."""


@dataclass(frozen=True)
class Choice:
    """One pass's answer: run ``backend`` with ``config`` (the pass's knobs). ``source``: one of SOURCES."""

    pass_: str
    backend: str
    config: Config
    source: str
    detail: str = ""

    def describe(self) -> str:
        knobs = ", ".join(f"{k}={v}" for k, v in self.config.items())
        extra = f"; {self.detail}" if self.detail else ""
        return f"{self.pass_}: {self.backend} [{knobs}] (source: {self.source}{extra})"


@dataclass(frozen=True)
class Plan:
    """What a call runs: ``backend`` ("triton" or "tvm") with ``params_json``.

    triton: the config the custom op runs, every knob in the spec's spelling as canonical JSON (forward
    knobs, plus the knobs of ``bwd`` when a backward follows; ``codegen._knobs.config_json``); the op turns
    it into kernel params (``codegen._knobs.resolve_json``); tvm: the forward Config's JSON, and the Triton
    backward's config in ``bwd_params_json`` (TVM forward, Triton backward).
    """

    backend: str
    params_json: str
    fwd: Choice
    bwd: Optional[Choice] = None
    bwd_params_json: Optional[str] = None   # the Triton backward's config JSON (when one follows)

    @property
    def source(self) -> str:
        return self.fwd.source

    def describe(self) -> str:
        out = self.fwd.describe()
        if self.bwd is not None:
            out += "; " + self.bwd.describe()
        return out

    def run(self, q, k, v, w, beta, g, scale: float, cu_seqlens: Optional[torch.Tensor], placement: str):
        """Run the plan's kernels on validated inputs -> (o, lse float32): the Triton custom op at
        ``params_json`` (``run_triton``), or the TVM forward (with the Triton backward at ``bwd_params_json``
        when one follows)."""
        if self.backend == "tvm":
            if cu_seqlens is not None:
                cu_seqlens = cu_seqlens.to(device=q.device, dtype=torch.int64)
            if self.bwd_params_json is None:
                from pathtune.codegen.tvm import path_attention_tvm

                return path_attention_tvm(q, k, v, w, beta, g, scale=scale, cu_seqlens=cu_seqlens,
                                          config=self.fwd.config)
            from pathtune.codegen.tvm.training import path_attention_tvm_trainable

            return path_attention_tvm_trainable(q, k, v, w, beta, g, scale=scale, cu_seqlens=cu_seqlens,
                                                config=self.fwd.config, bwd_config_json=self.bwd_params_json,
                                                gate_placement=placement)
        return run_triton(self.params_json, q, k, v, w, beta, g, scale, cu_seqlens, placement)


def run_triton(params_json: str, q, k, v, w, beta, g, scale: float, cu_seqlens: Optional[torch.Tensor],
               placement: str):
    """The Triton custom op ``pathtune::path_attn_fwd`` at the config ``params_json`` -> (o, lse float32):
    what an eager plan runs (``Plan.run``) and what a ``torch.compile``d call traces (its plan's text is a
    graph constant there).  cu_seqlens: any integer dtype, on any device."""
    from pathtune.codegen.triton import autograd  # noqa: F401  (registers torch.ops.pathtune.*)

    if cu_seqlens is not None:
        cu_seqlens = cu_seqlens.to(device=q.device, dtype=torch.int64)
    o, lse, _ = torch.ops.pathtune.path_attn_fwd(q, k, v, w, beta, g, cu_seqlens, float(scale), params_json,
                                                 placement)
    return o, lse


# -- helpers ---------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _importable(*modules: str) -> bool:
    """Every one of ``modules`` can be imported (found without importing it); cached per process."""
    try:
        return all(importlib.util.find_spec(m) is not None for m in modules)
    except (ImportError, ValueError):
        return False


def tvm_available() -> bool:
    """The TVM runtime (tvm_ffi) and compiler (tvm) can be imported (found without importing them)."""
    return _importable("tvm_ffi", "tvm")


def tvm_runtime_available() -> bool:
    """The TVM runtime (tvm_ffi) can be imported: enough to run prebuilt modules (no compiler needed)."""
    return _importable("tvm_ffi")


def _local_knobs(backend: str, pass_: str) -> tuple[str, ...]:
    """Knobs a backend reads beyond the spec's for a pass (the spec's ``backends.<name>.knobs``; records
    store them; dispatch keeps them)."""
    return tuple(load_spec().backend_knobs(backend, pass_))


_SPACES: dict[str, KnobSpace] = {}


def _space(pass_: str) -> KnobSpace:
    space = _SPACES.get(pass_)
    if space is None:
        space = _SPACES[pass_] = KnobSpace(load_spec(), pass_)
    return space


def pass_config(pass_: str, params: Any) -> Config:
    """The spec Config of one pass for kernel params: that pass's knobs only, in the spec's spelling
    (beta_clip_eps 'off'), as the tuner, the dispatcher and perf_db key them."""
    from pathtune.codegen._knobs import config_of

    values = config_of(getattr(params, "BACKEND", "triton"), params)
    return Config({n: values[n] for n in _space(pass_).knobs})


def untuned_choice(pass_: str, wl: Workload, backend: str, detail: str) -> Choice:
    """The backend's untuned config of the pass for ``wl`` (the spec's head-dim defaults over its defaults;
    source ``heuristic``), ``detail`` saying why."""
    space = _space(pass_)
    untuned = load_spec().backend_defaults(backend, wl.head_dim, wl.head_dim_v)
    return Choice(pass_, backend, Config({n: untuned[n] for n in space.knobs}), "heuristic", detail)


def _warn(message: str, category: type[Warning] = DispatchWarning) -> None:
    warnings.warn(message, category, stacklevel=4)
    _log.warning("%s", message)


# -- perf_db ---------------------------------------------------------------------------------------

class _Unusable(Exception):
    """perf_db cannot serve lookups (message says why)."""


DISPATCH_DB_LOCK_WAIT_MS = 200   # a kernel call waits at most this long for a writer's lock


def open_dispatch_db(url: Optional[str] = None):
    """perf_db opened for lookups, or raise ``_Unusable`` saying why it cannot be used.

    Opened like the read commands open it (``PerfDB.open_read``): nothing in the user's database changes,
    a missing default database is answered by the shipped results alone (built once into the cache
    folder), and shipped files the database has not ingested are served from an in-memory copy, so a
    kernel call never creates, migrates or fills the database and still sees the shipped records.
    """
    from pathtune.perf_db import DatabaseLockedError, NoDatabaseError, PerfDB, PerfDBError

    try:
        db = PerfDB.open_read(url, shipped=True, current_keys=current_keys, lock_wait_ms=DISPATCH_DB_LOCK_WAIT_MS)
    except NoDatabaseError as e:
        raise _Unusable(f"{e}; tune with `pathtune tune` or `pathtune bench --record`, or load a pack "
                        "(pathtune.load_pack / PATHTUNE_PACK)") from None
    except (DatabaseLockedError, PerfDBError) as e:
        raise _Unusable(_short(e)) from None
    except Exception as e:  # noqa: BLE001 - a corrupt file, an unreachable server: say which database
        from pathtune.perf_db import resolve_url
        from pathtune.perf_db._engine import safe_url

        raise _Unusable(f"cannot read {safe_url(resolve_url(url)[0])}: {_short(e)}") from None
    for note in getattr(db, "read_notes", ()):
        _log.debug("dispatch: %s", note)
    return db


def _short(e: BaseException) -> str:
    text = str(getattr(e, "orig", None) or e)
    return (text.splitlines()[0] if text else type(e).__name__)[:300]


# -- the dispatcher --------------------------------------------------------------------------------

class Dispatcher:
    """Cached per-key kernel selection over a pack, perf_db and the heuristic.

    ``env_info``: ``collect_env()`` output to match results against (default: collected on first
    use, per CUDA device). ``db``: a ``PerfDB`` (or any object with its ``best``), ``None`` for no
    database, default: opened lazily with ``open_dispatch_db``. ``pack``: a ``perf_db.Pack``,
    ``None``, default: ``PATHTUNE_PACK`` on first use. ``gpu_only``: answer only CUDA devices from
    packs / perf_db (tuned configs are per GPU; CPU calls -- the Triton interpreter -- get the
    heuristic); tests pass False to exercise the order on the CPU.
    """

    def __init__(self, *, env_info: Optional[Mapping[str, Any]] = None, db: Any = _UNSET, pack: Any = _UNSET,
                 gpu_only: bool = True) -> None:
        self._env_info = dict(env_info) if env_info is not None else None
        self._envs: dict[Optional[int], dict[str, Any]] = {}
        self._db = db
        self._pack = pack
        self.gpu_only = gpu_only
        self._plans: dict[tuple, Plan] = {}
        self._choices: dict[tuple, Choice] = {}
        self.decode_plans: dict[tuple, Any] = {}   # runtime/decode_dispatch.py's per-key decode plans
        self._lock = threading.RLock()
        self._warned: set[str] = set()
        self._stale_checked = False
        self.db_queries = 0      # PerfDB.best calls (tests: the cached path asks nothing)
        self.pack_queries = 0    # Pack.lookup calls

    # -- state ------------------------------------------------------------------------------------

    def clear_cache(self) -> None:
        with self._lock:
            self._plans.clear()
            self._choices.clear()
            self.decode_plans.clear()

    def _warn_once(self, message: str, category: type[Warning] = DispatchWarning) -> None:
        if message not in self._warned:
            self._warned.add(message)
            _warn(message, category)

    def env_for(self, device: torch.device) -> dict[str, Any]:
        index = device.index if device.type == "cuda" else None
        env = self._envs.get(index)
        if env is not None:
            return env
        with self._lock:
            if self._env_info is not None:
                env = dict(self._env_info)
            else:
                from pathtune.runtime.environment import collect_env

                env = collect_env()
                if index not in (None, 0) and torch.cuda.is_available() and not _env.GPU_NAME.get():
                    props = torch.cuda.get_device_properties(index)
                    env.update(gpu_name=props.name, compute_capability=f"{props.major}.{props.minor}",
                               sm_count=props.multi_processor_count, gpu_memory_bytes=props.total_memory)
            self._envs[index] = env
            return env

    @property
    def pack(self):
        """The installed pack (None: none). ``PATHTUNE_PACK`` is read the first time this is asked."""
        if self._pack is _UNSET:
            with self._lock:
                if self._pack is _UNSET:
                    self._pack = None
                    path = _env.PACK.get()
                    if path is not None:
                        from pathtune.perf_db import PerfDBError

                        try:
                            self.install_pack(path, strict=False)
                        except PerfDBError as e:
                            self._warn_once(f"pathtune: {_env.PACK.name}={path} is not used: {e}")
        return self._pack

    def install_pack(self, pack: Any, *, strict: bool = False, device: Optional[torch.device] = None):
        """Install a pack (a path or a ``perf_db.Pack``) after checking it against this machine.

        Hard-key mismatch: ``strict`` raises ``PackMismatch``; otherwise a ``PackRefusedWarning``
        says why, nothing is installed (the previous pack is dropped) and None is returned. Soft
        differences warn once (``SoftMismatchWarning``). Returns the installed Pack.
        """
        from pathtune.perf_db import Pack, PackMismatch
        from pathtune.perf_db import load_pack as read_pack

        if not isinstance(pack, Pack):
            pack = read_pack(pack)
        if device is None:
            device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
        env = self.env_for(device)
        try:
            pack.check(env)
        except PackMismatch as e:
            with self._lock:
                self._pack = None
                self.clear_cache()
            if strict:
                raise
            self._warn_once(f"pathtune: pack refused: {e}; kernels use perf_db / heuristic configs instead",
                            PackRefusedWarning)
            return None
        with self._lock:
            self._pack = pack
            self.clear_cache()
        _log.info("pathtune: installed pack %s (%d entries, %s)", pack.source, len(pack.entries),
                  pack.metadata.get("gpu_name"))
        return pack

    def uninstall_pack(self) -> None:
        """Drop the pack (``PATHTUNE_PACK`` is not re-read afterwards)."""
        with self._lock:
            self._pack = None
            self.clear_cache()

    def database(self):
        """perf_db for lookups, or None (disabled, or unusable: warned once)."""
        if self._db is _UNSET:
            with self._lock:
                if self._db is _UNSET:
                    self._db = None
                    if _env.DISPATCH_DB.get():
                        try:
                            self._db = open_dispatch_db()
                        except _Unusable as e:
                            self._warn_once(f"pathtune: perf_db not used: {e}; kernels use "
                                            f"{'the pack or ' if self._pack else ''}heuristic configs")
                        except Exception as e:  # noqa: BLE001 - never fail a kernel call over the database
                            self._warn_once(f"pathtune: perf_db not used ({type(e).__name__}: {_short(e)}); "
                                            "kernels use heuristic configs")
        return self._db

    def _warn_if_only_stale(self, env: Mapping[str, Any], pass_: str, backends: Sequence[str]) -> None:
        """Once per process, on the first miss: say so when this GPU's results are all stale."""
        self._stale_checked = True
        try:
            rows = self._db.query(gpu=env.get("gpu_name") or "cpu", pass_=pass_, status="ok", backend=tuple(backends),
                                  include_stale=True, limit=200, order="newest")
        except Exception as e:  # noqa: BLE001
            _log.debug("dispatch: stale check failed: %s", e)
            return
        rows = [r for r in rows if r["gpu"] == env.get("gpu_name") and r["cc"] == env.get("compute_capability")]
        if rows and all(r["stale"] for r in rows):
            self._warn_once(f"pathtune: perf_db holds {len(rows)}{'+' if len(rows) == 200 else ''} {pass_} results for "
                            f"{env.get('gpu_name')} measured with other kernel code ({rows[0]['stale'][0]}); stale "
                            "results are not served, kernels use another GPU's current records of the same "
                            "architecture where there are some, else heuristic configs: re-tune (`pathtune tune`) "
                            "or prune them (`pathtune db gc`)")

    def _drop_db(self, e: BaseException) -> None:
        db, self._db = self._db, None
        self._warn_once(f"pathtune: perf_db lookups failed ({type(e).__name__}: {_short(e)}); not asked again "
                        "in this process, kernels use pack / heuristic configs")
        try:
            db.close()
        except Exception:  # noqa: BLE001
            pass

    # -- selection --------------------------------------------------------------------------------

    def choose(self, pass_: str, workload: Workload, device: torch.device,
               backends: Sequence[str] = ("triton",)) -> Choice:
        """The config of one pass for ``workload`` on ``device`` among ``backends`` (cached)."""
        key = (pass_, workload, device.type, device.index, tuple(backends))
        hit = self._choices.get(key)
        if hit is None:
            with self._lock:
                hit = self._choices.get(key)
                if hit is None:
                    hit = self._choose(pass_, workload, device, tuple(backends))
                    self._choices[key] = hit
        return hit

    def _valid(self, pass_: str, config: Mapping[str, Any], wl: Workload, where: str,
               backend: str = "triton") -> Optional[Config]:
        """The spec knobs of ``config`` completed and checked for ``wl`` (None: not valid), plus the
        backend's own knobs outside the spec (the TVM decode's layout knobs) when they are valid."""
        space = _space(pass_)
        local = {k: config[k] for k in _local_knobs(backend, pass_) if k in config}
        if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in local.values()):
            _log.debug("dispatch: %s config %s has invalid %s knobs %s", where, dict(config), backend, local)
            return None
        full = dict(config)
        for name, knob in space.knobs.items():  # older entries may lack a knob added since: its default
            full.setdefault(name, knob.default)
        full = {k: v for k, v in full.items() if k in space.knobs}
        problems = space.validate(full, wl)
        if problems:
            _log.debug("dispatch: %s config %s is not valid for %s: %s", where, dict(config), wl, problems)
            return None
        return Config({**full, **local})

    def _choose(self, pass_: str, wl: Workload, device: torch.device, backends: tuple[str, ...]) -> Choice:
        fallback = backends[0]
        if device.type != "cuda" and self.gpu_only:
            return untuned_choice(pass_, wl, fallback, f"{device.type} device: tuned configs are per GPU")
        env = self.env_for(device)
        from pathtune.perf_db import PackMismatch

        pack_hit = None
        pack = self.pack
        if pack is not None:
            try:
                self.pack_queries += 1
                pack_hit = pack.lookup(wl, env_info=env, backends=backends, current_keys=current_keys)
            except PackMismatch as e:
                self.uninstall_pack()
                self._warn_once(f"pathtune: pack refused: {e}; kernels use perf_db / heuristic configs instead",
                                PackRefusedWarning)
            except Exception as e:  # noqa: BLE001
                self._warn_once(f"pathtune: pack lookup failed ({type(e).__name__}: {_short(e)}); skipped")
            if pack_hit is not None:
                config = self._valid(pass_, pack_hit.config, wl, "pack", pack_hit.backend)
                if config is None:
                    pack_hit = None
                else:
                    pack_src = Path(pack.source).name
                    if pack_hit.match == "exact":
                        return Choice(pass_, pack_hit.backend, config, "pack", f"{pack_src}, exact key")
        db_row = None
        db = self.database()
        if db is not None:
            try:
                self.db_queries += 1
                db_row = db.best(env, pass_, wl, backend=backends[0] if len(backends) == 1 else None)
            except Exception as e:  # noqa: BLE001 - locked / corrupt / gone: fall back, once
                self._drop_db(e)
                db_row = None
            if db_row is None and self._db is not None and not self._stale_checked:
                self._warn_if_only_stale(env, pass_, backends)
            if db_row is not None and db_row["backend"] not in backends:
                db_row = None
            if db_row is not None:
                config = self._valid(pass_, db_row["config"], wl, "perf_db", db_row["backend"])
                if config is None:
                    db_row = None
                else:
                    if db_row.get("warning"):
                        self._warn_once(f"pathtune: perf_db result for {db_row.get('gpu')} was {db_row['warning']}; "
                                        "served anyway", _soft_warning())
                    if db_row["match"] == "exact":
                        return Choice(pass_, db_row["backend"], config, "perf_db",
                                      f"measurement #{db_row['measurement_id']}, {db_row['median_ms']:.4g} ms")
        if pack_hit is not None and pack_hit.match == "nearest" and within_reach(pass_, pack_hit.seq_bucket,
                                                                               wl.seq_bucket):
            return Choice(pass_, pack_hit.backend, self._valid(pass_, pack_hit.config, wl, "pack", pack_hit.backend),
                          "bucket",
                          f"pack {Path(pack.source).name}, length bucket {pack_hit.seq_bucket} for {wl.seq_bucket}")
        if db_row is not None and within_reach(pass_, db_row["seq_bucket"], wl.seq_bucket):  # nearest
            return Choice(pass_, db_row["backend"],
                          self._valid(pass_, db_row["config"], wl, "perf_db", db_row["backend"]), "bucket",
                          f"perf_db measurement #{db_row['measurement_id']}, length bucket {db_row['seq_bucket']} "
                          f"for {wl.seq_bucket}")
        other = self._other_batch_bucket(pass_, wl, env, backends)
        if other is not None:
            return other
        other = self._other_gate(pass_, wl, env, backends)
        if other is not None:
            return other
        if pack_hit is not None and pack_hit.match == "default":
            return Choice(pass_, pack_hit.backend, self._valid(pass_, pack_hit.config, wl, "pack", pack_hit.backend),
                          "default",
                          f"pack {Path(pack.source).name} default for {pass_}")
        other = self._other_gpu(pass_, wl, env, backends)
        if other is not None:
            return other
        return untuned_choice(pass_, wl, fallback, "no tuned config for this key")

    def _results_for(self, pass_: str, alt: Workload, env: Mapping[str, Any], backends: tuple[str, ...]):
        """Results for workload ``alt``, in order: the pack's (exact or nearest length bucket, not its
        per-pass default), then perf_db's best; each as (backend, config, where, seq_bucket)."""
        pack = self._pack if self._pack is not _UNSET else None
        if pack is not None:
            try:
                self.pack_queries += 1
                hit = pack.lookup(alt, env_info=env, backends=backends, current_keys=current_keys)
            except Exception:  # noqa: BLE001 - handled (and warned) by the caller's own lookup
                hit = None
            if hit is not None and hit.match != "default" and within_reach(pass_, hit.seq_bucket, alt.seq_bucket):
                yield hit.backend, hit.config, f"pack {Path(pack.source).name}", hit.seq_bucket
        hit = self._db_result(pass_, alt, env, backends)
        if hit is not None:
            yield hit

    def _db_result(self, pass_: str, alt: Workload, env: Mapping[str, Any], backends: tuple[str, ...], *,
                   other_gpus: bool = False):
        """perf_db's best result for workload ``alt`` (``PerfDB.best``; ``other_gpus``: another GPU's of this one's
        architecture) as (backend, config, where, seq_bucket), or None (none, out of reach, or the database
        failed: dropped)."""
        db = self._db if self._db is not _UNSET else None
        if db is None:
            return None
        try:
            self.db_queries += 1
            row = db.best(env, pass_, alt, backend=backends[0] if len(backends) == 1 else None, other_gpus=other_gpus)
        except Exception as e:  # noqa: BLE001
            self._drop_db(e)
            return None
        if row is None or row["backend"] not in backends or not within_reach(pass_, row["seq_bucket"],
                                                                              alt.seq_bucket):
            return None
        where = f"perf_db measurement #{row['measurement_id']}" + (f" on {row['gpu']}" if other_gpus else "")
        return row["backend"], row["config"], where, row["seq_bucket"]

    def _other_batch_bucket(self, pass_: str, wl: Workload, env: Mapping[str, Any],
                            backends: tuple[str, ...]) -> Optional[Choice]:
        """Results of the same shape measured at another batch bucket (nearest first, ties to the
        larger; within one, the pack before perf_db): tuners fix a token budget, so the batch of a
        tuned workload rarely equals the caller's. Asked only when the caller's own bucket has nothing."""
        import dataclasses

        for b in _batch_buckets_by_distance(wl.batch_bucket)[1:]:
            for backend, config, where, seq in self._results_for(pass_, dataclasses.replace(wl, batch_bucket=b),
                                                                 env, backends):
                valid = self._valid(pass_, config, wl, where, backend)
                if valid is not None:
                    return Choice(pass_, backend, valid, "bucket", f"{where}, batch bucket {b} for "
                                  f"{wl.batch_bucket}, length bucket {seq} for {wl.seq_bucket}")
        return None

    def _other_gpu(self, pass_: str, wl: Workload, env: Mapping[str, Any],
                   backends: tuple[str, ...]) -> Optional[Choice]:
        """perf_db's result for the same key measured on another GPU of this one's compute capability, CUDA and
        backend library versions (an H800 or GH200 served the H100's or H200's tuned config; ``PerfDB.best``
        with ``other_gpus`` picks the GPU), the caller's batch bucket first, then the nearest.  Asked after
        every result and pack entry of this GPU: a config tuned on another model of the same architecture
        beats the untuned one, but is not this GPU's measurement."""
        import dataclasses

        for b in _batch_buckets_by_distance(wl.batch_bucket):
            hit = self._db_result(pass_, dataclasses.replace(wl, batch_bucket=b), env, backends, other_gpus=True)
            if hit is None:
                continue
            backend, config, where, seq = hit
            valid = self._valid(pass_, config, wl, where, backend)
            if valid is not None:
                return Choice(pass_, backend, valid, "gpu",
                              f"{where} (same compute capability, CUDA and {backend}), batch bucket {b} for "
                              f"{wl.batch_bucket}, length bucket {seq} for {wl.seq_bucket}")
        return None

    def _other_gate(self, pass_: str, wl: Workload, env: Mapping[str, Any],
                    backends: tuple[str, ...]) -> Optional[Choice]:
        """The schedule of a result for the same shape with the FoX gate the other way (PaTH for a
        PaTH-FoX call, or the reverse), precision and semantics knobs from the heuristic.

        The kernels differ only in the gate terms, so tiles, warps and stages carry over; the
        precision and beta-clip knobs passed that result's accuracy gate on the other function (the
        decay of FoX damps the long-range terms where a tf32 product's error accumulates), so they
        do not. Asked after every result of the caller's own gate setting, before the pack default."""
        import dataclasses

        alt = dataclasses.replace(wl, use_gate=not wl.use_gate)
        space = _space(pass_)
        other = "PaTH-FoX" if alt.use_gate else "PaTH"
        for backend, config, where, _ in self._results_for(pass_, alt, env, backends):
            base = untuned_choice(pass_, wl, backend, "").config
            mixed = {name: (config[name] if knob.role == "schedule" and name in config else base[name])
                     for name, knob in space.knobs.items()}
            valid = self._valid(pass_, mixed, wl, f"{where} (gate transfer)")
            if valid is not None:
                return Choice(pass_, backend, valid, "gate",
                              f"schedule knobs of the {other} result ({where}), precision and semantics knobs untuned")
        return None

    def plan(self, device: torch.device, head_dim: int, head_dim_v: int, heads_q: int, heads_kv: int, dtype: str,
             use_gate: bool, max_seqlen: int, num_seqs: int, varlen: bool, *,
             backends: Sequence[str] = ("triton",), grad: bool = False) -> Plan:
        """The plan of a ``path_attention`` call (cached per key; the first call of a key looks it up).

        ``backends``: the candidates in order of preference for the heuristic ("triton" first);
        "tvm" is dropped when a backward follows (``grad``), off CUDA, or without its runtime.
        """
        key = (device.type, device.index, head_dim, head_dim_v, heads_q, heads_kv, dtype, use_gate,
               seq_bucket(max_seqlen), batch_bucket(num_seqs), varlen, tuple(backends), grad)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._make_plan(key, device)
        return plan

    def _make_plan(self, key: tuple, device: torch.device) -> Plan:
        with self._lock:
            plan = self._plans.get(key)
            if plan is not None:
                return plan
            (_, _, D, DV, HQ, H, dtype, gate, sb, bb, varlen, backends, grad) = key
            cands = tuple(b for b in backends if b == "triton" or
                          (b == "tvm" and device.type == "cuda" and tvm_available()))
            if not cands:
                why = ("inputs are not on CUDA" if device.type != "cuda"
                       else "its runtime (tvm, tvm_ffi) is not importable")
                raise NotImplementedError(f"backend 'tvm' cannot run this call: {why}; the TVM backend is a "
                                          "CUDA forward kernel. Use backend='triton' or 'auto'")

            def workload(pass_: str) -> Workload:
                return Workload(head_dim=D, head_dim_v=DV, heads_q=HQ, heads_kv=H, dtype=dtype, use_gate=gate,
                                pass_=pass_, seq_bucket=sb, varlen=varlen, batch_bucket=bb)

            # what each backend implements (codegen/<backend>/registry.py): one that cannot run a pass of
            # this call is left out, and the plan says why
            spec = load_spec()
            fwd_cands, skipped = _implementing(spec, "fwd", cands, gate)
            if not fwd_cands:
                raise NotImplementedError("no requested backend can run this call: " + "; ".join(skipped))
            fwd = _noting(self.choose("fwd", workload("fwd"), device, fwd_cands), skipped)
            bwd = None
            if grad:
                # the backward runs on a backend that implements it, Triton when none of the requested does
                bwd_cands, skipped = _implementing(spec, "bwd", tuple(dict.fromkeys((*cands, "triton"))), gate)
                if not bwd_cands:
                    raise NotImplementedError("no backend can run the backward of this call: " + "; ".join(skipped))
                bwd = _noting(self.choose("bwd", workload("bwd"), device, bwd_cands[:1]),
                              [s for s in skipped if s.split(":")[0] in cands])
            if fwd.backend == "triton":
                params_json = _triton_params_json(fwd, bwd, D, DV)
                bwd_params_json = params_json if bwd is not None else None
            else:
                params_json = fwd.config.to_json()
                # the Triton backward recomputes its state: it runs with the bwd choice's own knobs
                bwd_params_json = _triton_params_json(bwd, None, D, DV) if bwd is not None else None
            plan = Plan(fwd.backend, params_json, fwd, bwd, bwd_params_json)
            self._plans[key] = plan
            _report(key, plan)
            return plan


def _batch_buckets_by_distance(batch_bucket: int) -> list[int]:
    """The batch buckets 1 .. 2**_MAX_BATCH_LOG2 nearest ``batch_bucket`` first (log2 distance, ties to the
    larger): ``batch_bucket`` itself, then the others."""
    import math

    return sorted({batch_bucket, *(1 << i for i in range(_MAX_BATCH_LOG2 + 1))},
                  key=lambda b: (abs(math.log2(b) - math.log2(batch_bucket)), -b))


def _implementing(spec, pass_: str, backends: Sequence[str], gated: bool) -> tuple[tuple[str, ...], list[str]]:
    """The backends that implement every stage of ``pass_`` for this call (the registry of each), and
    ``"backend: reason"`` for each one that does not."""
    from pathtune.codegen._registry import call_unsupported

    ok, skipped = [], []
    for b in backends:
        why = call_unsupported(b, spec, pass_, gated)
        if why is None:
            ok.append(b)
        else:
            skipped.append(f"{b}: {why}")
    return tuple(ok), skipped


def _noting(choice: Choice, skipped: Sequence[str]) -> Choice:
    """``choice`` with the backends left out (and why) added to its detail."""
    if not skipped:
        return choice
    import dataclasses

    note = "not " + "; not ".join(skipped)
    return dataclasses.replace(choice, detail=f"{choice.detail}; {note}" if choice.detail else note)


def _soft_warning() -> type[Warning]:
    from pathtune.perf_db import SoftMismatchWarning

    return SoftMismatchWarning


def _triton_params_json(fwd: Choice, bwd: Optional[Choice], D: int, DV: int) -> str:
    """The config the Triton op runs (every knob, spec spelling, canonical JSON): the untuned config for the
    head dims, overlaid with the forward's knobs, then every knob of ``bwd`` (see module doc) when they
    combine into valid kernel params, else the forward's alone, and without ``bwd`` bwd_forward_state
    recompute (``codegen._knobs.config_json``: checked by ``resolve``, so a config the kernels cannot take
    fails here, not in the op)."""
    from pathtune.codegen._knobs import config_json

    dims = (D, DV)
    merged = fwd.config.to_dict()
    if bwd is not None:
        try:
            return config_json("triton", "bwd", {**merged, **bwd.config.to_dict()}, dims)
        except (TypeError, ValueError) as e:
            _log.debug("dispatch: backward knobs %s do not combine with the forward config (%s); untuned "
                       "backward knobs", dict(bwd.config), e)
    if bwd is None:     # no backward follows: the forward keeps no state for one (bwd_forward_state)
        merged = {**merged, "bwd_forward_state": "recompute"}
    return config_json("triton", "fwd", merged, dims)


def _key_text(key: tuple) -> str:
    (dev_type, dev_index, D, DV, HQ, H, dtype, gate, sb, bb, varlen, backends, grad) = key
    dev = dev_type if dev_index is None else f"{dev_type}:{dev_index}"
    return (f"{dev} D={D} DV={DV} HQ={HQ} H={H} {dtype} gate={int(gate)} seq<={sb} seqs<={bb}"
            f"{' varlen' if varlen else ''} {'fwd+bwd' if grad else 'fwd'} [{'/'.join(backends)}]")


_printed: set[str] = set()


def report_choice(line: str) -> None:
    """Log a dispatch choice (debug) and, with PATHTUNE_PRINT_DISPATCH=1, print it once per process."""
    _log.debug("%s", line)
    if _env.PRINT_DISPATCH.get() and line not in _printed:
        _printed.add(line)
        print(f"[pathtune] {line}", file=sys.stderr)


def _report(key: tuple, plan: Plan) -> None:
    report_choice(f"dispatch {_key_text(key)} -> {plan.describe()}")


# -- the process-wide dispatcher -------------------------------------------------------------------

_DISPATCHER: Optional[Dispatcher] = None
_GLOBAL_LOCK = threading.Lock()


def get_dispatcher() -> Dispatcher:
    global _DISPATCHER
    if _DISPATCHER is None:
        with _GLOBAL_LOCK:
            if _DISPATCHER is None:
                _DISPATCHER = Dispatcher()
    return _DISPATCHER


def set_dispatcher(dispatcher: Optional[Dispatcher]) -> Optional[Dispatcher]:
    """Replace the process-wide dispatcher (None: a fresh default one on next use); returns the old one."""
    global _DISPATCHER
    with _GLOBAL_LOCK:
        old, _DISPATCHER = _DISPATCHER, dispatcher
    return old


def select_plan(device: torch.device, head_dim: int, head_dim_v: int, heads_q: int, heads_kv: int, dtype: str,
                use_gate: bool, max_seqlen: int, num_seqs: int, varlen: bool, *,
                backends: Sequence[str] = ("triton",), grad: bool = False) -> Plan:
    """``get_dispatcher().plan(...)``: the plan path_attention runs (cached per key)."""
    d = _DISPATCHER or get_dispatcher()
    return d.plan(device, head_dim, head_dim_v, heads_q, heads_kv, dtype, use_gate, max_seqlen, num_seqs, varlen,
                  backends=backends, grad=grad)


def select_config(pass_: str, workload: Workload, device: torch.device,
                  backends: Sequence[str] = ("triton",)) -> Choice:
    """The tuned config of any pass (e.g. ``"decode"``) by the same order; cached per key."""
    return get_dispatcher().choose(pass_, workload, device, backends)


def clear_cache() -> None:
    """Forget every cached decision (e.g. after recording new results into perf_db)."""
    get_dispatcher().clear_cache()


def load_pack(path: Union[str, Path, Any], *, strict: bool = False):
    """Install a tuned-config pack (JSON written by ``pathtune export``) for kernel dispatch.

    The pack is checked against this machine: a pack of another GPU, compute capability, Triton
    major.minor or spec is refused (``strict=True``: ``PackMismatch`` is raised; default: a
    ``PackRefusedWarning`` says why, None is returned and dispatch uses perf_db / the heuristic).
    Soft differences (driver, torch, CUDA patch) are served with one warning. An unreadable or
    malformed file raises ``PerfDBError``. Returns the installed ``perf_db.Pack``.
    Until ``unload_pack()``, lookups try the pack first (exact key), see ``pathtune.runtime.dispatch``.
    """
    return get_dispatcher().install_pack(path, strict=strict)


def unload_pack() -> None:
    """Remove the installed pack (also one from ``PATHTUNE_PACK``, which is then not read again)."""
    get_dispatcher().uninstall_pack()


def loaded_pack():
    """The installed pack, or None."""
    return get_dispatcher().pack
