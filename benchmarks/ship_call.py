"""Take in what device calls brought back, fast enough for the next call to find the machine still warm.

    python benchmarks/ship_call.py FILES_AT [FILES_AT ...] [--tcache .tcache_in] [--no-tcache] [--into DIR]

Each FILES_AT is the folder a ``benchmarks/gpu_session.sh`` call's files came back to (its ``session.tgz`` and
``tcache.txz.*``), oldest first.  For each: ``session.tgz`` is unpacked into a fresh folder of its own (printed; a
folder left from another call is never reused, so no stale file is taken for this call's), the steps' outcomes
(``steps.txt``) are printed, and the tune results files (``s/tune/*-tune-*.json``) are copied into
``perf_db/shipped/``, where ``backend="auto"`` and the next call read them.  Then the calls' Triton caches are merged
into ``--tcache`` (``benchmarks/tcache/merge_tcache.py``), so that the next call carries what they compiled.

Refused, before anything is copied: a FILES_AT without ``session.tgz``, and a results file whose name is already in
``perf_db/shipped/`` with other contents (a results file is never overwritten; the same contents are skipped).
What stays for a person: bench JSON files to wrap into ``benchmarks/results/`` (with their command and notes) and
a call's ``perf.sqlite3`` to ``pathtune db dump`` into ``perf_db/shipped/``; both are listed.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks" / "tcache"))
from merge_tcache import MAX_MIB, merge  # noqa: E402

SHIPPED = ROOT / "perf_db" / "shipped"


def unpack(files_at: Path, into: Path | None = None) -> Path:
    """``files_at``/session.tgz unpacked into a new folder under ``into`` (None: the system's temporary folder); the
    path of its ``s`` folder."""
    archive = files_at / "session.tgz"
    if not archive.is_file():
        raise SystemExit(f"{files_at}: no session.tgz (pass the files_at folder of a gpu_session.sh call)")
    dest = Path(tempfile.mkdtemp(prefix=f"call-{files_at.name}-", dir=into))
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    return dest / "s"


def tune_results(session: Path) -> list[Path]:
    """The tune results files a call wrote (``s/tune/*-tune-*.json``, and a lane's ``s/<lane>/tune/``)."""
    return sorted(session.glob("tune/*-tune-*.json")) + sorted(session.glob("*/tune/*-tune-*.json"))


def plan_copies(files: list[Path], shipped: Path) -> list[Path]:
    """The ``files`` to copy into ``shipped``, one per name (a name already there with the same contents is
    skipped); refuses a name that two calls, or a call and ``shipped``, hold with different contents."""
    todo: dict[str, Path] = {}
    for f in files:
        first = todo.get(f.name)
        if first is not None and first.read_bytes() != f.read_bytes():
            raise SystemExit(f"two calls wrote {f.name} with different contents: ship them one at a time")
        there = shipped / f.name
        if there.exists():
            if there.read_bytes() != f.read_bytes():
                raise SystemExit(f"perf_db/shipped/{f.name} exists with other contents: a results file is never "
                                 "overwritten (rename the new one if it is a different run)")
            continue
        todo[f.name] = f
    return list(todo.values())


def for_a_person(session: Path) -> list[Path]:
    """What a call wrote that needs a person's words before it is kept: its bench / probe JSON files and its
    perf_db (``perf.sqlite3``), at the top of ``s`` or of a lane's folder (not the per-step copies in ``steps/``)."""
    tops = [session] + [d for d in session.iterdir() if d.is_dir() and d.name not in ("steps", "tune")]
    return sorted(p.relative_to(session) for d in tops for p in d.iterdir()
                  if p.is_file() and (p.name == "perf.sqlite3" or (p.suffix == ".json" and p.name != "env.json")))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", type=Path, help="files_at folders of device calls, oldest first")
    ap.add_argument("--tcache", type=Path, default=ROOT / ".tcache_in",
                    help="the merged Triton cache the next call carries (default .tcache_in)")
    ap.add_argument("--no-tcache", action="store_true", help="leave the Triton cache as it is")
    ap.add_argument("--into", type=Path, default=None,
                    help="folder to unpack each call into a new subfolder of (default: the system's temporary folder)")
    ap.add_argument("--shipped", type=Path, default=SHIPPED, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.into is not None:
        a.into.mkdir(parents=True, exist_ok=True)
    sessions = [(f, unpack(f, a.into)) for f in a.folders]
    copies = plan_copies([r for _, s in sessions for r in tune_results(s)], a.shipped)
    for files_at, s in sessions:
        print(f"{files_at}: unpacked to {s}")
        steps = s / "steps.txt"
        for line in (steps.read_text().splitlines() if steps.exists() else ["(no steps.txt)"]):
            print(f"  {line}")
        left = for_a_person(s)
        if left:
            print("  for a person: " + ", ".join(str(p) for p in left))
    for f in copies:
        shutil.copy2(f, a.shipped / f.name)
        print(f"shipped {f.name} -> perf_db/shipped/")
    if not copies:
        print("no new tune results")
    with_cache = [f for f in a.folders if any(f.glob("tcache.txz.*"))]
    if not a.no_tcache and with_cache:
        inputs = ([a.tcache] if any(a.tcache.glob("tcache.txz.*")) else []) + with_cache
        n, size = merge(inputs, a.tcache, MAX_MIB)
        print(f"{a.tcache}: {n} cache entries, {size / 2 ** 20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
