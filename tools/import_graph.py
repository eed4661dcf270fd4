"""The import graph of the ``pathtune`` package: ``lint-imports`` (the contracts in pyproject.toml) and the
module-level import cycles, both read by grimp.

    python tools/import_graph.py            # lint-imports, then the cycle count; exit 1 if either fails
    python tools/import_graph.py --cycles   # the cycle count only

The subpackages live in top-level folders (``specs/`` is ``pathtune.specs``: pyproject's ``package-dir``),
which grimp cannot follow, since it finds a package's modules by walking the package's folder. So both
checks run on a tree of symlinks laid out as the installed package is (built from ``package-dir`` in a
temporary folder), put first on ``sys.path``.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "pathtune"


def package_dirs(root: Path = ROOT) -> dict[str, Path]:
    """Package name -> its folder, from pyproject.toml's ``[tool.setuptools] package-dir``."""
    config = tomllib.loads((root / "pyproject.toml").read_text())
    return {name: root / folder for name, folder in config["tool"]["setuptools"]["package-dir"].items()}


def build_tree(dest: Path, root: Path = ROOT) -> Path:
    """Lay out ``dest/pathtune/...`` as the installed package: the root package's files, and a symlink
    per mapped subpackage. Returns ``dest``."""
    dirs = package_dirs(root)
    top = dest / PACKAGE
    top.mkdir(parents=True)
    mapped = {name.split(".", 1)[1] for name in dirs if name != PACKAGE}
    for entry in dirs[PACKAGE].iterdir():
        if entry.name not in mapped:
            (top / entry.name).symlink_to(entry)
    for name, folder in dirs.items():
        if name != PACKAGE:
            (dest / name.replace(".", "/")).symlink_to(folder, target_is_directory=True)
    return dest


@contextlib.contextmanager
def package_tree(root: Path = ROOT) -> Iterator[Path]:
    """A temporary folder holding the package tree (``build_tree``), removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="pathtune-import-graph-") as tmp:
        yield build_tree(Path(tmp), root)


def _pythonpath(tree: Path) -> str:
    return os.pathsep.join([str(tree), *filter(None, [os.environ.get("PYTHONPATH")])])


def lint_imports(root: Path = ROOT) -> int:
    """Run ``lint-imports`` (its contracts: pyproject.toml) on the package tree; its exit status."""
    with package_tree(root) as tree:
        env = {**os.environ, "PYTHONPATH": _pythonpath(tree)}
        cmd = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command as c; "
               "sys.exit(c())", "--no-cache", "--config", str(root / "pyproject.toml")]
        # run from the tree: a checkout's own pathtune/ folder must not come first on the path
        return subprocess.run(cmd, cwd=tree, env=env).returncode


def open_imports(root: Path = ROOT) -> list[tuple[str, str]]:
    """The imports the acyclic_siblings contract of pyproject.toml ignores (known open cycles):
    (importer, imported) pairs, which must name modules exactly (no wildcards)."""
    config = tomllib.loads((root / "pyproject.toml").read_text()).get("tool", {}).get("importlinter", {})
    pairs = []
    for contract in config.get("contracts", []):
        if contract.get("type") != "acyclic_siblings":
            continue
        for expr in contract.get("ignore_imports", []):
            importer, _, imported = (part.strip() for part in expr.partition("->"))
            if "*" in expr or not importer or not imported:
                raise ValueError(f"pyproject.toml: ignore_imports entry {expr!r} of the acyclic_siblings contract "
                                 "must name two modules exactly ('a.b -> c.d')")
            pairs.append((importer, imported))
    return pairs


def import_cycles(root: Path = ROOT, *, ignore_open: bool = True) -> list[list[str]]:
    """Each set of modules that import one another in a circle (a strongly connected part of the
    module import graph with more than one module), sorted. Imports under ``if TYPE_CHECKING:`` never
    run and are left out, as in the import-linter contracts; ``ignore_open``: so are the imports the
    acyclic_siblings contract ignores (``open_imports``). Read in a child process, where the package
    tree comes first on the path."""
    ignored = open_imports(root) if ignore_open else []
    with package_tree(root) as tree:
        env = {**os.environ, "PYTHONPATH": _pythonpath(tree)}
        proc = subprocess.run([sys.executable, __file__, "--cycles-json", json.dumps(ignored)], cwd=root, env=env,
                              capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"reading the import graph failed:\n{proc.stderr}")
    return json.loads(proc.stdout)


def _cycles_here(ignored: list[tuple[str, str]]) -> list[list[str]]:
    import grimp

    graph = grimp.build_graph(PACKAGE, cache_dir=None, exclude_type_checking_imports=True)
    for importer, imported in ignored:
        graph.remove_import(importer=importer, imported=imported)
    cycles, seen = [], set()
    for module in sorted(graph.modules):
        if module in seen:
            continue
        # upstream: what it imports, directly or not; downstream: what imports it
        part = (graph.find_upstream_modules(module) & graph.find_downstream_modules(module)) | {module}
        seen |= part
        if len(part) > 1:
            cycles.append(sorted(part))
    return cycles


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", action="store_true", help="only count the module import cycles")
    parser.add_argument("--cycles-json", help=argparse.SUPPRESS)  # import_cycles' child: the ignored imports
    args = parser.parse_args(argv)
    if args.cycles_json is not None:
        print(json.dumps(_cycles_here([tuple(pair) for pair in json.loads(args.cycles_json)])))
        return 0
    status = 0 if args.cycles else lint_imports()
    cycles = import_cycles()
    for cycle in cycles:
        print("import cycle: " + " <-> ".join(cycle))
    ignored = open_imports()
    print(f"{len(cycles)} module import cycle(s)"
          + (f" ({len(ignored)} open import(s) ignored: pyproject.toml, acyclic_siblings contract)" if ignored else ""))
    return status or (1 if cycles else 0)


if __name__ == "__main__":
    sys.exit(main())
