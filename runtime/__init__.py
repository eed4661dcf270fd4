"""pathtune.runtime: the public op, kernel dispatch, the PaTHAttention layer and its cache, input
validation, the environment key, and the references.

Reference implementations live in ``pathtune.runtime.reference`` (naive, blockwise, recurrent).
"""
from .api import BACKENDS, path_attention, resolve_backend
from .cache import PaTHCache
from .dispatch import load_pack, loaded_pack, select_plan, unload_pack
from .environment import collect_env, env_hash, env_key
from .layer import PaTHAttention
from .validation import InputInfo, check_head_dims, validate_inputs

__all__ = [
    "path_attention", "BACKENDS", "resolve_backend",
    "PaTHAttention", "PaTHCache", "load_pack", "unload_pack", "loaded_pack", "select_plan",
    "validate_inputs", "check_head_dims", "InputInfo",
    "collect_env", "env_key", "env_hash",
]
