"""The capacity plot: throughput against p50/p99 latency, one point per concurrency (the knee sizes a fleet)."""
from __future__ import annotations

import math
from pathlib import Path

PANELS = (("generated_tokens_per_s", "generated tokens/s"), ("requests_per_s", "requests/s"))
LINES = (("p50_ms", "p50", "o-"), ("p99_ms", "p99", "s--"))


def plot_sweep(rows: list[dict], path: Path, title: str) -> None:
    """rows: the sweep table (users, throughputs, latencies in ms); writes a PNG."""
    from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend

    fig = Figure(figsize=(11, 4.5))
    axes = fig.subplots(1, 2, sharey=True)
    for ax, (x_key, x_label) in zip(axes, PANELS):
        x = [r[x_key] for r in rows]
        for key, label, style in LINES:
            ax.plot(x, [_num(r[key]) for r in rows], style, label=label)
        for r in rows:  # label each point with its concurrency, at the p99 curve where the knee shows first
            users = f"{r['users']} user{'s' if r['users'] != 1 else ''}"
            ax.annotate(users, (r[x_key], _num(r["p99_ms"])), textcoords="offset points", xytext=(4, 4), fontsize=8)
        ax.set_xlabel(x_label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("latency (ms)")
    axes[0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _num(value: float | None) -> float:
    return math.nan if value is None else value
