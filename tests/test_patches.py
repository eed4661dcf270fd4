"""Parked changes (benchmarks/patches/*.patch) still apply to this tree.

A patch holds a change that crosses hashed kernel sources and the spec and waits for its first GPU
measurement: applying it retires the records of the passes it touches, so it lands together with their
re-tune (benchmarks/NOTES.md says how).  The session that applies one deletes it in the same commit; until
then every edit of the files it touches must keep it applicable, which this checks.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PATCHES = sorted((ROOT / "benchmarks" / "patches").glob("*.patch"))


@pytest.mark.skipif(not PATCHES, reason="no parked patch")
@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="not a git checkout")
@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.name)
def test_parked_patch_applies(patch):
    res = subprocess.run(["git", "apply", "--check", str(patch)], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, f"{patch.name} no longer applies to this tree: {res.stderr[-2000:]}"
