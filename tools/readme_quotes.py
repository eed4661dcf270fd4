"""The CLI output README.md quotes: run each quoted command as a new user would and compare or rewrite.

    python tools/readme_quotes.py            # exit 1 and show the difference if a quoted block is stale
    python tools/readme_quotes.py --write    # replace each quoted block's output by what the command prints now

A fenced block right after ``<!-- readme-output: COMMAND -->`` shows ``$ COMMAND`` and what COMMAND prints (stdout
and stderr as a terminal shows them) from the records shipped in perf_db/shipped/: a fresh HOME, no PATHTUNE_ or
XDG_ setting, an 80-column terminal, a fresh working directory per command.  ``<!-- readme-output: COMMAND
[exit N] -->`` quotes a command that exits with status N.  tests/test_readme_current.py runs the check.
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SHIPPED_DIR = ROOT / "perf_db" / "shipped"

OUTPUT_MARK = re.compile(r"<!-- readme-output: (?P<cmd>.+?) -->\n```[^\n]*\n(?P<body>.*?)\n```", re.S)
EXIT_MARK = re.compile(r"\s*\[exit (\d+)\]$")
# ISO timestamps and run ids: never compared (none is printed by the quoted commands today)
STAMP = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:[+-]\d{2}:\d{2}|Z)?|\d{8}T\d{6}Z")


def normalise(text: str) -> str:
    lines = [STAMP.sub("<time>", line.rstrip()) for line in text.splitlines()]
    return "\n".join(lines).strip("\n")


def quoted_outputs(text: str) -> list[tuple[str, int, str]]:
    """(command, expected exit status, quoted body) of each readme-output block of ``text``."""
    out = []
    for m in OUTPUT_MARK.finditer(text):
        raw = m["cmd"].strip()
        code = EXIT_MARK.search(raw)
        out.append((EXIT_MARK.sub("", raw), int(code.group(1)) if code else 0, m["body"]))
    return out


def user_env(home: Path) -> dict[str, str]:
    """The caller's environment without any pathtune or XDG setting (so no user database, pack or data dir is
    read or written), a fresh HOME, the shipped records and an 80-column terminal."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PATHTUNE_", "XDG_"))}
    env.update(HOME=str(home), COLUMNS="80", LINES="50", NO_COLOR="1", PATHTUNE_SHIPPED_DIR=str(SHIPPED_DIR))
    env.pop("FORCE_COLOR", None)
    return env


def run_quoted(commands: list[tuple[str, int]], tmp: Path) -> dict[str, str]:
    """{command: what it prints now}, each run in a fresh working directory (a relative output path such as
    ``-o h200.json`` never exists beforehand) with one fresh data dir for all.  A command that exits with
    another status than its block says raises RuntimeError naming it."""
    home = tmp / "home"
    home.mkdir()
    env = user_env(home)
    out = {}
    for i, (cmd, want) in enumerate(commands):
        cwd = tmp / f"cwd{i}"
        cwd.mkdir()
        argv = [sys.executable, "-m", "pathtune.cli", *shlex.split(cmd)[1:]]
        run = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             timeout=120)
        if run.returncode != want:
            raise RuntimeError(f"`{cmd}` exited {run.returncode}, README expects {want}:\n{run.stdout[-2000:]}")
        out[cmd] = run.stdout.replace(str(home), "~")   # the data dir's path as a user's README reads it
    return out


def stale_quotes(text: str, current: dict[str, str]) -> list[str]:
    """A message per block of ``text`` whose quoted output differs from ``current``'s."""
    stale = []
    for cmd, _code, body in quoted_outputs(text):
        want = normalise(body.split("\n", 1)[1] if "\n" in body else "")
        got = normalise(current[cmd])
        if got != want:
            stale.append(f"`{cmd}` prints now:\n{got}\n\nREADME.md quotes:\n{want}")
    return stale


def refreshed(text: str, current: dict[str, str]) -> str:
    """``text`` with each quoted block's output replaced by ``current``'s (the ``$ COMMAND`` line kept)."""
    def body(m: re.Match) -> str:
        cmd = EXIT_MARK.sub("", m["cmd"].strip())
        lines = [line.rstrip() for line in current[cmd].strip("\n").splitlines()]
        head = m.group(0)[: m.start("body") - m.start(0)]
        return head + "\n".join([f"$ {cmd}", *lines]) + "\n```"
    return OUTPUT_MARK.sub(body, text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="rewrite README.md's quoted outputs")
    a = ap.parse_args(argv)
    text = README.read_text()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            current = run_quoted([(cmd, code) for cmd, code, _ in quoted_outputs(text)], Path(tmp))
        except RuntimeError as exc:
            print(f"readme_quotes: {exc}", file=sys.stderr)
            return 2
    if a.write:
        new = refreshed(text, current)
        README.write_text(new)
        print(f"README.md: {sum(o != n for o, n in zip(quoted_outputs(text), quoted_outputs(new)))} quoted "
              "block(s) refreshed")
        return 0
    stale = stale_quotes(text, current)
    for message in stale:
        print(message, end="\n\n")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
