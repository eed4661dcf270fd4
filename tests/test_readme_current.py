"""The README quotes only current figures.

* A fenced block right after ``<!-- readme-output: COMMAND -->`` shows ``$ COMMAND`` and what COMMAND
  prints now (stdout and stderr, as a terminal shows them) from the records shipped in perf_db/shipped/
  (fresh data dir, 80 terminal columns): the test runs it and compares.  ``<!-- readme-output: COMMAND
  [exit N] -->`` quotes a command that exits with status N (a refusal the README shows on purpose).
  Shipping new records without refreshing the README fails here.
* Every number between ``<!-- readme-numbers: BENCHMARKS.md -->`` and ``<!-- /readme-numbers -->`` is
  a cell of a table of BENCHMARKS.md (itself checked against benchmarks/results/ by
  test_benchmarks_doc.py); a time or speed ratio quoted anywhere else in the README's prose fails.
"""
from __future__ import annotations

import re
import sys

import pytest

from repo_scripts import ROOT, load_script

quotes = load_script("tools/readme_quotes.py")
README = ROOT / "README.md"
BENCHMARKS = ROOT / "BENCHMARKS.md"

NUMBERS = re.compile(r"<!-- readme-numbers: BENCHMARKS\.md -->\n(?P<body>.*?)<!-- /readme-numbers -->", re.S)
NUMBER = re.compile(r"(?<![\w.])\d+\.\d+(?:e[-+]\d+)?")
# a time or a speed ratio in prose: "2.07 ms", "1.4×", "1.4x" (ranges "0.53-0.85×" included)
SPEED = re.compile(r"(?<![\w.])\d+\.\d+(?:\s*-\s*\d+\.\d+)?\s*(?:ms\b|µs\b|×|x\b)")


def _quoted_outputs() -> list[tuple[str, str]]:
    return [(cmd, body) for cmd, _code, body in quotes.quoted_outputs(README.read_text())]


def test_readme_marks_the_blocks_it_checks():
    quoted = _quoted_outputs()
    assert quoted, "no <!-- readme-output: ... --> block in README.md"
    assert NUMBERS.search(README.read_text()), "no <!-- readme-numbers: BENCHMARKS.md --> region in README.md"
    for cmd, body in quoted:
        assert cmd.startswith("pathtune "), cmd
        assert body.splitlines()[0] == f"$ {cmd}", f"the block after the marker must start with `$ {cmd}`"


@pytest.fixture(scope="module")
def current_outputs(tmp_path_factory) -> dict[str, str]:
    """What each quoted command prints now (tools/readme_quotes.py: fresh HOME and working directory, the shipped
    records, 80 columns)."""
    commands = [(cmd, code) for cmd, code, _ in quotes.quoted_outputs(README.read_text())]
    try:
        return quotes.run_quoted(commands, tmp_path_factory.mktemp("readme"))
    except RuntimeError as exc:
        pytest.fail(str(exc))


def _stale_quotes(current: dict[str, str]) -> list[str]:
    return quotes.stale_quotes(README.read_text(), current)


def test_quoted_cli_output_is_what_the_shipped_records_give(current_outputs):
    stale = _stale_quotes(current_outputs)
    assert not stale, ("README.md quotes output that the shipped records no longer give; refresh it with "
                       "`python tools/readme_quotes.py --write`:\n\n" + "\n\n".join(stale))


def _benchmark_cells() -> set[str]:
    """Every number in a table row of BENCHMARKS.md (cells like "**2.074**", "2.33×", "2.6e-03 (dw)")."""
    cells: set[str] = set()
    for line in BENCHMARKS.read_text().splitlines():
        if line.startswith("|"):
            cells.update(NUMBER.findall(line))
    return cells


def test_readme_numbers_are_in_the_current_benchmarks():
    text = README.read_text()
    cells = _benchmark_cells()
    assert cells
    quoted = [n for m in NUMBERS.finditer(text) for n in NUMBER.findall(m["body"])]
    assert quoted, "the readme-numbers region quotes no number"
    missing = [n for n in quoted if n not in cells]
    assert not missing, (f"README.md quotes {missing}, which no table of BENCHMARKS.md holds: copy the current "
                         "numbers from BENCHMARKS.md (python benchmarks/report.py --write regenerates it)")


def test_no_speed_figure_outside_the_checked_parts():
    """A time or speed ratio in the README's prose is inside a readme-numbers region (checked above);
    code blocks quoting CLI output are checked by running the command."""
    text = NUMBERS.sub("", quotes.OUTPUT_MARK.sub("", README.read_text()))
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    loose = SPEED.findall(prose)
    assert not loose, (f"README.md quotes {loose} outside a <!-- readme-numbers: BENCHMARKS.md --> region: put "
                       "it in one (its numbers must be cells of BENCHMARKS.md)")


def test_a_stale_number_is_caught(monkeypatch, tmp_path):
    """One number of the region changed to a value no table holds fails the numbers check."""
    text = README.read_text()
    region = NUMBERS.search(text)
    first = NUMBER.search(region["body"])
    assert first, "the readme-numbers region quotes no number"
    start = region.start("body") + first.start()
    fake = tmp_path / "README.md"
    fake.write_text(text[:start] + "9.999" + text[start + len(first.group()):])
    monkeypatch.setattr(sys.modules[__name__], "README", fake)
    with pytest.raises(AssertionError, match="9.999"):
        test_readme_numbers_are_in_the_current_benchmarks()


def test_a_stale_output_is_caught(current_outputs, monkeypatch, tmp_path):
    """A README quoting other output than the commands give now (as after shipping records without
    refreshing it) fails the output check: one changed line of the first quoted block is caught."""
    text = README.read_text()
    cmd, body = _quoted_outputs()[0]
    lines = body.splitlines()
    assert len(lines) >= 2, f"the first quoted block (`{cmd}`) shows no output line"
    fake = tmp_path / "README.md"
    fake.write_text(text.replace(body, "\n".join(lines[:1] + [lines[1] + " (edited)"] + lines[2:]), 1))
    monkeypatch.setattr(sys.modules[__name__], "README", fake)
    stale = _stale_quotes(current_outputs)
    assert len(stale) == 1 and "(edited)" in stale[0]


def test_readme_stays_short():
    """The README is for users (what, install, journeys, API, CLI, environment): at most 20 KB; details
    belong in the package docs, BENCHMARKS.md and docs/."""
    size = len(README.read_bytes())
    assert size <= 20_000, f"README.md is {size} bytes, over 20 KB: move detail out of it"


def test_write_mode_turns_a_stale_block_current(current_outputs):
    """tools/readme_quotes.py --write's rewrite: a README with one quoted line changed is stale, and its rewrite
    quotes what the commands print (every other line of the README left as it was)."""
    text = README.read_text()
    cmd, body = _quoted_outputs()[0]
    lines = body.splitlines()
    stale = text.replace(body, "\n".join(lines[:1] + [lines[1] + " (edited)"] + lines[2:]), 1)
    assert quotes.stale_quotes(stale, current_outputs)
    fresh = quotes.refreshed(stale, current_outputs)
    assert not quotes.stale_quotes(fresh, current_outputs)
    strip = lambda t: quotes.OUTPUT_MARK.sub("", t)  # noqa: E731
    assert strip(fresh) == strip(text)
