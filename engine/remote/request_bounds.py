"""The bounds every EngineRequest keeps, which an engine process checks again on each ADD
(engine/remote/engine_process.py):
the edge's checks (server/options.py, server/service.py) are not the engine's only guard, since anything that reaches
its socket could send it anything.

The ranges are the edge's own, defined once: the decoding ranges and beam rules of contract/decoding.py, the stop
limits of server/options.py, the Limits the server resolved for the model (server/settings.py), and the model's
vocabulary. A problem comes back as a message that names the field, as the edge's do.
"""
from __future__ import annotations

import math

from seqserve.contract.decoding import REPETITION_PENALTY, TEMPERATURE, TOP_P, beam_problem, lengths_problem
from seqserve.engine.api import EngineRequest
from seqserve.engine.limits import InvalidOption, Limits, check_stop
from seqserve.engine.request import SamplingParams

SEED_END = 2**64  # the proto's seed is a uint64


def request_problem(r: EngineRequest, limits: Limits, vocab_size: int) -> str | None:
    """The first bound the request breaks, or None."""
    ids, most = r.input_ids, limits.max_input_tokens
    if not 1 <= len(ids) <= most:
        return f"input has {len(ids)} tokens, outside [1, max_input_tokens={most}]"
    if not 0 <= min(ids) <= max(ids) < vocab_size:
        return f"input ids must be in [0, {vocab_size}) (the vocabulary), got {min(ids)}..{max(ids)}"
    if r.forced_bos is not None and not 0 <= r.forced_bos < vocab_size:
        return f"forced_bos must be in [0, {vocab_size}) (the vocabulary), got {r.forced_bos}"
    if not all(t is None or math.isfinite(t) for t in (r.deadline, r.arrival)):
        return f"deadline and arrival must be finite, got {r.deadline} and {r.arrival}"
    problem = params_problem(r.params, limits)
    return None if problem is None else f"options.{problem}"


def params_problem(p: SamplingParams, limits: Limits) -> str | None:
    """The first option outside its range (named without the `options.` prefix), or None."""
    if not 1 <= p.max_new_tokens <= limits.max_new_tokens:
        return f"max_new_tokens must be in [1, {limits.max_new_tokens}], got {p.max_new_tokens}"
    for name, value, rng in (("temperature", p.temperature, TEMPERATURE), ("top_p", p.top_p, TOP_P),
                             ("repetition_penalty", p.repetition_penalty, REPETITION_PENALTY)):
        if value not in rng:
            return f"{name} must be in {rng}, got {value:g}"
    if p.top_k < 0:
        return f"top_k must be >= 0 (0 = disabled), got {p.top_k}"
    if p.seed is None or not 0 <= p.seed < SEED_END:
        return f"seed must be in [0, 2**64), got {p.seed}"
    if not 1 <= p.num_beams <= limits.max_num_beams:
        return f"num_beams must be in [1, {limits.max_num_beams}] (max_num_beams), got {p.num_beams}"
    if not 0 <= p.top_logprobs <= limits.max_top_logprobs:
        return f"top_logprobs must be in [0, {limits.max_top_logprobs}] (max_top_logprobs), got {p.top_logprobs}"
    if p.top_logprobs and not p.return_logprobs:
        return "top_logprobs needs return_logprobs"
    try:
        check_stop(p.stop, limits)
    except InvalidOption as e:
        return str(e).removeprefix("options.")
    return lengths_problem(p.max_new_tokens, p.min_new_tokens) or beam_problem(
        p.num_beams, p.num_return_sequences, p.length_penalty, p.temperature, p.repetition_penalty, p.stop)
