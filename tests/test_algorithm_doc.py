"""docs/algorithm.md stays citable: every ``docs/algorithm.md#<anchor>`` cited anywhere in the repository
names a section of the doc, the doc's own links resolve, and every code reference in the doc
(`` `path/to/file.py: name` ``) names a file that exists and defines or mentions that name."""
from __future__ import annotations

import re

from repo_scripts import ROOT

DOC = ROOT / "docs" / "algorithm.md"
# text files that may cite the doc (results JSON and build outputs cannot)
_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".sh", ".cfg", ".ini", ".rst"}
_SKIP_DIRS = {".git", "__pycache__", "build", "dist", ".venv", "venv", "node_modules", ".pytest_cache",
              ".ruff_cache", "results"}
_CITE = re.compile(r"algorithm\.md#([A-Za-z0-9_-]+)")
_CODE_REF = re.compile(r"`([\w.-]+(?:/[\w.-]+)+\.(?:py|yaml|md))(?:: ([\w.]+))?`")


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _headings(text: str) -> list[str]:
    out, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            out.append(line.lstrip("#").strip())
    return out


def _anchors() -> set[str]:
    return {_slug(h) for h in _headings(DOC.read_text(encoding="utf-8"))}


def _repo_files():
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT)
        if path.suffix in _SUFFIXES and path.is_file() and not (set(rel.parts[:-1]) & _SKIP_DIRS) \
                and not any(p.endswith(".egg-info") for p in rel.parts):
            yield path


def test_headings_have_unique_anchors():
    slugs = [_slug(h) for h in _headings(DOC.read_text(encoding="utf-8"))]
    assert len(slugs) > 10
    assert len(slugs) == len(set(slugs)), sorted(s for s in slugs if slugs.count(s) > 1)


def test_every_cited_anchor_exists():
    anchors = _anchors()
    cited, missing = 0, []
    for path in _repo_files():
        for m in _CITE.finditer(path.read_text(encoding="utf-8", errors="replace")):
            cited += 1
            if m.group(1) not in anchors:
                missing.append(f"{path.relative_to(ROOT)}: #{m.group(1)}")
    assert cited, "no file cites docs/algorithm.md#..."
    assert not missing, "cited sections missing from docs/algorithm.md:\n" + "\n".join(missing)


def test_reference_modules_cite_the_doc():
    for name in ("naive.py", "blockwise.py", "recurrent.py", "_common.py"):
        text = (ROOT / "runtime" / "reference" / name).read_text(encoding="utf-8")
        assert _CITE.search(text), f"runtime/reference/{name} cites no docs/algorithm.md section"


def test_links_inside_the_doc_resolve():
    text = DOC.read_text(encoding="utf-8")
    anchors = _anchors()
    missing = [a for a in re.findall(r"\]\(#([A-Za-z0-9_-]+)\)", text) if a not in anchors]
    assert not missing, missing


def test_code_references_in_the_doc_exist():
    text = DOC.read_text(encoding="utf-8")
    refs = _CODE_REF.findall(text)
    assert len(refs) > 30
    problems = []
    for rel, name in refs:
        path = ROOT / rel
        if not path.is_file():
            problems.append(f"{rel}: no such file")
        elif name and not re.search(rf"\b{re.escape(name.split('.')[-1])}\b", path.read_text(encoding="utf-8")):
            problems.append(f"{rel}: {name} not found")
    assert not problems, "\n".join(problems)
