"""BENCHMARKS.md is generated from the result files in benchmarks/results/ (benchmarks/report.py)."""
from __future__ import annotations

import re
from pathlib import Path

from repo_scripts import ROOT, load_script


def _report():
    return load_script("benchmarks/report.py")


def _synthetic(tmp_path, monkeypatch, command: str):
    """report.py reading its results from ``tmp_path``, and the header of a synthetic results file of ``command``."""
    report = _report()
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    return report, dict(command=command, gpu="NVIDIA H200", software="torch", notes="synthetic")


def _bench_row(D: int, T: int, B: int, H: int, **times) -> dict:
    """One ungated bench row (``times``: pathtune_f, sdpa_flash_f, ...)."""
    return dict(head_dim=D, seq_len=T, batch=B, heads=H, gate=False, times=times, errors={"o": 2e-3, "dq": 4e-3})


def test_benchmarks_md_is_what_the_result_files_give():
    report = _report()
    assert report.main(["--check"]) == 0, "run: python benchmarks/report.py --write"


def test_every_result_file_states_its_command_and_rows():
    import json

    files = sorted((ROOT / "benchmarks" / "results").glob("*.json"))
    assert files
    for path in files:
        doc = json.loads(path.read_text())
        # the command may set environment variables first ("PROFILE_GATES=both python benchmarks/...", "VAR= ...")
        command = re.sub(r"^(?:[A-Z_][A-Z0-9_]*=\S*\s+)+", "", doc["command"])
        # or a profiler around such a command (Nsight Compute: "ncu ... python benchmarks/ncu_step.py ...")
        assert command.startswith(("pathtune ", "python benchmarks/")) or (
            command.startswith("ncu ") and " python benchmarks/" in command), path.name
        # a decode probe may time only the steps (rows: generation) or only generation (steps empty)
        assert doc["gpu"] and (doc["rows"] or doc.get("steps")), path.name


def test_check_fails_on_a_hand_edit(tmp_path, monkeypatch):
    report = _report()
    edited = tmp_path / "BENCHMARKS.md"
    edited.write_text(report.render().replace("**", "", 1))
    monkeypatch.setattr(report, "TARGET", edited)
    assert report.main(["--check"]) == 1


def test_decode_steps_table_quotes_the_median_of_repeated_rounds():
    """A decode probe run with --repeats: the several-tokens table adds the median of the rounds'
    amortized / SDPA ratios with their range; a run without rounds keeps the plain table."""

    report = _report()
    row = dict(D=64, cache_len=4096, gate=False, tokens=1, pathtune_net_ms=0.06, flush_net_ms=0.18,
               amortized_ms=0.07, sdpa_ms=0.05, x_sdpa_amortized=1.4, graph_x_sdpa_graph=1.1)
    doc = dict(command="python benchmarks/decode_probe.py --repeats 3 --out p.json", gpu="NVIDIA H200",
               software="torch", notes="synthetic", steps=[dict(row, x_sdpa_amortized_rounds=[1.4, 1.2, 1.3],
                                                                 x_sdpa_amortized_median=1.3)])
    lines = report.decode_steps_section([(Path("H200-x-decode-probe.json"), doc)])
    assert "median of rounds (range)" in lines[2]
    assert lines[4].endswith("| 1.30× (1.20-1.40) |"), lines[4]
    plain = report.decode_steps_section([(Path("H200-x-decode-probe.json"), dict(doc, steps=[row]))])
    assert "median" not in plain[2] and plain[4].endswith("| 1.10× |"), plain[4]


def test_decode_steps_rows_come_from_the_newest_probe_of_each_token_count():
    """A probe run with --tokens 1 replaces the one-token rows of an older full probe and keeps its 4-token rows;
    the table names both sources, each with the token counts it gave."""
    report = _report()
    row = dict(D=64, cache_len=4096, gate=False, pathtune_net_ms=0.06, flush_net_ms=0.18, amortized_ms=0.07,
               sdpa_ms=0.05, x_sdpa_amortized=1.4, graph_x_sdpa_graph=1.1)
    base = dict(gpu="NVIDIA H200", software="torch", notes="synthetic")
    full = dict(base, command="python benchmarks/decode_probe.py --out a.json",
                steps=[dict(row, tokens=1), dict(row, tokens=4, x_sdpa_amortized=1.2)])
    one = dict(base, command="python benchmarks/decode_probe.py --tokens 1 --out b.json",
               steps=[dict(row, tokens=1, x_sdpa_amortized=1.05)])
    lines = report.decode_steps_section([(Path("H200-1-decode-probe.json"), full),
                                         (Path("H200-2-decode-probe.json"), one)])
    table = [ln for ln in lines if ln.startswith("| 64 ")]
    assert [ln.split(" | ")[3] for ln in table] == ["1", "4"]
    assert "| 1.05× |" in table[0] and "| 1.20× |" in table[1]
    text = "\n".join(lines)
    assert ("Rows of D 64 at cache 4096 (4 token(s) a call). Source: `benchmarks/results/H200-1-decode-probe.json`"
            in text)
    assert ("Rows of D 64 at cache 4096 (1 token(s) a call). Source: `benchmarks/results/H200-2-decode-probe.json`"
            in text)


def test_decode_step_rows_of_a_partial_probe_keep_the_older_probes_other_shapes():
    """A newer probe of some shapes only (--quick: D 64 at cache 4K) replaces those rows; the other shapes keep
    the older probe's rows, and each source says which rows it gave."""
    report = _report()
    row = dict(D=64, cache_len=4096, gate=False, tokens=1, pathtune_net_ms=0.06, flush_net_ms=0.18,
               amortized_ms=0.07, sdpa_ms=0.05, x_sdpa_amortized=1.4, graph_x_sdpa_graph=1.1)
    base = dict(gpu="NVIDIA H100", software="torch", notes="synthetic")
    full = dict(base, command="python benchmarks/decode_probe.py --out a.json",
                steps=[row, dict(row, D=128, x_sdpa_amortized=1.3), dict(row, cache_len=32768, x_sdpa_amortized=1.1)])
    quick = dict(base, command="python benchmarks/decode_probe.py --quick --out b.json",
                 steps=[dict(row, x_sdpa_amortized=0.95)])
    lines = report.decode_steps_section([(Path("H100-1-decode-probe.json"), full),
                                         (Path("H100-2-decode-probe.json"), quick)])
    table = [ln for ln in lines if ln.startswith("| ")][1:]
    assert [(ln.split(" | ")[0], ln.split(" | ")[1], ln.split(" | ")[8]) for ln in table] == [
        ("| 64", "4096", "0.95×"), ("| 64", "32768", "1.10×"), ("| 128", "4096", "1.30×")]
    text = "\n".join(lines)
    assert ("Rows of D 64 at cache 32768; D 128 at cache 4096 (1 token(s) a call). "
            "Source: `benchmarks/results/H100-1") in text
    assert "Rows of D 64 at cache 4096 (1 token(s) a call). Source: `benchmarks/results/H100-2" in text


def test_graph_timed_decode_rows_get_their_own_table():
    """A --graph decode bench (rows timing "graph") is its own table; the eager one-token table keeps the newest
    eager bench as its source."""
    report = _report()
    r = dict(head_dim=64, heads=16, cache_len=4096, gate=False, tokens=1, errors={"o": 2e-3},
             times={"pathtune": 0.05, "sdpa_flash": 0.05})
    doc = dict(command="pathtune bench --pass decode --graph", gpu="NVIDIA H200", software="torch", notes="synthetic",
               rows=[dict(r, timing="graph")])
    graph = report.decode_section(Path("H200-x-bench-decode-graph.json"), doc, timing="graph")
    assert graph[0] == "## Decoding one token, CUDA-graph replays (B = 8)"
    assert any(ln.startswith("| 64 | 16 | 4096 | PaTH |") for ln in graph)
    eager = report.decode_section(Path("H200-x-bench-decode-graph.json"), doc)
    assert not any(ln.startswith("| 64 |") for ln in eager)


def test_memory_table_comes_from_the_newest_bench_that_measured_memory(tmp_path, monkeypatch):
    """A bench run with --memory gives the extra-memory table (pathtune beside SDPA flash and fla, the gated
    row with its own numbers); a newer bench without memory keeps that table's source; a newer memory-only run
    (``*-memory-*.json``) takes the memory table and leaves the timing tables to the newest bench; without
    any, no table."""
    import json

    report, doc = _synthetic(tmp_path, monkeypatch, "pathtune bench --memory --json b.json")
    row = _bench_row(64, 16384, 2, 16, pathtune_f=4.0, sdpa_flash_f=3.0, pathtune_fb=22.0, sdpa_flash_fb=13.0)
    assert "Extra memory" not in report.render()
    mem = dict(pathtune_fb=0.91, sdpa_flash_fb=0.25, fla_fb=3.6)
    (tmp_path / "H200-20260101T000000Z-bench-fwd-bwd.json").write_text(json.dumps(dict(
        doc, rows=[dict(row, memory_gib=mem), dict(row, gate=True, memory_gib=dict(mem, pathtune_fb=0.94))])))
    (tmp_path / "H200-20260102T000000Z-bench-fwd-bwd.json").write_text(json.dumps(dict(doc, rows=[row])))
    text = report.render()
    assert "| 64 | 16384 | 2×16 | PaTH | 0.25 | 3.60 | **0.91** | 3.6× | 4.0× |" in text
    assert "| 64 | 16384 | 2×16 | FoX | 0.25 | 3.60 | **0.94** | 3.8× | 3.8× |" in text
    assert "Source: `benchmarks/results/H200-20260101T000000Z-bench-fwd-bwd.json`" in text
    # a memory run of its own (some points only) gives the memory table, not the timing tables
    (tmp_path / "H200-20260103T000000Z-memory-fwd-bwd.json").write_text(json.dumps(dict(
        doc, rows=[dict(row, memory_gib=dict(mem, pathtune_fb=0.5))])))
    text = report.render()
    assert "| 64 | 16384 | 2×16 | PaTH | 0.25 | 3.60 | **0.50** | 2.0× | 7.2× |" in text
    assert text.count("Source: `benchmarks/results/H200-20260102T000000Z-bench-fwd-bwd.json`") == 2   # fwd, fwd+bwd


def test_a_partial_bench_follows_the_complete_tables_while_it_is_newer(tmp_path, monkeypatch):
    """A bench stopped before every point (``*-bench-partial-*.json``) never replaces the forward and training
    tables, which keep the newest complete run; while it is newer than that run its rows follow them in a section
    of their own, once a later complete bench exists, they do not."""
    import json

    report, doc = _synthetic(tmp_path, monkeypatch, "pathtune bench --json b.json")
    row = _bench_row(128, 4096, 8, 8, pathtune_f=1.6, sdpa_flash_f=0.9, pathtune_fb=12.0, sdpa_flash_fb=3.4)
    full, partial = "H200-20260101T000000Z-bench-fwd-bwd.json", "H200-20260102T000000Z-bench-partial-fwd-bwd.json"
    (tmp_path / full).write_text(json.dumps(dict(doc, rows=[row])))
    (tmp_path / partial).write_text(json.dumps(dict(doc, rows=[dict(row, times=dict(row["times"], pathtune_fb=11.0))])))
    text = report.render()
    complete, newer = text.split("## Newer partial run")
    assert "**12.000**" in complete and "**11.000**" not in complete
    assert text.index("## Forward + backward") < text.index("## Newer partial run")
    assert "**11.000**" in newer and f"Source: `benchmarks/results/{partial}`" in newer
    (tmp_path / "H200-20260103T000000Z-bench-fwd-bwd.json").write_text(json.dumps(dict(doc, rows=[row])))
    assert "## Newer partial run" not in report.render()


def test_another_gpus_bench_gets_its_own_section_and_never_replaces_the_reference_tables(tmp_path, monkeypatch):
    """A newer bench on another GPU (an H100 file, whose name sorts before every H200 file) leaves the forward and
    training tables on the reference GPU's newest run and shows its own rows under "Other GPUs", each GPU's
    newest complete run only; files are ordered by the time in their names, not by the GPU prefix."""
    import json

    report, doc = _synthetic(tmp_path, monkeypatch, "pathtune bench --json b.json")
    row = _bench_row(128, 4096, 8, 8, pathtune_f=1.6, sdpa_flash_f=0.9, pathtune_fb=12.0, sdpa_flash_fb=3.4)
    other = dict(doc, gpu="NVIDIA H100 80GB HBM3")
    (tmp_path / "H200-20260102T000000Z-bench-fwd-bwd.json").write_text(json.dumps(dict(doc, rows=[row])))
    assert "## Other GPUs" not in report.render()
    (tmp_path / "H100-20260101T000000Z-bench-fwd-bwd.json").write_text(json.dumps(dict(
        other, rows=[dict(row, times=dict(row["times"], pathtune_f=1.7, pathtune_fb=13.0))])))
    (tmp_path / "H100-20260103T000000Z-bench-fwd-bwd.json").write_text(json.dumps(dict(
        other, rows=[dict(row, times=dict(row["times"], pathtune_f=1.8, pathtune_fb=14.0))])))
    reference, others = report.render().split("## Other GPUs")
    assert "**1.600**" in reference and "**12.000**" in reference and "**1.800**" not in reference
    assert "### NVIDIA H100 80GB HBM3" in others and "**1.800**" in others and "**14.000**" in others
    assert "**1.700**" not in others       # the older H100 run
    assert "Source: `benchmarks/results/H100-20260103T000000Z-bench-fwd-bwd.json`" in others


def test_another_gpus_memory_goes_under_its_own_heading_and_never_into_the_reference_table(tmp_path, monkeypatch):
    """Another GPU's extra-memory rows (a bench run with --memory, or a newer ``*-memory-*`` run of its own) show
    under that GPU's heading, from its newest file with memory rows; the reference table keeps the reference GPU's
    numbers; a notes text ending in a period is not given a second one."""
    import json

    report, doc = _synthetic(tmp_path, monkeypatch, "pathtune bench --memory --json b.json")
    row = _bench_row(128, 16384, 2, 8, pathtune_f=3.7, sdpa_flash_f=3.4, pathtune_fb=21.0, sdpa_flash_fb=12.0)
    mem = dict(pathtune_fb=0.9, sdpa_flash_fb=0.38, fla_fb=3.55)
    other = dict(doc, gpu="NVIDIA H100 80GB HBM3", notes="an H100 run.")
    (tmp_path / "H200-20260101T000000Z-bench-fwd-bwd.json").write_text(json.dumps(dict(
        doc, rows=[dict(row, memory_gib=mem)])))
    (tmp_path / "H100-20260102T000000Z-bench-fwd-bwd.json").write_text(json.dumps(dict(
        other, rows=[dict(row, memory_gib=dict(mem, pathtune_fb=0.97))])))
    reference, others = report.render().split("## Other GPUs")
    assert "**0.90**" in reference and "**0.97**" not in reference
    assert "#### Extra memory of one forward + backward (GiB)" in others and "**0.97**" in others
    assert "An H100 run.\n" in others and "run.." not in others
    (tmp_path / "H100-20260103T000000Z-memory-fwd-bwd.json").write_text(json.dumps(dict(
        other, rows=[dict(row, memory_gib=dict(mem, pathtune_fb=0.95))])))
    reference, others = report.render().split("## Other GPUs")
    assert "**0.95**" in others and "**0.97**" not in others and "**0.90**" in reference


def test_another_gpus_decode_probe_goes_under_its_own_heading_and_not_into_the_reference_tables(tmp_path, monkeypatch):
    """A decode probe on another GPU (steps and generation) shows under "Other GPUs", below that GPU's heading, also
    for a GPU without a bench; the reference decode tables keep the reference GPU's probe."""
    import json

    report, doc = _synthetic(tmp_path, monkeypatch, "python benchmarks/decode_probe.py --out p.json")
    step = dict(D=64, cache_len=4096, gate=False, tokens=16, pathtune_net_ms=0.06, flush_net_ms=0.18,
                amortized_ms=0.07, sdpa_ms=0.05, x_sdpa_amortized=1.4, graph_x_sdpa_graph=1.1)
    gen = [dict(kind=k, batch=8, prompt=4096, mode="graph", tokens_per_s=t) for k, t in (("rope", 1000.0),
                                                                                          ("path", 900.0))]
    (tmp_path / "H200-20260102T000000Z-decode-probe.json").write_text(json.dumps(dict(doc, steps=[step], rows=gen)))
    assert "## Other GPUs" not in report.render()
    other = dict(doc, gpu="NVIDIA H100 80GB HBM3", steps=[dict(step, x_sdpa_amortized=1.9)],
                 rows=[dict(g, tokens_per_s=g["tokens_per_s"] / 2) for g in gen])
    (tmp_path / "H100-20260103T000000Z-decode-probe.json").write_text(json.dumps(other))
    reference, others = report.render().split("## Other GPUs")
    assert "| 1.40× |" in reference and "| 1.90× |" not in reference and "| 500 |" not in reference
    assert "### NVIDIA H100 80GB HBM3" in others
    assert "#### Decoding several tokens per call" in others and "| 1.90× |" in others
    assert "#### Generation (tokens/s)" in others and "| 500 | 450 | 0.90× |" in others
    assert "Source: `benchmarks/results/H100-20260103T000000Z-decode-probe.json`" in others


def test_decode_steps_rows_with_a_negative_net_time_are_marked():
    """A probe row whose flush step came out shorter than its cache reset (net time below zero: host jitter) is
    marked, with a footnote saying its times measure nothing; the other rows are not."""
    report = _report()
    row = dict(D=64, cache_len=4096, gate=False, tokens=4, pathtune_net_ms=0.06, flush_net_ms=0.18, amortized_ms=0.07,
               sdpa_ms=0.05, x_sdpa_amortized=1.4, graph_x_sdpa_graph=1.1)
    doc = dict(command="python benchmarks/decode_probe.py --out p.json", gpu="NVIDIA H200", software="torch",
               notes="synthetic", steps=[row, dict(row, gate=True, flush_net_ms=-0.004)])
    lines = report.decode_steps_section([(Path("H200-x-decode-probe.json"), doc)])
    table = [ln for ln in lines if ln.startswith("| 64 ")]
    assert "†" not in table[0] and "| -0.0040† |" in table[1] and "**0.0700**†" in table[1]
    assert any(ln.startswith("† A net time below zero") for ln in lines)
    plain = report.decode_steps_section([(Path("H200-x-decode-probe.json"), dict(doc, steps=[row]))])
    assert not any("†" in ln for ln in plain)


def test_another_gpus_older_run_shows_only_the_shapes_its_newer_runs_did_not_time(tmp_path, monkeypatch):
    """A newer bench of some lengths only (here T 4K) leaves an older run's other lengths (T 16K) under the same GPU's
    heading, each table with its own source; the older run's T 4K row, timed again since, is not shown."""
    import json

    report, doc = _synthetic(tmp_path, monkeypatch, "pathtune bench --json b.json")
    other = dict(doc, gpu="NVIDIA H100 80GB HBM3")
    row = _bench_row(128, 4096, 8, 8, pathtune_f=1.6, sdpa_flash_f=0.9, pathtune_fb=12.0, sdpa_flash_fb=3.4)
    (tmp_path / "H200-20260102T000000Z-bench-fwd-bwd.json").write_text(json.dumps(dict(doc, rows=[row])))
    long_row = _bench_row(128, 16384, 2, 8, pathtune_f=3.8, sdpa_flash_f=3.3, pathtune_fb=27.0, sdpa_flash_fb=12.0)
    (tmp_path / "H100-20260101T000000Z-bench-fwd-bwd.json").write_text(json.dumps(dict(
        other, rows=[dict(row, times=dict(row["times"], pathtune_f=1.7)), long_row])))
    (tmp_path / "H100-20260103T000000Z-bench-fwd-bwd.json").write_text(json.dumps(dict(
        other, rows=[dict(row, times=dict(row["times"], pathtune_f=1.8))])))
    _reference, others = report.render().split("## Other GPUs")
    newer, older = others.split("Shapes the newer runs above did not time")
    assert "**1.800**" in newer and "Source: `benchmarks/results/H100-20260103T000000Z-bench-fwd-bwd.json`" in newer
    assert "**3.800**" in older and "**27.000**" in older and "**1.700**" not in older
    assert "Source: `benchmarks/results/H100-20260101T000000Z-bench-fwd-bwd.json`" in older


def test_the_reference_tables_keep_an_older_runs_shapes_that_the_newest_run_did_not_time(tmp_path, monkeypatch):
    """The forward and forward + backward tables: the newest bench's rows first (here D128 T 4K only), then an older
    complete run's rows for the shapes it did not time (T 16K), each with its own source; the older run's T 4K row,
    timed again since, is not shown."""
    import json

    report, doc = _synthetic(tmp_path, monkeypatch, "pathtune bench --json b.json")
    row = _bench_row(128, 4096, 8, 8, pathtune_f=1.6, sdpa_flash_f=0.9, pathtune_fb=12.0, sdpa_flash_fb=3.4)
    long_row = _bench_row(128, 16384, 2, 8, pathtune_f=3.8, sdpa_flash_f=3.3, pathtune_fb=27.0, sdpa_flash_fb=12.0)
    (tmp_path / "H200-20260101T000000Z-bench-fwd-bwd.json").write_text(json.dumps(dict(
        doc, rows=[dict(row, times=dict(row["times"], pathtune_f=1.7, pathtune_fb=13.0)), long_row])))
    (tmp_path / "H200-20260103T000000Z-bench-fwd-bwd.json").write_text(json.dumps(dict(doc, rows=[row])))
    text = report.render()
    forward = text.split("## Forward + backward")[0].split("## Forward")[1]
    training = text.split("## Forward + backward")[1]
    for section, new, old_shape, retimed in ((forward, "**1.600**", "**3.800**", "**1.700**"),
                                             (training, "**12.000**", "**27.000**", "**13.000**")):
        newer, older = section.split("Shapes the newer runs above did not time")
        assert new in newer and "Source: `benchmarks/results/H200-20260103T000000Z-bench-fwd-bwd.json`" in newer
        assert old_shape in older and retimed not in section
        assert "Source: `benchmarks/results/H200-20260101T000000Z-bench-fwd-bwd.json`" in older


def test_another_gpus_forward_profile_goes_under_its_own_heading(tmp_path, monkeypatch):
    """A fwd_probe.py profile on another GPU shows under "Other GPUs" as that GPU's "Where one forward's time goes",
    with TFLOP/s from each row's recorded super-chunk; the reference section keeps the reference GPU's profile."""
    import json

    report, doc = _synthetic(tmp_path, monkeypatch, "python benchmarks/fwd_probe.py --config auto --seq-lens 2048")
    row = dict(D=64, T=2048, B=16, H=16, gate=False, sdpa_flash=0.52, api=1.30, graph=1.29, variants=[],
               profile=dict(kernels=[["scan_intra_kernel", 0.800, 1], ["ut_fused_kernel", 0.450, 1]]))
    (tmp_path / "H200-20260102T000000Z-fwd-probe.json").write_text(json.dumps(dict(doc, rows=[row])))
    assert "## Other GPUs" not in report.render()
    other = dict(doc, gpu="NVIDIA H100 80GB HBM3",
                 rows=[dict(row, api=1.40, config=dict(superchunk_size=1024, chunk_size=64),
                            profile=dict(kernels=[["scan_intra_kernel", 0.700, 1], ["scan_inter_kernel", 0.2, 1]]))])
    (tmp_path / "H100-20260103T000000Z-fwd-probe.json").write_text(json.dumps(other))
    reference, others = report.render().split("## Other GPUs")
    assert "## Where one forward's time goes" in reference and "| 1.300 |" in reference and "1.400" not in reference
    assert "### NVIDIA H100 80GB HBM3" in others and "#### Where one forward's time goes" in others
    assert "| 1.400 |" in others and "| scan_inter_kernel | 0.200 (" in others
    assert "Source: `benchmarks/results/H100-20260103T000000Z-fwd-probe.json`" in others


def test_another_gpus_training_profile_goes_under_its_own_heading(tmp_path, monkeypatch):
    """A forward + backward profile (``*-fwdbwd-profile.json``) on another GPU shows under "Other GPUs" as that GPU's
    "Where one forward + backward's time goes" (its newest file), with the achieved TFLOP/s of the kernels that do
    matrix products; the reference section keeps the reference GPU's profile; a GPU with only such a profile still
    gets its heading."""
    import json

    report, doc = _synthetic(tmp_path, monkeypatch, "PROFILE_GATES=both python benchmarks/dev_gpu_run2.py profile4k")
    row = dict(kind="profile", D=128, T=4096, B=8, H=8, gate=False,
               kernels=[["bwd_intra_walk_kernel", 3.0, 8], ["bwd_inter_dkv_kernel", 1.9, 1]])
    (tmp_path / "H200-20260102T000000Z-fwdbwd-profile.json").write_text(json.dumps(dict(doc, rows=[row])))
    assert "## Other GPUs" not in report.render()
    other = dict(doc, gpu="NVIDIA H100 80GB HBM3")
    (tmp_path / "H100-20260103T000000Z-fwdbwd-profile.json").write_text(json.dumps(dict(
        other, rows=[dict(row, kernels=[["bwd_intra_walk_kernel", 2.7, 8], ["bwd_inter_dkv_kernel", 1.6, 1]])])))
    (tmp_path / "H100-20260101T000000Z-fwdbwd-profile.json").write_text(json.dumps(dict(
        other, rows=[dict(row, kernels=[["bwd_intra_walk_kernel", 9.9, 8]])])))
    reference, others = report.render().split("## Other GPUs")
    assert "## Where one forward + backward's time goes" in reference and "| 3.000 ×8 (" in reference
    assert "2.700" not in reference
    assert "### NVIDIA H100 80GB HBM3" in others and "#### Where one forward + backward's time goes" in others
    assert "| bwd_intra_walk_kernel | 2.700 ×8 (" in others and "| bwd_inter_dkv_kernel | 1.600 ×1 (" in others
    assert "9.900" not in others           # the older H100 profile
    assert "Source: `benchmarks/results/H100-20260103T000000Z-fwdbwd-profile.json`" in others
