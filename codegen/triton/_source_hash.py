"""Which source files key the Triton records of each pass, and their hash (``source_hash``).

A perf_db record of the Triton backend carries the hash of the files its pass's kernels and launchers are
built from: an edit of those files retires the pass's records (the dispatcher stops serving them, the tuner
warm-starts new studies from them).  The hash reads each file's code only: comments, docstrings, blank lines
and trailing spaces are left out (``canonical_source``), so rewording a comment retires nothing, while any
change to a statement does.

This module is not hashed itself (``NOT_HASHED``): moving a file between passes here changes the hashes
through the files each pass then covers.
"""
from __future__ import annotations

import ast
import functools
import hashlib
import io
import sys
import tokenize
from pathlib import Path

__all__ = ["NOT_HASHED", "PASS_SOURCES", "SHARED_SOURCES", "canonical_source", "source_files", "source_hash"]

# Module names in this folder.  SHARED modules count for every pass; a module listed nowhere (a new file)
# also counts for every pass until it is placed here.  compile_check and registry (which stage variants the
# launchers implement) run no kernel; heuristics reads the untuned config from the spec, whose hash keys
# every record.  autograd imports backward (the custom op's registered backward), which a forward never runs.
SHARED_SOURCES = ("__init__", "_ops", "launch", "params")
PASS_SOURCES = {
    "fwd": ("autograd", "forward", "_layout", "gate_bias", "scan_fwd", "transport", "ut"),
    "bwd": ("autograd", "forward", "_layout", "gate_bias", "scan_fwd", "transport", "ut",
            "backward", "bwd_chain", "bwd_inter", "bwd_intra", "bwd_prep", "ut_bwd"),
    "decode": ("decode",),
}
NOT_HASHED = ("compile_check", "heuristics", "registry", "_source_hash")

def _folder() -> Path:
    # the package's own __file__ (tests point it at a copy of the folder)
    return Path(sys.modules[__package__].__file__).parent


def source_files(pass_: str | None = None) -> list[Path]:
    """The .py files ``source_hash(pass_)`` covers, sorted (pass_ None: every kernel and launcher file)."""
    if pass_ is not None and pass_ not in PASS_SOURCES:
        raise ValueError(f"pass {pass_!r} is not one of {', '.join(PASS_SOURCES)}")
    files = [p for p in sorted(_folder().glob("*.py")) if p.stem not in NOT_HASHED]
    if pass_ is None:
        return files
    placed = {m for mods in PASS_SOURCES.values() for m in mods} | set(SHARED_SOURCES)
    mine = set(PASS_SOURCES[pass_]) | set(SHARED_SOURCES)
    return [p for p in files if p.stem in mine or p.stem not in placed]


def _docstring_spans(tree: ast.AST) -> list[tuple[int, int, int, int]]:
    """(first line, first column, last line, end column) of the module's, classes' and functions' docstrings."""
    spans = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                spans.append((first.lineno, first.col_offset, first.end_lineno, first.end_col_offset))
    return spans


def canonical_source(text: str) -> str:
    """``text`` (Python source) without its comments and docstrings, trailing spaces and blank lines: what
    the hash reads.  Raises SyntaxError for text that does not parse."""
    lines = text.splitlines()
    spans = _docstring_spans(ast.parse(text))
    spans += [(*tok.start, *tok.end) for tok in tokenize.generate_tokens(io.StringIO(text).readline)
              if tok.type == tokenize.COMMENT]
    chars = [list(line) for line in lines]
    for r0, c0, r1, c1 in spans:       # 1-based lines, 0-based columns (end exclusive)
        for r in range(r0, r1 + 1):
            row = chars[r - 1]
            lo = c0 if r == r0 else 0
            hi = c1 if r == r1 else len(row)
            row[lo:hi] = [" "] * (hi - lo)
    kept = ("".join(row).rstrip() for row in chars)
    return "\n".join(line for line in kept if line)


@functools.lru_cache(maxsize=256)
def _canonical_file(path: str, mtime_ns: int, size: int) -> bytes:
    """``canonical_source`` of a file's text, cached per (path, modification time, size): the passes share files,
    and parsing them is most of a hash's ~0.1 s."""
    return canonical_source(Path(path).read_text(encoding="utf-8")).encode()


def _code_hash(pass_: str | None) -> str:
    h = hashlib.sha256()
    for path in source_files(pass_):
        st = path.stat()
        h.update(path.name.encode())
        h.update(b"\0")
        h.update(_canonical_file(str(path), st.st_mtime_ns, st.st_size))
        h.update(b"\0")
    return h.hexdigest()[:16]


def source_hash(pass_: str | None = None) -> str:
    """sha256 (16 hex) of the code of one pass's kernel and launcher files (``fwd``, ``bwd``, ``decode``;
    ``PASS_SOURCES``), or of all of them (``pass_`` None): a perf_db hard key.

    A measurement recorded under another hash was taken with different kernel code and is not served to
    the dispatcher.  Comments and docstrings do not count (``canonical_source``)."""
    return _code_hash(pass_)
