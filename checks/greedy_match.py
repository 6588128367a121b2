"""The engine's greedy tokens against PyTorch's, allowing a divergence only at a near-tie.

Two implementations whose logits agree within the tolerance can still pick different argmaxes where the reference's
two best logits are closer than that tolerance (a degenerate repetition of a random-weight model has many such
steps). A row matches when its tokens equal the reference's up to the end, or up to a step where the token the engine
chose has a reference logit within the tolerance of the reference's own choice; after that step the two continue from
different prefixes, so the row is compared no further. The margin of that step is reported.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RowMatch:
    identical: bool  # every token equal, the end included
    diverged_at: int | None  # index of the first differing token (None when identical or only the lengths differ)
    margin: float  # the reference's logit of its token minus its logit of the engine's token there (nan: none)
    limit: float  # the tolerance that margin is held to at that step
    finite: bool  # no NaN or +inf among the reference logits of the compared steps
    ok: bool


def match_row(got: list[int], want: list[int], logits: np.ndarray, atol: float, rtol: float) -> RowMatch:
    """got, want: the engine's and the reference's tokens (the end token included when a row produced it); logits:
    (len(want), V) the reference's logits at each of its steps, after the model's token rules (a banned or
    non-forced token is -inf there, so choosing it is never a tie)."""
    n = min(len(got), len(want))
    at = next((t for t in range(n) if got[t] != want[t]), None)
    compared = logits[: (n if at is None else at + 1)]
    finite = not bool(np.isnan(compared).any() or np.isposinf(compared).any())  # -inf is a rule's mask
    if at is None:  # one a prefix of the other: a length difference is no tie
        same = len(got) == len(want)
        return RowMatch(same, None, float("nan"), float("nan"), finite, same and finite)
    top = float(logits[at, want[at]])
    margin = top - float(logits[at, got[at]])
    limit = atol + rtol * abs(top)
    return RowMatch(False, at, margin, limit, finite, finite and bool(margin <= limit))  # NaN margin: not ok


def summarise(matches: list[RowMatch], max_new_tokens: int) -> tuple[str, bool]:
    """The table's value for a set of rows, and whether all of them matched."""
    same = sum(m.identical for m in matches)
    value = f"{same}/{len(matches)} sequences identical (up to {max_new_tokens} tokens)"
    ties = [m for m in matches if m.ok and not m.identical]
    if ties:
        widest = max(ties, key=lambda m: m.margin)
        value += (f", {len(ties)} diverge at a near-tie (widest margin {widest.margin:.2e} at token "
                  f"{widest.diverged_at}, limit {widest.limit:.2e})")
    bad = [m for m in matches if not m.ok]
    if bad:
        first = bad[0]
        if not first.finite:
            why = "non-finite reference logits"
        elif first.diverged_at is None:
            why = "lengths differ"
        else:
            why = f"token {first.diverged_at} differs, margin {first.margin:.2e} > limit {first.limit:.2e}"
        value += f", {len(bad)} differ ({why})"
    return value, not bad
