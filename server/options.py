"""A request's DecodingOptions -> a validated, frozen SamplingParams: every option's rule and range, in one place.

Pure: it reads the message's fields (whatever object carries them; only service.py imports the generated code) and
the server's Limits, and returns params or raises InvalidOption with a message naming the field. An option the
request leaves unset takes its value from `defaults`, the model's generation defaults (SamplingParams() when the
bundle has none; each inside its range, checked when the model was loaded); max_new_tokens unset takes
Limits.default_max_new_tokens, the server's setting. A message only names a field the request set.
"""
from __future__ import annotations

import dataclasses

from seqserve.contract.decoding import (
    REPETITION_PENALTY,
    TEMPERATURE,
    TOP_P,
    beam_problem,
    max_new_tokens_problem,
    num_beams_problem,
)
from seqserve.engine.limits import InvalidOption, Limits, check_stop
from seqserve.engine.request import SamplingParams

NO_DEFAULTS = SamplingParams()  # a bundle without generation defaults


_PRESENCE: dict[str, bool] = {}  # DecodingOptions' field name -> whether it has presence (read once per field)


def _given(o, name: str, default):
    """The request's value, or default when it left the field unset (no presence: the zero value means unset)."""
    value, presence = getattr(o, name), _PRESENCE.get(name)
    if presence is None:
        presence = _PRESENCE[name] = o.DESCRIPTOR.fields_by_name[name].has_presence
    if presence:
        return value if o.HasField(name) else default
    return value or default


def sampling_params(o, limits: Limits, defaults: SamplingParams = NO_DEFAULTS,
                    forced_eos: bool = False, seed: int | None = None) -> SamplingParams:
    """The validated options; seed: what a seed the request left unset becomes (None: the service draws one per input
    later). Each message is formatted only when its check fails: a valid request, the common case, pays for none.
    forced_eos: the model forces its end token at max_new_tokens, which wins over min_new_tokens (as in HF)."""
    cap = limits.max_new_tokens
    max_new = o.max_new_tokens if o.HasField("max_new_tokens") else limits.default_max_new_tokens
    if (problem := max_new_tokens_problem(max_new, cap)) is not None:
        raise InvalidOption(f"options.{problem}")
    min_new = _given(o, "min_new_tokens", min(defaults.min_new_tokens, max_new))  # a default never exceeds the cap
    if forced_eos:
        min_new = min(min_new, max_new - 1)
    if min_new > max_new:
        raise InvalidOption(f"options.min_new_tokens must be at most max_new_tokens ({max_new}), got {min_new}")
    beam_request = o.num_beams > 1  # no presence: 0 = unset
    if beam_request:  # beam search, as transformers' generate(num_beams=4): the model's sampling defaults stay out
        defaults = dataclasses.replace(defaults, temperature=0.0)
        if not (o.HasField("repetition_penalty") or defaults.repetition_penalty == 1):
            raise InvalidOption(f"options.num_beams must be 1 with this model's repetition_penalty "
                                f"({defaults.repetition_penalty:g}); set options.repetition_penalty to 1 for beam "
                                f"search, got num_beams {o.num_beams}")
    temperature = float(_given(o, "temperature", defaults.temperature))
    if temperature not in TEMPERATURE:
        raise InvalidOption(f"options.temperature must be finite and >= 0 (in {TEMPERATURE}), got {temperature:g}")
    top_k = _given(o, "top_k", defaults.top_k)
    if top_k < 0:
        raise InvalidOption(f"options.top_k must be >= 0 (0 = disabled), got {top_k}")
    top_p = float(_given(o, "top_p", defaults.top_p))
    if top_p not in TOP_P:
        raise InvalidOption(f"options.top_p must be in {TOP_P}, got {top_p:g}")
    penalty = float(_given(o, "repetition_penalty", defaults.repetition_penalty))
    if penalty not in REPETITION_PENALTY:
        raise InvalidOption(f"options.repetition_penalty must be finite and > 0 (in {REPETITION_PENALTY}), "
                            f"got {penalty:g}")
    stop = tuple(o.stop) or defaults.stop
    check_stop(stop, limits)
    plain = temperature == 0 and not stop and penalty == 1  # a request that samples or stops gets no default beams
    beams, most = _given(o, "num_beams", defaults.num_beams if plain else 1), limits.max_num_beams
    if (problem := num_beams_problem(beams, most)) is not None:
        raise InvalidOption(f"options.{problem}")
    n = _given(o, "num_return_sequences", min(defaults.num_return_sequences, beams))
    length_penalty = float(_given(o, "length_penalty", defaults.length_penalty))
    problem = beam_problem(beams, n, length_penalty)
    if problem is not None:
        raise InvalidOption(f"options.{problem}")
    top, most = o.top_logprobs, limits.max_top_logprobs
    if top > most:
        raise InvalidOption(f"options.top_logprobs must be in [0, {most}] (max_top_logprobs), got {top}")
    if top and not o.return_logprobs:
        raise InvalidOption("options.top_logprobs needs options.return_logprobs")
    problem = beam_problem(beams, n, length_penalty, temperature, penalty, stop)
    if problem is not None:
        raise InvalidOption(f"options.{problem}")
    return SamplingParams(  # every field named (dataclasses.replace costs several times more, on every call)
        max_new_tokens=max_new, min_new_tokens=min_new, temperature=temperature, top_k=top_k, top_p=top_p,
        repetition_penalty=penalty, stop=stop, seed=o.seed if o.HasField("seed") else seed, num_beams=beams,
        num_return_sequences=n, length_penalty=length_penalty,
        early_stopping=bool(_given(o, "early_stopping", defaults.early_stopping)),
        return_logprobs=o.return_logprobs, top_logprobs=top)
