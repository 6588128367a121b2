"""The capacity plot: throughput against p50/p99 latency, one point per concurrency (the knee sizes a fleet)."""
from __future__ import annotations

import math
from pathlib import Path

PANELS = (("generated_tokens_per_s", "generated tokens/s"), ("requests_per_s", "requests/s"))
LINES = (("p50_ms", "p50", "o-"), ("p99_ms", "p99", "s--"))
DPI = 120


def plot_sweep(rows: list[dict], path: Path, title: str) -> None:
    """rows: the sweep table (users, throughputs, latencies in ms); writes a PNG."""
    sweep_figure(rows, title).savefig(path, dpi=DPI)


def sweep_figure(rows: list[dict], title: str):
    """The plot as a matplotlib Figure; every point's label stays inside its panel, and the legend below both panels
    covers neither a point nor a label."""
    from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend

    fig = Figure(figsize=(11, 4.8), dpi=DPI, layout="constrained")  # constrained: room for the legend outside
    axes = fig.subplots(1, 2, sharey=True)
    for ax, (x_key, x_label) in zip(axes, PANELS):
        x = [r[x_key] for r in rows]
        for key, label, style in LINES:
            ax.plot(x, [_num(r[key]) for r in rows], style, label=label)
        ax.set_xlabel(x_label)
        ax.grid(alpha=0.3)
    for ax, (x_key, _) in zip(axes, PANELS):  # after both panels are drawn: the shared y-range is final
        (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
        for r in rows:  # label each point with its concurrency, at the p99 curve where the knee shows first
            users = f"{r['users']} user{'s' if r['users'] != 1 else ''}"
            x, y = r[x_key], _num(r["p99_ms"])
            right = x1 > x0 and (x - x0) / (x1 - x0) > 0.5  # right half: the label goes left of the point
            high = y1 > y0 and (y - y0) / (y1 - y0) > 0.85  # near the top: beside the point, not above it
            ax.annotate(users, (x, y), textcoords="offset points", fontsize=8,
                        xytext=(-6 if right else 6, 0 if high else 4), ha="right" if right else "left",
                        va="center" if high else "bottom")
    axes[0].set_ylabel("latency (ms)")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncol=len(LINES))  # never on a point
    fig.suptitle(title)
    return fig


def _num(value: float | None) -> float:
    return math.nan if value is None else value
