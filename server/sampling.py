"""Next-token choice for a batch: greedy, temperature, top-k, top-p, repetition penalty, min_new_tokens.

Each request draws from its own seeded generator, exactly one number per sampled step, so a seeded
request gives the same output alone or inside any batch.
"""
from __future__ import annotations

import numpy as np

from seqserve.server.request import Request


def next_tokens(logits: np.ndarray, requests: list[Request], eos_id: int) -> np.ndarray:
    """logits (B, V) float32 in the order of requests -> chosen ids (B,) int64."""
    chosen = logits.argmax(axis=-1)  # (B,) one vectorised argmax serves every greedy row
    for row, request in enumerate(requests):
        if not request.params.greedy:
            chosen[row] = sample_row(logits[row], request, eos_id)
    return chosen.astype(np.int64)


def sample_row(logits: np.ndarray, request: Request, eos_id: int) -> int:
    p = request.params
    x = logits.astype(np.float64)  # (V,) a copy; float64 keeps the cumulative sums exact enough to be reproducible
    if p.repetition_penalty != 1.0 and request.output_ids:
        seen = np.unique(np.asarray(request.output_ids))
        x[seen] = np.where(x[seen] > 0, x[seen] / p.repetition_penalty, x[seen] * p.repetition_penalty)  # CTRL, 4.1
    if len(request.output_ids) < p.min_new_tokens:
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
