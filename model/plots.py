"""The training curve PNG written next to the checkpoint."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: no display on servers or CI
import matplotlib.pyplot as plt  # noqa: E402


def plot_curve(history: list[dict], evals: list[dict], path: Path, title: str) -> None:
    fig, ax_loss = plt.subplots(figsize=(8, 4.5))
    ax_loss.plot([h["step"] for h in history], [h["loss"] for h in history], color="tab:blue", lw=1, label="train loss")
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("loss (label-smoothed CE)", color="tab:blue")
    ax_acc = ax_loss.twinx()
    ax_acc.plot([e["step"] for e in evals], [100 * e["exact_match"] for e in evals], "o-", color="tab:green",
                label="valid exact match")
    ax_acc.set_ylabel("valid exact match (%)", color="tab:green")
    ax_acc.set_ylim(0, 100)
    ax_loss.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
