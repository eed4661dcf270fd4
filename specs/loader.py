"""Load a spec YAML into a validated :class:`Spec`."""
from __future__ import annotations

import functools
import os
from collections.abc import Hashable
from importlib import resources
from pathlib import Path
from typing import Optional, Union

import yaml

from .schema import Spec, SpecError

__all__ = ["load_spec", "parse_spec_text", "default_spec_path", "DEFAULT_SPEC"]

DEFAULT_SPEC = "path_attention.yaml"


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys (plain YAML keeps the last one silently)."""


def _mapping_without_duplicates(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False):
    seen: dict = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if isinstance(key, Hashable):
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first defined on line {seen[key] + 1})", key_node.start_mark)
            seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)


def default_spec_path() -> Path:
    """Path of the packaged spec (pathtune/specs/path_attention.yaml)."""
    return Path(str(resources.files("pathtune.specs").joinpath(DEFAULT_SPEC)))


def parse_spec_text(text: str, source: Optional[str] = None) -> Spec:
    """Validate spec YAML text; ``source`` names it in error messages."""
    source = source or "<string>"
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "unknown position"
        problem = getattr(e, "problem", None) or str(e)
        raise SpecError(source, [("", f"not valid YAML at {where}: {problem}")]) from None
    if data is None:
        raise SpecError(source, [("", "the file is empty")])
    return Spec.from_dict(data, source=source)


@functools.lru_cache(maxsize=1)
def _packaged_spec() -> Spec:
    path = default_spec_path()
    return parse_spec_text(path.read_text(encoding="utf-8"), source=str(path))


def load_spec(path: Union[str, os.PathLike, None] = None) -> Spec:
    """Load and validate a spec.

    ``path=None`` gives the packaged ``path_attention.yaml`` (parsed once, then cached: specs are
    immutable). Raises :class:`SpecError` (a ValueError) naming the file and every bad field.
    """
    if path is None:
        return _packaged_spec()
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(str(p), [("", "file not found")]) from None
    except IsADirectoryError:
        raise SpecError(str(p), [("", "is a directory, not a spec YAML file")]) from None
    except UnicodeDecodeError as e:
        raise SpecError(str(p), [("", f"not UTF-8 text ({e.reason} at byte {e.start})")]) from None
    return parse_spec_text(text, source=str(p))
