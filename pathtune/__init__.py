"""pathtune: compiler-driven kernel autotuner for PaTH attention (Householder position encoding).

Public API::

    from pathtune import path_attention, load_spec, Config, Workload
    from pathtune import PaTHAttention, PaTHCache, load_pack, unload_pack

Names are loaded on first use, so ``import pathtune`` stays light (``pathtune spec ...`` on the
command line never imports torch); nothing here imports TVM, Optuna or SQLAlchemy.
"""
from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

try:
    __version__ = version("pathtune")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

_EXPORTS = {
    "path_attention": "pathtune.runtime.api",
    "path_attention_prefill": "pathtune.runtime.decode",
    "path_attention_decode": "pathtune.runtime.decode",
    "PaTHKVCache": "pathtune.runtime.decode",
    "load_spec": "pathtune.specs.loader",
    "Config": "pathtune.specs.knobs",
    "Workload": "pathtune.specs.workload",
    "load_pack": "pathtune.runtime.dispatch",
    "unload_pack": "pathtune.runtime.dispatch",
    "PaTHAttention": "pathtune.runtime.layer",
    "PaTHCache": "pathtune.runtime.cache",
}
__all__ = ["path_attention", "load_spec", "Config", "Workload", "load_pack", "unload_pack", "PaTHAttention",
           "PaTHCache", "__version__"]

__all__ += ["path_attention_prefill", "path_attention_decode", "PaTHKVCache"]

if TYPE_CHECKING:  # pragma: no cover
    from pathtune.runtime.api import path_attention
    from pathtune.runtime.cache import PaTHCache
    from pathtune.runtime.dispatch import load_pack, unload_pack
    from pathtune.runtime.layer import PaTHAttention
    from pathtune.specs.knobs import Config
    from pathtune.specs.loader import load_spec
    from pathtune.specs.workload import Workload


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pathtune' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
