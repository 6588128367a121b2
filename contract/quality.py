"""A precision variant's measured quality against fp32 (the manifest's variants.<name>.quality, written by
`seqserve export`), and the bar below which the server refuses to serve the variant."""
from __future__ import annotations

MIN_TOP1 = 0.99  # top-1 agreement with fp32's argmax over teacher-forced steps
MAX_EXACT_MATCH_DROP = 1.0  # points of exact match a variant may lose against fp32 before it is reported loudly


def below_bar(quality: dict) -> str | None:
    """Why a variant's recorded quality is below the bar (non-finite logits, or top-1 agreement under MIN_TOP1), or
    None when it is not (or was not measured)."""
    problems = []
    if quality.get("nan_free") is False:
        problems.append("produced NaN or infinite logits")
    top1 = quality.get("top1_agreement")
    if isinstance(top1, (int, float)) and top1 < MIN_TOP1:
        problems.append(f"top-1 agreement with fp32 is {top1:.2%} (limit {MIN_TOP1:.0%})")
    return "; ".join(problems) or None
