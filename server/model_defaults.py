"""A model's own decoding defaults (the manifest's "generation", from its generation_config.json) as the defaults of
requests that leave an option unset: num_beams, max_new_tokens (max_length - 1: HF counts the decoder start token),
min_new_tokens (min_length - 1), length_penalty, early_stopping. The token rules (bad words, forced BOS/EOS) are
server/constraints.py's; they hold for every request."""
from __future__ import annotations

from dataclasses import replace

from seqserve.server.request import SamplingParams


def default_max_new_tokens(generation: dict) -> int | None:
    """max_new_tokens of a request that leaves it unset, as the model says (None: the server's own default)."""
    return generation["max_length"] - 1 if generation.get("max_length", 0) > 1 else None


def request_defaults(generation: dict, max_new_tokens: int, max_num_beams: int) -> SamplingParams:
    """The values unset request fields take (a model default beyond a server limit is clipped to it)."""
    defaults = SamplingParams(max_new_tokens=max_new_tokens)
    if not generation:
        return defaults
    return replace(defaults, num_beams=min(int(generation.get("num_beams", 1)), max_num_beams),
                   min_new_tokens=min(max(int(generation.get("min_length", 0)) - 1, 0), max_new_tokens),
                   length_penalty=float(generation.get("length_penalty", 1.0)),
                   early_stopping=bool(generation.get("early_stopping", False)))


def info_entries(generation: dict) -> dict[str, str]:
    """GetModelInfo's config entries for the model's generation defaults, named generation.<field>."""
    return {f"generation.{k}": str(v) for k, v in sorted(generation.items())}
