"""Next-token choice for a batch: greedy for every row in one argmax, then temperature, top-k, top-p, repetition
penalty and min_new_tokens for the rows that ask for them.

Each request draws from its own seeded generator, exactly one number per sampled step, so a seeded request gives the
same output alone or inside any batch. Sampled rows never return <pad>, <s> or <unk>: those ids are masked first.
"""
from __future__ import annotations

import numpy as np

from seqserve.server.request import Request


def choose(logits: np.ndarray, per_row: dict[int, tuple[Request, np.ndarray]], eos_id: int,
           banned: np.ndarray, no_eos: np.ndarray | None = None) -> np.ndarray:
    """logits (B, V) float32 -> chosen ids (B,) int64. per_row maps a row to (its request, the ids it generated so
    far) for the rows that are not greedy; banned (K,) are the ids sampling never returns; no_eos (B,) bool marks
    greedy rows still short of min_new_tokens: their end token is masked in logits itself (take log-probabilities
    before calling this)."""
    if no_eos is not None and no_eos.any():
        logits[no_eos, eos_id] = -np.inf
    chosen = logits.argmax(axis=-1)  # (B,) one vectorised argmax serves every greedy row
    for row, (request, generated) in per_row.items():
        chosen[row] = sample_row(logits[row], request, generated, eos_id, banned)
    return chosen.astype(np.int64)


def sample_row(logits: np.ndarray, request: Request, generated: np.ndarray, eos_id: int, banned: np.ndarray) -> int:
    p = request.params
    x = logits.astype(np.float64)  # (V,) a copy; float64 keeps the cumulative sums exact enough to be reproducible
    x[banned] = -np.inf
    if p.repetition_penalty != 1.0 and generated.size:
        seen = np.unique(generated)
        x[seen] = np.where(x[seen] > 0, x[seen] / p.repetition_penalty, x[seen] * p.repetition_penalty)  # CTRL, 4.1
    if generated.size < p.min_new_tokens:
        x[eos_id] = -np.inf
    if p.temperature == 0.0:
        return int(x.argmax())
    x = x / p.temperature
    if 0 < p.top_k < x.size:
        kth = np.partition(x, -p.top_k)[-p.top_k]
        x[x < kth] = -np.inf
    probs = np.exp(x - x.max())
    probs /= probs.sum()
    if p.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        cumulative = np.cumsum(probs[order])
        keep = order[: int(np.searchsorted(cumulative, p.top_p)) + 1]  # the smallest set reaching top_p
        kept = np.zeros_like(probs)
        kept[keep] = probs[keep]
        probs = kept / kept.sum()
    if request.rng is None:
        request.rng = np.random.default_rng(p.seed)
    u = request.rng.random()  # one draw per step, whatever else is in the batch
    return int(min(np.searchsorted(np.cumsum(probs), u, side="right"), probs.size - 1))


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """(..., V) float32 -> log-probabilities in float64 (numerically stable)."""
    x = logits.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))
