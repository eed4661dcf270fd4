"""pathtune query / query overhead / db / export / import / plot through typer's CliRunner, on a
synthetic SQLite database in tmp_path (GPU "TEST-GPU"; no real measurements)."""
import csv
import io
import json

import pytest
from typer.testing import CliRunner

from pathtune.cli import app
from pathtune.perf_db import KernelKey, Measurement, PerfDB, load_pack, results_record, write_results
from pathtune.specs import KnobSpace, Workload, load_spec

SPEC = load_spec()
runner = CliRunner()
ENV = {"gpu_name": "TEST-GPU", "gpu_count": 1, "compute_capability": "9.0", "sm_count": 132,
       "gpu_memory_bytes": 150_000_000_000, "driver": "550.54.15", "cuda_runtime": "12.4", "ptxas": "12.4.131",
       "torch": "2.5.1", "triton": "3.2.0", "tvm": None, "pathtune": "0.1.0", "host": "test-host"}
OVERHEAD_KEYS = {"gpu", "head_dim", "pass", "seq_len", "backend", "pathtune_ms", "sdpa_ms", "ratio"}


def run(*args):
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "250"})


def kernel(backend="triton", pass_="fwd"):
    """A kernel key that is current here (the dispatcher's rule: spec and kernel source hash)."""
    from pathtune.runtime.dispatch import current_keys

    if backend == "sdpa":
        return KernelKey(pass_=pass_, backend="sdpa")
    keys = current_keys(SPEC.name, pass_, backend)
    return KernelKey(pass_=pass_, backend=backend, spec_hash=SPEC.hash, source_hash=keys["source_hash"] or "src")


def wl(head_dim, seq=1024, pass_="fwd"):
    return Workload(head_dim, head_dim, 8, 2, "bfloat16", True, pass_, seq)


def ok(ms, **kw):
    return Measurement(status="ok", median_ms=ms, p20_ms=ms, p80_ms=ms * 1.05, n_reps=20, bench_method="synthetic",
                       **kw)


pytestmark = pytest.mark.usefixtures("isolated_perf_db")


@pytest.fixture
def url(tmp_path):
    url = f"sqlite:///{tmp_path / 'perf.sqlite3'}"
    db = PerfDB(url)
    config = KnobSpace(SPEC, "fwd").default()
    for d, ms, sdpa in ((64, 1.2, 1.0), (128, 2.4, 1.6)):
        for seq in (1024, 4096):
            db.record(ENV, kernel(), wl(d, seq), config, ok(ms * seq / 1024, baseline_ms=sdpa * seq / 1024),
                      run_id="run-1")
            db.record(ENV, kernel("sdpa"), wl(d, seq), {}, ok(sdpa * seq / 1024), run_id="run-1")
    db.record(ENV, kernel(pass_="bwd"), wl(64, pass_="bwd"), KnobSpace(SPEC, "bwd").default(), ok(5.0, baseline_ms=2.5),
              run_id="run-1")
    db.record(ENV, kernel(), wl(256), config.replace(num_warps=8), Measurement(status="compile_error"),
              run_id="run-1")
    db.close()
    return url


def test_overhead_json_shape(url):
    result = run("query", "overhead", "--by", "head_dim", "--format", "json", "--db", url)
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert isinstance(rows, list) and len(rows) == 5
    for row in rows:
        assert OVERHEAD_KEYS <= set(row)
        assert row["gpu"] == "TEST-GPU" and row["ratio"] == pytest.approx(row["pathtune_ms"] / row["sdpa_ms"])
    fwd = [(r["head_dim"], r["seq_len"], round(r["ratio"], 3)) for r in rows if r["pass"] == "fwd"]
    assert fwd == [(64, 1024, 1.2), (64, 4096, 1.2), (128, 1024, 1.5), (128, 4096, 1.5)]
    only_bwd = json.loads(run("query", "overhead", "--pass", "bwd", "-f", "json", "--db", url).stdout)
    assert [(r["pass"], r["ratio"]) for r in only_bwd] == [("bwd", 2.0)]
    # options before the subcommand carry over
    before = run("query", "--db", url, "--format", "json", "overhead", "--gpu", "test-gpu")
    assert before.exit_code == 0 and len(json.loads(before.stdout)) == 5


def test_overhead_table_and_csv(url):
    table = run("query", "overhead", "--db", url)
    assert table.exit_code == 0, table.output
    assert "pathtune vs SDPA" in table.stdout and "TEST-GPU" in table.stdout and "1.50x" in table.stdout
    out = run("query", "overhead", "-f", "csv", "--db", url)
    rows = list(csv.DictReader(io.StringIO(out.stdout)))
    assert len(rows) == 5 and OVERHEAD_KEYS <= set(rows[0])
    assert [(r["pass"], float(r["ratio"])) for r in rows[:2]] == [("bwd", 2.0), ("fwd", pytest.approx(1.2))]


def test_query_formats_and_filters(url):
    table = run("query", "--db", url)
    assert table.exit_code == 0, table.output
    assert "TEST-GPU" in table.stdout and "compile_error" in table.stdout
    data = json.loads(run("query", "--head-dim", "128", "--backend", "triton", "-f", "json", "--db", url).stdout)
    assert len(data) == 2 and {r["head_dim"] for r in data} == {128} and data[0]["config"]["num_warps"] == 4
    assert json.loads(run("query", "--status", "compile_error", "-f", "json", "--db", url).stdout)[0]["head_dim"] == 256
    assert len(json.loads(run("query", "--limit", "3", "-f", "json", "--db", url).stdout)) == 3
    env_hash = data[0]["env_hash"]
    assert len(json.loads(run("query", "--env-hash", env_hash[:10], "-f", "json", "--db", url).stdout)) == 10
    assert json.loads(run("query", "--env-hash", "0" * 12, "-f", "json", "--db", url).stdout) == []
    assert len(json.loads(run("query", "--pass", "bwd", "--gpu", "test", "-f", "json", "--db", url).stdout)) == 1
    assert len(json.loads(run("query", "--dtype", "bfloat16", "--seq-len", "4096", "-f", "json", "--db",
                              url).stdout)) == 4
    out = run("query", "-f", "csv", "--backend", "sdpa", "--db", url).stdout
    rows = list(csv.DictReader(io.StringIO(out)))
    assert len(rows) == 4 and {"median_ms", "gpu", "config", "run_id"} <= set(rows[0])
    assert json.loads(rows[0]["workload"])["head_dim"] in (64, 128)


def test_empty_results_say_so(url, tmp_path):
    result = run("query", "--gpu", "H200", "--db", url)
    assert result.exit_code == 0 and "no measurements match" in result.output and "gpu=H200" in result.output
    as_json = run("query", "--gpu", "H200", "-f", "json", "--db", url)
    assert as_json.exit_code == 0 and json.loads(as_json.stdout) == []
    empty_url = f"sqlite:///{tmp_path / 'empty.sqlite3'}"
    PerfDB(empty_url).close()      # an existing database without measurements (a missing one is refused)
    empty = run("query", "overhead", "--db", empty_url)
    assert empty.exit_code == 0 and "no measurements match" in empty.output


@pytest.mark.parametrize("args, message", [
    (("query", "--db", "nosuchdialect://x"), "cannot open"),
    (("query", "--db", "::bad::"), "not a database URL"),
    (("query", "--db", "sqlite:////nonexistent-dir/x.sqlite3"), "no database at /nonexistent-dir/x.sqlite3"),
    (("query", "--pass", "sideways"), "not one of fwd, bwd, decode"),
    (("query", "overhead", "--by", "colour"), "--by must be one of"),
    (("query", "--status", "great"), "status"),
])
def test_failures_exit_nonzero_with_a_message(url, args, message):
    if "--db" not in args:
        args = (*args, "--db", url)
    result = run(*args)
    assert result.exit_code == 1, result.output
    assert message in result.output and "Traceback" not in result.output


def test_db_upgrade_path_gc(url, tmp_path, monkeypatch):
    fresh = f"sqlite:///{tmp_path / 'fresh.sqlite3'}"
    first = run("db", "upgrade", "--db", fresh)
    assert first.exit_code == 0 and "upgraded from empty to revision 0002_query_bucket" in first.stdout
    assert "perf_alembic_version" in first.stdout
    assert "already at revision 0002_query_bucket" in run("db", "upgrade", "--db", fresh).stdout

    info = json.loads(run("db", "path", "--db", url, "-f", "json").stdout)
    assert info["file"].endswith("perf.sqlite3") and info["revision"] == "0002_query_bucket"
    assert info["counts"]["perf_measurement"] == 10
    missing = json.loads(run("db", "path", "--db", f"sqlite:///{tmp_path / 'nope.sqlite3'}", "-f", "json").stdout)
    assert missing["exists"] is False and not (tmp_path / "nope.sqlite3").exists()

    import pathtune.fingerprint as fingerprint

    monkeypatch.setattr(fingerprint, "collect_env", lambda: {**ENV, "triton": "3.3.0"})  # Triton was upgraded
    dry = run("db", "gc", "--db", url)
    assert dry.exit_code == 0 and "would delete 6 measurements" in dry.stdout and "dry run" in dry.stdout
    assert "triton version changed on this GPU" in dry.stdout
    report = json.loads(run("db", "gc", "--dry-run", "-f", "json", "--db", url).stdout)
    assert report["total"] == 6 and report["dry_run"] is True
    done = run("db", "gc", "--yes", "--db", url)
    assert done.exit_code == 0 and "deleted 6 measurements" in done.stdout
    assert json.loads(run("db", "path", "--db", url, "-f", "json").stdout)["counts"]["perf_measurement"] == 4
    assert "nothing to prune" in run("db", "gc", "--db", url).stdout


def test_export_and_import(url, tmp_path):
    pack_path = tmp_path / "pack.json"
    result = run("export", "--gpu", "test-gpu", "-o", pack_path, "--db", url)
    assert result.exit_code == 0, result.output
    assert "wrote" in result.stdout and "default fwd" in result.stdout
    pack = load_pack(pack_path)
    assert pack.metadata["gpu_name"] == "TEST-GPU" and len(pack.entries) == 5
    missing = run("export", "--gpu", "H200", "-o", tmp_path / "x.json", "--db", url)
    assert missing.exit_code == 1 and "recorded GPUs: TEST-GPU" in missing.output

    results = write_results(tmp_path / "results.json",
                            [results_record(ENV, kernel(), wl(32), KnobSpace(SPEC, "fwd").default(), ok(0.5),
                                            run_id="gpu-host-run")],
                            runs=[{"run_id": "gpu-host-run", "command": "pathtune tune --synthetic"}])
    first = run("import", results, "--db", url, "-f", "json")
    assert first.exit_code == 0 and json.loads(first.stdout)[0]["added"] == 1
    again = run("import", results, "--db", url)
    assert again.exit_code == 0 and "0 added, 1 already present" in again.stdout
    refused = run("import", pack_path, "--db", url)
    assert refused.exit_code == 1 and "pack" in refused.output


def test_plot(url, tmp_path):
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        result = run("plot", "overhead", "-o", tmp_path / "o.png", "--db", url)
        assert result.exit_code == 1 and "pip install 'pathtune[plot]'" in result.output
        return
    for kind, name in (("overhead", "o.png"), ("history", "h.svg")):
        result = run("plot", kind, "-o", tmp_path / name, "--db", url)
        assert result.exit_code == 0, result.output
        assert (tmp_path / name).stat().st_size > 1000
    bad = run("plot", "overhead", "-o", tmp_path / "o.txt", "--db", url)
    assert bad.exit_code == 1 and ".png" in bad.output


def test_fresh_machine_prints_shipped_table(tmp_path, monkeypatch):
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    write_results(shipped / "TEST-GPU-run.json",
                  [results_record(ENV, kernel(), wl(64), KnobSpace(SPEC, "fwd").default(), ok(1.5, baseline_ms=1.0),
                                  run_id="shipped-run")],
                  runs=[{"run_id": "shipped-run", "command": "synthetic"}])
    monkeypatch.setenv("PATHTUNE_SHIPPED_DIR", str(shipped))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))     # the default database: not there yet
    monkeypatch.setenv("PATHTUNE_CACHE_DIR", str(tmp_path / "cache"))
    result = run("query", "overhead", "--by", "head_dim", "-f", "json")
    assert result.exit_code == 0, result.output
    assert [(r["head_dim"], r["ratio"]) for r in json.loads(result.stdout)] == [(64, 1.5)]
    assert len(json.loads(run("query", "-f", "json").stdout)) == 1
    assert not (tmp_path / "data").exists()                          # read without creating it


def test_read_commands_judge_current_records_like_the_dispatcher(tmp_path, monkeypatch):
    """One definition of current (runtime.dispatch.current_keys: the spec hash and the pass's kernel source
    hash): a record of the current spec measured with retired kernel sources is not exported, not in the
    overhead table and hidden by query --current, exactly as the dispatcher does not serve it."""
    from pathtune.codegen.triton import source_hash

    url = f"sqlite:///{tmp_path / 'perf.sqlite3'}"
    db = PerfDB(url)
    config = KnobSpace(SPEC, "fwd").default()
    current = KernelKey(pass_="fwd", backend="triton", spec_hash=SPEC.hash, source_hash=source_hash("fwd"))
    retired = KernelKey(pass_="fwd", backend="triton", spec_hash=SPEC.hash, source_hash="retired-source")
    db.record(ENV, current, wl(64, 1024), config, ok(1.0, baseline_ms=0.5), run_id="run-1")
    db.record(ENV, retired, wl(128, 1024), config, ok(2.0, baseline_ms=1.0), run_id="run-1")
    db.close()
    rows = json.loads(run("query", "overhead", "--by", "head_dim", "--db", url, "-f", "json").stdout)
    assert [r["head_dim"] for r in rows] == [64]
    shown = json.loads(run("query", "--current", "--db", url, "-f", "json").stdout)
    assert [r["head_dim"] for r in shown] == [64]
    assert len(json.loads(run("query", "--db", url, "-f", "json").stdout)) == 2       # all, when not asked
    result = run("export", "--gpu", "test-gpu", "-o", tmp_path / "pack.json", "--db", url)
    assert result.exit_code == 0, result.output
    assert [e.workload.head_dim for e in load_pack(tmp_path / "pack.json").entries] == [64]
    gc = run("db", "gc", "--db", url, "-f", "json")
    assert gc.exit_code == 0, gc.output


def test_export_refuses_what_it_would_overwrite_and_writes_readable_packs(url, tmp_path):
    """Like db dump: an existing -o is refused without --force (one line, nothing written), a folder or an
    empty --gpu is a clear error, and the pack is readable by others (mode 0644 under umask 022)."""
    import os
    import stat

    pack_path = tmp_path / "pack.json"
    pack_path.write_text("mine")
    refused = run("export", "--gpu", "test-gpu", "-o", pack_path, "--db", url)
    assert refused.exit_code == 1 and "exists; choose another -o, or pass --force" in refused.output
    assert pack_path.read_text() == "mine"
    folder = run("export", "--gpu", "test-gpu", "-o", tmp_path, "--db", url)
    assert folder.exit_code == 1 and "is a folder" in folder.output and "Traceback" not in folder.output
    empty = run("export", "--gpu", "", "-o", tmp_path / "e.json", "--db", url)
    assert empty.exit_code == 1 and "--gpu is empty" in empty.output
    old = os.umask(0o022)
    try:
        forced = run("export", "--gpu", "test-gpu", "-o", pack_path, "--force", "--db", url)
    finally:
        os.umask(old)
    assert forced.exit_code == 0, forced.output
    assert stat.S_IMODE(pack_path.stat().st_mode) == 0o644
    assert load_pack(pack_path).metadata["gpu_name"] == "TEST-GPU"


def test_tables_fit_80_columns_and_wide_shows_every_column(url):
    def at_80(*args):
        result = runner.invoke(app, [*args, "--db", url], env={"COLUMNS": "80"})
        assert result.exit_code == 0, result.output
        return result.stdout

    for args in (("query",), ("query", "overhead")):
        lines = at_80(*args).splitlines()
        assert max(map(len, lines)) <= 80, "\n".join(lines)
    table = at_80("query", "--limit", "2", "--order", "fastest")
    fastest = json.loads(run("query", "--limit", "2", "--order", "fastest", "-f", "json", "--db", url).stdout)
    rows = [ln.split() for ln in table.splitlines() if ln.split()[:1] in ([str(r["id"])] for r in fastest)]
    assert [row[0] for row in rows] == [str(r["id"]) for r in fastest]      # one line per row
    assert [row[-2] for row in rows] == [f"{r['median_ms']:.4f}" for r in fastest]       # numbers whole
    assert "config" not in table
    wide = run("query", "--wide", "--limit", "2", "--db", url).stdout
    assert "config" in wide and "run" in wide and "p20-p80" in wide
    assert "sdpa ms" in run("query", "overhead", "--wide", "--db", url).stdout


def test_decode_rows_show_their_token_count(tmp_path):
    """A decode record of several tokens per call reads '<length>+<tokens>' in the narrow tables and has its
    own tokens<= column in the wide ones (one-token rows show the length alone), in query and overhead."""
    url = f"sqlite:///{tmp_path / 'perf.sqlite3'}"
    db = PerfDB(url)
    cfg = KnobSpace(SPEC, "decode").default()
    for tokens, ms in ((1, 0.30), (16, 0.46)):
        w = Workload(64, 64, 8, 8, "bfloat16", False, "decode", 32768, batch_bucket=8, query_bucket=tokens)
        db.record(ENV, kernel(pass_="decode"), w, cfg, ok(ms, baseline_ms=0.29), run_id="run-d")
    db.close()
    narrow = run("query", "--pass", "decode", "--db", url).stdout
    assert "32768+16" in narrow and "32768 " in narrow
    over = run("query", "overhead", "--pass", "decode", "--db", url).stdout
    assert "32768+16" in over and "1.59x" in over
    wide = run("query", "--pass", "decode", "--wide", "--db", url).stdout
    assert "tokens<=" in wide
    rows = json.loads(run("query", "overhead", "--pass", "decode", "-f", "json", "--db", url).stdout)
    assert sorted(r["tokens"] for r in rows) == [1, 16]


def test_narrow_tables_name_a_gpu_without_its_memory_words(tmp_path):
    """A real GPU name ("NVIDIA H100 80GB HBM3") must not wrap the 80-column tables: they show "H100" (a form
    factor word such as PCIe stays, telling two H100s apart), --wide the full name."""
    url = f"sqlite:///{tmp_path / 'perf.sqlite3'}"
    db = PerfDB(url)
    config = KnobSpace(SPEC, "fwd").default()
    for name, ms in (("NVIDIA H100 80GB HBM3", 1.5), ("NVIDIA H100 PCIe", 1.9)):
        env = dict(ENV, gpu_name=name)
        db.record(env, kernel(), wl(64, 4096), config, ok(ms, baseline_ms=1.0), run_id="run-1")
        db.record(env, kernel("sdpa"), wl(64, 4096), {}, ok(1.0), run_id="run-1")
    db.close()
    for args in (("query",), ("query", "overhead")):
        out = runner.invoke(app, [*args, "--db", url], env={"COLUMNS": "80"}).stdout
        lines = out.splitlines()
        assert max(map(len, lines)) <= 80, out
        firsts = [ln.split()[:3] for ln in lines if "H100" in ln]
        assert "80GB" not in out and "HBM3" not in out and len(firsts) >= 2, out
        assert any("PCIe" in ln for ln in lines) and all(ln.count("H100") == 1 for ln in lines if "H100" in ln), out
    wide = run("query", "overhead", "--wide", "--db", url).stdout
    assert "H100 80GB HBM3" in wide and "H100 PCIe" in wide
