"""pathtune.runtime: the public op, its input validation, the environment key, and the references.

Reference implementations live in ``pathtune.runtime.reference`` (naive, blockwise, recurrent).
"""
from .api import BACKENDS, path_attention, resolve_backend
from .environment import collect_env, env_hash, env_key
from .validation import InputInfo, check_head_dims, validate_inputs

__all__ = [
    "path_attention", "BACKENDS", "resolve_backend",
    "validate_inputs", "check_head_dims", "InputInfo",
    "collect_env", "env_key", "env_hash",
]
