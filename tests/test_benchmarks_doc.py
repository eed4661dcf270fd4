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


def test_decode_steps_table_quotes_the_median_of_repeated_rounds():
    """A decode probe run with --repeats: the several-tokens table adds the median of the rounds'
    amortized / SDPA ratios with their range; a run without rounds keeps the plain table."""
    from pathlib import Path

    report = _report()
    row = dict(D=64, cache_len=4096, gate=False, tokens=1, pathtune_net_ms=0.06, flush_net_ms=0.18,
               amortized_ms=0.07, sdpa_ms=0.05, x_sdpa_amortized=1.4, graph_x_sdpa_graph=1.1)
    doc = dict(command="python benchmarks/decode_probe.py --repeats 3 --out p.json", gpu="NVIDIA H200",
               software="torch", notes="synthetic", steps=[dict(row, x_sdpa_amortized_rounds=[1.4, 1.2, 1.3],
                                                                 x_sdpa_amortized_median=1.3)])
    lines = report.decode_steps_section(Path("H200-x-decode-probe.json"), doc)
    assert "median of rounds (range)" in lines[2]
    assert lines[4].endswith("| 1.30× (1.20-1.40) |"), lines[4]
    plain = report.decode_steps_section(Path("H200-x-decode-probe.json"), dict(doc, steps=[row]))
    assert "median" not in plain[2] and plain[4].endswith("| 1.10× |"), plain[4]
