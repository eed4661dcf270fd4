"""Measure a tuning bundle on a GPU host: ``python -m pathtune.tuning.runner BUNDLE_DIR --out results.json``.

Needs pathtune, torch and triton only: no database, no Optuna, no SQLAlchemy, no compiler beyond
Triton's JIT (TVM tasks load the bundle's prebuilt modules with the TVM runtime libraries in
``tvm_runtime/``). For each task of ``bundle.json`` it runs ``tuning.measure.measure`` (accuracy
gate, then do_bench) and rewrites the results file (perf_db/RESULTS_FORMAT.md) atomically after
every task, so a killed runner loses at most the task it was on; ``--resume`` skips tasks already
in the file. Ingest the file on the build host with ``pathtune tune ingest results.json``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

__all__ = ["main", "run_bundle"]

_MEASUREMENT_KEYS = ("status", "median_ms", "p20_ms", "p80_ms", "n_reps", "bench_method", "errors", "max_rel_err",
                     "baseline_ms", "baseline_name", "message")


def _json_float(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


def _measurement(result: dict, task: dict, command: str) -> dict:
    m = {k: result[k] for k in _MEASUREMENT_KEYS if result.get(k) is not None}
    if m.get("status") != "ok":
        for k in ("median_ms", "p20_ms", "p80_ms", "n_reps", "bench_method"):
            m.pop(k, None)
    if "errors" in m:
        m["errors"] = {k: _json_float(float(v)) for k, v in m["errors"].items()}
    if "message" in m:
        m["message"] = str(m["message"])[:2000]
    m["study_name"] = task.get("study_name") or None
    if task.get("trial_number") is not None:
        m["trial_number"] = int(task["trial_number"])
    m["command"] = command
    m["created_at"] = datetime.now(timezone.utc).isoformat()
    return {k: v for k, v in m.items() if v is not None}


def _write(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def run_bundle(bundle_dir: Path, out: Path, *, resume: bool = False, measure_with: Optional[str] = None,
               log=print) -> int:
    """Measure every task; returns 0, or 3 if a task left the GPU unusable (rerun with --resume)."""
    from pathtune.fingerprint import collect_env

    from .measure import MeasureTask, load_measure_fn

    bundle_dir = Path(bundle_dir)
    bundle = json.loads((bundle_dir / "bundle.json").read_text())
    if bundle.get("format") != "pathtune-bundle" or bundle.get("version") != 1:
        raise SystemExit(f"{bundle_dir}/bundle.json is not a pathtune bundle (format/version)")
    measure_fn = load_measure_fn(measure_with)
    env = collect_env()
    env["host"] = platform.node() or "gpu-host"
    command = shlex.join(["python", "-m", "pathtune.tuning.runner", *sys.argv[1:]])
    doc: dict = {"format": "pathtune-results", "version": 1, "runs": [], "records": []}
    if resume and out.exists():
        doc = json.loads(out.read_text())
    task_ids = {r["measurement"].get("study_name", "") + "#" + str(r["measurement"].get("trial_number"))
                for r in doc["records"]}
    runs = {r["run_id"]: r for r in doc.get("runs", [])}
    expected = bundle.get("expected_env") or {}
    if expected.get("gpu_name") and expected.get("gpu_name") != env.get("gpu_name"):
        log(f"warning: the bundle was built for {expected.get('gpu_name')}, this host has {env.get('gpu_name')}; "
            "ingest will store the results but leave the trials waiting")
    rc = 0
    for i, item in enumerate(bundle["tasks"]):
        task = item["task"]
        tag = f"{task.get('study_name', '')}#{task.get('trial_number')}"
        if tag in task_ids:
            continue
        if item.get("prefailed"):
            result = dict(item["prefailed"])
        else:
            t = MeasureTask.from_dict(task)
            if t.module_dir:
                t.module_dir = str((bundle_dir / t.module_dir).resolve())
            result = measure_fn(t)
        wl = dict(task["workload"])
        rec = {"env": env, "run_id": item["run_id"], "kernel": item["kernel"], "workload": wl,
               "config": task["config"], "measurement": _measurement(result, task, command)}
        runs.setdefault(item["run_id"], {"run_id": item["run_id"], "command": command, "host": env["host"],
                                         "notes": f"pathtune tune bundle {bundle.get('bundle_id')}"})
        doc["records"].append(rec)
        doc["runs"] = list(runs.values())
        _write(out, doc)
        status = rec["measurement"]["status"]
        ms = rec["measurement"].get("median_ms")
        log(f"[{i + 1}/{len(bundle['tasks'])}] {tag}: {status}" + (f" {ms:.4g} ms" if ms else ""))
        if result.get("fatal"):
            log("the GPU is unusable after this task (CUDA error); rerun with --resume to continue in a fresh process")
            rc = 3
            break
    if not doc["records"]:
        _write(out, doc)
    return rc


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pathtune.tuning.runner", description=__doc__.splitlines()[0])
    ap.add_argument("bundle_dir", type=Path)
    ap.add_argument("--out", type=Path, default=None, help="results file (default: BUNDLE_DIR/results.json)")
    ap.add_argument("--resume", action="store_true", help="skip tasks already in the results file")
    ap.add_argument("--measure-with", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    out = args.out or args.bundle_dir / "results.json"
    rc = run_bundle(args.bundle_dir, out, resume=args.resume, measure_with=args.measure_with)
    print(f"wrote {out}; ingest it where the study lives: pathtune tune ingest {out}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
