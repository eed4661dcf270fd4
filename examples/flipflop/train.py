"""Training, evaluation and the same-run throughput measurement for the flip-flop models.

``python -m examples.flipflop.train SPEC.json`` is the child process of one tokens/s measurement
(``measure_throughput_in_child``): a CUDA fault in one kernel (e.g. an illegal memory access, which
poisons the process's CUDA context) then fails only that measurement.
"""
from __future__ import annotations

import copy
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Dict, Optional

import torch
import torch.nn.functional as F

from .data import SPLITS, Split, batches, loss_targets
from .metrics import read_errors, wilson_interval
from .model import FlipFlopLM, attention_kernel

Callback = Optional[Callable[[int, str], None]]   # (units done so far, status text)


@dataclass
class TrainConfig:
    """Optimiser and schedule.  Defaults: see README (AdamW, linear warmup, cosine to 10%)."""

    steps: int = 4000
    batch: int = 256
    seq_len: int = 512
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup: int = 200
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.98
    grad_clip: float = 1.0
    log_every: int = 50
    amp: bool = True            # bf16 autocast on CUDA (w, beta, g stay float32 inside the layer)
    steady_after: int = 10      # steps excluded from tokens/s (kernel compilation, allocator warm-up)

    def to_dict(self) -> dict:
        return asdict(self)


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Multiplier of cfg.lr at optimiser step ``step`` (0-based)."""
    if step < cfg.warmup:
        return (step + 1) / cfg.warmup
    span = max(1, cfg.steps - cfg.warmup)
    t = min(1.0, (step - cfg.warmup) / span)
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t))


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    fused = all(p.is_cuda for p in model.parameters())
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=fused or None)


def _autocast(device: torch.device, enabled: bool):
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=enabled and device.type == "cuda")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _loss(model: FlipFlopLM, tokens: torch.Tensor, amp: bool):
    with _autocast(tokens.device, amp):
        logits = model(tokens)
    tgt = loss_targets(tokens)
    loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tgt.reshape(-1), ignore_index=-100)
    return loss, logits


def train_model(model: FlipFlopLM, cfg: TrainConfig, *, seed: int, device: torch.device,
                time_limit_s: float, on_step: Callback = None, split: Split = SPLITS["train"]) -> dict:
    """Train on FFL(0.8) for ``cfg.steps`` steps or until ``time_limit_s``; returns stats and curves.

    Loss: next-token cross-entropy on the read targets only (the only predictable tokens; our choice).
    """
    split = replace(split, seq_len=cfg.seq_len)
    opt = make_optimizer(model, cfg)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, cfg))
    data = batches(split, cfg.batch, seed, device)
    curve: Dict[str, list] = {"step": [], "loss": [], "read_error": [], "seconds": [], "lr": []}
    model.train()
    t0 = time.perf_counter()
    t_steady = None
    loss_acc = torch.zeros((), device=device)
    err_acc = torch.zeros((), device=device)
    read_acc = torch.zeros((), device=device)
    n_acc = 0
    step = 0
    stop_reason = "steps"
    while step < cfg.steps:
        tokens = next(data)
        loss, logits = _loss(model, tokens, cfg.amp)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        sched.step()
        step += 1
        with torch.no_grad():
            e, n = read_errors(logits, tokens)
            loss_acc += loss.detach()
            err_acc += e
            read_acc += n
            n_acc += 1
        if step == cfg.steady_after:
            _sync(device)
            t_steady = time.perf_counter()
        if step % cfg.log_every == 0 or step == cfg.steps:
            lval = (loss_acc / n_acc).item()          # synchronises
            rerr = (err_acc / read_acc.clamp(min=1)).item()
            el = time.perf_counter() - t0
            curve["step"].append(step)
            curve["loss"].append(lval)
            curve["read_error"].append(rerr)
            curve["seconds"].append(round(el, 3))
            curve["lr"].append(sched.get_last_lr()[0])
            loss_acc.zero_(); err_acc.zero_(); read_acc.zero_(); n_acc = 0
            if on_step:
                on_step(step, f"loss {lval:.4f} read-err {rerr:.2e}")
            if not math.isfinite(lval):
                stop_reason = "diverged (non-finite loss)"
                break
        if time.perf_counter() - t0 > time_limit_s:
            stop_reason = f"time limit {time_limit_s:.0f}s"
            break
    _sync(device)
    t1 = time.perf_counter()
    steady_steps = step - cfg.steady_after if t_steady is not None else step
    steady_time = (t1 - t_steady) if t_steady is not None else (t1 - t0)
    tokens_per_s = steady_steps * cfg.batch * cfg.seq_len / steady_time if steady_time > 0 and steady_steps > 0 else None
    return {
        "train_steps": step,
        "train_seconds": round(t1 - t0, 3),
        "tokens_per_s": tokens_per_s,
        "train_tokens": step * cfg.batch * cfg.seq_len,
        "stop_reason": stop_reason,
        "curve": curve,
    }


@torch.no_grad()
def evaluate(model: FlipFlopLM, split: Split, *, n_sequences: int, batch: int, seed: int, device: torch.device,
             time_limit_s: float, amp: bool = True, on_batch: Callback = None) -> dict:
    """Exact read-position error count of ``model`` on ``n_sequences`` of ``split`` (fewer if the time
    limit hits; the count actually evaluated is reported) and its 95% Wilson interval."""
    model.eval()
    t0 = time.perf_counter()
    errors = torch.zeros((), dtype=torch.int64, device=device)
    reads = torch.zeros((), dtype=torch.int64, device=device)
    done = 0
    truncated = False
    for tokens in batches(split, batch, seed, device, n_sequences=n_sequences):
        with _autocast(device, amp):
            logits = model(tokens)
        e, n = read_errors(logits, tokens)
        errors += e
        reads += n
        done += tokens.shape[0]
        if on_batch:
            on_batch(done, "")
        if time.perf_counter() - t0 > time_limit_s and done < n_sequences:
            truncated = True
            break
    e, n = int(errors.item()), int(reads.item())
    lo, hi = wilson_interval(e, n)
    model.train()
    return {
        "errors": e,
        "reads": n,
        "sequences": done,
        "error": e / n if n else None,
        "ci95": [lo, hi],
        "seconds": round(time.perf_counter() - t0, 3),
        "truncated_by_time": truncated,
        "p_ignore": split.p_ignore,
    }


def measure_throughput(model: FlipFlopLM, cfg: TrainConfig, *, kernel: str, seed: int, device: torch.device,
                       steps: int = 30, warmup: int = 5) -> dict:
    """Training tokens/s of a copy of ``model`` (fwd + bwd + AdamW step) with the given PaTH kernel.

    Same batch, data and optimiser as training; ``warmup`` untimed steps first (compilation,
    autotuning), then ``steps`` timed steps between two synchronisations.
    """
    m = copy.deepcopy(model).to(device)
    m.train()
    c = replace(cfg, steps=warmup + steps)
    opt = make_optimizer(m, c)
    data = batches(replace(SPLITS["train"], seq_len=c.seq_len), c.batch, seed, device)
    with attention_kernel(m, kernel):
        t_start = time.perf_counter()
        for i in range(warmup + steps):
            if i == warmup:
                _sync(device)
                t0 = time.perf_counter()
            tokens = next(data)
            loss, _ = _loss(m, tokens, c.amp)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if c.grad_clip:
                torch.nn.utils.clip_grad_norm_(m.parameters(), c.grad_clip)
            opt.step()
        _sync(device)
        t1 = time.perf_counter()
    dt = t1 - t0
    return {"kernel": kernel, "tokens_per_s": steps * c.batch * c.seq_len / dt, "ms_per_step": 1e3 * dt / steps,
            "timed_steps": steps, "warmup_steps": warmup, "warmup_seconds": round(t0 - t_start, 3),
            "final_loss": float(loss.item())}


# ------------------------------------------------------------------- tokens/s in a child process

ROOT = Path(__file__).resolve().parents[2]
# tests only: "path/fla=cuda,path/pathtune=exit" makes those children fail (exit: os._exit(3);
# raise: a RuntimeError; cuda: a RuntimeError worded like a CUDA fault, which triggers the rerun)
FAULT_ENV = "FLIPFLOP_BENCH_FAULT"
CUDA_FAULT = re.compile(r"CUDA error|cudaError|CUDA_ERROR|illegal memory access|illegal instruction|"
                        r"misaligned address|device-side assert|Triton Error \[CUDA\]")
TAIL_LINES = 40


def tail_lines(text: str, n: int = TAIL_LINES) -> str:
    return "\n".join(text.rstrip().splitlines()[-n:])


def is_cuda_fault(record: dict, stderr: str = "") -> bool:
    """Whether a failed measurement looks like a CUDA fault (message, traceback, stderr or a signal)."""
    if "failed" not in record:
        return False
    if record.get("signal") in ("SIGSEGV", "SIGABRT", "SIGBUS", "SIGILL"):
        return True
    return bool(CUDA_FAULT.search(" ".join((record["failed"], record.get("traceback", ""), stderr))))


def measure_throughput_in_child(state: dict[str, torch.Tensor], attention: str, cfg: TrainConfig, *,
                                kernel: str, seed: int, device: torch.device, steps: int = 30,
                                warmup: int = 5, backend: str = "auto", timeout_s: float,
                                env: Optional[dict[str, str]] = None) -> tuple[dict, str]:
    """``measure_throughput`` of ``FlipFlopLM(attention, backend=backend)`` loaded with ``state``, in a
    fresh Python process (same interpreter, working directory and environment, plus ``env``).

    Returns ``(record, stderr)``: the dict ``measure_throughput`` returns, or on failure
    ``{"failed": ..., "exit_code": ...}`` with the child's traceback (an exception it caught) or the
    tail of its stderr (a hard crash: exit code / signal) or the timeout.
    """
    with tempfile.TemporaryDirectory(prefix="flipflop_tokens_s_") as tmp:
        tmp_p = Path(tmp)
        torch.save({k: v.detach().cpu() for k, v in state.items()}, tmp_p / "state.pt")
        spec = {"attention": attention, "kernel": kernel, "backend": backend, "cfg": cfg.to_dict(),
                "seed": seed, "device": str(device), "steps": steps, "warmup": warmup,
                "state": str(tmp_p / "state.pt"), "out": str(tmp_p / "result.json"),
                "threads": torch.get_num_threads(), "matmul_precision": torch.get_float32_matmul_precision()}
        (tmp_p / "spec.json").write_text(json.dumps(spec))
        child_env = dict(os.environ)
        child_env["PYTHONPATH"] = os.pathsep.join(   # `examples` importable; after what the parent had
            [p for p in (child_env.get("PYTHONPATH"), str(ROOT)) if p])
        child_env.update(env or {})
        cmd = [sys.executable, "-m", "examples.flipflop.train", str(tmp_p / "spec.json")]
        t0 = time.perf_counter()
        rc: Optional[int] = None
        try:
            proc = subprocess.run(cmd, env=child_env, capture_output=True, text=True, timeout=timeout_s,
                                  check=False)
            rc, err, out_text = proc.returncode, proc.stderr or "", proc.stdout or ""
        except subprocess.TimeoutExpired as exc:
            err, out_text = (x.decode(errors="replace") if isinstance(x, bytes) else (x or "")
                             for x in (exc.stderr, exc.stdout))
        seconds = round(time.perf_counter() - t0, 2)
        result = tmp_p / "result.json"
        rec = json.loads(result.read_text()) if result.exists() else None
    if rec is not None and "failed" not in rec:     # measured (whatever the exit did after)
        return rec, err
    if rec is None:
        if rc is None:
            rec = {"failed": f"timed out after {timeout_s:.0f}s (child killed)", "timeout_s": round(timeout_s, 1)}
        elif rc < 0:   # a signal: a segfault or an abort in native code
            try:
                name = signal.Signals(-rc).name
            except ValueError:
                name = f"signal {-rc}"
            rec = {"failed": f"child process killed by {name}", "signal": name}
        else:
            rec = {"failed": f"child process exited with code {rc} without a result"}
        rec["stderr_tail"] = tail_lines(err or out_text)
    rec["exit_code"] = rc
    rec["child_seconds"] = seconds
    return rec, err


def _inject_fault(key: str) -> None:
    for item in os.environ.get(FAULT_ENV, "").split(","):
        target, _, mode = item.partition("=")
        if target.strip() != key:
            continue
        mode = mode.strip()
        if mode == "exit":
            print(f"{FAULT_ENV}: hard exit in {key}", file=sys.stderr, flush=True)
            os._exit(3)
        if mode == "raise":
            raise RuntimeError(f"{FAULT_ENV}: injected failure in {key}")
        if mode == "cuda":
            raise RuntimeError(f"CUDA error: an illegal memory access was encountered ({FAULT_ENV}: injected in "
                               f"{key}; CUDA_LAUNCH_BLOCKING={os.environ.get('CUDA_LAUNCH_BLOCKING')})")


def _child_main(argv: list) -> int:
    """Child process: one tokens/s measurement from a spec file; writes its record next to it."""
    spec = json.loads(Path(argv[0]).read_text())
    out = Path(spec["out"])
    try:
        torch.set_float32_matmul_precision(spec["matmul_precision"])
        torch.set_num_threads(spec["threads"])
        _inject_fault(f"{spec['attention']}/{spec['kernel']}")
        torch.manual_seed(spec["seed"])
        model = FlipFlopLM(spec["attention"], backend=spec["backend"])
        model.load_state_dict(torch.load(spec["state"], map_location="cpu"))
        rec = measure_throughput(model, TrainConfig(**spec["cfg"]), kernel=spec["kernel"], seed=spec["seed"],
                                 device=torch.device(spec["device"]), steps=spec["steps"], warmup=spec["warmup"])
    except Exception as exc:
        traceback.print_exc()
        rec = {"failed": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
    out.write_text(json.dumps(rec))
    return 1 if "failed" in rec else 0


if __name__ == "__main__":
    _code = _child_main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_code)    # no interpreter teardown: after a CUDA fault it can abort or hang
