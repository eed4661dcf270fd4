"""Merge the Triton caches that device calls brought back into the one archive the next call carries.

    python benchmarks/tcache/merge_tcache.py --out .tcache_in FILES_AT [FILES_AT ...]

Each FILES_AT is a folder holding one call's ``tcache.txz.aa``, ``.ab``, ... (``benchmarks/gpu_session.sh`` splits
one xz-compressed tar of the cache entries that call opened).  A call on a warm machine brings back only the
entries it opened, so the newest call's archive alone can lack what an earlier call compiled; this writes the
union (a later folder's entry replaces an earlier one's of the same name) as ``--out``/tcache.txz.* in the same
format, after removing the parts already there.  Refused, nothing written: a folder without parts, or a merged
archive over ``--max-mib`` (the device call's carry limit is 64 MiB for everything carried).
"""
from __future__ import annotations

import argparse
import io
import lzma
import sys
import tarfile
from pathlib import Path

PART_BYTES = 15 * 2 ** 20       # gpu_session.sh's `split -b 15m`
MAX_MIB = 40.0                  # the merged archive's cap (the device call carries at most 64 MiB in all)


def read_entries(folder: Path) -> dict[str, tuple[tarfile.TarInfo, bytes | None]]:
    """{member name: (info, data)} of the archive split over ``folder``/tcache.txz.* (data None: a folder)."""
    parts = sorted(folder.glob("tcache.txz.*"))
    if not parts:
        raise SystemExit(f"{folder}: no tcache.txz.* parts (pass the files_at folder of a device call)")
    blob = lzma.decompress(b"".join(p.read_bytes() for p in parts))
    out = {}
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        for info in tar.getmembers():
            data = tar.extractfile(info).read() if info.isfile() else None
            out[info.name.removeprefix("./")] = (info, data)
    return out


def merge(folders: list[Path], out: Path, max_mib: float) -> tuple[int, int]:
    """Write the union of the folders' archives to ``out``; (entries, bytes written)."""
    entries: dict[str, tuple[tarfile.TarInfo, bytes | None]] = {}
    for folder in folders:
        entries.update(read_entries(folder))
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name in sorted(entries):
            info, data = entries[name]
            info.name = "./" + name
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    packed = lzma.compress(raw.getvalue(), preset=6)
    if len(packed) > max_mib * 2 ** 20:
        raise SystemExit(f"merged cache is {len(packed) / 2 ** 20:.1f} MiB, over --max-mib {max_mib:g}: "
                         "merge fewer calls (the newest ones)")
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("tcache.txz.*"):
        old.unlink()
    for i in range(0, max(len(packed), 1), PART_BYTES):
        suffix = chr(ord("a") + i // PART_BYTES // 26) + chr(ord("a") + i // PART_BYTES % 26)
        (out / f"tcache.txz.{suffix}").write_bytes(packed[i:i + PART_BYTES])
    tops = {name.split("/")[0] for name in entries}
    return len(tops), len(packed)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", type=Path, help="files_at folders of device calls, oldest first")
    ap.add_argument("--out", type=Path, required=True, help="where the merged tcache.txz.* go (e.g. .tcache_in)")
    ap.add_argument("--max-mib", type=float, default=MAX_MIB, help="refuse a merged archive larger than this")
    a = ap.parse_args(argv)
    n, size = merge(a.folders, a.out, a.max_mib)
    print(f"{a.out}: {n} cache entries, {size / 2 ** 20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
