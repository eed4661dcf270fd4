"""Fault injection on the CPU: a damaged or truncated database file, a database locked by another
writer, a data folder that cannot be created, a read-only database file, and damaged packs and results
files. Each fault is one line on stderr that says what to fix, a non-zero exit and no traceback, and
nothing that was stored changes."""
import hashlib
import json
import os
import sqlite3

import pytest
from typer.testing import CliRunner

from pathtune.cli import app
from pathtune.perf_db import KernelKey, Measurement, PerfDB, PerfDBError, load_pack, results_record, write_results
from pathtune.specs import KnobSpace, Workload, load_spec

SPEC = load_spec()
ENV = {"gpu_name": "TEST-GPU", "gpu_count": 1, "compute_capability": "9.0", "sm_count": 132,
       "gpu_memory_bytes": 150_000_000_000, "driver": "550.54.15", "cuda_runtime": "12.4", "ptxas": "12.4.131",
       "torch": "2.5.1", "triton": "3.2.0", "tvm": None, "pathtune": "0.1.0", "host": "test-host"}
runner = CliRunner()

pytestmark = pytest.mark.usefixtures("isolated_perf_db")


def run(*args):
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "250"})


def one_line_error(result, *needles):
    """The command failed with exactly one line on stderr (containing every needle) and no traceback."""
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    err = result.stderr.strip()
    assert err and "\n" not in err, result.stderr
    for needle in needles:
        assert needle in err, err
    return err


def kernel():
    """A forward kernel key that is current here (the dispatcher's rule, which the CLI applies)."""
    from pathtune.runtime.dispatch import current_keys

    return KernelKey(pass_="fwd", backend="triton", spec_hash=SPEC.hash,
                     source_hash=current_keys(SPEC.name, "fwd", "triton")["source_hash"] or "src")


def wl(head_dim=64, seq=1024):
    return Workload(head_dim, head_dim, 8, 2, "bfloat16", True, "fwd", seq)


def ok(ms):
    return Measurement(status="ok", median_ms=ms, p20_ms=ms, p80_ms=ms * 1.05, n_reps=20, bench_method="synthetic",
                       baseline_ms=1.0)


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def stored(url):
    """Every stored measurement, as the read commands see it (for 'nothing changed' checks)."""
    with PerfDB(url, current_keys=None, read_only=True) as db:
        return sorted((r["workload_hash"], r["config_hash"], r["median_ms"]) for r in db.query(limit=None))


@pytest.fixture
def db_file(tmp_path):
    """A database (WAL mode, as pathtune writes them) holding two measurements of TEST-GPU."""
    folder = tmp_path / "db"
    folder.mkdir()
    path = folder / "perf.sqlite3"
    with PerfDB(f"sqlite:///{path}") as db:
        for d, ms in ((64, 1.2), (128, 2.4)):
            db.record(ENV, kernel(), wl(d), KnobSpace(SPEC, "fwd").default(), ok(ms), run_id="user-run")
    assert sorted(os.listdir(folder)) == ["perf.sqlite3"]
    return path


@pytest.fixture
def results_file(tmp_path):
    """A valid results file with one new measurement (head dim 96)."""
    path = tmp_path / "new.json"
    write_results(path, [results_record(ENV, kernel(), wl(96), KnobSpace(SPEC, "fwd").default(), ok(1.8),
                                        run_id="new-run")],
                  runs=[{"run_id": "new-run", "command": "pathtune tune synthetic"}])
    return path


# ---------------------------------------------------------------------------------------------------
# damaged database files

def _damage(path, how):
    if how == "garbage":
        path.write_bytes(os.urandom(3) + b"\0" * 8189)       # no SQLite header
    else:                                                     # cut after its first pages, as a full disk or a
        with open(path, "r+b") as f:                          # copy that stopped would leave it
            f.truncate(4 * 4096)


@pytest.mark.parametrize("how", ["garbage", "truncated"])
def test_a_damaged_database_is_one_line_and_left_as_it_is(db_file, results_file, tmp_path, how):
    _damage(db_file, how)
    before = digest(db_file)
    url = f"sqlite:///{db_file}"
    out = tmp_path / "out"
    out.mkdir()
    for args in (("query",), ("query", "overhead"), ("export", "--gpu", "test-gpu", "-o", out / "pack.json"),
                 ("db", "dump", "--out", out / "dump.json"), ("import", results_file), ("db", "gc", "--yes"),
                 ("db", "upgrade")):
        err = one_line_error(run(*args, "--db", url))
        assert "the file is damaged or not a pathtune database" in err, (args, err)
        assert digest(db_file) == before, args
    assert os.listdir(out) == []                      # no pack or dump was written from it


# ---------------------------------------------------------------------------------------------------
# a database another process is writing to

@pytest.mark.parametrize("journal", ["wal", "delete"])
def test_a_write_to_a_locked_database_is_one_line_within_the_bound(db_file, results_file, monkeypatch, journal):
    from pathtune.perf_db import _engine

    monkeypatch.setattr(_engine, "SQLITE_BUSY_TIMEOUT_MS", 300)       # writers wait 30 s in real use
    url = f"sqlite:///{db_file}"
    before = stored(url)
    con = sqlite3.connect(db_file, isolation_level=None)
    con.execute(f"PRAGMA journal_mode = {journal}")
    con.execute("BEGIN EXCLUSIVE")                    # in WAL mode readers still get in: the write waits
    con.execute("DELETE FROM perf_measurement WHERE id < 0")
    try:
        for args in (("import", results_file), ("db", "gc", "--yes")):
            err = one_line_error(run(*args, "--db", url))
            assert err == f"{url} is locked by another process (waited 0.3 s); retry when it is done", args
    finally:
        con.execute("ROLLBACK")
        con.close()
    assert stored(url) == before
    assert run("import", results_file, "--db", url).exit_code == 0      # the same import, once the lock is gone
    assert len(stored(url)) == len(before) + 1


# ---------------------------------------------------------------------------------------------------
# a default data folder that cannot be created

@pytest.fixture
def blocked_home(tmp_path, monkeypatch, results_file):
    """$HOME/.local and $HOME/.cache are files, so the default database and cache folders cannot exist; one
    shipped results file (the read commands show it without a database)."""
    home = tmp_path / "home"
    home.mkdir()
    for name in (".local", ".cache"):
        (home / name).write_text("a file where a folder should be\n")
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    results_file.rename(shipped / "TEST-GPU-run.json")
    monkeypatch.setenv("HOME", str(home))
    for var in ("XDG_DATA_HOME", "XDG_CACHE_HOME", "PATHTUNE_DB_URL", "PATHTUNE_CACHE_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PATHTUNE_SHIPPED_DIR", str(shipped))
    return home


def test_read_commands_work_without_a_data_folder(blocked_home, tmp_path):
    result = run("query", "-f", "json")
    assert result.exit_code == 0, result.output
    assert [r["head_dim"] for r in json.loads(result.stdout)] == [96]          # the shipped record
    exported = run("export", "--gpu", "test-gpu", "-o", tmp_path / "pack.json")
    assert exported.exit_code == 0, exported.output
    assert len(load_pack(tmp_path / "pack.json").entries) == 1
    assert (blocked_home / ".local").is_file() and (blocked_home / ".cache").is_file()


def test_writes_without_a_data_folder_are_one_line(blocked_home, tmp_path):
    default = blocked_home / ".local" / "share" / "pathtune" / "perf.sqlite3"
    for args in (("import", tmp_path / "shipped" / "TEST-GPU-run.json"), ("db", "gc", "--yes"), ("db", "upgrade")):
        one_line_error(run(*args), f"cannot create the folder {default.parent}", "PATHTUNE_DB_URL")
    # checked before any GPU time is spent (here: before the bench finds there is no GPU)
    one_line_error(run("bench", "--record"), f"--record: cannot create {default}",
                   f"{blocked_home / '.local'} is a file", "PATHTUNE_DB_URL")
    assert (blocked_home / ".local").is_file()


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root may write a read-only file")
def test_a_write_to_a_read_only_database_is_one_line(db_file, results_file):
    url = f"sqlite:///{db_file}"
    before = stored(url)
    os.chmod(db_file, 0o444)
    try:
        one_line_error(run("import", results_file, "--db", url), "readonly")
        one_line_error(run("bench", "--record", "--db", url), f"--record: {db_file} is read-only")
    finally:
        os.chmod(db_file, 0o644)
    assert stored(url) == before


# ---------------------------------------------------------------------------------------------------
# damaged packs and results files

def _pack_doc():
    cfg = KnobSpace(SPEC, "fwd").default().to_dict()
    return {"format": "pathtune-pack", "version": 1, "_metadata": {"gpu_name": "TEST-GPU", "spec_hash": SPEC.hash},
            "entries": [{"workload": wl().to_dict(), "pass": "fwd", "backend": "triton", "config": cfg,
                         "median_ms": 0.5}],
            "default": {"fwd": {"backend": "triton", "config": cfg}}}


@pytest.mark.parametrize("damage, message", [
    (lambda d: json.dumps(d).replace('"median_ms": 0.5', '"median_ms": NaN'),
     "median_ms must be a positive finite time, got nan"),
    (lambda d: json.dumps({**d, "entries": [{k: v for k, v in d["entries"][0].items() if k != "config"}]}),
     "entries[0]: the field 'config' is missing"),
    (lambda d: json.dumps({k: v for k, v in d.items() if k != "entries"}), "'entries' must be a list"),
    (lambda d: json.dumps({**d, "default": {"fwd": {"config": d["default"]["fwd"]["config"]}}}),
     "default['fwd']: the field 'backend' is missing"),
    (lambda d: json.dumps(d)[:200], "not JSON"),
])
def test_a_damaged_pack_is_refused_in_one_line(tmp_path, damage, message):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(_pack_doc()))
    assert len(load_pack(good).entries) == 1
    bad = tmp_path / "bad.json"
    bad.write_text(damage(_pack_doc()))
    with pytest.raises(PerfDBError) as info:
        load_pack(bad)
    text = str(info.value)
    assert "\n" not in text and text.startswith(f"{bad}: not a valid pathtune pack: ") and message in text, text


@pytest.mark.parametrize("damage, message", [
    (lambda t: t.replace('"median_ms": 1.8', '"median_ms": NaN'), "median_ms"),
    (lambda t: json.dumps({k: v for k, v in json.loads(t).items() if k != "records"}), "records"),
    (lambda t: t[: len(t) // 2], "JSON"),
])
def test_a_damaged_results_file_adds_nothing(db_file, results_file, damage, message):
    url = f"sqlite:///{db_file}"
    before = stored(url)
    results_file.write_text(damage(results_file.read_text()))
    one_line_error(run("import", results_file, "--db", url), f"{results_file.name}: ", message)
    assert stored(url) == before
