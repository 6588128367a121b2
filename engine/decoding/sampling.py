"""The sampled rows' decider: the token rules (engine/decoding/token_rules.py) on a float64 copy of each row's logits,
then
temperature, top-k and top-p, and one draw. Greedy rows are one argmax over the batch (engine/decoding/greedy.py).

Each request draws from its own seeded generator, exactly one number per sampled step, so a seeded request gives the
same output alone or inside any batch.
"""
from __future__ import annotations

import numpy as np

from seqserve.engine.decoding.rule import Rows
from seqserve.engine.decoding.rule_renormalize import log_softmax
from seqserve.engine.decoding.token_rules import TokenRules
from seqserve.engine.request import SamplingParams
from seqserve.engine.step.running import Running

__all__ = ["Sampler", "log_softmax", "sample_row"]


class Sampler:
    def __init__(self, rules: TokenRules, slots) -> None:
        self.rules, self.slots = rules, slots

    def choose(self, rec: Running, logits: np.ndarray, chosen: np.ndarray) -> None:
        """rec's row draws its token into chosen (hi,); logits (hi, V) are the step's, before the greedy rules."""
        s, slots, r = rec.slot, self.slots, rec.request
        chosen[s] = sample_row(logits[s], r.params, rec.rng, slots.ids[s, 1 : 1 + slots.length[s]], self.rules,
                               r.forced_bos)


def sample_row(logits: np.ndarray, p: SamplingParams, rng: np.random.Generator, generated: np.ndarray,
               rules: TokenRules, forced_bos: int | None = None) -> int:
    """One sampled row's token, drawn from rng (the row's own, seeded from p.seed); rules: the model's list;
    forced_bos: the row's own forced first token. logits (V,) are not changed."""
    x = logits.astype(np.float64)  # (V,) a copy; float64 keeps the cumulative sums exact enough to be reproducible
    rules.apply(x[None], Rows.single(p, generated, forced_bos))
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
