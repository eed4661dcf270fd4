"""Consoles of the CLI commands."""
from __future__ import annotations

from rich.console import Console


def table_console(console: Console, width: int) -> Console:
    """``console`` on a terminal; else (output piped to a file or a log) a console at least ``width``
    columns wide, so that a wide table keeps its numbers instead of eliding every cell to fit 80."""
    return console if console.is_terminal else Console(file=console.file, width=max(console.width, width))
