"""Next-token choice for sampled rows: the token rules (engine/token_rules.py) on a float64 copy of the row's logits,
then temperature, top-k and top-p, and one draw. Greedy rows are one argmax over the batch (the engine's).

Each request draws from its own seeded generator, exactly one number per sampled step, so a seeded request gives the
same output alone or inside any batch.
"""
from __future__ import annotations

import numpy as np

from seqserve.engine.request import SamplingParams
from seqserve.engine.rule import Rows
from seqserve.engine.rule_min_new import MinNewTokens
from seqserve.engine.rule_renormalize import log_softmax
from seqserve.engine.token_rules import TokenRules

__all__ = ["choose", "log_softmax", "sample_row"]


def choose(logits: np.ndarray, per_row: dict[int, tuple[SamplingParams, np.random.Generator, np.ndarray]],
           eos_id: int, banned: np.ndarray, no_eos: np.ndarray | None = None) -> np.ndarray:
    """logits (B, V) float32 -> chosen ids (B,) int64, for tools and tests that hold no Slots. per_row maps a row to
    (its options, its generator, the ids it generated so far) for the rows that are not greedy; banned (K,) are the ids
    sampling never returns; no_eos (B,) bool marks greedy rows still short of min_new_tokens (masked in logits
    itself)."""
    if no_eos is not None and no_eos.any():
        MinNewTokens(eos_id).apply(logits, None, no_eos)
    chosen = logits.argmax(axis=-1)  # (B,) one vectorised argmax serves every greedy row
    for row, (params, rng, generated) in per_row.items():
        chosen[row] = sample_row(logits[row], params, rng, generated, eos_id, banned)
    return chosen.astype(np.int64)


def sample_row(logits: np.ndarray, p: SamplingParams, rng: np.random.Generator, generated: np.ndarray, eos_id: int,
               banned: np.ndarray, rules: TokenRules | None = None, forced_bos: int | None = None) -> int:
    """One sampled row's token, drawn from rng (the row's own, seeded from p.seed); rules: the model's list (None: the
    request-level rules, with `banned` never sampled); forced_bos: the row's own forced first token. logits (V,) are
    not changed."""
    x = logits.astype(np.float64)  # (V,) a copy; float64 keeps the cumulative sums exact enough to be reproducible
    (rules or TokenRules.for_request(eos_id, banned)).apply(x[None], Rows.single(p, generated, forced_bos))
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
    u = rng.random()  # one draw per step, whatever else is in the batch
    return int(min(np.searchsorted(np.cumsum(probs), u, side="right"), probs.size - 1))
