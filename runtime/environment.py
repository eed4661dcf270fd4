"""The GPU environment fingerprint (``collect_env``, ``env_key``, ``env_hash``), importable from here
too: defined in ``pathtune.fingerprint``, below perf_db and the runtime, which both key records by it."""
from pathtune.fingerprint import ENV_KEY_SCHEMA, HARD_KEYS, SOFT_KEYS, collect_env, env_hash, env_key

__all__ = ["collect_env", "env_key", "env_hash", "HARD_KEYS", "SOFT_KEYS", "ENV_KEY_SCHEMA"]
