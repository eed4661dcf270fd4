"""Split tuning, as TVM's builder/runner: a build host proposes and compiles, a GPU host measures.

``build``  (``pathtune tune build --gpu-env env.json --out DIR``; Optuna + perf_db, no GPU): for each
           key, ``study.ask()`` a batch of configs, answer the ones perf_db already holds at once,
           compile the rest where a compiler exists (TVM modules; Triton kernels for sm_90 through
           ``codegen.triton.compile_check`` to catch configs that do not fit), and write DIR:
           ``bundle.json`` (workloads, candidates, expected GPU env) + ``run.sh`` + ``modules/`` and
           ``tvm_runtime/`` (TVM). The asked trials stay RUNNING (without heartbeats, so nobody fails
           them) until their results are ingested.
``run``    (``python -m pathtune.tuning.runner DIR --out results.json``; torch + triton only): see
           runner.py.
``ingest`` (``pathtune tune ingest results.json``): ``PerfDB.ingest`` the results file (idempotent),
           then tell every waiting trial of each record's study with that config its stored value.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from .measure import MeasureTask
from .objective import mark_feasibility, trial_value

__all__ = ["BUNDLE_FORMAT", "BUNDLE_VERSION", "build_bundle", "ingest_results", "precompile_triton",
           "SM90_SHARED_LIMIT"]

BUNDLE_FORMAT = "pathtune-bundle"
BUNDLE_VERSION = 1
log = logging.getLogger("pathtune.tune")
SM90_SHARED_LIMIT = 232448  # bytes of shared memory one block may use on sm_90 (227 KB)

_RUN_SH = """#!/usr/bin/env bash
# Measure this bundle on a GPU host (needs pathtune, torch and triton; no database, no Optuna):
#   bash run.sh [results.json]      then on the build host: pathtune tune ingest results.json
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python -m pathtune.tuning.runner "$here" --out "${1:-$here/results.json}" --resume
"""


def precompile_triton(task: MeasureTask) -> Optional[dict]:
    """Compile every Triton kernel of the task's pass for sm_90 (no GPU needed, ``compile_check``); a
    kernel over the shared-memory limit is returned as a pre-measured ``out_of_resources``, None otherwise
    (other offline build failures are left to the GPU host, which compiles the real launches)."""
    from pathtune.codegen.triton import compile_check

    from .measure import classify_exception, triton_params

    wl = task.workload
    params = triton_params(task.config, wl["head_dim"], wl["head_dim_v"], task.pass_)
    dtype = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(wl["dtype"], "bf16")
    group = wl["heads_q"] // wl["heads_kv"]
    if task.pass_ == "decode":
        if not hasattr(compile_check, "decode_kernels"):
            return None
        launches = compile_check.decode_kernels(params, wl["head_dim"], wl["head_dim_v"], dtype=dtype,
                                                gate=wl["use_gate"], heads=wl["heads_kv"], group=group)
    else:
        # the forward's own knobs (gate_bias) as the task's forward runs them: the fwd params of its config
        fwd = triton_params(task.config, wl["head_dim"], wl["head_dim_v"], "fwd")
        launches = compile_check.forward_kernels(params, wl["head_dim"], wl["head_dim_v"], dtype=dtype,
                                                 gate=wl["use_gate"], heads=wl["heads_kv"], group=group,
                                                 fwd_params=fwd)
    for fn, sig, const, nw, ns in launches:
        name = fn.fn.__name__
        if task.pass_ == "fwd" and (name.startswith("bwd_") or name.startswith("ut_bwd_")):
            continue  # fwd times the forward only; bwd (forward + backward) compiles everything
        try:
            res = compile_check.compile_kernel(fn, sig, const, num_warps=nw, num_stages=ns)
        except Exception as exc:  # noqa: BLE001
            status, message = classify_exception(exc)
            if status == "out_of_resources":
                return {"status": status, "message": f"sm_90 build of {name}: {message}"}
            # anything else may be this offline build's own limitation (its launch signatures are a model
            # of the real launches): the GPU host compiles and decides
            log.warning("sm_90 pre-build of %s failed (%s); the GPU host will compile it", name, message[:200])
            return None
        if res.shared_bytes > SM90_SHARED_LIMIT:
            return {"status": "out_of_resources",
                    "message": f"{name} needs {res.shared_bytes} B of shared memory > {SM90_SHARED_LIMIT} B on sm_90"}
    return None


def precompile_tvm(task: MeasureTask, out_dir: Path) -> tuple[Optional[dict], Optional[str]]:
    """Build the TVM forward modules of a task into the bundle; (prefailed status or None, module dir)."""
    from pathtune.codegen.tvm.build import build_kernels
    from pathtune.codegen.tvm.params import KernelDims

    from .measure import classify_exception

    wl = task.workload
    dims = KernelDims(H=wl["heads_kv"], HQ=wl["heads_q"], D=wl["head_dim"], DV=wl["head_dim_v"], dtype=wl["dtype"],
                      gated=wl["use_gate"])
    rel = Path("modules") / task.task_id.replace("#", "-").replace("/", "-")
    try:
        paths = build_kernels("fwd", task.config, dims)
    except Exception as exc:  # noqa: BLE001
        status, message = classify_exception(exc)
        return {"status": "compile_error" if status == "crash" else status, "message": message}, None
    dest = out_dir / rel
    dest.mkdir(parents=True, exist_ok=True)
    for path in paths.values():
        shutil.copy2(path, dest / path.name)
        meta = Path(path).with_suffix(".json")
        if meta.exists():
            shutil.copy2(meta, dest / meta.name)
    runtime = out_dir / "tvm_runtime"
    if not runtime.exists():
        from pathtune.codegen.tvm.runtime import copy_runtime_libs

        try:
            copy_runtime_libs(runtime)
        except FileNotFoundError:   # a wheel without them: the GPU host's own TVM runtime loads the modules
            runtime.mkdir(parents=True, exist_ok=True)
    return None, str(rel)


def build_bundle(tuner: Any, out_dir: Path, batch: int, *, precompile: bool = True,
                 log: Callable[[str], None] = print) -> dict:
    """Ask ``batch`` new candidates per key and write the bundle (see module doc). Returns bundle.json."""
    import optuna
    from optuna.trial import TrialState

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    bundle_id = uuid.uuid4().hex[:12]
    tasks: list[dict] = []
    answered = 0
    for key in tuner.keys:
        if key.backend == "tvm" and key.pass_ != "fwd":
            log(f"skip {key.label}: the TVM backend has the forward pass only")
            continue
        study = tuner.open_study(key)
        ctx = tuner.context(key, study.study_name)
        hashes: set[str] = set()
        new = attempts = 0
        while new < batch and attempts < 10 * batch + 10:
            attempts += 1
            trial = study.ask()
            try:
                config = ctx.space.suggest(trial, key.workload)
            except optuna.TrialPruned:
                study.tell(trial, state=TrialState.PRUNED)
                continue
            trial.set_user_attr("config", config.to_dict())
            trial.set_user_attr("config_hash", config.hash)
            stored = tuner.db.lookup(tuner.env_info, ctx.kernel, key.workload, config)
            if stored is not None:
                value, constraint = trial_value(stored)
                trial.set_user_attr("source", "perf_db")
                trial.set_user_attr("status", stored["status"])
                mark_feasibility(trial, constraint)
                study.tell(trial, value)
                answered += 1
                continue
            trial.set_user_attr("bundle", bundle_id)
            trial.set_user_attr("source", "bundle")
            if config.hash in hashes:  # the same config twice in one batch: told together at ingest
                continue
            hashes.add(config.hash)
            task = ctx.task(config, trial.number)
            task.task_id = f"{bundle_id}-{len(tasks)}"
            prefailed = None
            if precompile and key.backend == "triton":
                prefailed = precompile_triton(task)
            elif key.backend == "tvm":
                prefailed, task.module_dir = precompile_tvm(task, out_dir)
            tasks.append({"task": task.to_dict(), "kernel": ctx.kernel.to_dict(), "run_id": ctx.run_id,
                          "prefailed": prefailed})
            new += 1
        log(f"{key.label}: {new} candidates in the bundle ({study.study_name})")
    doc = {"format": BUNDLE_FORMAT, "version": BUNDLE_VERSION, "bundle_id": bundle_id,
           "created_at": datetime.now(timezone.utc).isoformat(), "command": tuner.opts.command,
           "env_hash": tuner.env_hash, "expected_env": tuner.env_info, "tasks": tasks}
    tmp = out_dir / "bundle.json.tmp"
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, out_dir / "bundle.json")
    run_sh = out_dir / "run.sh"
    run_sh.write_text(_RUN_SH)
    run_sh.chmod(0o755)
    doc["answered_from_perf_db"] = answered
    return doc


def ingest_results(paths: Sequence[Path], storage_url: str, db_url: Optional[str] = None, *,
                   log: Callable[[str], None] = print) -> dict:
    """perf_db ingest + tell the waiting trials. Returns counts."""
    import optuna
    from optuna.trial import TrialState

    from pathtune.fingerprint import env_hash
    from pathtune.perf_db import PerfDB
    from pathtune.perf_db._results import parse_results, read_results

    from .tuner import make_storage

    counts = {"records": 0, "added": 0, "told": 0, "not_waiting": 0, "env_mismatch": 0, "unknown_study": 0}
    storage = make_storage(storage_url, None)
    studies: dict[str, Any] = {}
    with PerfDB.open_default(db_url or storage_url) as db:
        for path in paths:
            report = db.ingest(path, on_conflict="skip")
            counts["records"] += report.records
            counts["added"] += report.added
            data, sha, _ = read_results(path)
            _, records = parse_results(data, sha256=sha)
            for rec in records:
                name = rec.measurement.study_name
                if not name:
                    continue
                if name not in studies:
                    try:
                        studies[name] = optuna.load_study(study_name=name, storage=storage)
                    except KeyError:
                        studies[name] = None
                study = studies[name]
                if study is None:
                    counts["unknown_study"] += 1
                    log(f"{path}: no study {name} in {db.display_url}; stored in perf_db only")
                    continue
                want = (study.user_attrs.get("key") or {}).get("env_hash")
                if want and env_hash(rec.env) != want:
                    counts["env_mismatch"] += 1
                    log(f"{path}: a record of {name} was measured on another environment (gpu {rec.env.get('gpu_name')}"
                        f", env hash {env_hash(rec.env)[:12]} != {want[:12]}): stored in perf_db, trial left waiting")
                    continue
                stored = db.lookup(rec.env, rec.kernel, rec.workload, rec.config)
                if stored is None:
                    continue
                value, constraint = trial_value(stored)
                waiting = [t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                           if t.user_attrs.get("config_hash") == rec.config.hash]
                if not waiting:
                    counts["not_waiting"] += 1
                for t in waiting:
                    trial = optuna.trial.Trial(study, t._trial_id)
                    trial.set_user_attr("status", stored["status"])
                    mark_feasibility(trial, constraint)
                    try:
                        study.tell(trial, value)
                        counts["told"] += 1
                    except RuntimeError:  # told meanwhile by another ingest
                        counts["not_waiting"] += 1
    try:
        storage.engine.dispose()
    except Exception:  # noqa: BLE001
        pass
    return counts
