"""Load a script of the repository that is not part of the installed package (benchmarks/, examples/)."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_script(relpath: str) -> ModuleType:
    """Import ``ROOT / relpath`` as a module named after the file."""
    path = ROOT / relpath
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load_benchmark_script(monkeypatch, relpath: str) -> ModuleType:
    """``load_script`` of a script under benchmarks/ (a probe, a variants/ candidate) with benchmarks/ on sys.path
    for the test's duration, as the script has it when run (its ``kernel_variants`` and sibling imports)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    return load_script(relpath)
