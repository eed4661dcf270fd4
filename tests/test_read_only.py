"""Read commands never write: `pathtune query` (and `query overhead`), `export`, `plot`, `db dump` and
`db path` open an existing database read-only, refuse a path that does not exist, wait for a lock only
a bounded time, and still show the shipped results without storing them (perf_db/_readonly.py)."""
import hashlib
import json
import os
import sqlite3
import time

import pytest
from typer.testing import CliRunner

from pathtune.cli import app
from pathtune.perf_db import KernelKey, Measurement, PerfDB, results_record, write_results
from pathtune.perf_db._engine import READ_COMMAND_LOCK_WAIT_MS, sqlite_read_uri
from pathtune.perf_db._errors import NoDatabaseError
from pathtune.specs import KnobSpace, Workload, load_spec

SPEC = load_spec()
runner = CliRunner()
ENV = {"gpu_name": "TEST-GPU", "gpu_count": 1, "compute_capability": "9.0", "sm_count": 132,
       "gpu_memory_bytes": 150_000_000_000, "driver": "550.54.15", "cuda_runtime": "12.4", "ptxas": "12.4.131",
       "torch": "2.5.1", "triton": "3.2.0", "tvm": None, "pathtune": "0.1.0", "host": "test-host"}
SHIPPED_ENV = {**ENV, "gpu_name": "SHIPPED-GPU", "host": "reference-host"}

pytestmark = pytest.mark.usefixtures("isolated_perf_db")


def run(*args):
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "250"})


def no_database(path):
    return f"no database at {path}; `pathtune db path` shows the default, `pathtune import FILE` fills one\n"


def kernel(backend="triton"):
    """A kernel key that is current here (the dispatcher's rule, which the read commands apply)."""
    from pathtune.runtime.dispatch import current_keys

    if backend == "sdpa":
        return KernelKey(pass_="fwd", backend="sdpa")
    keys = current_keys(SPEC.name, "fwd", backend)
    return KernelKey(pass_="fwd", backend=backend, spec_hash=SPEC.hash, source_hash=keys["source_hash"] or "src")


def wl(head_dim=64, seq=1024):
    return Workload(head_dim, head_dim, 8, 2, "bfloat16", True, "fwd", seq)


def ok(ms, **kw):
    return Measurement(status="ok", median_ms=ms, p20_ms=ms, p80_ms=ms * 1.05, n_reps=20, bench_method="synthetic",
                       **kw)


def state(path):
    """What a read must not change: the folder's entries (no -wal / -shm / journal left), the bytes, the mtime."""
    return sorted(os.listdir(path.parent)), hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns


@pytest.fixture
def db_file(tmp_path):
    """A WAL-mode database (as pathtune writes them) in a folder of its own, with one run of TEST-GPU."""
    folder = tmp_path / "db"
    folder.mkdir()
    path = folder / "perf.sqlite3"
    with PerfDB(f"sqlite:///{path}") as db:
        for d, ms in ((64, 1.2), (128, 2.4)):
            db.record(ENV, kernel(), wl(d), KnobSpace(SPEC, "fwd").default(), ok(ms, baseline_ms=1.0),
                      run_id="user-run")
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    con.close()
    assert os.listdir(folder) == ["perf.sqlite3"]
    return path


@pytest.fixture
def shipped(tmp_path, monkeypatch):
    """One shipped results file (of SHIPPED-GPU), not in any database yet."""
    folder = tmp_path / "shipped"
    folder.mkdir()
    write_results(folder / "SHIPPED-GPU-run.json",
                  [results_record(SHIPPED_ENV, kernel(), wl(64), KnobSpace(SPEC, "fwd").default(),
                                  ok(1.5, baseline_ms=1.0), run_id="shipped-run")],
                  runs=[{"run_id": "shipped-run", "command": "pathtune tune synthetic"}])
    monkeypatch.setenv("PATHTUNE_SHIPPED_DIR", str(folder))
    monkeypatch.setenv("PATHTUNE_CACHE_DIR", str(tmp_path / "cache"))
    return folder


def read_commands(out):
    return [("query",), ("query", "overhead"), ("export", "--gpu", "test-gpu", "-o", out / "pack.json"),
            ("plot", "overhead", "-o", out / "o.png"), ("db", "dump", "--out", out / "dump.json"), ("db", "path")]


# ---------------------------------------------------------------------------------------------------
# a path that does not exist

@pytest.mark.parametrize("how", ["--db", "PATHTUNE_DB_URL"])
def test_a_mistyped_path_is_refused_and_nothing_is_created(tmp_path, shipped, monkeypatch, how):
    typo = tmp_path / "typo.sqlite3"
    url = f"sqlite:///{typo}"
    out = tmp_path / "out"
    out.mkdir()
    if how == "PATHTUNE_DB_URL":
        monkeypatch.setenv("PATHTUNE_DB_URL", url)
    for args in read_commands(out)[:-1]:
        result = run(*args, *(("--db", url) if how == "--db" else ()))
        assert result.exit_code != 0, (args, result.output)
        assert result.stderr == no_database(typo), (args, result.stderr)     # one line, no traceback
        assert result.stdout == ""
        assert not typo.exists() and os.listdir(out) == [], args


def test_open_read_refuses_missing_files_it_was_not_told_may_be_absent(tmp_path, monkeypatch):
    with pytest.raises(NoDatabaseError, match="no database at"):
        PerfDB.open_read(f"sqlite:///{tmp_path / 'x.sqlite3'}")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    with pytest.raises(NoDatabaseError, match="no database at"):   # the default, but without the shipped files
        PerfDB.open_read(shipped=False)
    with PerfDB.open_read() as db:                                  # the default may be absent: shipped results
        assert db.query() == [] and "not created yet" in db.display_url
    assert not (tmp_path / "data").exists()


# ---------------------------------------------------------------------------------------------------
# an existing database is not changed

def test_reads_leave_an_existing_database_unchanged(db_file, shipped, tmp_path):
    url = f"sqlite:///{db_file}"
    before = state(db_file)
    time.sleep(0.01)
    out = tmp_path / "out"
    out.mkdir()
    for args in read_commands(out):
        result = run(*args, "--db", url)
        if args[0] != "plot":     # plot may lack matplotlib; it read the database all the same
            assert result.exit_code == 0, (args, result.output)
        assert state(db_file) == before, args
    rows = json.loads(run("query", "-f", "json", "--db", url).stdout)
    # the shipped results are shown beside the user's, and said to be not stored there
    assert sorted(r["gpu"] for r in rows) == ["SHIPPED-GPU", "TEST-GPU", "TEST-GPU"]
    note = run("query", "overhead", "--db", url).stderr
    assert "1 shipped results file(s) not stored in" in note and "nothing is written" in note
    dump = json.loads((out / "dump.json").read_text())
    assert {r["env"]["gpu_name"] for r in dump["records"]} == {"TEST-GPU"}    # a dump leaves shipped files out
    assert state(db_file) == before
    with PerfDB(url, read_only=True) as db:
        assert db.counts()["perf_ingest"] == 0 and db.counts()["perf_measurement"] == 2


def test_a_database_with_the_shipped_files_is_read_in_place(db_file, shipped):
    url = f"sqlite:///{db_file}"
    PerfDB.open_default(url).close()          # what the commands that write do: the shipped files are stored
    before = state(db_file)
    result = run("query", "-f", "json", "--db", url)
    assert result.exit_code == 0 and result.stderr == ""
    assert len(json.loads(result.stdout)) == 3 and state(db_file) == before
    with PerfDB.open_read(url) as db:
        assert db.sqlite_path == db_file and db.read_only       # the file itself, read-only


def test_commands_that_write_still_ingest_the_shipped_files(tmp_path, shipped):
    url = f"sqlite:///{tmp_path / 'new.sqlite3'}"
    record = results_record(ENV, kernel(), wl(32), KnobSpace(SPEC, "fwd").default(), ok(0.5), run_id="r")
    results = write_results(tmp_path / "r.json", [record], runs=[{"run_id": "r", "command": "pathtune tune x"}])
    assert run("import", results, "--db", url).exit_code == 0
    with PerfDB(url, read_only=True) as db:
        assert db.counts()["perf_ingest"] == 2 and db.counts()["perf_measurement"] == 2


def test_a_read_only_database_in_a_read_only_folder_is_readable(db_file):
    folder = db_file.parent
    before = state(db_file)
    os.chmod(db_file, 0o444)
    os.chmod(folder, 0o555)
    try:
        result = run("query", "-f", "json", "--db", f"sqlite:///{db_file}")
        assert result.exit_code == 0, result.output
        assert len(json.loads(result.stdout)) == 2
        dumped = run("db", "dump", "--out", folder.parent / "d.json", "--db", f"sqlite:///{db_file}")
        assert dumped.exit_code == 0, dumped.output
        assert state(db_file) == before          # no -wal / -shm could be (or was) created
        assert "immutable=1" in sqlite_read_uri(db_file)
    finally:
        os.chmod(folder, 0o755)
        os.chmod(db_file, 0o644)
    assert "immutable" not in sqlite_read_uri(db_file)


def test_a_read_only_copy_with_an_unapplied_wal_says_what_it_cannot_show(db_file, tmp_path):
    import shutil

    writer = sqlite3.connect(db_file, isolation_level=None)
    writer.execute("PRAGMA wal_autocheckpoint = 0")
    writer.execute("DELETE FROM perf_measurement WHERE id = (SELECT max(id) FROM perf_measurement)")
    media = tmp_path / "media"       # a copy taken while the writer had not checkpointed
    media.mkdir()
    for name in ("perf.sqlite3", "perf.sqlite3-wal"):
        shutil.copy(db_file.parent / name, media / name)
    writer.close()
    for name in ("perf.sqlite3", "perf.sqlite3-wal"):
        os.chmod(media / name, 0o444)
    os.chmod(media, 0o555)
    try:
        result = run("query", "-f", "json", "--db", f"sqlite:///{media / 'perf.sqlite3'}")
        assert result.exit_code == 0, result.output
        assert "perf.sqlite3-wal holds changes not yet written into perf.sqlite3; they are not shown" in result.stderr
        assert len(json.loads(result.stdout)) == 2       # as before the (unapplied) delete
    finally:
        os.chmod(media, 0o755)


# ---------------------------------------------------------------------------------------------------
# locks

@pytest.mark.parametrize("journal", ["wal", "delete"])
def test_a_locked_database_fails_within_the_bound(db_file, journal):
    url = f"sqlite:///{db_file}"
    con = sqlite3.connect(db_file, isolation_level=None)
    con.execute(f"PRAGMA journal_mode = {journal}")
    if journal == "wal":
        con.execute("PRAGMA locking_mode = EXCLUSIVE")   # a writer that keeps readers out
    con.execute("BEGIN EXCLUSIVE")
    con.execute("DELETE FROM perf_measurement WHERE id < 0")
    bound = READ_COMMAND_LOCK_WAIT_MS / 1000
    try:
        for args in (("query",), ("db", "dump", "--out", db_file.parent.parent / "d.json")):
            t0 = time.perf_counter()
            result = run(*args, "--db", url)
            waited = time.perf_counter() - t0
            assert result.exit_code == 1, result.output
            assert result.stderr == (f"sqlite:///{db_file} is locked by another process (waited {bound:g} s); "
                                     "retry when it is done\n")
            assert bound * 0.9 <= waited < bound + 10, waited     # it waited, but not the writers' 30 s
    finally:
        con.execute("ROLLBACK")
        con.close()
    assert run("query", "--db", url).exit_code == 0


# ---------------------------------------------------------------------------------------------------
# a fresh machine

def test_a_fresh_default_shows_the_shipped_results_without_creating_it(tmp_path, shipped, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    first = run("query", "-f", "json")
    assert first.exit_code == 0, first.output
    assert [r["gpu"] for r in json.loads(first.stdout)] == ["SHIPPED-GPU"]
    cached = list((tmp_path / "cache" / "perf_db").glob("shipped-*.sqlite3"))
    assert len(cached) == 1              # built once, in the cache folder
    mtime = cached[0].stat().st_mtime_ns
    again = run("query", "overhead", "-f", "json")
    assert again.exit_code == 0 and [r["ratio"] for r in json.loads(again.stdout)] == [1.5]
    assert cached[0].stat().st_mtime_ns == mtime and not (tmp_path / "data").exists()
    path = json.loads(run("db", "path", "-f", "json").stdout)
    assert path["default"] and path["exists"] is False
    refused = run("db", "dump", "--out", tmp_path / "d.json")    # nothing of the user's to dump
    assert refused.exit_code == 1 and refused.stderr == no_database(path["file"])
    # a changed set of shipped files gets its own database
    write_results(shipped / "SHIPPED-GPU-run2.json",
                  [results_record(SHIPPED_ENV, kernel(), wl(128), KnobSpace(SPEC, "fwd").default(),
                                  ok(3.0, baseline_ms=1.5), run_id="shipped-run-2")],
                  runs=[{"run_id": "shipped-run-2", "command": "pathtune tune synthetic"}])
    assert len(json.loads(run("query", "-f", "json").stdout)) == 2
    assert len(list((tmp_path / "cache" / "perf_db").glob("shipped-*.sqlite3"))) == 2
    assert not (tmp_path / "data").exists()


# ---------------------------------------------------------------------------------------------------
# PostgreSQL (with PATHTUNE_TEST_PG_URL)

def test_postgres_is_read_in_read_only_transactions(pg_url, shipped):
    from pathtune.perf_db import PerfDBError

    with PerfDB(pg_url) as db:
        db.record(ENV, kernel(), wl(), KnobSpace(SPEC, "fwd").default(), ok(1.0, baseline_ms=1.0), run_id="pg")
    with PerfDB.open_read(pg_url) as db:
        assert len(db.query()) == 1 and "1 shipped results file(s) are not in" in db.read_notes[0]
        with pytest.raises(PerfDBError, match="read-only transaction"):
            db.ingest(shipped / "SHIPPED-GPU-run.json")
    result = run("query", "-f", "json", "--db", pg_url)
    assert result.exit_code == 0 and len(json.loads(result.stdout)) == 1
    with PerfDB(pg_url, read_only=True) as db:
        assert db.counts()["perf_ingest"] == 0
