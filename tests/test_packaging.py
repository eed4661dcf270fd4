"""The built wheel, the import surface and the env-var docs."""
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    # Build from a copy so nothing (build/, *.egg-info) lands in the shared checkout.
    src = tmp_path_factory.mktemp("src") / "pathtune"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__",
                                                               ".pytest_cache", "tests", "benchmarks"))
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps",
                           "-q", "-w", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (path,) = out.glob("pathtune-*.whl")
    with zipfile.ZipFile(path) as zf:
        return zf.namelist()


def test_wheel_contains_spec_and_subpackages(wheel):
    for name in ("pathtune/specs/path_attention.yaml", "pathtune/specs/schema.py", "pathtune/runtime/__init__.py",
                 "pathtune/runtime/api.py", "pathtune/runtime/reference/__init__.py", "pathtune/cli/__init__.py",
                 "pathtune/codegen/triton/__init__.py", "pathtune/tuning/__init__.py", "pathtune/perf_db/__init__.py"):
        assert name in wheel, name


def test_wheel_has_no_top_level_generic_modules(wheel):
    stray = [n for n in wheel if not n.startswith("pathtune/") and not re.match(r"pathtune-[^/]+\.dist-info/", n)]
    assert stray == []


def test_import_is_light():
    code = ("import sys, pathtune, pathtune.specs; pathtune.load_spec(); "
            "bad = [m for m in ('tvm', 'optuna', 'sqlalchemy', 'torch', 'triton') if m in sys.modules]; "
            "assert not bad, bad; "
            "pathtune.path_attention; "
            "bad = [m for m in ('tvm', 'optuna', 'sqlalchemy') if m in sys.modules]; assert not bad, bad")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_every_env_var_is_documented():
    from pathtune import _env

    doc = (ROOT / "ENVs.md").read_text()
    # the table's rows (the prose below it also names the test suite's own variables)
    documented = set(re.findall(r"^\| `(PATHTUNE_[A-Z_]+)`", doc, flags=re.MULTILINE))
    declared = {var.name for var in _env.ALL}
    assert declared == documented
    used = set()
    for folder in ("pathtune", "specs", "runtime", "codegen", "tuning", "perf_db"):
        for path in (ROOT / folder).rglob("*.py"):
            used |= set(re.findall(r"\bPATHTUNE_[A-Z_]+\b", path.read_text()))
    used -= set(_env.TEST_SUITE_VARIABLES)      # named in _env only so that `pathtune env` does not flag them
    used -= set(_env.RETIRED)                   # named in _env only so that `pathtune env` says what replaced them
    assert used <= declared, f"PATHTUNE_* variables used but not declared in pathtune/_env.py: {used - declared}"
    for name in _env.TEST_SUITE_VARIABLES:
        assert name in doc, f"{name} (the test suite's) is not mentioned in ENVs.md"
