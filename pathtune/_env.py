"""Every ``PATHTUNE_*`` environment variable, typed, in one place (documented in ENVs.md).

Values are read from ``os.environ`` at each access (not at import), so a change made by a test or a
launcher script takes effect immediately. A malformed value raises ``ValueError`` naming the
variable and what it accepts.

    from pathtune import _env
    if _env.CHECK_INPUTS.get(): ...
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Generic, Optional, TypeVar

__all__ = ["EnvVar", "ALL", "CHECK_INPUTS", "DB_URL", "PACK", "GPU_NAME", "PRINT_DISPATCH", "CACHE_DIR",
           "DISPATCH_DB", "SHIPPED_DIR", "TVM_MODULES",
           "default_db_url", "default_cache_dir", "problems", "check_once"]

T = TypeVar("T")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _parse_bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{name}={raw!r} is not a boolean; use 1 or 0 (also accepted: true/false, yes/no, on/off)")


def _parse_str(name: str, raw: str) -> Optional[str]:
    return raw.strip() or None


def _parse_path(name: str, raw: str) -> Optional[Path]:
    raw = raw.strip()
    return Path(raw).expanduser() if raw else None


def default_cache_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_cache_dir("pathtune"))


def default_db_url() -> str:
    import platformdirs

    return f"sqlite:///{Path(platformdirs.user_data_dir('pathtune')) / 'perf.sqlite3'}"


@dataclass(frozen=True)
class EnvVar(Generic[T]):
    """One variable: its name, how to parse it, the default when unset, and what it does."""

    name: str
    parse: Callable[[str, str], T]
    default: Callable[[], T]
    type_name: str
    default_doc: str
    doc: str

    def raw(self) -> Optional[str]:
        return os.environ.get(self.name)

    def is_set(self) -> bool:
        return self.name in os.environ

    def get(self) -> T:
        raw = self.raw()
        if raw is not None:
            value = self.parse(self.name, raw)
            if value is not None:
                return value
        return self.default()


CHECK_INPUTS: EnvVar[bool] = EnvVar(
    "PATHTUNE_CHECK_INPUTS", _parse_bool, lambda: False, "bool", "0",
    "1: run the value checks of path_attention (beta in (0, 2], w unit-norm, cu_seqlens) on GPU inputs "
    "too. They always run on CPU inputs; on the GPU they are off by default because each is a host sync.")
DB_URL: EnvVar[str] = EnvVar(
    "PATHTUNE_DB_URL", _parse_str, default_db_url, "SQLAlchemy URL",
    "sqlite:///<user data dir>/pathtune/perf.sqlite3",
    "Database of tuning results (perf_db), e.g. postgresql+psycopg://user@host/pathtune for a fleet.")
PACK: EnvVar[Optional[Path]] = EnvVar(
    "PATHTUNE_PACK", _parse_path, lambda: None, "path", "unset",
    "A tuned-config pack (JSON) the dispatcher installs on its first lookup (as pathtune.load_pack would); "
    "a pack for another GPU is refused with a warning.")
GPU_NAME: EnvVar[Optional[str]] = EnvVar(
    "PATHTUNE_GPU_NAME", _parse_str, lambda: None, "str", "unset (torch.cuda.get_device_name())",
    "Overrides the GPU name in the environment key (e.g. to share results between two names of one GPU).")
PRINT_DISPATCH: EnvVar[bool] = EnvVar(
    "PATHTUNE_PRINT_DISPATCH", _parse_bool, lambda: False, "bool", "0",
    "1: print to stderr which backend path_attention chose and why, and per dispatch key the kernel config "
    "and its source (pack / perf_db / bucket / default / heuristic), once each.")
CACHE_DIR: EnvVar[Path] = EnvVar(
    "PATHTUNE_CACHE_DIR", _parse_path, default_cache_dir, "path", "<user cache dir>/pathtune",
    "Where pathtune keeps files it can rebuild (generated sources, downloaded packs).")

DISPATCH_DB: EnvVar[bool] = EnvVar(
    "PATHTUNE_DISPATCH_DB", _parse_bool, lambda: True, "bool", "1",
    "0: the runtime dispatcher never opens perf_db; it uses a loaded pack, then the built-in heuristic.")

SHIPPED_DIR: EnvVar[Optional[Path]] = EnvVar(
    "PATHTUNE_SHIPPED_DIR", _parse_path, lambda: None, "path", "unset (the package's perf_db/shipped)",
    "Folder of shipped results files (the tuned records of reference GPUs): commands that write ingest them "
    "into their database once, read commands show them beside it without writing; an empty folder leaves "
    "them out (the test suite does).")

TVM_MODULES: EnvVar[Optional[Path]] = EnvVar(
    "PATHTUNE_TVM_MODULES", _parse_path, lambda: None, "path", "unset",
    "Folder of prebuilt TVM modules (e.g. a `python -m pathtune.codegen.tvm.build_decode_bench` bundle) that "
    "backend='auto' decoding searches first, before tvm_modules/ beside a loaded pack and "
    "<PATHTUNE_CACHE_DIR>/tvm/modules; modules are matched by their build metadata, not by name.")

ALL: tuple[EnvVar, ...] = (CHECK_INPUTS, DB_URL, PACK, GPU_NAME, PRINT_DISPATCH, CACHE_DIR, DISPATCH_DB, SHIPPED_DIR,
                           TVM_MODULES)

# read by the test suite and its helpers (tests/), never by the package: set, they are not typos
TEST_SUITE_VARIABLES = ("PATHTUNE_TEST_PG_URL", "PATHTUNE_TEST_PG_DIR", "PATHTUNE_TEST_SESSION_DB", "PATHTUNE_FAKE_LOG",
                        "PATHTUNE_FAKE_SLEEP", "PATHTUNE_TVM_BENCH_MODULES")
# variables pathtune no longer reads, with what replaced them (named when one is still set)
RETIRED = {"PATHTUNE_BWD_RANGE_MIB": "the backward's range budget is the spec knob bwd_range_budget_mib (MiB, 0 = one "
                                     "range): tune it with `pathtune tune --memory-knobs`"}
_BY_NAME = {var.name: var for var in ALL}


def problems(environ: Optional[dict] = None) -> list[str]:
    """One line per PATHTUNE_* variable that is set but malformed, retired (the line names what replaced it) or not
    a pathtune variable at all (a misspelt name would otherwise be ignored without a word)."""
    return [message for message, _malformed in _problems(environ)]


def _problems(environ: Optional[dict] = None) -> list[tuple[str, bool]]:
    """``problems``' lines, each with whether it is a malformed value (an error) rather than a name pathtune
    does not read (unknown or retired: a warning)."""
    environ = os.environ if environ is None else environ
    out = []
    for name in sorted(n for n in environ if n.startswith("PATHTUNE_") and n not in TEST_SUITE_VARIABLES):
        var = _BY_NAME.get(name)
        if name in RETIRED:
            out.append((f"{name} is no longer read: {RETIRED[name]}", False))
            continue
        if var is None:
            out.append((f"{name} is not a pathtune variable (known: {', '.join(sorted(_BY_NAME))}; see ENVs.md)",
                        False))
            continue
        try:
            var.parse(name, environ[name])
        except ValueError as exc:
            out.append((str(exc), True))
    return out


_CHECKED = False


def check_once() -> None:
    """On the first call in a process: raise ValueError naming every malformed PATHTUNE_* value (the
    public entry points call it, so a bad value fails there instead of being ignored on code paths
    that never read it) and warn about unknown or retired PATHTUNE_* names.  Later calls cost nothing; a value
    changed afterwards is still checked wherever it is read."""
    global _CHECKED
    if _CHECKED:
        return
    import warnings

    found = _problems()
    bad = [message for message, malformed in found if malformed]
    if bad:
        raise ValueError("malformed pathtune environment: " + "; ".join(bad))
    for message, _malformed in found:
        warnings.warn(f"pathtune: {message}", stacklevel=3)
    _CHECKED = True
