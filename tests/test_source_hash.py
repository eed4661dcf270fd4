"""Per-pass kernel source hashes (``pathtune.codegen.triton.source_hash(pass_)``), the perf_db hard key
of Triton records: a code edit of one pass's kernels retires only the records of the passes built from
that file; comments and docstrings do not count.  File edits are made on a temporary copy of
codegen/triton (the package's ``__file__`` is pointed at it), never on the real sources."""
from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

import pathtune.codegen.triton as tri
from pathtune.codegen.triton import _source_hash as sh

PASSES = ("fwd", "bwd", "decode")


def _module_imports(path: Path) -> set[str]:
    """Sibling modules a file imports at module level (``from .x import ...``)."""
    out = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            out.add(node.module.split(".")[0])
    return out


def test_every_file_is_placed_and_imports_stay_inside_their_pass():
    """Each kernel/launcher file belongs to the shared set or to a pass (so a new file is a decision);
    a pass's modules import (at module level) only modules hashed for that pass -- except autograd,
    which imports the backward launcher to register the custom op's backward: a forward never runs it."""
    root = Path(tri.__file__).parent
    placed = set(sh.SHARED_SOURCES) | {m for mods in sh.PASS_SOURCES.values() for m in mods}
    stems = {p.stem for p in root.glob("*.py")}
    assert stems - placed - set(sh.NOT_HASHED) == set()
    assert placed <= stems
    for pass_, mods in sh.PASS_SOURCES.items():
        hashed = set(mods) | set(sh.SHARED_SOURCES)
        for mod in mods:
            allowed = {"backward"} if (pass_, mod) == ("fwd", "autograd") else set()
            assert _module_imports(root / f"{mod}.py") <= hashed | allowed, (pass_, mod)
    assert set(sh.PASS_SOURCES["fwd"]) < set(sh.PASS_SOURCES["bwd"])     # fwd+bwd runs the forward
    assert not set(sh.PASS_SOURCES["decode"]) & set(sh.PASS_SOURCES["bwd"])


@pytest.fixture
def copy_of_sources(tmp_path, monkeypatch):
    root = tmp_path / "triton"
    shutil.copytree(Path(tri.__file__).parent, root, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(tri, "__file__", str(root / "__init__.py"))
    return root


def _hashes():
    return {p: tri.source_hash(p) for p in (None, *PASSES)}


@pytest.mark.parametrize("edit,changed", [
    ("forward.py", {None, "fwd", "bwd"}),
    ("scan_fwd.py", {None, "fwd", "bwd"}),
    ("bwd_intra.py", {None, "bwd"}),
    ("backward.py", {None, "bwd"}),
    ("decode.py", {None, "decode"}),
    ("_ops.py", {None, *PASSES}),
    ("params.py", {None, *PASSES}),
    ("new_helper.py", {None, *PASSES}),      # a file not placed yet counts for every pass
    ("compile_check.py", set()),             # runs no kernel
    ("registry.py", set()),                  # which stage variants exist: runs no kernel
    ("heuristics.py", set()),                # reads the spec's head_dim_defaults (untuned configs: not hashed)
])
def test_an_edit_changes_the_hashes_of_the_passes_built_from_it(copy_of_sources, edit, changed):
    before = _hashes()
    assert len(set(before.values())) == 4
    with open(copy_of_sources / edit, "a") as fh:
        fh.write("\n_EDITED = 1\n")
    after = _hashes()
    assert {p for p in before if before[p] != after[p]} == changed


def test_comments_docstrings_and_blank_lines_change_no_hash(copy_of_sources):
    """Rewording a comment or a docstring, or adding blank lines and trailing spaces, in any hashed file keeps
    every pass's hash (and so its records); a statement edit inside the same function changes it."""
    before = _hashes()
    path = copy_of_sources / "bwd_intra.py"
    text = path.read_text()
    first_def = text.index('    """', text.index("def _program_tile("))
    rest = text[text.index('"""', first_def + 7) + 4:]
    edited = text[:first_def] + '    """Reworded."""  # and a comment\n\n   \n' + rest
    edited = edited.replace("    n, hq = chunk_and_head(HQ)\n", "    n, hq = chunk_and_head(HQ)  # a new comment\n\n")
    path.write_text("# header comment\n" + edited + "\n\n# trailing comment\n")
    (copy_of_sources / "decode.py").write_text((copy_of_sources / "decode.py").read_text().replace("\n\n", "\n   \n\n"))
    assert _hashes() == before
    path.write_text(edited.replace("    n, hq = chunk_and_head(HQ)", "    n, hq = chunk_and_head(HQ + 0)"))
    after = _hashes()
    assert {p for p in before if before[p] != after[p]} == {None, "bwd"}


def test_canonical_source_keeps_code_that_looks_like_a_comment():
    """A '#' inside a string and a string that is not a docstring are code."""
    from pathtune.codegen.triton._source_hash import canonical_source

    text = 'def f():\n    """Doc."""\n    s = "# not a comment"  # a comment\n    "a bare string"\n    return s\n'
    assert canonical_source(text) == 'def f():\n    s = "# not a comment"\n    "a bare string"\n    return s'


def test_source_hash_default_is_all_files_and_passes_are_checked():
    assert [p.name for p in tri.source_files()] == sorted(
        p.name for p in Path(tri.__file__).parent.glob("*.py")
        if p.stem not in ("compile_check", "heuristics", "registry", "_source_hash"))
    with pytest.raises(ValueError, match="pass 'prefill'"):
        tri.source_hash("prefill")


def test_records_are_keyed_per_pass():
    """The tuner, the benches and the dispatcher key Triton records by the pass's hash."""
    from pathtune.runtime import dispatch
    from pathtune.tuning.space import source_hash_for

    for pass_ in PASSES:
        want = tri.source_hash(pass_)
        assert source_hash_for("triton", pass_) == want
        assert dispatch.current_keys("path_attention", pass_, "triton")["source_hash"] == want
    assert source_hash_for("triton") == tri.source_hash()
