"""BENCHMARKS.md is generated from the result files in benchmarks/results/ (benchmarks/report.py)."""
from __future__ import annotations

import re

from repo_scripts import ROOT, load_script


def _report():
    return load_script("benchmarks/report.py")


def test_benchmarks_md_is_what_the_result_files_give():
    report = _report()
    assert report.main(["--check"]) == 0, "run: python benchmarks/report.py --write"


def test_every_result_file_states_its_command_and_rows():
    import json

    files = sorted((ROOT / "benchmarks" / "results").glob("*.json"))
    assert files
    for path in files:
        doc = json.loads(path.read_text())
        # the command may set environment variables first ("PROFILE_GATES=both python benchmarks/...")
        command = re.sub(r"^(?:[A-Z_][A-Z0-9_]*=\S+\s+)+", "", doc["command"])
        assert command.startswith(("pathtune ", "python benchmarks/")), path.name
        # a decode probe may time only the steps (rows: generation) or only generation (steps empty)
        assert doc["gpu"] and (doc["rows"] or doc.get("steps")), path.name


def test_check_fails_on_a_hand_edit(tmp_path, monkeypatch):
    report = _report()
    edited = tmp_path / "BENCHMARKS.md"
    edited.write_text(report.render().replace("**", "", 1))
    monkeypatch.setattr(report, "TARGET", edited)
    assert report.main(["--check"]) == 1
