"""Write BENCHMARKS.md from the result files in benchmarks/results/ (no GPU needed).

    python benchmarks/report.py --write      # regenerate BENCHMARKS.md
    python benchmarks/report.py --check      # exit 1 when BENCHMARKS.md differs from what the files give

Result files (JSON, one per GPU run): ``{"command", "gpu", "software", "notes", "rows"}``, where rows are
what ``pathtune bench --json`` writes (``*-bench-*.json``) or what ``benchmarks/fwd_probe.py`` writes
(``*-fwd-probe.json``).  Files are ordered by the UTC time their name carries (``<GPU>-<YYYYMMDDTHHMMSSZ>-...``).
Of the reference GPU's files (``REFERENCE_GPU``, the one the header names), the newest bench file with forward
rows gives the forward table, the newest with forward+backward rows the training table, the newest probe file
the per-kernel profile (with the matrix-product FLOPs of ``kernel_flops.py``) and the knob variants; every
other GPU's newest bench gets a section of its own ("Other GPUs"), so a run on another card never replaces
the reference tables.  Add a run by dropping its file here and regenerating; nothing in BENCHMARKS.md is
typed by hand.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
TARGET = HERE.parent / "BENCHMARKS.md"
sys.path.insert(0, str(HERE))
from kernel_flops import table as flops_table  # noqa: E402

FWD_KERNELS = ("scan_inter_kernel", "scan_intra_kernel", "ut_fused_kernel", "ut_chunk_kernel", "ut_apply_kernel",
               "ut_diag_inverse_kernel", "superchunk_transport_kernel", "gate_cumsum_kernel")


REFERENCE_GPU = "NVIDIA H200"     # the GPU of the header and of every section but "Other GPUs"


def _load(pattern: str, gpu: str | None = REFERENCE_GPU) -> list[tuple[Path, dict]]:
    """The results files matching ``pattern``, oldest first (by the time in their names), of GPU ``gpu`` only
    (its name as the files spell it; None: every GPU)."""
    files = [(p, json.loads(p.read_text())) for p in sorted(RESULTS.glob(pattern), key=lambda p: (_stamp(p), p.name))]
    return [(p, d) for p, d in files if gpu is None or d["gpu"] == gpu]


def _has_forward(row) -> bool:
    return "pathtune_f" in row["times"]


def _newest(files, want) -> tuple[Path, dict] | None:
    hits = [(p, d) for p, d in files if any(want(r) for r in d["rows"])]
    return hits[-1] if hits else None


def _newest_cells(files, want) -> list[tuple[Path, dict]]:
    """Newest first, the files (oldest first in ``files``) whose ``want`` rows time a shape (head dim, length,
    gate) that no newer file times, each cut to those rows: a run of some lengths only does not hide the
    other lengths of an older run, and no shape shows twice."""
    seen, out = set(), []
    for path, doc in reversed(files):
        rows = [r for r in doc["rows"] if want(r) and (r["head_dim"], r["seq_len"], r["gate"]) not in seen]
        if rows:
            seen.update((r["head_dim"], r["seq_len"], r["gate"]) for r in rows)
            out.append((path, dict(doc, rows=rows)))
    return out


def _gate(r) -> str:
    return "FoX" if r["gate"] else "PaTH"


def _f(x, nd=3) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def _source(path: Path, doc: dict) -> list[str]:
    """Where a table's numbers come from: the results file and its GPU / software on one line, the run's notes
    (which tree and records it timed, how) folded in a details block, and the command that reproduces it."""
    notes = doc["notes"][:1].upper() + doc["notes"][1:].rstrip(".")
    return [f"Source: `benchmarks/results/{path.name}` ({doc['gpu']}; {doc['software']}).", "",
            "<details><summary>How this run was made</summary>", "", f"{notes}.", "", "</details>",
            "", "Reproduce (in the repo root of a GPU host with pathtune installed; fla optional):", "",
            f"    {doc['command']}", ""]


def _timing_rows(doc: dict, suffix: str, extra_cells) -> list[str]:
    """Rows of one timing table: pathtune's time ``pathtune_<suffix>`` beside SDPA flash and fla of the
    same run, then the table's own columns (``extra_cells(row)``, inserted after SDPA flash)."""
    out = []
    for r in doc["rows"]:
        t = r["times"]
        if f"pathtune_{suffix}" not in t:
            continue
        fl, fla, pt = t.get(f"sdpa_flash_{suffix}"), t.get(f"fla_{suffix}"), t[f"pathtune_{suffix}"]
        before, after = extra_cells(r)
        out.append(f"| {r['head_dim']} | {r['seq_len']} | {r['batch']}×{r['heads']} | {_gate(r)} | {_f(fl)} | "
                   f"{before}{_f(fla)} | **{_f(pt)}** | {_f(pt / fl if fl else None, 2)}× | "
                   f"{_f(fla / pt if fla else None, 2)}× | {after} |")
    return out


def _forward_table(doc: dict) -> list[str]:
    out = ["| D | T | B×H | | SDPA flash | SDPA cuDNN | fla | pathtune | pathtune / flash | fla / pathtune | o err |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    return out + _timing_rows(doc, "f", lambda r: (f"{_f(r['times'].get('sdpa_cudnn_f'))} | ",
                                                         f"{r['errors'].get('o', float('nan')):.1e}"))


_OLDER_SHAPES = "Shapes the newer runs above did not time, from an older run:"


def _merged_tables(runs, table) -> list[str]:
    """``table`` of each of ``runs`` (``_newest_cells``: newest first, each cut to the shapes no newer run timed)
    with its source, the older ones under a line that says so."""
    out: list[str] = []
    for i, (path, doc) in enumerate(runs):
        if i:
            out += ["", _OLDER_SHAPES, ""]
        out += table(doc) + [""] + _source(path, doc)
    return out


def forward_section(runs) -> list[str]:
    """The forward table of the newest bench, then older benches' rows for the shapes it did not time."""
    return ["## Forward", ""] + _merged_tables(runs, _forward_table)


def _worst_grad(r) -> str:
    grads = {k: v for k, v in r["errors"].items() if k != "o"}
    worst = max(grads, key=grads.get)
    return f"{grads[worst]:.1e} ({worst})"


def _training_table(doc: dict) -> list[str]:
    out = ["| D | T | B×H | | SDPA flash | fla | pathtune | pathtune / flash | fla / pathtune | max grad err |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    return out + _timing_rows(doc, "fb", lambda r: ("", _worst_grad(r)))


def training_section(runs) -> list[str]:
    """The forward + backward table of the newest bench, then older benches' rows for the shapes it did not time."""
    return ["## Forward + backward", ""] + _merged_tables(runs, _training_table)


def _stamp(path: Path) -> str:
    """The UTC time a results file's name carries (``<GPU>-<YYYYMMDDTHHMMSSZ>-...``), "" if none."""
    m = re.search(r"\d{8}T\d{6}Z", path.name)
    return m.group(0) if m else ""


def partial_section(path: Path, doc: dict) -> list[str]:
    """A bench stopped before all its points (``*-bench-partial-*.json``), newer than the full tables above: the
    rows it reached, each with its baselines from the same run."""
    return (["## Newer partial run", "",
             "A later bench that stopped before every point (its notes say why): the rows it timed, baselines from "
             "the same run; the tables above are the newest complete run.", "", "Forward:", ""]
            + _forward_table(doc) + ["", "Forward + backward:", ""] + _training_table(doc) + [""] + _source(path, doc))


def _has_memory(row) -> bool:
    return "pathtune_fb" in (row.get("memory_gib") or {})


def memory_section(path: Path, doc: dict, level: str = "##") -> list[str]:
    """Extra peak memory of one forward + backward call (``pathtune bench --memory``), beside SDPA's and fla's;
    ``level``: its heading's."""
    out = [f"{level} Extra memory of one forward + backward (GiB)", "",
           "Peak allocated during one call minus what was allocated before it (inputs and the upstream gradient):",
           "the outputs, what autograd saves, the backward's buffers and the returned gradients.", "",
           "| D | T | B×H | | SDPA flash | fla | pathtune | pathtune / flash | fla / pathtune |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        if not _has_memory(r):
            continue
        m = r["memory_gib"]
        ours, flash, fla = m["pathtune_fb"], m.get("sdpa_flash_fb"), m.get("fla_fb")
        out.append(f"| {r['head_dim']} | {r['seq_len']} | {r['batch']}×{r['heads']} | {_gate(r)} | {_f(flash, 2)} | "
                   f"{_f(fla, 2)} | **{ours:.2f}** | " + (f"{ours / flash:.1f}× | " if flash else "- | ")
                   + (f"{fla / ours:.1f}× |" if fla and ours else "- |"))
    return out + [""] + _source(path, doc)


def _kernel_cells(rows, name: str, kernels_of, flops: dict, launches: bool = True) -> list[str]:
    """One table row's cells: kernel ``name``'s device ms in each profile row (``kernels_of(row)``: its
    [name, ms, launches] entries), with the launch count and the achieved TFLOP/s where counted; "-"
    where the run did not launch it."""
    cells = []
    for r in rows:
        hit = next(((ms, n) for k, ms, n in kernels_of(r) if k == name), None)
        fl = flops.get((r["D"], r["T"], r["gate"], name))
        cells.append("-" if hit is None else f"{hit[0]:.3f}" + (f" ×{hit[1]}" if launches else "")
                     + (f" ({fl['tflops']:.0f})" if fl else ""))
    return cells


def profile_section(path: Path, doc: dict, level: str = "##") -> list[str]:
    """Device ms per kernel of one public forward per (D, T, gate) of a fwd_probe.py run, its do_bench time,
    its CUDA-graph replay (where the run timed one) and the launcher's knob variants; ``level``: its heading's."""
    rows = sorted((r for r in doc["rows"] if "profile" in r), key=lambda r: (r["T"], r["D"], not r["gate"]))
    flops = {(f["D"], f["T"], f["gate"], f["kernel"]): f
             for f in flops_table(rows, 64, 1024, 64, forward_only=True)}
    head = " | ".join(f"D{r['D']} T{r['T']} {'FoX' if r['gate'] else 'PaTH'}" for r in rows)
    config = "tuned config, backend='auto'" if "--config auto" in doc["command"] else "heuristic config"
    out = [f"{level} Where one forward's time goes ({config})", "",
           "Device ms per kernel of one public `path_attention` call (torch profiler) and, where the kernel does "
           "matrix products, the achieved TFLOP/s (`benchmarks/kernel_flops.py --forward`: 2·m·n·k per product, "
           "tf32x3 counted once).  The transport runs on a second stream beside `scan_intra`.", "",
           f"| kernel | {head} |", "|---|" + "---|" * len(rows)]
    for name in FWD_KERNELS:
        cells = _kernel_cells(rows, name, lambda r: r["profile"]["kernels"], flops, launches=False)
        if any(c != "-" for c in cells):     # kernels this run did not launch (an older stage layout) stay out
            out.append(f"| {name} | " + " | ".join(cells) + " |")
    out.append("| whole call (do_bench) | " + " | ".join(f"{r['api']:.3f}" for r in rows) + " |")
    if all("graph" in r for r in rows):
        out.append("| the call from a CUDA graph | " + " | ".join(f"{r['graph']:.3f}" for r in rows) + " |")
    out.append("| SDPA flash | " + " | ".join(f"{r['sdpa_flash']:.3f}" for r in rows) + " |")
    changes = [json.dumps(v["change"]) for v in rows[0]["variants"]] if rows else []
    if changes:
        out += ["", "Knob changes, launcher only (ms, o error vs the float64 oracle):", "",
                f"| change | {head} |", "|---|" + "---|" * len(rows)]
        out.append("| (none) | " + " | ".join(f"{r['launcher']:.3f} ({r['o_err']:.1e})" for r in rows) + " |")
    for i, change in enumerate(changes):
        cells = []
        for r in rows:
            v = r["variants"][i]
            cells.append(v.get("error", "")[:30] if "ms" not in v else f"{v['ms']:.3f} ({v['o_err']:.1e})")
        out.append(f"| `{change}` | " + " | ".join(cells) + " |")
    return out + [""] + _source(path, doc)


HEADER = """# Benchmarks

<!-- Generated by `python benchmarks/report.py --write` from benchmarks/results/*.json: edit those, not this. -->

PaTH / PaTH-FoX attention on one NVIDIA H200 (sm_90; other GPUs' runs under "Other GPUs"): bf16 q/k/v, float32
w/β/g, causal, B·T = 32768 tokens, H = 16 heads at D = 64 and 8 at D = 128.  Inputs: β ~ U(1.5, 2), unit-norm w,
FoX gate g = log U(0.95, 1).  Times are `triton.testing.do_bench` medians in ms of what users call
(`pathtune.path_attention`, host included); the forward and training tables keep the median of 3 rounds that
time every callable of a point in turn (`pathtune bench --rounds`).  Every row's baselines (torch SDPA with the
flash and cuDNN backends, flash-linear-attention's `parallel_path_attn`) were measured in the same process on
the same inputs; errors are relative Frobenius norms against the float64 naive reference on the same (rounded)
inputs.

"""

def current_section() -> list[str]:
    """Which shipped records the dispatcher serves for the kernels and spec of this tree (``perf_db/shipped/``,
    per pass: the files and their ok records), computed here: a kernel or spec edit changes this section until the
    next measurement.  A pass without one runs its untuned config under ``backend="auto"``, said so."""
    from pathtune.perf_db._keys import stale_reasons
    from pathtune.provenance import current_keys

    shipped = sorted((HERE.parent / "perf_db" / "shipped").glob("*.json"))
    by_pass: dict[str, list[tuple[str, int]]] = {p: [] for p in ("fwd", "bwd", "decode")}
    retired = 0
    for path in shipped:
        counts: dict[str, int] = {}
        for rec in json.loads(path.read_text())["records"]:
            k = rec["kernel"]
            keys = current_keys(k.get("op", "path_attention"), k["pass"], k["backend"])
            if rec["measurement"]["status"] == "ok" and not stale_reasons({**k, "run_id": rec.get("run_id")}, keys):
                counts[k["pass"]] = counts.get(k["pass"], 0) + 1
        for p, n in counts.items():
            by_pass.setdefault(p, []).append((path.name, n))
        retired += not counts
    out = ["## What is current", "",
           "Every table names the commit whose kernels it timed.  What `backend=\"auto\"` serves for the kernels and "
           "spec of this tree, per pass (shipped files in `perf_db/shipped/` and their ok records):", "",
           "| pass | records | files |", "|---|---|---|"]
    for p, files in by_pass.items():
        if files:
            out.append(f"| {p} | {sum(n for _f, n in files)} | " + ", ".join(f"`{f}` ({n})" for f, n in files) + " |")
        else:
            out.append(f"| {p} | none | no current measurement: the kernels changed since; `backend=\"auto\"` runs "
                       "the untuned config |")
    out += ["", f"The other {retired} files in `perf_db/shipped/` hold retired or withdrawn records only (earlier "
            "kernels or spec; runs `perf_db._keys.WITHDRAWN_RUNS` names), kept for history and for the tuner's warm "
            "start."]
    return out


def _by_other_gpu(files) -> dict[str, list]:
    """``files`` ((path, doc), oldest first) of every GPU but the reference one, grouped by GPU in that order."""
    out: dict[str, list] = {}
    for path, doc in files:
        if doc["gpu"] != REFERENCE_GPU:
            out.setdefault(doc["gpu"], []).append((path, doc))
    return out


def _has_profile(doc: dict) -> bool:
    return any("profile" in r for r in doc["rows"])


def other_gpus_section(benches, probes=(), fwd_probes=(), memory=(), train_profiles=()) -> list[str]:
    """Each other GPU's newest complete bench with forward rows, then older ones for the shapes no newer run timed
    (forward and forward + backward tables, baselines from its own run; ``benches``: the complete bench files of
    every GPU, oldest first), its newest extra-memory table (``memory``: bench and ``*-memory-*`` files of every GPU,
    oldest first; the newest with memory rows), its newest forward profile (``fwd_probes``: fwd_probe.py files of
    every GPU, oldest first; those with a per-kernel profile count) and forward + backward profile
    (``train_profiles``: ``*-fwdbwd-profile`` files of every GPU, oldest first) and its decode probes' tables
    (``probes``: the decode probe files of every GPU, oldest first), newest GPU run first; empty when every bench and
    probe ran on the reference GPU."""
    runs = {gpu: hits for gpu, files in _by_other_gpu(benches).items() if (hits := _newest_cells(files, _has_forward))}
    decode = _by_other_gpu(probes)
    profiles = _by_other_gpu([f for f in fwd_probes if _has_profile(f[1])])
    memories = {gpu: hit for gpu, files in _by_other_gpu(memory).items() if (hit := _newest(files, _has_memory))}
    trainings = _by_other_gpu(train_profiles)
    if not runs and not decode and not profiles and not trainings and not memories:
        return []
    out = ["## Other GPUs", "",
           f"The newest complete bench (older runs for the shapes it did not time), extra-memory table, forward and "
           f"forward + backward profiles and decode probes of each GPU other than the {REFERENCE_GPU}, same shapes "
           "and columns as above, every baseline "
           "from that GPU's own "
           "run; each table names the commit whose kernels it timed.", ""]

    def newest_stamp(gpu):
        files = (runs.get(gpu, []) + decode.get(gpu, []) + profiles.get(gpu, []) + trainings.get(gpu, [])
                 + ([memories[gpu]] if gpu in memories else []))
        return max(_stamp(p) for p, _d in files)

    gpus = set(runs) | set(decode) | set(profiles) | set(trainings) | set(memories)
    for gpu in sorted(gpus, key=newest_stamp, reverse=True):
        out += [f"### {gpu}", ""]
        for i, (path, doc) in enumerate(runs.get(gpu, [])):
            if i:
                out += ["", _OLDER_SHAPES, ""]
            out += ["Forward:", ""] + _forward_table(doc)
            if any("pathtune_fb" in r["times"] for r in doc["rows"]):
                out += ["", "Forward + backward:", ""] + _training_table(doc)
            out += [""] + _source(path, doc)
        if gpu in memories:
            out += [""] + memory_section(*memories[gpu], level="####")
        if gpu in profiles:
            out += [""] + profile_section(*profiles[gpu][-1], level="####")
        if gpu in trainings:
            out += [""] + training_profile_section(*trainings[gpu][-1], level="####")
        steps = [p for p in decode.get(gpu, []) if p[1].get("steps")]
        generation = [p for p in decode.get(gpu, []) if p[1].get("rows")]
        if steps:
            out += decode_steps_section(steps, level="####") + [""]
        if generation:
            out += generation_section(*generation[-1], level="####") + [""]
    return out


def kernel_change_section(path: Path, doc: dict) -> list[str]:
    """Times of kernels (or of one launcher call) before and after changes, each pair from one process."""
    pairs: dict[tuple, dict] = {}
    e2e = []
    for r in doc["rows"]:
        if r["variant"] == "before" and r["kernel"].startswith("fwd+bwd"):
            e2e.append(f"D{r['D']} {_gate(r)} {_f(r['ms'])}")
            continue
        entry = pairs.setdefault((r["kernel"], r["D"], r.get("gate")), {"before": None, "after": []})
        if r["variant"].startswith("before"):
            entry["before"] = r
        else:
            entry["after"].append(r)
    errs = any("o_err" in r for r in doc["rows"])
    out = ["## Latest kernel changes: before and after in one process (T = 4096)", "",
           "| kernel | D | | before | after | after / before | change |" + (" o err after |" if errs else ""),
           "|---|---|---|---|---|---|---|" + ("---|" if errs else "")]
    for (kernel, D, gate), pr in pairs.items():
        b = pr["before"]
        label = "-" if gate is None else ("FoX" if gate else "PaTH")
        for a in pr["after"] if b else ():
            err = (f" {a['o_err']:.1e} |" if "o_err" in a else " - |") if errs else ""
            out.append(f"| {kernel} | {D} | {label} | {_f(b['ms'])} | **{_f(a['ms'])}** | {a['ms'] / b['ms']:.2f} | "
                       f"{a['variant'].removeprefix('after: ')} |" + err)
    out.append("")
    if e2e:
        out += ["Forward + backward before these changes (same run, autograd, heuristic config, ms): "
                + ", ".join(e2e) + ".", ""]
    return out + _source(path, doc)


def training_profile_section(path: Path, doc: dict, level: str = "##") -> list[str]:
    """Device ms per kernel of one forward + backward (summed over launches) and achieved TFLOP/s; ``level``: its
    heading's."""
    rows = [r for r in doc["rows"] if r.get("kind") == "profile"]
    flops = {(f["D"], f["T"], f["gate"], f["kernel"]): f for f in flops_table(rows, 64, 1024, 64)}
    cols = [(r["D"], r["T"], r["gate"]) for r in rows]
    head = " | ".join(f"D{d} T{t} {'FoX' if g else 'PaTH'}" for d, t, g in cols)
    names = []
    for r in rows:
        names += [k for k, _, _ in sorted(r["kernels"], key=lambda e: -e[1]) if k not in names]
    out = [f"{level} Where one forward + backward's time goes (heuristic config)", "",
           "Device ms per kernel of one `path_attention` forward + backward (torch profiler, summed over the "
           "kernel's launches, in brackets) and, where the kernel does matrix products, the achieved TFLOP/s "
           "(`benchmarks/kernel_flops.py`: 2·m·n·k per product, tf32x3 counted once).", "",
           f"| kernel | {head} |", "|---|" + "---|" * len(cols)]
    for name in names:
        out.append(f"| {name} | " + " | ".join(_kernel_cells(rows, name, lambda r: r["kernels"], flops)) + " |")
    out.append("| sum of kernels | " + " | ".join(f"{sum(ms for _, ms, _ in r['kernels']):.3f}" for r in rows) + " |")
    return out + [""] + _source(path, doc)


def decode_section(path: Path, doc: dict, timing: str = "eager") -> list[str]:
    """The decode step (``pathtune bench --pass decode``) beside SDPA flash over the same cache and fla's step;
    ``timing``: the rows timed as eager calls, or (``graph``, ``--graph``) as CUDA-graph replays."""
    rows = [r for r in doc["rows"] if r.get("timing", "eager") == timing]
    swept = any(r.get("sweep") for r in rows)
    if timing == "graph":
        out = ["## Decoding one token, CUDA-graph replays (B = 8)", "",
               "pathtune and SDPA flash timed as CUDA-graph replays of the same calls (`--graph`: their GPU time "
               "without host work; fla's step eager).  A short cache's eager call is about as long on the host as "
               "on the GPU, so these times pick its config.", ""]
    else:
        out = ["## Decoding one token (B = 8)", ""]
    if swept:
        out += ["pathtune: the fastest config of the sweep (block_n / splits / warps, and / the pending window where "
                "the sweep varied it), which `backend=\"auto\"` serves from the shipped records; heuristic: the "
                "untuned config, timed first in the same row.", "",
                "| D | H | cache | | SDPA flash | fla step | pathtune | pathtune / flash | config | heuristic | "
                "heuristic / flash | o err |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    else:
        out += ["| D | H | cache | | SDPA flash | fla step | pathtune | pathtune / flash | o err |",
                "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        t = r["times"]
        pt, fl = t.get("pathtune"), t.get("sdpa_flash")
        line = (f"| {r['head_dim']} | {r['heads']} | {r['cache_len']} | {_gate(r)} | {_f(fl, 4)} | "
                f"{_f(t.get('fla'), 4)} | **{_f(pt, 4)}** | {_f(pt / fl if pt and fl else None, 2)}× | ")
        if swept:
            p, hd = r.get("params", {}), t.get("pathtune_default")
            cfg = "/".join(str(p.get(k, "?")) for k in ("decode_block_n", "decode_splits", "decode_num_warps"))
            windows = {e["config"].get("decode_pending_window") for e in r["sweep"]}
            if len(windows) > 1:      # the window the fastest entry ran
                best = next((e["config"] for e in r["sweep"] if e.get("ms") == pt), {})
                cfg += f"/W{best.get('decode_pending_window', '?')}"
            line += f"{cfg} | {_f(hd, 4)} | {_f(hd / fl if hd and fl else None, 2)}× | "
        out.append(line + f"{r['errors'].get('o', float('nan')):.1e} |")
    return out + [""] + _source(path, doc)


def decode_steps_section(files: list, level: str = "##") -> list[str]:
    """The public decode step for 1, 4 and 16 new tokens (decode_probe.py): a step without a flush, the
    flush step, the amortized step over a flush cycle, beside SDPA flash over the same query count.  ``files``:
    the probes' (path, doc), oldest first; each row (head dim, cache, gate, token count) comes from the newest
    file that timed it (a probe run with --tokens or --quick times only some), and the sources say which rows
    each gave.  ``level``: the heading's markdown level."""
    newest: dict = {}
    for path, doc in files:
        for r in doc.get("steps", []):
            if "pathtune_net_ms" in r:
                newest[(r["D"], r["cache_len"], r["gate"], r["tokens"])] = (path, doc, r)
    used = sorted({id(d): (p, d) for p, d, _r in newest.values()}.values(), key=lambda f: f[0].name)
    steps = [newest[shape][2] for shape in sorted(newest)]
    # --old-decode runs also time an older decode kernel on the same steps: its flush step and amortized step
    before = any("old_amortized_ms" in r for r in steps)
    # --repeats runs time each row several times: the median of the rounds' ratios, with their range
    rounds = any("x_sdpa_amortized_median" in r for r in steps)
    out = [f"{level} Decoding several tokens per call (public API, B = 8, H = 16 at D = 64, 8 at D = 128)", "",
           "| D | cache | | tokens | step | flush step | amortized | SDPA flash | amortized / SDPA | "
           "graph / SDPA graph |" + (" median of rounds (range) |" if rounds else "")
           + (" flush step before | amortized before |" if before else ""),
           "|---|---|---|---|---|---|---|---|---|---|" + ("---|" if rounds else "") + ("---|---|" if before else "")]
    jitter = False
    for r in steps:
        # a net time (the timed call minus its cache reset) below zero: jitter larger than the call's work
        mark = "†" if min(r["pathtune_net_ms"], r.get("flush_net_ms") or 0.0) < 0 else ""
        jitter = jitter or bool(mark)
        line = (f"| {r['D']} | {r['cache_len']} | {_gate(r)} | {r['tokens']} | {_f(r['pathtune_net_ms'], 4)}{mark} | "
                f"{_f(r.get('flush_net_ms'), 4)}{mark} | **{_f(r.get('amortized_ms'), 4)}**{mark} | "
                f"{_f(r['sdpa_ms'], 4)} | {_f(r.get('x_sdpa_amortized'), 2)}× | "
                f"{_f(r.get('graph_x_sdpa_graph'), 2)}× |")
        if rounds:
            rs = r.get("x_sdpa_amortized_rounds") or []
            line += (f" {_f(r.get('x_sdpa_amortized_median'), 2)}× ({_f(min(rs), 2)}-{_f(max(rs), 2)}) |" if rs
                     else " - |")
        if before:
            line += f" {_f(r.get('old_flush_net_ms'), 4)} | {_f(r.get('old_amortized_ms'), 4)} |"
        out.append(line)
    if jitter:
        out += ["", "† A net time below zero: the timed call came out shorter than its cache reset alone (host jitter "
                "larger than the call's work on that row), so the row's step, flush and amortized times measure "
                "nothing; rerun the probe for it."]
    for path, doc in used:
        src = _source(path, doc)
        mine = sorted(shape for shape, (_p, d, _r) in newest.items() if d is doc)
        counts = ", ".join(str(n) for n in sorted({shape[3] for shape in mine}))
        if len(used) == 1:
            out += ["", f"All rows, {counts} token(s) a call. {src[0]}"] + src[1:]
            continue
        caches: dict = {}
        for shape in mine:
            caches.setdefault(shape[0], set()).add(shape[1])
        where = "; ".join(f"D {d_} at cache {', '.join(map(str, sorted(cs)))}" for d_, cs in sorted(caches.items()))
        out += ["", f"Rows of {where} ({counts} token(s) a call). {src[0]}"] + src[1:]
    return out


def generation_section(path: Path, doc: dict, level: str = "##") -> list[str]:
    """Tokens/s of a small LM generating with PaTH / PaTH-FoX / RoPE + SDPA attention (decode_probe.py);
    ``level``: the heading's markdown level."""
    rows = doc["rows"]
    rope = {(r["batch"], r["prompt"], r["mode"]): r["tokens_per_s"] for r in rows if r["kind"] == "rope"}
    out = [f"{level} Generation (tokens/s)", "",
           "| batch | prompt | mode | RoPE + SDPA | PaTH | PaTH / RoPE | PaTH-FoX | FoX / RoPE |",
           "|---|---|---|---|---|---|---|---|"]
    keys = sorted({(r["batch"], r["prompt"], r["mode"]) for r in rows})
    for key in keys:
        got = {r["kind"]: r["tokens_per_s"] for r in rows if (r["batch"], r["prompt"], r["mode"]) == key}
        base = rope.get(key)
        cells = []
        for kind in ("path", "fox"):
            v = got.get(kind)
            cells += [f"{v:.0f}" if v else "-", _f(v / base if v and base else None, 2) + "×"]
        out.append(f"| {key[0]} | {key[1]} | {key[2]} | {base:.0f} | " + " | ".join(cells) + " |")
    return out + [""] + _source(path, doc)


def _on_reference(files) -> list[tuple[Path, dict]]:
    """The ``files`` ((path, doc), in their order) of the reference GPU."""
    return [f for f in files if f[1]["gpu"] == REFERENCE_GPU]


def render() -> str:
    # each kind of results file read once for every GPU: the reference GPU's make the tables above "Other GPUs"
    # a bench stopped before every point (``*-bench-partial-*.json``) never replaces the complete tables: shown
    # after them while it is the newer run
    every_gpu = _load("*-bench-*.json", gpu=None)
    complete = [f for f in every_gpu if "-bench-partial-" not in f[0].name]
    partial = _on_reference(f for f in every_gpu if "-bench-partial-" in f[0].name)
    bench = _on_reference(complete)
    fwd_probes = _load("*-fwd-probe.json", gpu=None)
    # a memory run may time only some points: its own file name (``*-memory-*.json``) keeps it out of the
    # timing tables, whose source is the newest full bench
    memory = sorted(complete + _load("*-memory-*.json", gpu=None), key=lambda f: f[0].name)
    train_profiles = _load("*-fwdbwd-profile.json", gpu=None)
    decode_probes = _load("*-decode-probe.json", gpu=None)
    probe = _on_reference(fwd_probes)
    changes = _load("*-kernel-probe.json")
    parts = [HEADER]
    # the newest bench's shapes, then older benches' for the shapes it did not time (a run of some lengths or head
    # dims only hides nothing of an older complete one)
    fwd = _newest_cells(bench, _has_forward)
    if fwd:
        parts.append("\n".join(forward_section(fwd)) + "\n")
    fb = _newest_cells(bench, lambda r: "pathtune_fb" in r["times"])
    if fb:
        parts.append("\n".join(training_section(fb)) + "\n")
    newest = [runs[0] for runs in (fwd, fb) if runs]
    newer = [f for f in partial if not newest or _stamp(f[0]) > max(_stamp(x[0]) for x in newest)]
    if newer:
        parts.append("\n".join(partial_section(*newer[-1])) + "\n")
    mem = _newest(_on_reference(memory), _has_memory)
    if mem:
        parts.append("\n".join(memory_section(*mem)) + "\n")
    if probe:
        parts.append("\n".join(profile_section(*probe[-1])) + "\n")
    profiles = _on_reference(train_profiles)
    if profiles:
        parts.append("\n".join(training_profile_section(*profiles[-1])) + "\n")
    if changes:
        parts.append("\n".join(kernel_change_section(*changes[-1])) + "\n")
    # one-token steps only: a sweep of several-token calls (--new-tokens) is read through the decode probe's table
    for timing in ("eager", "graph"):
        decode = _newest(bench, lambda r, timing=timing: ("cache_len" in r and r.get("tokens", 1) == 1
                                                          and r.get("timing", "eager") == timing))
        if decode:
            parts.append("\n".join(decode_section(*decode, timing=timing)) + "\n")
    # a decode probe may time only some sections (--skip): each table comes from the newest file that has it
    probes = _on_reference(decode_probes)
    steps = [p for p in probes if p[1].get("steps")]
    generation = [p for p in probes if p[1].get("rows")]
    if steps:
        parts.append("\n".join(decode_steps_section(steps)) + "\n")
    if generation:
        parts.append("\n".join(generation_section(*generation[-1])) + "\n")
    others = other_gpus_section(complete, decode_probes, fwd_probes, memory, train_profiles)
    if others:
        parts.append("\n".join(others) + "\n")
    parts.append("\n".join(current_section()) + "\n")
    return "\n".join(parts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="write BENCHMARKS.md")
    mode.add_argument("--check", action="store_true", help="exit 1 if BENCHMARKS.md is not what --write writes")
    a = ap.parse_args(argv)
    text = render()
    if a.write:
        TARGET.write_text(text)
        print(f"wrote {TARGET}")
        return 0
    if TARGET.read_text() != text:
        print(f"{TARGET.name} differs from the result files: run python benchmarks/report.py --write", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
