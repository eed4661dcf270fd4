"""Rich progress for ``pathtune tune``: keys done, trials per key, best so far, time left."""
from __future__ import annotations

import time
from typing import Any, Optional

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

__all__ = ["TuneProgress"]


def _best_ok(study: Any) -> tuple[int, Optional[float], Optional[float]]:
    """(COMPLETE trials, best ok ms, the seeded default's ms) of a study, over every worker."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    best = None
    default = None
    for t in trials:
        if t.user_attrs.get("status") == "ok" and t.value is not None:
            best = t.value if best is None else min(best, t.value)
            if t.user_attrs.get("seeded_default"):
                default = t.value
    return len(trials), best, default


class TuneProgress:
    """One overall line (keys, time left of the wall-time budget) and one line per key."""

    def __init__(self, n_keys: int, seconds: Optional[float], console: Optional[Console] = None) -> None:
        self.console = console or Console(stderr=True)
        self.seconds = seconds
        self.start = time.monotonic()
        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(bar_width=24), MofNCompleteColumn(),
            TextColumn("{task.fields[best]}"), TextColumn("[dim]{task.fields[left]}"), TimeElapsedColumn(),
            console=self.console, transient=False, refresh_per_second=4)
        self.overall = self.progress.add_task("keys", total=n_keys, best="", left=self._left())

    def _left(self) -> str:
        if self.seconds is None:
            return ""
        left = max(0.0, self.seconds - (time.monotonic() - self.start))
        return f"{int(left // 60)}:{int(left % 60):02d} left"

    def __enter__(self) -> "TuneProgress":
        self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.stop()

    def add_key(self, key: Any, trials: Optional[int], done: int) -> Any:
        self.progress.update(self.overall, left=self._left())
        return self.progress.add_task(key.label, total=trials, completed=done, best="best -", left="")

    def start_key(self, task: Any, study: Any) -> None:
        self.update_key(task, study)

    def update_key(self, task: Any, study: Any, trial: Any = None) -> None:
        if trial is not None and not self.console.is_terminal:
            # a log (device run, CI): one line per trial, since a live bar is not drawn there
            status = trial.user_attrs.get("status", trial.state.name.lower())
            ms = f" {trial.value:.4g} ms" if status == "ok" and trial.value is not None else ""
            cfg = " ".join(f"{k}={v}" for k, v in (trial.user_attrs.get("config") or trial.params).items())
            self.console.print(f"{self.progress.tasks[task].description} #{trial.number} {status}{ms} "
                               f"[{trial.user_attrs.get('source', '-')}] {cfg}", markup=False, highlight=False)
        n, best, default = _best_ok(study)
        text = "best -" if best is None else f"best {best:.4g} ms"
        if best is not None and default:
            text += f" ({default / best:.2f}x default)"
        self.progress.update(task, completed=n, best=text)
        self.progress.update(self.overall, left=self._left())

    def finish_key(self, task: Any, result: Any) -> None:
        total = self.progress.tasks[task].total
        if total is None:
            self.progress.update(task, total=result.trials)
        self.progress.update(task, completed=result.trials)
        self.progress.advance(self.overall)
        self.progress.update(self.overall, left=self._left())

    def note(self, message: str) -> None:
        self.progress.console.print(message, style="yellow", markup=False, highlight=False)
