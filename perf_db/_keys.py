"""The values perf_db stores, validated: kernel key, measurement, and the normalised forms of an
environment (``collect_env()`` output), a ``Workload`` and a ``Config``."""
from __future__ import annotations

import math
import platform
import re
import shlex
import sys
import uuid
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from typing import Any, Callable, Mapping, Optional, Union

from pathtune.specs import Config, Workload
from pathtune.specs.canonical import canonical_json, sha256_hex

from ._errors import PerfDBError
from ._models import BACKENDS, PASSES, STATUSES

__all__ = ["KernelKey", "Measurement", "EnvLike", "KernelLike", "WorkloadLike", "ConfigLike", "CurrentKeys",
           "DISPATCH_BACKENDS", "SPEC_BACKENDS", "BACKEND_LIBS", "as_kernel", "as_workload", "as_config",
           "as_measurement", "env_columns", "new_run_id", "current_command", "parse_time", "iso",
           "default_current_keys", "spec_keys", "current_spec_hashes", "same_spec_hashes", "stale_reasons",
           "soft_mismatch", "DEFAULT_OP", "env_key_schema", "WITHDRAWN_RUNS"]

DEFAULT_OP = "path_attention"
# Backends the runtime can dispatch a PaTH call to (best() considers these unless told otherwise).
DISPATCH_BACKENDS = ("triton", "tvm")
# Backends whose kernels are generated from the spec (so spec_hash / source_hash pin them).
SPEC_BACKENDS = ("triton", "tvm")
# Which library versions are hard keys for a backend's results (besides GPU, cc and CUDA).
BACKEND_LIBS: dict[str, tuple[str, ...]] = {"triton": ("triton",), "fla": ("triton",), "tvm": ("tvm",),
                                            "sdpa": (), "reference": ()}
ENV_COLUMNS = ("gpu_name", "cc", "sm_count", "mem_bytes", "driver", "cuda", "ptxas", "triton", "tvm", "torch",
               "pathtune", "host")


@dataclass(frozen=True, kw_only=True)
class KernelKey:
    """What was measured. ``spec_hash`` / ``codegen_version`` / ``source_hash`` are ``""`` when they do
    not apply (e.g. the SDPA baseline)."""

    op: str = DEFAULT_OP
    pass_: str
    backend: str
    spec_hash: str = ""
    codegen_version: str = ""
    source_hash: str = ""

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise PerfDBError(f"kernel backend {self.backend!r} is not one of {', '.join(BACKENDS)}")
        if self.pass_ not in PASSES:
            raise PerfDBError(f"kernel pass {self.pass_!r} is not one of {', '.join(PASSES)}")
        for name in ("op", "spec_hash", "codegen_version", "source_hash"):
            value = getattr(self, name)
            if not isinstance(value, str) or len(value) > 64:
                raise PerfDBError(f"kernel {name} must be a string of at most 64 characters, got {value!r}")
        if not self.op:
            raise PerfDBError("kernel op must not be empty")

    def to_dict(self) -> dict[str, str]:
        d = asdict(self)
        d["pass"] = d.pop("pass_")
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "KernelKey":
        data = dict(data)
        if "pass" in data:
            data["pass_"] = data.pop("pass")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise PerfDBError(f"unknown kernel fields {unknown}; fields: op, pass, backend, spec_hash, "
                              "codegen_version, source_hash")
        for name in ("spec_hash", "codegen_version", "source_hash"):
            if data.get(name) is None:
                data[name] = ""
        try:
            return cls(**data)
        except TypeError as e:
            raise PerfDBError(f"bad kernel {dict(data)!r}: {e}") from None


def _finite_pos(name: str, value: Any, *, allow_zero: bool = False) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PerfDBError(f"measurement {name} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise PerfDBError(f"measurement {name} must be a finite positive number, got {value!r}")
    return value


def parse_time(value: Any) -> Optional[datetime]:
    """An aware UTC datetime from a datetime or an ISO-8601 string (a naive one is read as UTC)."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise PerfDBError(f"not an ISO-8601 time: {value!r}") from None
    if not isinstance(value, datetime):
        raise PerfDBError(f"expected a datetime or ISO-8601 string, got {value!r}")
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc)


def iso(value: Optional[datetime]) -> Optional[str]:
    return None if value is None else value.astimezone(timezone.utc).isoformat()


@dataclass(frozen=True, kw_only=True)
class Measurement:
    """The outcome of timing one config (architecture.md's Measurement contract).

    status: ``ok``, ``compile_error``, ``out_of_resources``, ``wrong`` (failed the accuracy gate),
    ``crash`` or ``timeout``. ``ok`` needs ``median_ms``. Times are milliseconds; ``p20_ms`` <=
    ``median_ms`` <= ``p80_ms``. ``errors``: relative error per output tensor vs the reference
    (``{"o": 3e-3, "dq": 5e-3}``); ``max_rel_err`` defaults to their max. ``baseline_ms``: the SDPA
    (or other, ``baseline_name``) time measured in the same run on the same shapes.
    """

    status: str
    median_ms: Optional[float] = None
    p20_ms: Optional[float] = None
    p80_ms: Optional[float] = None
    n_reps: Optional[int] = None
    bench_method: Optional[str] = None
    errors: Optional[Mapping[str, float]] = None
    max_rel_err: Optional[float] = None
    baseline_ms: Optional[float] = None
    baseline_name: Optional[str] = None
    study_name: Optional[str] = None
    trial_number: Optional[int] = None
    command: Optional[str] = None
    message: Optional[str] = None
    created_at: Optional[datetime] = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if self.status not in STATUSES:
            raise PerfDBError(f"measurement status {self.status!r} is not one of {', '.join(STATUSES)}")
        for name in ("median_ms", "p20_ms", "p80_ms", "baseline_ms"):
            set_(self, name, _finite_pos(name, getattr(self, name)))
        if self.status == "ok" and self.median_ms is None:
            raise PerfDBError("an ok measurement needs median_ms")
        if self.median_ms is not None:
            if self.p20_ms is not None and self.p20_ms > self.median_ms * (1 + 1e-9):
                raise PerfDBError(f"p20_ms {self.p20_ms} > median_ms {self.median_ms}")
            if self.p80_ms is not None and self.p80_ms < self.median_ms * (1 - 1e-9):
                raise PerfDBError(f"p80_ms {self.p80_ms} < median_ms {self.median_ms}")
        for name in ("n_reps", "trial_number"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise PerfDBError(f"measurement {name} must be a non-negative int, got {value!r}")
        errors = None
        if self.errors is not None:
            if not isinstance(self.errors, Mapping):
                raise PerfDBError(f"measurement errors must map output name -> relative error, got {self.errors!r}")
            errors = {}
            for name, value in self.errors.items():
                if not isinstance(name, str) or isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise PerfDBError(f"measurement errors must map output name -> float, got {name!r}: {value!r}")
                value = float(value)
                if math.isnan(value) or value < 0:
                    value = math.inf  # a NaN or negative "error" is as wrong as it gets
                if not math.isfinite(value) and self.status == "ok":
                    raise PerfDBError(f"an ok measurement has a non-finite error for {name!r}")
                errors[name] = value
            errors = dict(sorted(errors.items()))
            set_(self, "errors", errors)
        if self.max_rel_err is not None:
            if isinstance(self.max_rel_err, bool) or not isinstance(self.max_rel_err, (int, float)):
                raise PerfDBError(f"measurement max_rel_err must be a number, got {self.max_rel_err!r}")
            value = float(self.max_rel_err)
            set_(self, "max_rel_err", math.inf if math.isnan(value) else value)
        elif errors:
            set_(self, "max_rel_err", max(errors.values()))
        if self.baseline_ms is not None and self.baseline_name is None:
            set_(self, "baseline_name", "sdpa")
        set_(self, "created_at", parse_time(self.created_at))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (``created_at`` as ISO-8601; non-finite errors as the strings ``"inf"``)."""
        d = asdict(self)
        d["created_at"] = iso(self.created_at)
        if d["errors"] is not None:
            d["errors"] = {k: json_float(v) for k, v in d["errors"].items()}
        d["max_rel_err"] = json_float(d["max_rel_err"])
        return {k: v for k, v in d.items() if v is not None}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Measurement":
        data = dict(data)
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise PerfDBError(f"unknown measurement fields {unknown}; fields: {', '.join(sorted(names))}")
        if "status" not in data:
            raise PerfDBError("a measurement needs a status")
        if isinstance(data.get("errors"), Mapping):
            data["errors"] = {k: float_from_json(v) for k, v in data["errors"].items()}
        if "max_rel_err" in data:
            data["max_rel_err"] = float_from_json(data["max_rel_err"])
        return cls(**data)

    def content(self) -> dict[str, Any]:
        """What two copies of one fact must agree on (everything but ``command`` and ``created_at``)."""
        d = self.to_dict()
        for k in ("command", "created_at"):
            d.pop(k, None)
        return d


def json_float(value: Optional[float]) -> Any:
    """A float for JSON output: inf / nan as strings (strict JSON has no such numbers)."""
    if value is None or math.isfinite(value):
        return value
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def float_from_json(value: Any) -> Any:
    if isinstance(value, str) and value.lower() in ("inf", "infinity", "+inf", "nan", "-inf"):
        return float(value)
    return value


EnvLike = Mapping[str, Any]
KernelLike = Union[KernelKey, Mapping[str, Any]]
WorkloadLike = Union[Workload, Mapping[str, Any]]
ConfigLike = Union[Config, Mapping[str, Any]]
CurrentKeys = Callable[[str, str, str], Optional[Mapping[str, Any]]]
"""``current_keys(op, pass_, backend)`` -> ``{"spec_hash": ..., "source_hash": ...}`` of the code that
would run now; a missing or None value is not checked. Results whose kernel differs are stale.
``"spec_hashes"`` (optional) lists further spec hashes that are current too (``current_spec_hashes``):
the default's are the pass's hash (``Spec.pass_hash``, what new records carry) and the full spec hash
(what records carried before the per-pass hash; the same spec, so the same pass hash)."""


def as_kernel(kernel: KernelLike) -> KernelKey:
    if isinstance(kernel, KernelKey):
        return kernel
    if isinstance(kernel, Mapping):
        return KernelKey.from_dict(kernel)
    raise PerfDBError(f"kernel must be a KernelKey or a mapping, got {type(kernel).__name__}")


def as_workload(workload: WorkloadLike) -> Workload:
    if isinstance(workload, Workload):
        return workload
    if isinstance(workload, Mapping):
        try:
            return Workload.from_dict(dict(workload))
        except (TypeError, ValueError) as e:
            raise PerfDBError(f"bad workload {dict(workload)!r}: {e}") from None
    raise PerfDBError(f"workload must be a pathtune.specs.Workload or a mapping, got {type(workload).__name__}")


def as_config(config: ConfigLike) -> Config:
    if isinstance(config, Config):
        return config
    if isinstance(config, Mapping):
        try:
            return Config(config)
        except (TypeError, ValueError) as e:
            raise PerfDBError(f"bad config {dict(config)!r}: {e}") from None
    raise PerfDBError(f"config must be a pathtune.specs.Config or a mapping, got {type(config).__name__}")


def as_measurement(measurement: Union[Measurement, Mapping[str, Any]]) -> Measurement:
    if isinstance(measurement, Measurement):
        return measurement
    if isinstance(measurement, Mapping):
        return Measurement.from_dict(measurement)
    raise PerfDBError(f"measurement must be a Measurement or a mapping, got {type(measurement).__name__}")


def _host() -> str:
    return platform.node() or "unknown-host"


def _environment() -> Any:
    # Imported on use: read-only commands that never look at an environment do not need it.
    from pathtune import fingerprint

    return fingerprint


def env_key_schema() -> int:
    return _environment().ENV_KEY_SCHEMA


def env_columns(info: EnvLike) -> dict[str, Any]:
    """Columns of a ``perf_env`` row from ``collect_env()`` output (plus an optional ``host``)."""
    environment = _environment()
    HARD_KEYS, SOFT_KEYS = environment.HARD_KEYS, environment.SOFT_KEYS
    if not isinstance(info, Mapping):
        raise PerfDBError(f"env_info must be a mapping (collect_env() output), got {type(info).__name__}")
    missing = [k for k in (*HARD_KEYS, *SOFT_KEYS) if k not in info]
    if missing:
        raise PerfDBError(f"env_info lacks {', '.join(missing)}; pass pathtune.fingerprint.collect_env() "
                          "output (keys may be None, but must be present)")
    info = dict(info)
    info.setdefault("host", _host())
    hard = environment.env_key(info)["hard"]

    def opt_str(name: str, value: Any) -> Optional[str]:
        if value is None:
            return None
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise PerfDBError(f"env_info {name} must be a string, got {value!r}")
        return str(value)

    def opt_int(name: str, value: Any) -> Optional[int]:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise PerfDBError(f"env_info {name} must be an int, got {value!r}")
        return value

    cols = {
        "gpu_name": opt_str("gpu_name", hard["gpu_name"]),
        "cc": opt_str("compute_capability", info.get("compute_capability")),
        "sm_count": opt_int("sm_count", info.get("sm_count")),
        "mem_bytes": opt_int("gpu_memory_bytes", info.get("gpu_memory_bytes")),
        "driver": opt_str("driver", info.get("driver")),
        "cuda": opt_str("cuda_runtime", info.get("cuda_runtime")),
        "ptxas": opt_str("ptxas", info.get("ptxas")),
        "triton": opt_str("triton", info.get("triton")),
        "tvm": opt_str("tvm", info.get("tvm")),
        "torch": opt_str("torch", info.get("torch")),
        "pathtune": opt_str("pathtune", info.get("pathtune")),
        "host": opt_str("host", info.get("host")),
    }
    try:
        info_json = canonical_json(info)
    except (TypeError, ValueError) as e:
        raise PerfDBError(f"env_info is not JSON-serialisable: {e}") from None
    cols["env_hash"] = environment.env_hash(info)
    cols["key_schema"] = environment.ENV_KEY_SCHEMA
    cols["fingerprint"] = sha256_hex(canonical_json({k: cols[k] for k in (*ENV_COLUMNS, "env_hash", "key_schema")}))
    cols["info_json"] = info_json
    return cols


def current_command() -> str:
    return shlex.join(sys.argv) if sys.argv and sys.argv != [""] else "python (interactive)"


def new_run_id(host: Optional[str] = None, when: Optional[datetime] = None) -> str:
    """``20250101T120000Z-<host>-<8 hex>``: sortable by time, unique across hosts."""
    when = (when or datetime.now(timezone.utc)).astimezone(timezone.utc)
    host = re.sub(r"[^A-Za-z0-9.-]+", "-", host or _host())[:40].strip("-") or "host"
    return f"{when:%Y%m%dT%H%M%SZ}-{host}-{uuid.uuid4().hex[:8]}"


def spec_keys(spec: Any, pass_: str) -> dict[str, Any]:
    """The spec part of ``current_keys`` for ``pass_`` of ``spec`` (a ``pathtune.specs.Spec``): new records
    carry the pass hash (``spec_hash``); a record of the pass hash or of the full spec hash is current."""
    if pass_ not in spec.passes:
        return {"spec_hash": spec.hash}
    hashes = spec.hashes_of(pass_)
    return {"spec_hash": hashes[0], "spec_hashes": hashes}


def default_current_keys(op: str, pass_: str, backend: str) -> Optional[dict[str, Any]]:
    """The packaged spec's hashes for spec-generated backends of its op (``spec_keys``: the pass hash, and
    the full hash of records made before per-pass hashes); source hashes unknown.

    The tuner and dispatcher pass their own ``current_keys`` (with the codegen's source hashes) to
    ``PerfDB``; this default only retires results of an older spec, or of a pass whose part of the spec
    changed.
    """
    if backend not in SPEC_BACKENDS:
        return None
    from pathtune.specs import load_spec

    spec = load_spec()
    if op != spec.name:
        return None
    return {**spec_keys(spec, pass_), "source_hash": None}


def current_spec_hashes(current: Optional[Mapping[str, Any]]) -> tuple[str, ...]:
    """Every spec hash a ``current_keys`` answer accepts: its ``spec_hash`` and its ``spec_hashes``
    (empty: the spec hash is not checked)."""
    if not current:
        return ()
    out = [] if current.get("spec_hash") is None else [current["spec_hash"]]
    out += [h for h in current.get("spec_hashes") or () if h not in out]
    return tuple(out)


def same_spec_hashes(spec_hash: str, current: Optional[Mapping[str, Any]]) -> tuple[str, ...]:
    """The stored spec hashes that name the same spec as ``spec_hash`` for one pass: all that ``current``
    accepts when it accepts ``spec_hash`` (the pass hash and the full hash of the current spec), else
    ``spec_hash`` alone."""
    accepted = current_spec_hashes(current)
    return accepted if spec_hash in accepted else (spec_hash,)


# Runs whose measurements are known not to be of the configs their records name (a fault of the harness found
# after they were made): never served, packed or shown as current, never pruned by ``gc`` (the records stay, with
# this reason in their ``stale`` list).  run_id -> reason.
_BWD_KNOBS_NOT_RUN = ("withdrawn: its bwd trials ran dk / dv on the head-dim default's key tile and warps, not the "
                      "recorded config's (a tuner fault, fixed)")
WITHDRAWN_RUNS: Mapping[str, str] = dict.fromkeys((
    # H100-20261206T093612Z-bwd-tune.json (source ffcc0ae57babddba), one run per key
    "tune-4efa73074e1726517d67fa7e", "tune-e13fbbcd8c59fbd4404d3a0b", "tune-63394df9cab597d876cb3e7e",
    "tune-cdeb781a9440447157cfaebc", "tune-96cf7dd6bfc2e4934589680e", "tune-38555ed6036dd648d84026ae",
    "tune-6969be970f19b1d1f756f3e2", "tune-b5141390aae605afd3102303", "tune-e2da48f635fd6cf05635f771",
    "tune-88a53db30432af537b2eaa47", "tune-18155a883ec933376276b50b", "tune-278ef4400933a37f85c46e38",
), _BWD_KNOBS_NOT_RUN)


def stale_reasons(kernel: Mapping[str, Any], current: Optional[Mapping[str, Any]]) -> list[str]:
    """Why a stored kernel no longer matches the code that would run now (empty: it matches); a row that
    carries its ``run_id`` is stale too when that run is withdrawn (``WITHDRAWN_RUNS``)."""
    withdrawn = WITHDRAWN_RUNS.get(str(kernel.get("run_id")))
    out = [withdrawn] if withdrawn else []
    if not current:
        return out
    specs = current_spec_hashes(current)
    if specs and kernel.get("spec_hash") not in specs:
        out.append(f"spec_hash {str(kernel.get('spec_hash'))[:12] or '(none)'} != current {specs[0][:12]}")
    want = current.get("source_hash")
    if want is not None and kernel.get("source_hash") != want:
        out.append(f"source_hash {str(kernel.get('source_hash'))[:12] or '(none)'} != current {str(want)[:12]}")
    return out


def soft_mismatch(row: Mapping[str, Any], info: Optional[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Soft keys (driver, torch, ptxas) where a stored row differs from ``info``: ``{key: {stored, current}}``."""
    if info is None:
        return {}
    out = {}
    for key in _environment().SOFT_KEYS:
        if key in info and row.get(key) != info.get(key):
            out[key] = {"stored": row.get(key), "current": info.get(key)}
    return out
