"""The decoding options' ranges and the beam rules, defined once: the server's validation (server/options.py) and the
PyTorch reference's checks (model/beam.py's BeamOptions) both ask here. Only the rules are shared; the searches stay
separate, so the reference remains an independent oracle.

A problem is returned as a message that names the option (without a prefix: the server adds `options.`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Range:
    """A closed range [lo, hi], or (lo, hi] when lo_open: every float option has one, not only finiteness."""

    lo: float
    hi: float
    lo_open: bool = False

    def __contains__(self, value: float) -> bool:
        above = value > self.lo if self.lo_open else value >= self.lo
        return math.isfinite(value) and above and value <= self.hi

    def __str__(self) -> str:
        return f"{'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}]"


# Why these bounds: n ** length_penalty stays finite (and non-zero) for every n a request can reach (n <= 2**16), so
# a score never overflows; CTranslate2 and Hugging Face users pass 0..2. Temperature and repetition penalty beyond
# 100 only sharpen or flatten a distribution that is already one-hot or uniform in float64.
TEMPERATURE = Range(0.0, 100.0)
TOP_P = Range(0.0, 1.0, lo_open=True)
REPETITION_PENALTY = Range(0.0, 100.0, lo_open=True)
LENGTH_PENALTY = Range(-10.0, 10.0)
FLOAT_RANGES = {"temperature": TEMPERATURE, "top_p": TOP_P, "repetition_penalty": REPETITION_PENALTY,
                "length_penalty": LENGTH_PENALTY}


# The widest beam search any server grants (--max-num-beams stops here): each beam is a row of the decoder's batch.
MAX_NUM_BEAMS = 1024


def max_new_tokens_problem(max_new_tokens: int, cap: int) -> str | None:
    """A request's max_new_tokens, or a model's default for it, against the longest generation allowed (cap: the
    server's limit for a request; the bundle's max_new_tokens, the most any server allows, for a default)."""
    if not 1 <= max_new_tokens <= cap:
        return f"max_new_tokens must be in [1, {cap}], got {max_new_tokens}"
    return None


def num_beams_problem(num_beams: int, most: int = MAX_NUM_BEAMS) -> str | None:
    """A request's num_beams against the server's max_num_beams, or a model's default against MAX_NUM_BEAMS."""
    if not 1 <= num_beams <= most:
        return f"num_beams must be in [1, {most}] (max_num_beams), got {num_beams}"
    return None


def lengths_problem(max_new_tokens: int, min_new_tokens: int) -> str | None:
    if max_new_tokens < 1:
        return f"max_new_tokens must be >= 1, got {max_new_tokens}"
    if not 0 <= min_new_tokens <= max_new_tokens:
        return f"min_new_tokens must be at most max_new_tokens ({max_new_tokens}), got {min_new_tokens}"
    return None


def beam_problem(num_beams: int, num_return_sequences: int, length_penalty: float, temperature: float = 0.0,
                 repetition_penalty: float = 1.0, stop: tuple[str, ...] = ()) -> str | None:
    """The first broken beam rule, or None. Beam search is deterministic and defined as model/beam.py defines it."""
    if num_beams < 1:
        return f"num_beams must be >= 1, got {num_beams}"
    if not 1 <= num_return_sequences <= num_beams:
        return f"num_return_sequences must be in [1, num_beams={num_beams}], got {num_return_sequences}"
    if length_penalty not in LENGTH_PENALTY:
        return f"length_penalty must be finite and in {LENGTH_PENALTY}, got {length_penalty:g}"
    if num_beams > 1:
        if temperature != 0:
            return f"temperature must be 0 with num_beams > 1 (beam search is deterministic), got {temperature:g}"
        if stop:
            return "stop is not supported with num_beams > 1"
        if repetition_penalty != 1:
            return f"repetition_penalty must be 1 with num_beams > 1, got {repetition_penalty:g}"
    return None
