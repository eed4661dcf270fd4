"""What machine and software a measurement belongs to, and the key that says when it still applies.

``collect_env()`` gathers facts (GPU, driver, CUDA, ptxas, library versions) without importing
Triton or TVM: versions come from package metadata. ``env_key()`` splits them into *hard* keys (a
tuning result measured under other values must not be used) and *soft* keys (recorded; a mismatch
is worth a warning only). ``env_hash()`` is the sha256 of the hard keys.
"""
from __future__ import annotations

import importlib.metadata as md
import importlib.util
import os
import platform
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Optional

from pathtune import _env
from pathtune.specs.canonical import canonical_json, sha256_hex

__all__ = ["collect_env", "env_key", "env_hash", "HARD_KEYS", "SOFT_KEYS", "ENV_KEY_SCHEMA"]

# Bump when the meaning of a hard key changes: stored results then stop matching.
ENV_KEY_SCHEMA = 1
HARD_KEYS = ("gpu_name", "compute_capability", "cuda_runtime", "triton", "tvm")
# ptxas is soft: which one Triton runs can change inside a process (torch's inductor points
# TRITON_PTXAS_PATH at the ptxas in torch's wheel the first time it compiles), so a model under
# torch.compile and the bench that measured its records would otherwise never share an environment.
SOFT_KEYS = ("driver", "torch", "ptxas")

_TIMEOUT_S = 10


def _version(dist: str) -> Optional[str]:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _run(cmd: list[str]) -> Optional[str]:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=_TIMEOUT_S, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _ptxas_path() -> Optional[str]:
    """The ptxas Triton uses: TRITON_PTXAS_PATH, else the one bundled in the triton wheel, else PATH."""
    explicit = os.environ.get("TRITON_PTXAS_PATH")
    if explicit:
        return explicit
    try:
        spec = importlib.util.find_spec("triton")  # locates the package without importing it
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.origin:
        bundled = Path(spec.origin).parent / "backends" / "nvidia" / "bin" / "ptxas"
        if bundled.is_file():
            return str(bundled)
    return shutil.which("ptxas")


def _ptxas_version() -> Optional[str]:
    path = _ptxas_path()
    if path is None:
        return None
    text = _run([path, "--version"])
    m = re.search(r"release\s+([\d.]+),\s*V([\d.]+)", text or "")
    return m.group(2) if m else None


def _driver_version() -> Optional[str]:
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        pynvml = None
    if pynvml is not None:
        try:
            pynvml.nvmlInit()
            try:
                version = pynvml.nvmlSystemGetDriverVersion()
            finally:
                pynvml.nvmlShutdown()
            return version.decode() if isinstance(version, bytes) else str(version)
        except Exception:  # NVML missing or no driver: fall through
            pass
    if shutil.which("nvidia-smi"):
        text = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        if text:
            return text.splitlines()[0].strip()
    return None


def collect_env() -> dict[str, Any]:
    """Facts about this machine. GPU fields are None when there is no CUDA GPU."""
    import torch

    info: dict[str, Any] = {
        "gpu_name": None,
        "gpu_count": 0,
        "compute_capability": None,
        "sm_count": None,
        "gpu_memory_bytes": None,
        "driver": None,
        "cuda_runtime": torch.version.cuda,
        "ptxas": _ptxas_version(),
        "torch": torch.__version__,
        "triton": _version("triton"),
        "tvm": _version("apache-tvm") or _version("tvm"),
        "tvm_ffi": _version("apache-tvm-ffi"),
        "pathtune": _version("pathtune"),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(
            gpu_name=_env.GPU_NAME.get() or props.name,
            gpu_count=torch.cuda.device_count(),
            compute_capability=f"{props.major}.{props.minor}",
            sm_count=props.multi_processor_count,
            gpu_memory_bytes=props.total_memory,
            driver=_driver_version(),
        )
    return info


def env_key(info: Optional[dict[str, Any]] = None) -> dict[str, dict[str, Any]]:
    """``{"hard": {...}, "soft": {...}}`` from ``collect_env()`` output (collected now if not given).

    Hard: GPU name and compute capability ("cpu" / None without a GPU), CUDA runtime, Triton, TVM,
    plus the key schema version. Soft: driver, torch, ptxas.
    """
    info = collect_env() if info is None else info
    hard = {k: info.get(k) for k in HARD_KEYS}
    if hard["gpu_name"] is None:
        hard["gpu_name"] = "cpu"
    hard["key_schema"] = ENV_KEY_SCHEMA
    return {"hard": hard, "soft": {k: info.get(k) for k in SOFT_KEYS}}


def env_hash(info: Optional[dict[str, Any]] = None) -> str:
    """sha256 (hex) of the canonical JSON of the hard keys."""
    hard = env_key(info)["hard"]
    return sha256_hex(canonical_json(hard))
