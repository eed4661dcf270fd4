"""Tuned-config packs: one JSON per GPU that the runtime reads, read-only, without a database.

Layout (``format: pathtune-pack``, ``version: 1``)::

    {"format": "pathtune-pack", "version": 1,
     "_metadata": {"gpu_name", "cc", "pathtune", "spec_hash", "spec_hashes"?, "triton", "tvm", "torch", "cuda",
                   "ptxas", "driver", "env_hash", "key_schema", "created_at"},
     "entries": [{"workload": {...Workload.to_dict()}, "pass", "backend", "config", "median_ms",
                  "source_hash", "codegen_version", "run_id", "baseline_ms"?}, ...],
     "default": {"fwd": {"backend", "config", "wins", "workloads", "geomean_slowdown"}, ...}}

Lookup: the exact workload key, else the same key at the nearest length bucket (log2 distance, ties
to the larger), else the pass's default (when it satisfies the spec's constraints for the workload).
Decode keys differ by their token-count bucket (``Workload.query_bucket``) too: the decode default comes
from one-token keys and serves one-token calls only.
Hard keys (GPU name, cc, Triton major.minor, spec hash) must match or ``PackMismatch`` is raised;
other differences (CUDA, ptxas, torch, driver, Triton patch, pathtune) only warn. The pack's spec hash
is the full spec hash (``Spec.hash``) of the records it was exported from, which carry their pass's hash
(``Spec.pass_hash``) or, older ones, the full hash.  A pack exported from records of the packaged spec also
stores each pass's hash (``spec_hashes``): its entries and default of a pass are then served while that
pass's part of the spec is unchanged (a later knob of another pass does not retire them; a changed pass's
entries are not served, said once), and the full hash is not a hard key; an older pack without them needs
the full hash to match.
"""
from __future__ import annotations

import copy
import json
import math
import os
import tempfile
import warnings
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence, Union

from pathtune import _env
from pathtune.specs import KEY_SCHEMA, Config, Workload

from ._errors import PackMismatch, PerfDBError, SoftMismatchWarning
from ._keys import DEFAULT_OP, DISPATCH_BACKENDS, CurrentKeys, as_workload, iso
from ._validate import config_problems, time_problem

if TYPE_CHECKING:  # pragma: no cover
    from ._store import PerfDB

__all__ = ["PACK_FORMAT", "PACK_VERSION", "Pack", "PackEntry", "PackHit", "export_pack", "load_pack"]

PACK_FORMAT = "pathtune-pack"
PACK_VERSION = 1
# pack metadata key -> collect_env() key, for the soft comparison
_SOFT = {"cuda": "cuda_runtime", "ptxas": "ptxas", "torch": "torch", "driver": "driver", "pathtune": "pathtune"}


def _major_minor(version: Optional[str]) -> Optional[str]:
    if not version:
        return None
    parts = version.split("+")[0].split(".")
    return ".".join(parts[:2])


@dataclass(frozen=True)
class PackEntry:
    workload: Workload
    backend: str
    config: Config
    median_ms: float
    source_hash: str = ""
    codegen_version: str = ""
    run_id: Optional[str] = None
    baseline_ms: Optional[float] = None

    @property
    def pass_(self) -> str:
        return self.workload.pass_

    def to_dict(self) -> dict[str, Any]:
        d = {"workload": self.workload.to_dict(), "pass": self.workload.pass_, "backend": self.backend,
             "config": self.config.to_dict(), "median_ms": self.median_ms, "source_hash": self.source_hash,
             "codegen_version": self.codegen_version, "run_id": self.run_id}
        if self.baseline_ms is not None:
            d["baseline_ms"] = self.baseline_ms
        return d


@dataclass(frozen=True)
class PackHit:
    """A pack's answer: run ``backend`` with ``config``. ``match``: exact, nearest or default."""

    backend: str
    config: Config
    match: str
    median_ms: Optional[float]
    seq_bucket: Optional[int]
    entry: Optional[PackEntry] = None


def _shape_key(wl: Workload) -> tuple:
    return (wl.pass_, wl.head_dim, wl.head_dim_v, wl.heads_q, wl.heads_kv, wl.dtype, wl.use_gate, wl.varlen,
            wl.batch_bucket, wl.query_bucket)


def _bad(path: str, message: str) -> PerfDBError:
    return PerfDBError(f"{path}: not a valid pathtune pack: {message}")


class Pack:
    """A loaded pack (read-only). ``lookup`` answers a workload; ``check`` compares environments."""

    def __init__(self, doc: Mapping[str, Any], source: str = "<pack>") -> None:
        if not isinstance(doc, Mapping) or doc.get("format") != PACK_FORMAT:
            raise _bad(source, f"'format' must be {PACK_FORMAT!r}")
        if doc.get("version") != PACK_VERSION:
            raise _bad(source, f"version {doc.get('version')!r} is not supported (this pathtune reads {PACK_VERSION})")
        meta = doc.get("_metadata")
        if not isinstance(meta, Mapping) or not meta.get("gpu_name"):
            raise _bad(source, "'_metadata' with at least gpu_name is required")
        if meta.get("key_schema", KEY_SCHEMA) != KEY_SCHEMA:
            raise _bad(source, f"workload key schema {meta.get('key_schema')} is not the current {KEY_SCHEMA}; "
                               "export the pack again")
        self.source = source
        self._doc = copy.deepcopy(dict(doc))
        self.metadata: Mapping[str, Any] = MappingProxyType(dict(meta))
        if not isinstance(doc.get("entries"), list):
            raise _bad(source, "'entries' must be a list (empty when nothing was measured)")
        if not isinstance(doc.get("default", {}), Mapping):
            raise _bad(source, "'default' must be an object of pass -> {backend, config}")
        entries = []
        for i, e in enumerate(doc["entries"]):
            try:
                wl = Workload.from_dict(e["workload"])
                if e.get("pass", wl.pass_) != wl.pass_:
                    raise ValueError(f"pass {e['pass']!r} != workload pass {wl.pass_!r}")
                entry = PackEntry(wl, e["backend"], Config(e["config"]), float(e["median_ms"]),
                                  e.get("source_hash") or "", e.get("codegen_version") or "",
                                  e.get("run_id"), e.get("baseline_ms"))
            except KeyError as exc:
                raise _bad(source, f"entries[{i}]: the field {exc.args[0]!r} is missing") from None
            except (TypeError, ValueError) as exc:
                raise _bad(source, f"entries[{i}]: {exc}") from None
            pass_hash = (meta.get("spec_hashes") or {}).get(wl.pass_, meta.get("spec_hash"))
            problem = time_problem(entry.median_ms) or next(iter(config_problems(
                entry.backend, wl.pass_, pass_hash, entry.config.to_dict(), wl)), None)
            if problem:
                raise _bad(source, f"entries[{i}] ({entry.backend} {wl.pass_} D={wl.head_dim} T<={wl.seq_bucket}): "
                                   f"{problem}; export the pack again from valid records")
            entries.append(entry)
        self.entries: tuple[PackEntry, ...] = tuple(entries)
        defaults = {}
        for pass_, d in (doc.get("default") or {}).items():
            try:
                defaults[pass_] = (d["backend"], Config(d["config"]))
            except KeyError as exc:
                raise _bad(source, f"default[{pass_!r}]: the field {exc.args[0]!r} is missing") from None
            except (TypeError, ValueError) as exc:
                raise _bad(source, f"default[{pass_!r}]: {exc}") from None
            # a default serves every head dim of its pass: its knobs and domains (constraints need dims)
            problems = config_problems(d["backend"], pass_, (meta.get("spec_hashes") or {}).get(
                pass_, meta.get("spec_hash")), d["config"])
            if problems:
                raise _bad(source, f"default[{pass_!r}]: {problems[0]}; export the pack again from valid records")
        self.defaults: Mapping[str, tuple[str, Config]] = MappingProxyType(defaults)
        index: dict[tuple, dict[int, list[PackEntry]]] = {}
        for entry in self.entries:
            index.setdefault(_shape_key(entry.workload), {}).setdefault(entry.workload.seq_bucket, []).append(entry)
        for by_bucket in index.values():
            for bucket in by_bucket.values():
                bucket.sort(key=lambda en: en.median_ms)
        self._index = index
        self._checked: dict[tuple, tuple[str, ...]] = {}
        self._told_passes: set[str] = set()

    def __repr__(self) -> str:
        return f"Pack({self.metadata['gpu_name']!r}, {len(self.entries)} entries, source={self.source!r})"

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(self._doc)

    def save(self, path: Union[str, Path]) -> Path:
        return _write_json(Path(path), self._doc)

    # -- environment check ----------------------------------------------------------------------------

    def check(self, env_info: Optional[Mapping[str, Any]] = None, spec_hash: Optional[str] = None
              ) -> tuple[str, ...]:
        """Raise ``PackMismatch`` on a hard-key difference; warn (once) and return soft differences.

        ``env_info``: ``collect_env()`` output (collected if None). ``spec_hash``: default the
        packaged spec's hash.
        """
        if env_info is None:
            from pathtune.fingerprint import collect_env

            env_info = collect_env()
        if spec_hash is None:
            spec_hash = _packaged_spec().hash
        gpu = env_info.get("gpu_name") or "cpu"
        cache_key = (gpu, env_info.get("compute_capability"), env_info.get("triton"), spec_hash,
                     *(env_info.get(k) for k in _SOFT.values()))
        if cache_key in self._checked:
            return self._checked[cache_key]
        meta = self.metadata
        hard = [("GPU name", meta.get("gpu_name"), gpu),
                ("compute capability", meta.get("cc"), env_info.get("compute_capability"))]
        if not self._per_pass(spec_hash):
            hard.append(("spec hash", meta.get("spec_hash"), spec_hash))
        if meta.get("triton"):
            hard.append(("Triton major.minor", _major_minor(meta.get("triton")), _major_minor(env_info.get("triton"))))
        for name, packed, here in hard:
            if packed is not None and packed != here:
                raise PackMismatch(f"pack {self.source} was tuned for {name} {packed!r}, but this machine has "
                                   f"{here!r}; export a pack for this machine (pathtune export) or unset "
                                   f"{_env.PACK.name}")
        soft = []
        if meta.get("triton") and meta.get("triton") != env_info.get("triton"):
            soft.append(f"triton {meta.get('triton')} (now {env_info.get('triton')})")
        for key, env_key in _SOFT.items():
            if meta.get(key) is not None and meta.get(key) != env_info.get(env_key):
                soft.append(f"{key} {meta.get(key)} (now {env_info.get(env_key)})")
        if meta.get("tvm") and _major_minor(meta.get("tvm")) != _major_minor(env_info.get("tvm")):
            soft.append(f"tvm {meta.get('tvm')} (now {env_info.get('tvm')}): tvm entries are not served")
        result = tuple(soft)
        if result:
            warnings.warn(f"pack {self.source} was tuned with " + "; ".join(result) + "; its configs are served, "
                          "timings may differ", SoftMismatchWarning, stacklevel=3)
        self._checked[cache_key] = result
        return result

    def _per_pass(self, spec_hash: Optional[str]) -> bool:
        """The pack names each pass's spec hash and is checked against the packaged spec (whose pass hashes
        decide, per pass, in ``lookup``)."""
        return isinstance(self.metadata.get("spec_hashes"), Mapping) and (
            spec_hash is None or spec_hash == _packaged_spec().hash)

    def pass_current(self, pass_: str, spec_hash: Optional[str] = None) -> bool:
        """Whether the pack's entries and default of ``pass_`` were tuned for the packaged spec's part of that pass
        (a pack without per-pass hashes: whether its full spec hash is ``spec_hash``, default the packaged spec's)."""
        if self._per_pass(spec_hash):
            return self.metadata["spec_hashes"].get(pass_) in _packaged_spec().hashes_of(pass_)
        return self.metadata.get("spec_hash") in (None, spec_hash or _packaged_spec().hash)

    # -- lookup ---------------------------------------------------------------------------------------

    def lookup(self, workload: Union[Workload, Mapping[str, Any]], pass_: Optional[str] = None,
               env_info: Optional[Mapping[str, Any]] = None, *, backend: Optional[str] = None,
               backends: Sequence[str] = DISPATCH_BACKENDS, spec_hash: Optional[str] = None,
               current_keys: Optional[CurrentKeys] = None) -> Optional[PackHit]:
        """The config to run for ``workload``: exact key -> nearest length bucket -> the pass default.

        ``pass_`` defaults to the workload's own. ``backend`` restricts to one backend (else any of
        ``backends``). ``current_keys(op, pass_, backend)`` skips entries whose source hash differs
        from the code that would run. Returns None when nothing applies (then the runtime uses the
        spec's defaults). Raises ``PackMismatch`` when the pack is for another GPU / Triton / spec.
        """
        if isinstance(workload, Mapping) and "pass" not in workload and "pass_" not in workload and pass_:
            workload = {**workload, "pass": pass_}
        wl = as_workload(workload)
        if pass_ is not None and pass_ != wl.pass_:
            raise PerfDBError(f"pass_={pass_!r} but the workload is for pass {wl.pass_!r}")
        env_info = env_info if env_info is not None else _collect()
        soft = self.check(env_info, spec_hash)
        if not self.pass_current(wl.pass_, spec_hash):
            if wl.pass_ not in self._told_passes:
                self._told_passes.add(wl.pass_)
                warnings.warn(f"pack {self.source}: its {wl.pass_} entries were tuned for another version of that "
                              f"pass's spec (its knobs, domains or stages changed); they are not served (export "
                              f"the pack again after tuning)", SoftMismatchWarning, stacklevel=2)
            return None
        allowed = {backend} if backend else set(backends)
        if any(s.startswith("tvm ") for s in soft):
            allowed.discard("tvm")
        source_ok: dict[str, Optional[str]] = {}

        def usable(entry: PackEntry) -> bool:
            if entry.backend not in allowed:
                return False
            if current_keys is not None:
                if entry.backend not in source_ok:
                    keys = current_keys(DEFAULT_OP, wl.pass_, entry.backend) or {}
                    source_ok[entry.backend] = keys.get("source_hash")
                want = source_ok[entry.backend]
                if want is not None and entry.source_hash != want:
                    return False
            return True

        by_bucket = self._index.get(_shape_key(wl), {})
        candidates = {b: [e for e in es if usable(e)] for b, es in by_bucket.items()}
        candidates = {b: es for b, es in candidates.items() if es}
        if candidates:
            req = wl.seq_bucket
            if req in candidates:
                chosen, match = req, "exact"
            else:
                chosen = min(candidates, key=lambda b: (abs(math.log2(b) - math.log2(req)), -b))
                match = "nearest"
            top = candidates[chosen][0]
            return PackHit(top.backend, top.config, match, top.median_ms, chosen, top)
        # the pass default comes from one-token decode steps: a call of several tokens gets none
        default = self.defaults.get(wl.pass_) if wl.query_bucket == 1 else None
        if default is not None and default[0] in allowed and self._valid(default[1], wl, spec_hash):
            return PackHit(default[0], default[1], "default", None, None)
        return None

    @staticmethod
    def _valid(config: Config, wl: Workload, spec_hash: Optional[str]) -> bool:
        from pathtune.specs import KnobSpace, load_spec

        spec = load_spec()
        if spec_hash is not None and spec.hash != spec_hash:
            return True  # a caller with another spec validates on its own
        try:
            return KnobSpace(spec, wl.pass_).is_valid(config, wl)
        except (ValueError, TypeError):
            return False


def _packaged_spec():
    from pathtune.specs import load_spec

    return load_spec()


def _collect() -> dict[str, Any]:
    from pathtune.fingerprint import collect_env

    return collect_env()


def _write_json(path: Path, doc: Mapping[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
            f.write("\n")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)      # as open() would create it (mkstemp's 0600 hid packs from others)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_pack(path: Union[str, Path, None] = None) -> Pack:
    """Load a pack (default: ``PATHTUNE_PACK``)."""
    if path is None:
        path = _env.PACK.get()
        if path is None:
            raise PerfDBError(f"no pack given and {_env.PACK.name} is not set")
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except OSError as e:
        raise PerfDBError(f"cannot read pack {path}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise _bad(str(path), f"not JSON ({e})") from None
    return Pack(doc, str(path))


def _geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.inf


def _full_spec_hash(row: Mapping[str, Any]) -> str:
    """The full spec hash of a record's spec: a record carries its pass's hash (``Spec.pass_hash``) or,
    made before per-pass hashes, the full hash; the pass hash of the packaged spec maps to that spec's
    full hash (a pack stores one spec hash, the full one), any other hash stays as it is."""
    from pathtune.specs import load_spec

    spec = load_spec()
    h = row["spec_hash"]
    if row.get("op", DEFAULT_OP) == spec.name and row["pass"] in spec.passes and h == spec.pass_hash(row["pass"]):
        return spec.hash
    return h


def export_pack(db: "PerfDB", gpu: str, path: Union[str, Path, None] = None, *, env_hash: Optional[str] = None,
                backends: Sequence[str] = DISPATCH_BACKENDS) -> dict[str, Any]:
    """Write the pack of one GPU (one hard environment) and return it.

    ``gpu`` matches a substring of the recorded GPU names (case-insensitive) and must name one GPU.
    When several environments of it exist (e.g. two Triton versions) the one with the newest
    measurement is exported unless ``env_hash`` (a prefix) says which. Entries: the fastest ok,
    non-stale measurement per (workload, backend). Default per pass: the Triton config that is fastest
    on the most workloads (ties: lowest geometric-mean slowdown over the workloads it was measured on).
    """
    envs = [e for e in db.gpus() if gpu.strip().lower() in e["gpu"].lower()]
    if not envs:
        known = sorted({e["gpu"] for e in db.gpus()})
        raise PerfDBError(f"no measurements for a GPU matching {gpu!r} in {db.display_url}; recorded GPUs: "
                          f"{', '.join(known) or 'none'}")
    names = sorted({e["gpu"] for e in envs})
    exact = [n for n in names if n.lower() == gpu.strip().lower()]
    if len(names) > 1 and not exact:
        raise PerfDBError(f"{gpu!r} matches several GPUs ({', '.join(names)}); give the full name")
    name = exact[0] if exact else names[0]
    envs = [e for e in envs if e["gpu"] == name]
    if env_hash:
        envs = [e for e in envs if e["env_hash"].startswith(env_hash)]
        if not envs:
            raise PerfDBError(f"no environment of {name} has an env_hash starting with {env_hash!r}")
    chosen = max(envs, key=lambda e: e["newest"] or "")
    rows = db.query(env_hash=chosen["env_hash"], status="ok", backend=tuple(backends), include_stale=False,
                    order="newest")
    if not rows:
        raise PerfDBError(f"no ok, current measurements of backends {', '.join(backends)} for {name} "
                          f"(env {chosen['env_hash'][:12]}) in {db.display_url}")
    spec_hashes = sorted({_full_spec_hash(r) for r in rows})
    if len(spec_hashes) > 1:
        listed = ", ".join(h[:12] for h in spec_hashes)
        raise PerfDBError(f"{name}: current measurements come from several specs ({listed}); pass a current_keys "
                          "that pins one spec")
    newest = rows[0]

    best: dict[tuple[str, str], dict[str, Any]] = {}
    by_workload: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        key = (r["workload_hash"], r["backend"])
        if key not in best or r["median_ms"] < best[key]["median_ms"]:
            best[key] = r
        by_workload.setdefault(r["workload_hash"], []).append(r)
    entries = sorted(best.values(), key=lambda r: (r["pass"], r["head_dim"], r["head_dim_v"], r["dtype"],
                                                   r["use_gate"], r["heads_q"], r["heads_kv"], r["seq_bucket"],
                                                   r["batch_bucket"], r["varlen"], r["query_bucket"],
                                                   r["backend"]))

    # Defaults come from Triton results only: a default serves shapes nothing was measured for, and a TVM
    # config runs only where modules were built for the exact shape (tvm entries stay per workload).
    defaults: dict[str, dict[str, Any]] = {}
    for pass_ in sorted({r["pass"] for r in rows if r["backend"] == "triton"}):
        workloads = {h: [r for r in rs if r["backend"] == "triton"] for h, rs in by_workload.items()
                     if rs[0]["pass"] == pass_ and rs[0]["query_bucket"] == 1}
        workloads = {h: rs for h, rs in workloads.items() if rs}
        if not workloads:
            continue
        fastest = {h: min(r["median_ms"] for r in rs) for h, rs in workloads.items()}
        stats: dict[tuple[str, str], dict[str, Any]] = {}
        for h, rs in workloads.items():
            per_config: dict[tuple[str, str], float] = {}
            for r in rs:
                k = (r["backend"], r["config_hash"])
                per_config[k] = min(per_config.get(k, math.inf), r["median_ms"])
                stats.setdefault(k, {"config": r["config"], "wins": 0, "slowdowns": []})
            winner = min(per_config, key=lambda k: (per_config[k], k))
            stats[winner]["wins"] += 1
            for k, ms in per_config.items():
                stats[k]["slowdowns"].append(ms / fastest[h])
        top = min(stats, key=lambda k: (-stats[k]["wins"], -len(stats[k]["slowdowns"]),
                                        _geomean(stats[k]["slowdowns"]), k))
        defaults[pass_] = {"backend": top[0], "config": stats[top]["config"], "wins": stats[top]["wins"],
                           "workloads": len(workloads), "measured_on": len(stats[top]["slowdowns"]),
                           "geomean_slowdown": round(_geomean(stats[top]["slowdowns"]), 4),
                           "rule": "fastest on the most workloads; ties: more workloads measured, then lowest "
                                   "geometric-mean slowdown vs each workload's fastest"}

    spec = _packaged_spec()
    per_pass = ({"spec_hashes": {p: spec.pass_hash(p) for p in sorted({r["pass"] for r in rows}) if p in spec.passes}}
                if spec_hashes[0] == spec.hash else {})
    meta = {"gpu_name": name, "cc": newest["cc"], "pathtune": newest["pathtune"], "spec_hash": spec_hashes[0],
            **per_pass,
            "triton": newest["triton"], "tvm": newest["tvm"], "torch": newest["torch"], "cuda": newest["cuda"],
            "ptxas": newest["ptxas"], "driver": newest["driver"], "env_hash": chosen["env_hash"],
            "key_schema": KEY_SCHEMA, "created_at": iso(datetime.now(timezone.utc)),
            "measurements": len(rows)}
    doc = {
        "format": PACK_FORMAT, "version": PACK_VERSION, "_metadata": meta,
        "entries": [PackEntry(as_workload(r["workload"]), r["backend"], Config(r["config"]), r["median_ms"],
                              r["source_hash"], r["codegen_version"], r["run_id"], r["baseline_ms"]).to_dict()
                    for r in entries],
        "default": defaults,
    }
    Pack(doc, "<export>")  # what we write must load
    if path is not None:
        _write_json(Path(path), doc)
    return doc
