"""examples/flipflop: the FFL generator against its definition (data.py), read-error counting, Wilson
intervals, the models' causality and the --tiny end-to-end run (CPU, reference backend).

The generator tests draw a fresh seed each run (printed in the assertion message).
"""
from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from examples.flipflop.data import (  # noqa: E402
    BIT0,
    BIT1,
    IGNORE,
    READ,
    SPLITS,
    WRITE,
    expected_reads,
    loss_targets,
    make_generator,
    read_mask,
    sample_flipflop,
)
from examples.flipflop.metrics import count_read_errors, reads_to_resolve, wilson_interval  # noqa: E402


def _fresh_seed() -> int:
    return random.SystemRandom().randrange(2**31)


def _reference_answers(seq: list[int]) -> list[tuple[int, int]]:
    """(read position, expected bit) by walking the sequence as the definition says."""
    out, last = [], None
    for p in range(0, len(seq), 2):
        ins, bit = seq[p], seq[p + 1]
        if ins == WRITE:
            last = bit
        elif ins == READ:
            out.append((p, last))
    return out


# ------------------------------------------------------------------------------------- generator

@pytest.mark.parametrize("p_ignore", [0.1, 0.8, 0.98])
def test_structure_and_read_answers(p_ignore):
    seed = _fresh_seed()
    x = sample_flipflop(64, 512, p_ignore, make_generator(seed))
    assert x.shape == (64, 512) and x.dtype == torch.int64, seed
    ins, bits = x[:, 0::2], x[:, 1::2]
    assert torch.isin(ins, torch.tensor([WRITE, READ, IGNORE])).all(), seed   # instructions at even positions
    assert torch.isin(bits, torch.tensor([BIT0, BIT1])).all(), seed          # bits at odd positions
    assert (ins[:, 0] == WRITE).all() and (ins[:, -1] == READ).all(), seed
    for row in x.tolist():
        for p, want in _reference_answers(row):
            assert want is not None, seed
            assert row[p + 1] == want, (seed, p)


@pytest.mark.parametrize("p_ignore", [0.1, 0.8, 0.98])
def test_instruction_frequencies(p_ignore):
    seed = _fresh_seed()
    B, T = 2000, 512
    x = sample_flipflop(B, T, p_ignore, make_generator(seed))
    free = x[:, 2:-2:2]                        # instructions 1 .. n-2 are i.i.d.
    n = free.numel()
    p_rw = (1 - p_ignore) / 2
    for tok, p in ((IGNORE, p_ignore), (WRITE, p_rw), (READ, p_rw)):
        f = (free == tok).float().mean().item()
        sd = math.sqrt(p * (1 - p) / n)
        assert abs(f - p) < 6 * sd + 1e-12, (seed, tok, f, p)
    reads = (x[:, 0::2] == READ).sum(1).float()
    mu = expected_reads(T, p_ignore)
    assert abs(reads.mean().item() - mu) < 6 * math.sqrt((T // 2 - 2) * p_rw * (1 - p_rw) / B) + 1e-9, seed
    # bits after w and i are fair coins
    ins, bits = x[:, 0::2], x[:, 1::2]
    free_bits = bits[ins != READ].float()
    assert abs(free_bits.mean().item() - 0.5) < 6 * 0.5 / math.sqrt(free_bits.numel()), seed


def test_expected_reads_formula():
    assert expected_reads(512, 0.8) == pytest.approx(1 + 254 * 0.1)
    assert expected_reads(512, 0.98) == pytest.approx(1 + 254 * 0.01)
    assert expected_reads(512, 0.1) == pytest.approx(1 + 254 * 0.45)


def test_seeded_determinism_and_disjoint_streams():
    seed = _fresh_seed()
    a = sample_flipflop(8, 512, 0.8, make_generator(seed))
    b = sample_flipflop(8, 512, 0.8, make_generator(seed))
    c = sample_flipflop(8, 512, 0.8, make_generator(seed + 1))
    assert torch.equal(a, b), seed
    assert not torch.equal(a, c), seed
    offsets = [s.seed_offset for s in SPLITS.values()]
    assert len(set(offsets)) == len(offsets)
    assert [SPLITS[s].p_ignore for s in ("train", "id", "sparse", "dense")] == [0.8, 0.8, 0.98, 0.1]


def test_loss_targets_only_at_reads():
    seed = _fresh_seed()
    x = sample_flipflop(16, 64, 0.5, make_generator(seed))
    tgt = loss_targets(x)
    m = read_mask(x)
    assert torch.equal(tgt != -100, m), seed
    assert torch.equal(tgt[m], x[:, 1:][m[:, :-1]]), seed


# ------------------------------------------------------------------------------------- counting

def test_count_read_errors_hand_made():
    w, r, i = WRITE, READ, IGNORE
    #          0  1  2  3  4  5  6  7  8  9 10 11
    seq1 = [w, 1, i, 0, r, 1, w, 0, r, 0, r, 0]    # reads at 4 (->1), 8 (->0), 10 (->0)
    seq2 = [w, 0, r, 0, i, 1, i, 1, w, 1, r, 1]    # reads at 2 (->0), 10 (->1)
    tokens = torch.tensor([seq1, seq2])
    V = 5
    logits = torch.zeros(2, 12, V)
    # predict the true next token everywhere ...
    for b in range(2):
        for p in range(11):
            logits[b, p, tokens[b, p + 1]] = 1.0
    assert count_read_errors(logits, tokens) == (0, 5)
    # ... then break two reads and one non-read position (which must not count)
    logits[0, 8] = 0
    logits[0, 8, 1] = 1.0        # read answered 1, truth 0 -> error
    logits[1, 10] = 0
    logits[1, 10, w] = 1.0       # read answered with an instruction -> error
    logits[0, 5] = 0
    logits[0, 5, 0] = 1.0        # after a bit: not a read position
    assert count_read_errors(logits, tokens) == (2, 5)


def test_wilson_interval_numbers():
    # textbook values (Newcombe 1998 style): 95% Wilson
    lo, hi = wilson_interval(5, 100)
    assert lo == pytest.approx(0.02154, abs=2e-5) and hi == pytest.approx(0.11175, abs=2e-5)
    lo, hi = wilson_interval(50, 100)
    assert lo == pytest.approx(0.40383, abs=2e-5) and hi == pytest.approx(0.59617, abs=2e-5)
    lo, hi = wilson_interval(0, 1000)
    z2 = 1.959963984540054 ** 2
    assert lo == 0.0 and hi == pytest.approx(z2 / (1000 + z2), rel=1e-12)
    lo, hi = wilson_interval(1000, 1000)
    assert hi == 1.0 and lo == pytest.approx(1000 / (1000 + z2), rel=1e-12)


def test_reads_to_resolve():
    n = reads_to_resolve(1e-3)
    assert wilson_interval(0, n)[1] < 1e-3 <= wilson_interval(0, n - 1)[1]


# ------------------------------------------------------------------------------------- models

@pytest.mark.parametrize("attention", ["path", "rope", "path_fox"])
def test_models_are_causal(attention):
    from examples.flipflop.model import FlipFlopLM

    torch.manual_seed(0)
    m = FlipFlopLM(attention, backend="reference").eval()
    x = sample_flipflop(2, 64, 0.5, make_generator(_fresh_seed()))
    y = x.clone()
    y[:, 40:] = sample_flipflop(2, 64, 0.5, make_generator(_fresh_seed()))[:, 40:]
    with torch.no_grad():
        a, b = m(x), m(y)
    assert torch.allclose(a[:, :40], b[:, :40], atol=1e-5)
    assert not torch.allclose(a[:, 40:], b[:, 40:], atol=1e-5)


def test_lr_schedule():
    from examples.flipflop.train import TrainConfig, lr_factor

    c = TrainConfig(steps=1000, warmup=100, min_lr_ratio=0.1)
    assert lr_factor(0, c) == pytest.approx(0.01)
    assert lr_factor(99, c) == pytest.approx(1.0)
    assert lr_factor(100, c) == pytest.approx(1.0)
    assert lr_factor(550, c) == pytest.approx(0.55)
    assert lr_factor(1000, c) == pytest.approx(0.1)


# ------------------------------------------------------------------------------------- end to end

def test_tiny_end_to_end_cpu(tmp_path):
    out = tmp_path / "results.json"
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "examples.flipflop", "--tiny", "--no-progress", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    wall = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert wall < 60, f"--tiny took {wall:.1f}s"
    res = json.loads(out.read_text())
    assert set(res) == {"path", "rope", "path_fox", "meta"}
    for name in ("path", "rope", "path_fox"):
        r = res[name]
        assert r["status"] == "ok", r.get("traceback")
        for s in ("id", "sparse", "dense"):
            assert 0.0 <= r[f"{s}_error"] <= 1.0
            assert r[f"{s}_reads"] > 0 and r[f"{s}_errors"] == round(r[f"{s}_error"] * r[f"{s}_reads"])
            lo, hi = r[f"{s}_ci95"]
            assert lo <= r[f"{s}_error"] <= hi
        for k in ("train_steps", "train_seconds", "tokens_per_s"):
            assert r[k] > 0
        assert r["train_steps"] == 24 and len(r["curve"]["loss"]) == 6, r["stop_reason"]
    meta = res["meta"]
    assert meta["tiny"] and meta["complete"] and "--tiny" in meta["command"]
    assert meta["seeds"]["model_init"] == 0 and meta["backend"] == "reference"


def _install_fake_fla(monkeypatch) -> list:
    """fla is not installed on the CPU hosts: a stand-in ``fla.ops.path_attn.parallel_path_attn`` with
    fla's signature that runs the pathtune reference. Returns the list its calls are logged to."""
    import types

    from pathtune.runtime.api import path_attention

    calls = []

    def parallel_path_attn(q, k, v, w, beta, g=None, scale=None, cu_seqlens=None, use_cache=False):
        calls.append((q.shape, w.dtype, beta.dtype, None if g is None else g.dtype, scale))
        return path_attention(q, k, v, w, beta, g, scale=scale, backend="reference"), None

    mod = types.ModuleType("fla.ops.path_attn")
    mod.parallel_path_attn = parallel_path_attn
    for name in ("fla", "fla.ops"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "fla.ops.path_attn", mod)
    return calls


def test_fla_switch_wires_the_same_layer(monkeypatch):
    """The fla kernel switch must feed fla exactly the layer's q, k, v, w, beta, g and use its o_proj:
    with the stand-in fla the model's output must equal the pathtune path's."""
    from examples.flipflop.model import FlipFlopLM, attention_kernel

    calls = _install_fake_fla(monkeypatch)

    for attention in ("path", "path_fox"):
        torch.manual_seed(1)
        m = FlipFlopLM(attention, backend="reference").eval()
        x = sample_flipflop(2, 64, 0.5, make_generator(_fresh_seed()))
        with torch.no_grad():
            ref = m(x)
            with attention_kernel(m, "fla"):
                got = m(x)
        assert m.kernel == "pathtune"
        assert torch.allclose(ref, got, atol=1e-5, rtol=1e-5)
        assert calls[-1][1:4] == (torch.float32, torch.float32, torch.float32 if attention == "path_fox" else None)
        assert calls[-1][4] == pytest.approx(32 ** -0.5)
    with pytest.raises(ValueError):
        with attention_kernel(FlipFlopLM("rope"), "fla"):
            pass


def test_failed_model_keeps_the_others_and_resume(tmp_path, monkeypatch):
    """A crash in one model is recorded and the others' results survive; --resume reruns only it."""
    from examples.flipflop import run

    real = run.FlipFlopLM

    def flaky(attention, **kw):
        if attention == "rope":
            raise RuntimeError("injected failure")
        return real(attention, **kw)

    out = tmp_path / "r.json"
    args = ["--tiny", "--no-progress", "--steps", "4", "--out", str(out)]
    monkeypatch.setattr(run, "FlipFlopLM", flaky)
    assert run.main(args) == 1
    res = json.loads(out.read_text())
    assert res["path"]["status"] == "ok" and res["path_fox"]["status"] == "ok"
    assert res["rope"]["status"].startswith("failed: RuntimeError: injected failure")
    assert "traceback" in res["rope"] and res["meta"]["complete"] is False
    path_before = res["path"]

    monkeypatch.setattr(run, "FlipFlopLM", real)
    assert run.main(args + ["--resume"]) == 0
    res = json.loads(out.read_text())
    assert res["rope"]["status"] == "ok" and res["meta"]["complete"] is True
    assert res["path"] == path_before                      # kept, not retrained
    assert res["meta"]["previous_runs"][0]["models_kept"] == ["path", "path_fox"]
    assert "--resume" in res["meta"]["command"] and "--resume" not in res["meta"]["previous_runs"][0]["command"]
    assert list(res) == ["path", "rope", "path_fox", "meta"]


def test_throughput_measurement_and_table(monkeypatch):
    from examples.flipflop.model import FlipFlopLM
    from examples.flipflop.run import markdown_table
    from examples.flipflop.train import TrainConfig, measure_throughput

    cfg = TrainConfig(steps=2, batch=2, seq_len=32, warmup=1)
    r = measure_throughput(FlipFlopLM("path", backend="reference"), cfg, kernel="pathtune", seed=0,
                           device=torch.device("cpu"), steps=2, warmup=1)
    assert r["tokens_per_s"] > 0 and r["timed_steps"] == 2 and math.isfinite(r["final_loss"])
    comp = {"batch": 2, "seq_len": 32, "timed_steps": 2, "path/pathtune": r,
            "path/fla": {"skipped": "fla not importable"}}
    table = markdown_table({"meta": {"throughput_comparison": comp}})
    assert "| PaTH |" in table and "fla not importable" in table


def test_evaluate_counts_exactly():
    """evaluate() over a seeded split equals an independent count with the reference walk."""
    from dataclasses import replace

    from examples.flipflop.data import batches
    from examples.flipflop.train import evaluate

    class AlwaysZero(torch.nn.Module):          # predicts bit 0 everywhere
        def forward(self, tokens):
            out = torch.zeros(*tokens.shape, 5)
            out[..., BIT0] = 1.0
            return out

    class Oracle(torch.nn.Module):              # peeks at the next token: never wrong
        def forward(self, tokens):
            out = torch.zeros(*tokens.shape, 5)
            out[:, :-1].scatter_(-1, tokens[:, 1:, None], 1.0)
            return out

    seed = _fresh_seed()
    split = replace(SPLITS["id"], seq_len=64)
    data = torch.cat(list(batches(split, 7, seed, "cpu", n_sequences=50)))
    answers = [a for row in data.tolist() for _, a in _reference_answers(row)]
    kw = dict(n_sequences=50, batch=7, seed=seed, device=torch.device("cpu"), time_limit_s=60, amp=False)
    ev = evaluate(AlwaysZero(), split, **kw)
    assert (ev["errors"], ev["reads"], ev["sequences"]) == (sum(answers), len(answers), 50), seed
    assert ev["error"] == pytest.approx(sum(answers) / len(answers))
    assert tuple(ev["ci95"]) == wilson_interval(sum(answers), len(answers))
    ev = evaluate(Oracle(), split, **kw)
    assert (ev["errors"], ev["reads"]) == (0, len(answers)), seed


FAKE_FLA = """
import os

from pathtune.runtime.api import path_attention


def parallel_path_attn(q, k, v, w, beta, g=None, scale=None, cu_seqlens=None, use_cache=False):
    with open(os.environ["FAKE_FLA_LOG"], "a") as f:
        f.write(f"{tuple(q.shape)} {w.dtype} {beta.dtype} {None if g is None else g.dtype} {scale}\\n")
    return path_attention(q, k, v, w, beta, g, scale=scale, backend="reference"), None
"""


def _install_fake_fla_on_disk(tmp_path, monkeypatch) -> Path:
    """The stand-in fla as a package on disk, importable here and in the measurement child processes
    (they inherit PYTHONPATH). Returns the file its calls are logged to."""
    pkg = tmp_path / "fakefla" / "fla" / "ops" / "path_attn"
    pkg.mkdir(parents=True)
    for d in (pkg.parent.parent, pkg.parent):
        (d / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text(FAKE_FLA)
    log = tmp_path / "fla_calls.log"
    monkeypatch.setenv("FAKE_FLA_LOG", str(log))
    root = str(tmp_path / "fakefla")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    monkeypatch.syspath_prepend(root)
    for name in [m for m in sys.modules if m == "fla" or m.startswith("fla.")]:
        monkeypatch.delitem(sys.modules, name)
    return log


def test_runner_tokens_per_s_comparison(tmp_path, monkeypatch):
    """The runner's same-run comparison (CUDA only in real runs) end to end, with the stand-in fla;
    each measurement runs in a child process."""
    from examples.flipflop import run

    log = _install_fake_fla_on_disk(tmp_path, monkeypatch)
    out = tmp_path / "r.json"
    assert run.main(["--tiny", "--no-progress", "--steps", "4", "--models", "path,rope", "--bench-steps", "2",
                     "--compare-on-cpu", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    comp = res["meta"]["throughput_comparison"]
    assert comp["fla_importable"] is True
    assert log.exists() and "torch.float32" in log.read_text()      # the child ran fla's stand-in
    for kernel in ("pathtune", "fla"):
        assert comp[f"path/{kernel}"]["tokens_per_s"] > 0 and comp[f"path/{kernel}"]["timed_steps"] == 2
        assert math.isfinite(comp[f"path/{kernel}"]["final_loss"])
    assert comp["path/pathtune_over_fla"] == pytest.approx(
        comp["path/pathtune"]["tokens_per_s"] / comp["path/fla"]["tokens_per_s"])
    assert list(comp)[-3:] == ["path/pathtune", "path/fla", "path/pathtune_over_fla"]
    assert set(res["path"]["tokens_per_s_same_run"]) == {"pathtune", "fla"}
    assert "rope/pathtune" not in comp
    assert "pathtune / fla" in run.markdown_table(res)


def test_child_measurement_matches_in_process():
    """The child gets the same weights, config and seed: its final loss equals the in-process one."""
    from examples.flipflop.model import FlipFlopLM
    from examples.flipflop.train import TrainConfig, measure_throughput, measure_throughput_in_child

    cfg = TrainConfig(steps=2, batch=2, seq_len=32, warmup=1, amp=False)
    torch.manual_seed(3)
    model = FlipFlopLM("path_fox", backend="reference")
    here = measure_throughput(model, cfg, kernel="pathtune", seed=5, device=torch.device("cpu"), steps=2, warmup=1)
    there, _ = measure_throughput_in_child(model.state_dict(), "path_fox", cfg, kernel="pathtune", seed=5,
                                           device=torch.device("cpu"), steps=2, warmup=1, backend="reference",
                                           timeout_s=120)
    assert "failed" not in there, there
    assert set(there) == set(here)
    assert there["final_loss"] == pytest.approx(here["final_loss"], rel=1e-5, abs=1e-6)


def test_measurement_child_timeout_is_recorded():
    from examples.flipflop.model import FlipFlopLM
    from examples.flipflop.train import TrainConfig, measure_throughput_in_child

    rec, _ = measure_throughput_in_child(FlipFlopLM("path", backend="reference").state_dict(), "path",
                                         TrainConfig(batch=2, seq_len=32), kernel="pathtune", seed=0,
                                         device=torch.device("cpu"), steps=2, warmup=1, backend="reference",
                                         timeout_s=0.3)
    assert rec["failed"].startswith("timed out after") and rec["exit_code"] is None and rec["timeout_s"] == 0.3


def test_crashing_measurement_child_is_recorded_and_the_next_runs(tmp_path, monkeypatch):
    """A measurement child that dies (os._exit) is that entry's failure; the next entries are still
    measured; a fla child failing with a CUDA error is rerun once with CUDA_LAUNCH_BLOCKING=1 and the
    tail of its traceback recorded."""
    from examples.flipflop import run
    from examples.flipflop.train import FAULT_ENV

    _install_fake_fla_on_disk(tmp_path, monkeypatch)
    monkeypatch.setenv(FAULT_ENV, "path/pathtune=exit,path_fox/fla=cuda")
    out = tmp_path / "r.json"
    assert run.main(["--tiny", "--no-progress", "--steps", "4", "--models", "path,path_fox", "--bench-steps", "2",
                     "--compare-on-cpu", "--out", str(out)]) == 0      # the models themselves are fine
    res = json.loads(out.read_text())
    comp = res["meta"]["throughput_comparison"]
    crashed = comp["path/pathtune"]
    assert crashed["exit_code"] == 3 and "exited with code 3" in crashed["failed"], crashed
    assert "hard exit in path/pathtune" in crashed["stderr_tail"]
    assert "blocking_rerun" not in crashed                  # pathtune: no rerun
    for key in ("path_fox/pathtune", "path/fla"):           # after the crash: still measured
        assert comp[key]["tokens_per_s"] > 0, comp[key]
    faulted = comp["path_fox/fla"]
    assert faulted["failed"].startswith("RuntimeError: CUDA error: an illegal memory access")
    assert faulted["exit_code"] == 1
    assert "CUDA_LAUNCH_BLOCKING=None" in faulted["traceback"]
    assert faulted["blocking_rerun"]["env"] == "CUDA_LAUNCH_BLOCKING=1" and faulted["blocking_rerun"]["exit_code"] == 1
    tail = faulted["blocking_rerun_tail"]
    assert "CUDA_LAUNCH_BLOCKING=1" in tail and "Traceback" in tail and len(tail.splitlines()) <= 40
    assert "path/pathtune_over_fla" not in comp and "path_fox/pathtune_over_fla" not in comp
    assert "tokens_per_s_same_run" not in res["path"]
    assert res["path_fox"]["tokens_per_s_same_run"] == {"pathtune": comp["path_fox/pathtune"]["tokens_per_s"],
                                                        "fla": None}
    table = run.markdown_table(res)
    assert "failed: child process exited with code 3" in table
    assert all(line.startswith("|") or not line for line in table.splitlines()[-3:])   # one row per model


def test_issue_checks():
    from examples.flipflop.run import issue_checks

    def rec(id_e, id_n, sp_e, sp_n):
        return {"status": "ok", "id_error": id_e / id_n, "id_ci95": list(wilson_interval(id_e, id_n)),
                "sparse_error": sp_e / sp_n, "sparse_ci95": list(wilson_interval(sp_e, sp_n))}

    good = issue_checks({"path": rec(0, 400_000, 0, 1_000_000), "rope": rec(30_000, 400_000, 400_000, 1_000_000)})
    assert all(good.values()) and len(good) == 6
    bad = issue_checks({"path": rec(8_000, 400_000, 2_000, 1_000_000), "rope": rec(30_000, 400_000, 10_000, 1_000_000)})
    assert not bad["path_sparse_below_0.1pct"] and not bad["path_id_below_1pct_upper_bound"]
    assert not bad["path_sparse_10x_below_rope"]
    # too few reads: the point estimate passes, the bound does not resolve it
    few = issue_checks({"path": rec(0, 100, 0, 1000)})
    assert few["path_sparse_below_0.1pct"] and not few["path_sparse_below_0.1pct_upper_bound"]
    assert "path_sparse_10x_below_rope" not in few
