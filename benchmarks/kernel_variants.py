"""Kernel variants for GPU probes, built from a kernel module's source by text replacement.

``triton.jit`` reads a kernel's source from its file, so a variant is written to a temporary module
(relative imports turned into ``pathtune.codegen.triton`` ones) and imported from there.  The
shipped kernel files stay untouched: a probe can time ideas next to the real kernels without
changing a source hash (which would retire the performance records measured on them).
"""
from __future__ import annotations

import contextlib
import importlib.util
import inspect
import os
import re
import sys
import tempfile
from pathlib import Path

_TMP = tempfile.mkdtemp(prefix="pathtune_variants_")


def module_source(module) -> str:
    """The source text of a kernel module (e.g. ``pathtune.codegen.triton.ut``)."""
    return inspect.getsource(module)


def load_variant_module(src: str, tag: str, replacements=(), append: str = ""):
    """The module of source ``src`` after the text replacements (each ``(old, new)`` must occur in the
    source) and with ``append`` (extra jit helpers) added at the end."""
    src = re.sub(r"^from \.(\w+) import", r"from pathtune.codegen.triton.\1 import", src, flags=re.M)
    for old, new in replacements:
        if old not in src:
            raise ValueError(f"variant {tag}: {old[:60]!r} not in the source")
        src = src.replace(old, new)
    path = os.path.join(_TMP, f"{tag}.py")
    with open(path, "w") as fh:
        fh.write(src + append)
    spec = importlib.util.spec_from_file_location(f"variant_{tag}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod      # dataclasses (with string annotations) look their module up there
    spec.loader.exec_module(mod)
    return mod


def load_variant(src: str, kernel: str, tag: str, replacements=(), append: str = ""):
    """The kernel ``kernel`` of ``load_variant_module(src, tag, replacements, append)``."""
    return getattr(load_variant_module(src, tag, replacements, append), kernel)


def repo_path(path: str) -> Path:
    """``path`` as given, or relative to the repository root when it does not exist from here (a GPU
    session runs its steps from another directory)."""
    p = Path(path)
    return p if p.is_absolute() or p.exists() else Path(__file__).resolve().parents[1] / p


def candidate_kernels(file: str, names) -> dict:
    """{name: attribute} of the ``names`` that the candidate module ``file`` (benchmarks/variants/) defines, from one
    load of it (its kernels built once)."""
    spec = importlib.util.spec_from_file_location(f"candidate_{Path(file).stem}_set", repo_path(file))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return {name: getattr(mod, name) for name in names if hasattr(mod, name)}


def load_candidate(entry: str, default_name: str):
    """The attribute NAME (default ``default_name``) of the module FILE, for ``entry`` = ``FILE[:NAME]``: a
    candidate kernel in benchmarks/variants/ (built from this tree's kernel source, with its launch arguments)."""
    file, _, name = entry.partition(":")
    spec = importlib.util.spec_from_file_location(f"candidate_{Path(file).stem}", repo_path(file))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return getattr(mod, name or default_name)


class Capture:
    """Stands in for a jitted kernel in a launcher module; keeps the first launch's grid and args."""

    def __init__(self, module, name):
        self.module, self.name, self.real = module, name, getattr(module, name)
        self.calls = []

    def __getattr__(self, attr):   # the kernel's attributes (its Python function, hooks) as the real one
        return getattr(self.real, attr)

    def __getitem__(self, grid):
        def launch(*args, **kw):
            if not self.calls:
                self.calls.append((grid, args, kw))
            return self.real[grid](*args, **kw)
        return launch

    def __enter__(self):
        setattr(self.module, self.name, self)
        return self

    def __exit__(self, *exc):
        setattr(self.module, self.name, self.real)


@contextlib.contextmanager
def swapped(module, name: str, kernel):
    """``module.name`` is ``kernel`` inside the block (None: unchanged), e.g. a launcher module's kernel."""
    if kernel is None:
        yield
        return
    real = getattr(module, name)
    setattr(module, name, kernel)
    try:
        yield
    finally:
        setattr(module, name, real)


@contextlib.contextmanager
def repeat_launcher_in_place(cls):
    """Every ``compiled(kernel)`` launch of the Triton launchers through repeat-launcher class ``cls`` (a candidate
    for codegen/triton/launch.py's ``_RepeatLaunch``) inside the block; the kept launchers are forgotten on the way
    in and out, so that each side compiles its own repeats."""
    import pathtune.codegen.triton.launch as launch_mod

    shipped = launch_mod._RepeatLaunch
    launch_mod._RepeatLaunch = cls
    launch_mod._REPEAT.clear()
    try:
        yield
    finally:
        launch_mod._RepeatLaunch = shipped
        launch_mod._REPEAT.clear()


class RegriddedKernel:
    """A kernel that takes the shipped launcher's ``kernel[grid](...)`` and launches on ``regrid(grid)`` instead (a
    candidate whose programs split the work another way); its other attributes are the kernel's."""

    def __init__(self, kernel, regrid) -> None:
        self.kernel, self.regrid = kernel, regrid

    def __getattr__(self, attr):
        return getattr(self.kernel, attr)

    def __getitem__(self, grid):
        return self.kernel[self.regrid(tuple(grid))]
