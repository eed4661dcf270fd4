"""Module import cycles of the package (tools/import_graph.py, read with grimp; `.ci/run` also runs
lint-imports with the layer contracts of pyproject.toml)."""
from __future__ import annotations

import textwrap

import pytest

from repo_scripts import load_script

import_graph = load_script("tools/import_graph.py")


def test_no_module_import_cycles():
    assert import_graph.import_cycles() == []


def _fake_repo(root, files, ignore=()):
    (root / "pyproject.toml").write_text(textwrap.dedent("""\
        [tool.setuptools]
        package-dir = { "pathtune" = "pathtune", "pathtune.low" = "low" }

        [[tool.importlinter.contracts]]
        name = "acyclic"
        type = "acyclic_siblings"
        ancestors = ["pathtune"]
        ignore_imports = [%s]
        """) % ", ".join(f'"{i}"' for i in ignore))
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_a_cycle_through_a_mapped_subpackage_is_found(tmp_path):
    repo = _fake_repo(tmp_path, {
        "pathtune/__init__.py": "",
        "pathtune/top.py": "from pathtune.low import a\n",
        "low/__init__.py": "",
        "low/a.py": "from . import b\n",
        "low/b.py": "import pathtune.low.c\n",
        "low/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n",
        "low/d.py": "from .a import x\n",
        "low/e.py": "from .d import y\n",
    })
    assert import_graph.import_cycles(repo) == []               # c -> a is a TYPE_CHECKING import only
    (repo / "low/a.py").write_text("from . import b\nfrom .e import z\n")
    assert import_graph.import_cycles(repo) == [["pathtune.low.a", "pathtune.low.d", "pathtune.low.e"]]


def test_an_open_import_named_in_the_contract_leaves_the_count(tmp_path):
    files = {"pathtune/__init__.py": "", "low/__init__.py": "", "low/a.py": "from . import b\n",
             "low/b.py": "from . import a\n"}
    assert import_graph.import_cycles(_fake_repo(tmp_path, files)) == [["pathtune.low.a", "pathtune.low.b"]]
    (tmp_path / "pyproject.toml").unlink()
    repo = _fake_repo(tmp_path, files, ignore=["pathtune.low.b -> pathtune.low.a"])
    assert import_graph.open_imports(repo) == [("pathtune.low.b", "pathtune.low.a")]
    assert import_graph.import_cycles(repo) == []
    assert import_graph.import_cycles(repo, ignore_open=False) == [["pathtune.low.a", "pathtune.low.b"]]
    (tmp_path / "pyproject.toml").unlink()
    with pytest.raises(ValueError, match="must name two modules exactly"):
        import_graph.open_imports(_fake_repo(tmp_path, files, ignore=["pathtune.low.* -> pathtune.low.a"]))
