"""Compile a batch of candidates at once, each in its own child process, before they are measured.

Compiling a fresh forward+backward config of the Triton kernels takes 30-100 s on one core of a
GPU host, so a tuner that compiles inside its measuring process spends its budget in LLVM and
ptxas. ``Preparer.run(tasks)`` starts one ``python -m pathtune.tuning.prepare`` per task (at most
``workers`` at a time); each child runs ``measure.prepare(task)``: the candidate once at the gate
shape and once at the timed shape, which fills Triton's on-disk cache (``TRITON_CACHE_DIR``, shared
by every process of the user) with exactly the kernels the measurement will launch. The measuring
process then loads them from the cache, and measures one candidate at a time on a quiet GPU.

A batch is as slow as its slowest child, and a few configs (128-token UT chunks, deep pipelines,
float32-exact products everywhere) take ptxas 5-10x longer than the rest while spilling registers (a
whole forward batch of ~150 s can wait on them).  So once half of a batch has compiled, a child still
running after ``straggler_factor`` x the median compile time of the finished ones (and at least
``straggler_floor_s``) is killed and recorded as ``timeout``: a config that takes minutes to JIT
would stall a user's first call the same way, and it never wins.

A child per task (not a long-lived pool) because a candidate that faults the GPU leaves its CUDA
context unusable: that child dies with it, its task comes back as a ``crash`` (``fatal``), and the
measuring process never launches that config. A child over ``timeout_s`` is killed and reported as
``timeout``. Children inherit the environment (device selection, cache folder, interpreter mode).

    echo '<MeasureTask JSON>' | python -m pathtune.tuning.prepare     # prints the result JSON last
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Optional, Sequence

from .measure import MeasureTask

__all__ = ["Preparer", "PREPARED", "default_workers"]

PREPARED = "prepared"
_RESULT_MARK = "pathtune-prepare-result: "


def default_workers() -> int:
    """Children at a time: the cores less two (the measuring process and the system), at most 16."""
    return max(1, min(16, (os.cpu_count() or 1) - 2))


class Preparer:
    """Run ``measure.prepare`` for many tasks in parallel child processes (see module doc)."""

    def __init__(self, workers: Optional[int] = None, timeout_s: float = 300.0,
                 command: Optional[Sequence[str]] = None, straggler_factor: Optional[float] = 3.0,
                 straggler_floor_s: float = 60.0) -> None:
        self.workers = max(1, workers or default_workers())
        self.timeout_s = float(timeout_s)
        self.straggler_factor = straggler_factor      # None: no straggler rule, only timeout_s
        self.straggler_floor_s = float(straggler_floor_s)
        self.command = list(command) if command else [sys.executable, "-m", "pathtune.tuning.prepare"]

    def run(self, tasks: Sequence[MeasureTask], should_stop: Optional[Callable[[], bool]] = None) -> list[dict]:
        """One result per task, in order: ``{"status": "prepared", "seconds"}``, a failure status, or
        ``{"status": "interrupted"}`` for tasks cut short because ``should_stop()`` turned true."""
        results: list[Optional[dict]] = [None] * len(tasks)
        waiting = list(range(len(tasks)))
        running: dict[int, tuple[subprocess.Popen, float, object]] = {}
        finished: list[float] = []     # seconds of the children that compiled (a result, any status)
        try:
            while waiting or running:
                if should_stop is not None and should_stop():
                    break
                while waiting and len(running) < self.workers:
                    i = waiting.pop(0)
                    running[i] = self._start(tasks[i])
                time.sleep(0.05)
                limit = self._straggler_limit(finished, len(tasks))
                for i, (proc, t0, log) in list(running.items()):
                    elapsed = time.monotonic() - t0
                    if proc.poll() is None and elapsed < min(self.timeout_s, limit):
                        continue
                    if proc.poll() is None:
                        proc.kill()
                        proc.wait()
                        why = (f"compiling took over {self.timeout_s:.0f} s" if elapsed >= self.timeout_s else
                               f"compiling took over {limit:.0f} s, {self.straggler_factor:g}x the median "
                               f"{statistics.median(finished):.0f} s of its batch (a straggler)")
                        results[i] = {"status": "timeout", "seconds": elapsed, "message": f"{why} (killed)"}
                    else:
                        results[i] = self._result(proc, log, elapsed)
                        if not results[i].get("child_failed"):   # it compiled (maybe into a failing config)
                            finished.append(elapsed)
                    log.close()
                    del running[i]
        finally:
            for proc, _, log in running.values():   # interrupted: leave no orphans behind
                proc.kill()
                proc.wait()
                log.close()
        return [r if r is not None else {"status": "interrupted", "message": "stopped before it compiled"}
                for r in results]

    def _straggler_limit(self, finished: list[float], n_tasks: int) -> float:
        """Seconds a child of this batch may still take (inf until half of a batch of >= 4 is done)."""
        if self.straggler_factor is None or n_tasks < 4 or 2 * len(finished) < n_tasks:
            return float("inf")
        return max(self.straggler_floor_s, self.straggler_factor * statistics.median(finished))

    def _start(self, task: MeasureTask) -> tuple[subprocess.Popen, float, object]:
        log = tempfile.TemporaryFile(mode="w+b")
        # its own session: a Ctrl-C at the terminal stops the tuner (which then stops the children),
        # not the children mid-compile (a child killed by it would read as a crashed config)
        # PYTHONSAFEPATH: the child imports pathtune as the parent did, not a `pathtune/` folder in the
        # working directory (a source checkout's root holds one: `python -m` would put it first)
        # one CPU thread each: a batch runs many children on the host's cores at once
        env = {"OMP_NUM_THREADS": "1", **os.environ, "PYTHONSAFEPATH": "1"}
        cwd = None if sys.version_info >= (3, 11) else tempfile.gettempdir()
        proc = subprocess.Popen(self.command, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, env=env, cwd=cwd)
        try:
            proc.stdin.write(json.dumps(task.to_dict()).encode())
            proc.stdin.close()
        except BrokenPipeError:   # the child died at once: its exit code says so
            pass
        return proc, time.monotonic(), log

    @staticmethod
    def _result(proc: subprocess.Popen, log, elapsed: float) -> dict:
        log.seek(0)
        text = log.read().decode(errors="replace")
        for line in reversed(text.splitlines()):
            if line.startswith(_RESULT_MARK):
                try:
                    return json.loads(line[len(_RESULT_MARK):])
                except json.JSONDecodeError:
                    break
        tail = "\n".join(text.strip().splitlines()[-15:])
        # no result line: the child died (a fault, a signal) or never started (cannot import pathtune);
        # "child_failed" lets the tuner tell a broken setup (every child of a batch) from a bad config
        return {"status": "crash", "seconds": elapsed, "fatal": True, "child_failed": True,
                "message": f"compile child exited with code {proc.returncode} without a result: {tail}"[-2000:]}


def main() -> int:
    t0 = time.perf_counter()
    import torch  # noqa: F401 -- timed: the child's start-up is part of what a batch costs

    from .measure import prepare

    task = MeasureTask.from_dict(json.loads(sys.stdin.read()))
    startup = time.perf_counter() - t0
    result = prepare(task)
    result.setdefault("phases", {})["startup"] = round(startup, 3)
    sys.stdout.flush()
    print(_RESULT_MARK + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
