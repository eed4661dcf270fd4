"""Flip-flop language modelling (FFL, Liu et al. 2023, as in the PaTH paper's Table 1) with PaTH, RoPE and PaTH-FoX; see README.md."""
from __future__ import annotations


def _ensure_pathtune_importable() -> None:
    """Let a bare source checkout run the example without ``pip install``.

    pathtune maps its subpackages onto top-level folders of the same name (pyproject's
    package-dir: ``pathtune.runtime`` -> ``runtime/`` ...).  An installed pathtune is used as is;
    otherwise the repository root is added to the search path of the ``pathtune`` package.
    """
    try:
        import pathtune.runtime  # noqa: F401
        return
    except ImportError:
        pass
    import os
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if root not in sys.path:
        sys.path.insert(0, root)
    import pathtune

    if root not in list(pathtune.__path__):
        pathtune.__path__.append(root)
    import pathtune.runtime  # noqa: F401  (raises if the checkout is broken)


_ensure_pathtune_importable()
