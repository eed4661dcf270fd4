"""The two plots of ``pathtune plot``: overhead (pathtune / SDPA by a workload dimension) and tuning
history (time per trial with the best so far). matplotlib is imported here only ([plot] extra)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from ._errors import PerfDBError

__all__ = ["plot_overhead", "plot_history", "PLOT_SUFFIXES"]

PLOT_SUFFIXES = (".png", ".svg", ".pdf")
_DIMS = ("dtype", "use_gate", "heads_q", "heads_kv", "head_dim", "head_dim_v", "seq_len", "batch", "varlen", "tokens",
         "backend")


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise PerfDBError("pathtune plot needs matplotlib, which is not installed: pip install 'pathtune[plot]'") \
            from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _check_out(out: Path) -> Path:
    out = Path(out)
    if out.suffix.lower() not in PLOT_SUFFIXES:
        raise PerfDBError(f"plot file {out} must end in {', '.join(PLOT_SUFFIXES)}")
    if not out.parent.is_dir():
        raise PerfDBError(f"directory {out.parent} does not exist")
    return out


def _label(row: dict[str, Any], dims: Sequence[str]) -> str:
    names = {"use_gate": "gate", "heads_q": "HQ", "heads_kv": "H", "head_dim": "D", "head_dim_v": "DV",
             "seq_len": "T<=", "batch": "B<=", "varlen": "varlen", "tokens": "tokens<="}
    return " ".join(f"{names.get(d, '')}{row[d]}" if d not in ("dtype", "backend") else str(row[d]) for d in dims)


def _tied(rows: Sequence[dict[str, Any]], a: str, b: str) -> bool:
    """``b`` moves one-to-one with ``a`` over these rows (e.g. head_dim_v with head_dim): no own series."""
    pairs = {(r[a], r[b]) for r in rows}
    return len(pairs) == len({r[a] for r in rows}) == len({r[b] for r in rows})


def plot_overhead(rows: Sequence[dict[str, Any]], by: str, out: Path) -> Path:
    """One panel per (gpu, pass); x = ``by``; y = pathtune_ms / sdpa_ms; one line per other-dims combo."""
    out = _check_out(out)
    if not rows:
        raise PerfDBError("nothing to plot: no overhead rows match")
    plt = _pyplot()
    panels = sorted({(r["gpu"], r["pass"]) for r in rows})
    varying = [d for d in _DIMS if d != by and len({r[d] for r in rows}) > 1 and not _tied(rows, by, d)]
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 3.8 * len(panels)), squeeze=False)
    for ax, (gpu, pass_) in zip(axes[:, 0], panels):
        series: dict[tuple, list[tuple[Any, float]]] = {}
        for r in rows:
            if (r["gpu"], r["pass"]) == (gpu, pass_):
                key = tuple((str(type(r[d])), r[d]) for d in varying) + ((_label(r, varying) or "pathtune"),)
                series.setdefault(key, []).append((r[by], r["ratio"]))
        categorical = any(isinstance(x, (str, bool)) for pts in series.values() for x, _ in pts)
        xs = sorted({x for pts in series.values() for x, _ in pts}, key=lambda v: (str(type(v)), v))
        for key, pts in sorted(series.items()):
            label = key[-1]
            pts.sort(key=lambda p: xs.index(p[0]))
            x = [xs.index(p[0]) for p in pts] if categorical else [p[0] for p in pts]
            ax.plot(x, [p[1] for p in pts], marker="o", label=label)
        if categorical:
            ax.set_xticks(range(len(xs)), [str(x) for x in xs])
        elif all(isinstance(x, int) and x > 0 and not x & (x - 1) for x in xs):
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs, [str(x) for x in xs])
        ax.axhline(1.0, color="gray", linestyle="--", linewidth=1, label="SDPA (same run)")
        # a bwd key times forward + backward (against SDPA's forward + backward)
        what = "bwd (forward + backward)" if pass_ == "bwd" else pass_
        ax.set_title(f"{gpu}, {what}: pathtune / SDPA")
        ax.set_xlabel(by)
        ax.set_ylabel("time ratio (lower is better)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


def plot_history(rows: Sequence[dict[str, Any]], out: Path) -> Path:
    """Median time per trial (ok measurements, in recording order) and the best so far, one series per
    (study or run, gpu, backend, workload)."""
    out = _check_out(out)
    ok = [r for r in rows if r["status"] == "ok"]
    if not ok:
        raise PerfDBError("nothing to plot: no ok measurements match")
    plt = _pyplot()
    series: dict[tuple, list[dict[str, Any]]] = {}
    for r in ok:
        key = (r["study_name"] or r["run_id"], r["gpu"], r["backend"], r["workload_hash"])
        series.setdefault(key, []).append(r)
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for (study, gpu, backend, _), rs in sorted(series.items()):
        rs.sort(key=lambda r: (r["trial_number"] if r["trial_number"] is not None else -1, r["created_at"], r["id"]))
        x = [r["trial_number"] if r["trial_number"] is not None else i for i, r in enumerate(rs)]
        y = [r["median_ms"] for r in rs]
        best, running = [], float("inf")
        for v in y:
            running = min(running, v)
            best.append(running)
        w = rs[0]
        label = f"{study} {gpu} {backend} D{w['head_dim']} T<={w['seq_bucket']} {w['dtype']}"
        points = ax.scatter(x, y, s=10, alpha=0.5)
        ax.step(x, best, where="post", color=points.get_facecolor()[0], label=label)
    ax.set_xlabel("trial")
    ax.set_ylabel("median ms (dots) / best so far (line)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out
