"""A deterministic cost model standing in for GPU measurements in the tuner tests.

``measure(task)`` returns what ``pathtune.tuning.measure.measure`` returns, computed from the config
alone (so any worker, in any order, gets the same number for the same config): milliseconds grow with
the sequence length and depend on each knob; configs with ``scan_precision == "bf16"`` and no beta
clip fail the "accuracy gate" and ``chunk_size == 128`` with ``num_stages == 4`` is "out of
resources" (fwd). ``PATHTUNE_FAKE_SLEEP`` seconds of sleep per call let workers overlap;
``PATHTUNE_FAKE_LOG`` names a file that gets one line per call (``start``/``end`` with the pid).
``FakePreparer`` stands in for the compile step (``pathtune.tuning.prepare.Preparer``).
"""
from __future__ import annotations

import os
import time

# the tuner keys studies and perf_db rows by this instead of the Triton sources (which may change
# while a test runs in a shared checkout)
SOURCE_HASH = "fake-cost-model-v1"

WEIGHTS = {
    "chunk_size": {32: 1.3, 64: 1.0, 128: 1.1},
    "superchunk_size": {256: 1.25, 512: 1.1, 1024: 1.0, 2048: 0.97, 4096: 1.05},
    "block_n": {32: 1.2, 64: 1.0, 128: 0.93},
    "block_m": {64: 1.07, 128: 1.0},
    "inter_num_warps": {4: 0.985, 8: 1.0},
    "ut_precision": {"tf32": 0.97, "tf32x3": 1.0},
    "num_warps": {2: 1.3, 4: 1.0, 8: 0.96},
    "num_stages": {1: 1.1, 2: 1.0, 3: 0.98, 4: 1.02},
    "scan_precision": {"fp16": 1.0, "bf16": 0.99, "tf32": 1.6},
    "transition_precision": {"tf32": 0.9, "tf32x3": 1.0, "ieee": 1.4, "fp16": 0.86, "bf16": 0.86},
    "beta_clip_eps": {"off": 1.0, 0.001: 1.001, 0.0078125: 1.002, 0.015625: 1.003},
    "bwd_block_n": {32: 1.2, 64: 1.0, 128: 0.9},
    "bwd_num_warps": {4: 1.0, 8: 0.95},
    "bwd_num_stages": {1: 1.1, 2: 1.0, 3: 0.97},
    "decode_block_n": {64: 1.2, 128: 1.0, 256: 0.95, 512: 1.05},
    "decode_num_warps": {2: 1.1, 4: 1.0, 8: 1.02},
    "decode_splits": {1: 1.5, 2: 1.2, 4: 1.0, 8: 0.9, 16: 0.95},
    "decode_num_stages": {1: 1.0, 2: 0.96, 3: 0.94, 4: 0.97},
}


def cost_ms(config: dict, seq_len: int) -> float:
    ms = 0.01 * seq_len ** 0.5
    for name, value in sorted(config.items()):
        ms *= WEIGHTS.get(name, {}).get(value, 1.0)
    return round(ms, 9)


def failure(config: dict) -> str | None:
    if config.get("scan_precision") == "bf16" and config.get("beta_clip_eps") == "off":
        return "wrong"
    if config.get("chunk_size") == 128 and config.get("num_stages") == 4:
        return "out_of_resources"
    return None


def _log(what: str, task) -> None:
    path = os.environ.get("PATHTUNE_FAKE_LOG")
    if path:
        with open(path, "a") as f:
            f.write(f"{what} {os.getpid()} {task.study_name} {task.trial_number} "
                    f"{sorted(task.config.items())}\n")


def measure(task) -> dict:
    _log("start", task)
    time.sleep(float(os.environ.get("PATHTUNE_FAKE_SLEEP", "0")))
    status = failure(task.config)
    if status == "wrong":
        out = {"status": "wrong", "errors": {"o": 0.02}, "message": "accuracy gate: o 0.02 > 0.004"}
    elif status:
        out = {"status": status, "message": "OutOfResources: shared memory"}
    else:
        ms = cost_ms(task.config, task.seq_len)
        out = {"status": "ok", "median_ms": ms, "p20_ms": ms * 0.99, "p80_ms": ms * 1.01, "n_reps": 10,
               "bench_method": "fake cost model", "errors": {"o": 1e-3}, "baseline_ms": 0.5,
               "baseline_name": "sdpa_flash"}
    _log("end", task)
    return out


class FakePreparer:
    """Stands in for ``Preparer``: records each batch's configs; every config compiles unless
    ``fails(config)`` returns a compile error message (then a fatal ``compile_error``)."""

    def __init__(self, workers, fails=None):
        self.workers = workers
        self.fails = fails
        self.batches = []

    def run(self, tasks, should_stop=None):
        from pathtune.tuning.prepare import PREPARED

        self.batches.append([dict(t.config) for t in tasks])
        out = []
        for t in tasks:
            message = self.fails(t.config) if self.fails else None
            out.append({"status": "compile_error", "message": message, "fatal": True} if message
                       else {"status": PREPARED, "seconds": 0.01})
        return out


def run_tuner(keys, url, spec_path, env_info, *, measure_fn=None, batched=True, workers=2, **options):
    """One in-process ``Tuner`` run of ``keys`` on ``url`` with this cost model (or ``measure_fn``): no start-up
    trials, no retired or neighbour seeds unless ``options`` say so, compile batches of ``workers`` through
    ``FakePreparer`` when ``batched``.  Returns (the key results, the tuner's notes)."""
    from pathtune.tuning.tuner import TuneOptions, Tuner

    settings = {"startup_trials": 0, "heartbeat": None, "seed_retired": 0, "seed_neighbours": 0, **options}
    opts = TuneOptions(storage=url, measure_fn=measure_fn or measure, spec_path=spec_path, env_info=env_info,
                       preparer=FakePreparer(workers=workers) if batched else None, **settings)
    tuner = Tuner(keys, opts)
    notes: list = []
    tuner.on_note = notes.append
    try:
        return tuner.run(), notes
    finally:
        tuner.close()
