"""benchmarks/timing_noise.py's command line (the timing itself needs a GPU: gpu_session.sh's ``noise`` step)."""
from __future__ import annotations

import sys

import pytest

from repo_scripts import load_benchmark_script


def test_cells_parse_and_bad_ones_say_the_form(monkeypatch):
    tn = load_benchmark_script(monkeypatch, "benchmarks/timing_noise.py")
    assert tn.parse_cells("64:2048:0, 128:4096:1,") == [(64, 2048, False), (128, 4096, True)]
    for bad in ("64:2048", "64:2048:2", "d64:2048:0", "64:2048:0:1"):
        with pytest.raises(SystemExit, match="is not D:T:gate"):
            tn.parse_cells(bad)


def test_too_few_trials_is_refused_before_any_gpu_work(monkeypatch):
    tn = load_benchmark_script(monkeypatch, "benchmarks/timing_noise.py")
    monkeypatch.setattr(sys, "argv", ["timing_noise.py", "--trials", "1"])
    with pytest.raises(SystemExit, match="at least 2"):
        tn.main()
    assert tn.heads_for(64) == 16 and tn.heads_for(128) == 8
