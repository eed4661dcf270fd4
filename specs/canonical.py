"""Canonical JSON and hashes: the one definition every key of pathtune is built on (spec hash,
Config hash, workload key, environment hash). Changing it changes every stored key."""
from __future__ import annotations

import hashlib
import json
from typing import Any

__all__ = ["canonical_json", "sha256_hex", "dtype_name"]


def canonical_json(obj: Any) -> str:
    """JSON with sorted keys and compact separators; NaN/inf are refused."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


def sha256_hex(text: str, length: int = 64) -> str:
    """sha256 of ``text`` (UTF-8) as hex, cut to ``length`` digits."""
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def dtype_name(dtype: Any) -> str:
    """The spec's name of a torch dtype: ``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")
