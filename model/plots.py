"""The training curve PNG written next to the checkpoint."""
from __future__ import annotations

import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: no display on servers or CI
import matplotlib.pyplot as plt  # noqa: E402

from seqserve.model.checkpoint import temporary  # noqa: E402


def plot_curve(history: list[dict], evals: list[dict], path: Path, title: str, best_step: int | None = None) -> None:
    """Train and validation loss (left axis), validation chrF, BLEU and exact match (right axis, 0-100), and a
    dashed line at the step whose weights are kept."""
    fig, ax_loss = plt.subplots(figsize=(8, 4.5))
    ax_loss.plot([h["step"] for h in history], [h["loss"] for h in history], color="tab:blue", lw=1, label="train loss")
    steps = [e["step"] for e in evals]
    if all("loss" in e for e in evals):  # evaluations of runs older than the validation loss lack it
        ax_loss.plot(steps, [e["loss"] for e in evals], "s--", color="tab:cyan", label="valid loss")
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("loss (train: label-smoothed CE; valid: CE)", color="tab:blue")
    ax_score = ax_loss.twinx()
    for key, label, color in (("chrf", "valid chrF", "tab:green"), ("bleu", "valid BLEU", "tab:olive"),
                              ("exact_match", "valid exact match (%)", "tab:red")):
        scale = 100 if key == "exact_match" else 1
        ax_score.plot(steps, [scale * e.get(key, float("nan")) for e in evals], "o-", color=color, label=label)
    ax_score.set_ylabel("valid chrF / BLEU / exact match %")
    ax_score.set_ylim(0, 100)
    if best_step is not None:
        ax_loss.axvline(best_step, color="gray", ls=":", lw=1, label=f"kept: step {best_step}")
    lines = ax_loss.get_legend_handles_labels()[0] + ax_score.get_legend_handles_labels()[0]
    ax_loss.legend(lines, [line.get_label() for line in lines], loc="center right", fontsize=8)
    ax_loss.set_title(title)
    fig.tight_layout()
    tmp = temporary(Path(path))
    fig.savefig(tmp, dpi=110, format="png")  # the format by name: the temporary name does not end in .png
    plt.close(fig)
    os.replace(tmp, path)
