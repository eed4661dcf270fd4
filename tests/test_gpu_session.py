"""benchmarks/gpu_session.sh's step runner (run on the GPU host; here its ``run_step`` function alone, on CPU)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None, reason="needs bash and timeout")
def test_a_second_step_of_the_same_name_keeps_the_first_ones_files(tmp_path):
    """Two kprobe steps write the same file names in s/: each step's files (log, JSON) are kept in
    s/steps/NN-<step>/ as well, databases excepted, so the second overwrites nothing the first wrote."""
    src = (ROOT / "benchmarks" / "gpu_session.sh").read_text()
    start = src.index("STEP_NO=0\n")
    end = src.index("\n}\n", src.index("_step_files() {")) + 3
    (tmp_path / "run_step.sh").write_text(src[start:end])
    script = f"""
        set -uo pipefail
        export S={tmp_path / "s"}
        mkdir -p "$S"
        source {tmp_path / "run_step.sh"}
        run_step kprobe 5 bash -c 'echo first > $S/kernel_probe.json; echo one'
        sleep 0.05
        run_step kprobe 5 bash -c 'echo second > $S/kernel_probe.json; echo two'
        run_step tune 5 bash -c 'echo db > $S/perf.sqlite3'
    """
    res = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    steps = tmp_path / "s" / "steps"
    assert (steps / "01-kprobe" / "kernel_probe.json").read_text() == "first\n"
    assert (steps / "01-kprobe" / "kprobe.log").read_text() == "one\n"
    assert (steps / "02-kprobe" / "kernel_probe.json").read_text() == "second\n"
    assert sorted(p.name for p in (steps / "03-tune").iterdir()) == ["tune.log"]
    assert (tmp_path / "s" / "kernel_probe.json").read_text() == "second\n"
    assert (tmp_path / "s" / "steps.txt").read_text().count("rc=0") == 3


def test_the_ncu_steps_script_runs_two_public_steps(monkeypatch):
    """benchmarks/ncu_step.py (what the ncu step profiles) in Triton's interpreter at a small shape: its public
    fwd+bwd steps run and give q a finite, nonzero gradient; a token count T does not divide is refused."""
    import torch

    from repo_scripts import load_benchmark_script

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    script = load_benchmark_script(monkeypatch, "benchmarks/ncu_step.py")
    once = script.main(["--D", "64", "--T", "64", "--tokens", "64", "--device", "cpu", "--gate"])
    assert once is not None and torch.isfinite(once).all() and once.abs().sum() > 0
    with pytest.raises(SystemExit):
        script.main(["--T", "64", "--tokens", "100", "--device", "cpu"])


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None, reason="needs bash and timeout")
def test_a_call_stopped_at_its_limit_still_packs_what_its_finished_steps_wrote(tmp_path):
    """gpu_session.sh's TERM trap (the script's own line, here around a step that outlives the limit): stopped by
    SIGTERM, the call exits 124 and $OUT/session.tgz holds the files the finished steps left in s/."""
    import tarfile

    src = (ROOT / "benchmarks" / "gpu_session.sh").read_text()
    trap = next(line for line in src.splitlines() if line.startswith("trap ") and "session.tgz" in line)
    script = f"""
        ROOT_S={tmp_path / "session" / "s"}
        OUT={tmp_path / "out"}
        mkdir -p "$ROOT_S" "$OUT"
        echo finished > "$ROOT_S/tune.log"
        {trap}
        sleep 30
    """
    res = subprocess.run(["timeout", "-s", "TERM", "2", "bash", "-c", script], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 124, (res.returncode, res.stdout, res.stderr)
    with tarfile.open(tmp_path / "out" / "session.tgz") as tar:
        assert tar.extractfile("s/tune.log").read() == b"finished\n"


def _call_folder(folder, files: dict, part_bytes=None):
    """A device call's files_at folder: ``files`` {path under the cache: bytes} as gpu_session.sh packs them (a tar
    of ./entry/file members, xz, split into tcache.txz.aa, .ab, ...)."""
    import io
    import lzma
    import tarfile

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo("./" + name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    packed = lzma.compress(raw.getvalue())
    step = part_bytes or len(packed)
    folder.mkdir()
    for n, i in enumerate(range(0, len(packed), step)):
        (folder / f"tcache.txz.a{chr(ord('a') + n)}").write_bytes(packed[i:i + step])
    return folder


def test_merged_triton_caches_hold_every_calls_entries_the_later_one_winning(tmp_path):
    from repo_scripts import load_script

    mod = load_script("benchmarks/tcache/merge_tcache.py")
    first = _call_folder(tmp_path / "1", {"aaa/k.cubin": b"old", "bbb/k.cubin": b"b"}, part_bytes=100)
    second = _call_folder(tmp_path / "2", {"aaa/k.cubin": b"new", "ccc/k.json": b"{}"})
    out = tmp_path / "tcache_in"
    out.mkdir()
    (out / "tcache.txz.zz").write_bytes(b"stale part")
    assert mod.main([str(first), str(second), "--out", str(out)]) == 0
    assert [p.name for p in sorted(out.glob("tcache.txz.*"))] == ["tcache.txz.aa"]
    got = mod.read_entries(out)
    assert {k: v[1] for k, v in got.items() if v[1] is not None} == {
        "aaa/k.cubin": b"new", "bbb/k.cubin": b"b", "ccc/k.json": b"{}"}
    with pytest.raises(SystemExit, match="no tcache.txz"):
        mod.main([str(tmp_path / "1"), str(tmp_path), "--out", str(out)])
    with pytest.raises(SystemExit, match="over --max-mib"):
        mod.main([str(first), "--out", str(out), "--max-mib", "0.0001"])
    assert mod.read_entries(out)["ccc/k.json"][1] == b"{}"     # a refused merge wrote nothing


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_a_tuned_bench_from_the_calls_empty_database_is_refused():
    """The bench step dispatches from the call's own record database (empty until a step records), so BENCH_ARGS
    asking for --config tuned would time every key at its heuristic config: the script's check says so, in
    either spelling, and lets the step run once a PATHTUNE_DB_URL word points elsewhere or the config is not
    'tuned'."""
    src = (ROOT / "benchmarks" / "gpu_session.sh").read_text()
    start = src.index("_tuned_without_records() {")
    end = src.index("\n}\n", start) + 3
    cases = [("--seq-len 16384 --config tuned --memory", "sqlite:///s/perf.sqlite3", 0),
             ("--config=tuned", "sqlite:///s/perf.sqlite3", 0),
             ("--config tuned", "", 1),                             # PATHTUNE_DB_URL= : the shipped records
             ('--config {"num_warps":8}', "sqlite:///s/perf.sqlite3", 1),
             ("--config tunedx", "sqlite:///s/perf.sqlite3", 1),
             ("", "sqlite:///s/perf.sqlite3", 1)]
    for args, url, want in cases:
        script = src[start:end] + f'\nPATHTUNE_DB_URL="{url}"\n_tuned_without_records \'{args}\' sqlite:///s/perf.sqlite3\n'
        res = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
        assert res.returncode == want, (args, url, res.returncode, res.stderr)


def _session_archive(folder, files: dict):
    """A device call's session.tgz in ``folder``: ``files`` {path under s/: bytes}, as gpu_session.sh packs them."""
    import io
    import tarfile

    folder.mkdir(parents=True, exist_ok=True)
    with tarfile.open(folder / "session.tgz", "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo("s/" + name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return folder


def test_ship_call_takes_in_the_tune_results_and_the_triton_caches_of_calls(tmp_path, capsys):
    """benchmarks/ship_call.py: each call's session.tgz unpacks into a fresh folder, its steps and what a person
    must wrap are printed, the new tune results files land in the shipped folder (one already there with the same
    contents is skipped), the calls' Triton caches are merged into the carried one; a results file there with
    other contents, or a folder without session.tgz, is refused before anything is copied."""
    from repo_scripts import load_script

    mod = load_script("benchmarks/ship_call.py")
    merge = load_script("benchmarks/tcache/merge_tcache.py")
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    (shipped / "H200-tune-d128-20260101T000000Z.json").write_text('{"old": 1}')
    one = _call_folder(tmp_path / "1", {"aaa/k.cubin": b"a"})
    _session_archive(one, {"steps.txt": b"== tune rc=0 in 90s\n", "tune/H200-tune-d128-20260101T000000Z.json":
                           b'{"old": 1}', "tune/H200-tune-d64-20260102T000000Z.json": b'{"new": 2}',
                           "tune/tune.sqlite3": b"db", "env.json": b"{}"})
    two = _call_folder(tmp_path / "2", {"bbb/k.cubin": b"b"})
    _session_archive(two, {"steps.txt": b"== benchtuned rc=0 in 400s\n", "bench_tuned.json": b"[]",
                           "perf.sqlite3": b"db", "steps/01-benchtuned/bench_tuned.json": b"[]"})
    carried = tmp_path / "tcache_in"
    argv = [str(one), str(two), "--tcache", str(carried), "--shipped", str(shipped), "--into", str(tmp_path / "u")]
    assert mod.main(argv) == 0
    out = capsys.readouterr().out
    assert sorted(p.name for p in shipped.iterdir()) == ["H200-tune-d128-20260101T000000Z.json",
                                                         "H200-tune-d64-20260102T000000Z.json"]
    assert (shipped / "H200-tune-d64-20260102T000000Z.json").read_text() == '{"new": 2}'
    assert "== tune rc=0 in 90s" in out and "== benchtuned rc=0 in 400s" in out
    assert "for a person: bench_tuned.json, perf.sqlite3" in out
    assert "shipped H200-tune-d64-20260102T000000Z.json" in out
    got = merge.read_entries(carried)
    assert {k: v[1] for k, v in got.items() if v[1] is not None} == {"aaa/k.cubin": b"a", "bbb/k.cubin": b"b"}
    # a second call of a later session: the carried cache keeps the earlier entries
    three = _call_folder(tmp_path / "3", {"ccc/k.cubin": b"c"})
    _session_archive(three, {"steps.txt": b""})
    unpack = ["--into", str(tmp_path / "u")]
    assert mod.main([str(three), "--tcache", str(carried), "--shipped", str(shipped), *unpack]) == 0
    assert len(list((tmp_path / "u").iterdir())) == 3        # a fresh folder per call, never one reused
    assert set(merge.read_entries(carried)) >= {"aaa/k.cubin", "bbb/k.cubin", "ccc/k.cubin"}
    # refusals: nothing copied
    clash = _session_archive(tmp_path / "4", {"tune/H200-tune-d128-20260101T000000Z.json": b'{"other": 3}',
                                              "tune/H200-tune-d32-20260103T000000Z.json": b"{}"})
    with pytest.raises(SystemExit, match="exists with other contents"):
        mod.main([str(clash), "--no-tcache", "--shipped", str(shipped), "--into", str(tmp_path / "u")])
    assert not (shipped / "H200-tune-d32-20260103T000000Z.json").exists()
    with pytest.raises(SystemExit, match="no session.tgz"):
        mod.main([str(tmp_path / "tcache_in"), "--shipped", str(shipped), "--into", str(tmp_path / "u")])
