"""A model's decoding defaults, read from Hugging Face's generation_config.json (json and dataclasses only).

`seqserve import` reads them with `from_generation_config`, the manifest records `to_dict()`, the server reads them
back with `from_dict` and serves them as the model's defaults, each overridable per request.

Decisions (what a transformers user expects from `model.generate(**inputs)` with no arguments):
  * max_length counts the decoder start token, as in transformers: max_new_tokens = max_length - 1 (an explicit
    max_new_tokens wins). Absent both, transformers' generate() adds the start token to its default max_length 20,
    so 20 tokens are generated (fewer only when max_position_embeddings is smaller). min_length counts it too.
  * Every token id must lie inside the model's vocabulary, and every option inside the range a request's own value
    must lie in (contract/decoding.py): a default no request could set is refused when the model is loaded.
  * bad_words_ids may ban single tokens only (a logits mask); a multi-token sequence is refused.
  * renormalize_logits: the log-probabilities are renormalised after masking (bad words, min length, forced tokens),
    which changes beam scores; it is recorded so the engine can honour it.
  * An option that changes the output and that seqserve does not implement (no_repeat_ngram_size, diverse beam
    groups, suppress_tokens, ...) is refused when set to anything but transformers' default, naming the field;
    an unknown field is refused too. Options with no effect on the tokens (output_scores, use_cache, ...) are ignored.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from seqserve.contract.decoding import (
    FLOAT_RANGES, beam_problem, lengths_problem, max_new_tokens_problem, num_beams_problem)
from seqserve.contract.jsonfile import confined, read_object

GENERATION_CONFIG = "generation_config.json"
# transformers' default max_length (20) when neither it nor max_new_tokens is set: generate() adds the decoder start
# token to it (generation/utils.py _prepare_generated_length), so it counts new tokens only
HF_DEFAULT_MAX_NEW_TOKENS = 20
# Token-id fields that transformers also reads from config.json when generation_config.json leaves them out.
ID_FIELDS = ("decoder_start_token_id", "eos_token_id", "pad_token_id", "bos_token_id", "forced_bos_token_id",
             "forced_eos_token_id")
# Fields that do not change the generated tokens (outputs, caching, compilation, bookkeeping).
IGNORED = frozenset({
    "transformers_version", "_from_model_config", "use_cache", "output_attentions", "output_hidden_states",
    "output_scores", "output_logits", "return_dict_in_generate", "return_legacy_cache", "cache_implementation",
    "cache_config", "compile_config", "disable_compile", "remove_invalid_values", "is_assistant",
    "num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold",
    "prompt_lookup_num_tokens", "max_matching_ngram_size", "assistant_early_exit", "assistant_lookbehind",
    "target_lookbehind", "trust_remote_code", "decoder_start_token_ids", "low_memory",
})
# Options that change the tokens and that seqserve does not implement: refused unless at transformers' default.
UNSUPPORTED = {
    "no_repeat_ngram_size": 0, "encoder_no_repeat_ngram_size": 0, "num_beam_groups": 1, "diversity_penalty": 0.0,
    "penalty_alpha": None, "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "min_p": None,
    "encoder_repetition_penalty": 1.0, "suppress_tokens": None, "begin_suppress_tokens": None,
    "forced_decoder_ids": None, "sequence_bias": None, "constraints": None, "force_words_ids": None,
    "exponential_decay_length_penalty": None, "guidance_scale": None, "max_time": None, "stop_strings": None,
    "token_healing": False, "dola_layers": None, "watermarking_config": None, "top_h": None,
}


class GenerationConfigError(ValueError):
    """generation_config.json asks for something seqserve cannot honour: the message names the field (`field`, when
    the message starts with it, so the manifest can call it generation.<field>)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class GenerationDefaults:
    decoder_start_token_id: int
    eos_token_id: int
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    max_new_tokens: int = HF_DEFAULT_MAX_NEW_TOKENS
    min_new_tokens: int = 0  # the end token is suppressed until this many tokens were generated
    num_beams: int = 1
    num_return_sequences: int = 1
    length_penalty: float = 1.0  # score = cumulative_logprob / n ** length_penalty (beams)
    early_stopping: bool = False
    bad_words_ids: tuple[int, ...] = ()  # never generated (single-token bans)
    forced_bos_token_id: int | None = None  # the first generated token
    forced_eos_token_id: int | None = None  # the token generated at max_new_tokens when nothing ended before
    renormalize_logits: bool = False
    repetition_penalty: float = 1.0
    do_sample: bool = False
    temperature: float = 1.0  # used only with do_sample
    top_k: int = 50  # used only with do_sample; 0 = off
    top_p: float = 1.0  # used only with do_sample

    def __post_init__(self) -> None:
        problem = _range_problem(self)
        if problem is not None:
            raise GenerationConfigError(problem, field=problem.split()[0])

    def to_dict(self) -> dict:
        data = asdict(self)
        data["bad_words_ids"] = list(self.bad_words_ids)
        return data

    @classmethod
    def from_dict(cls, data: dict, vocab_size: int | None = None,
                  max_new_tokens: int | None = None) -> GenerationDefaults:
        """Reads to_dict()'s output back (the manifest's copy), checking every field's type and range, with
        vocab_size every token id, and with max_new_tokens (the bundle's) the default length."""
        if not isinstance(data, dict):
            raise GenerationConfigError(f"generation defaults must be an object, got {type(data).__name__}")
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise GenerationConfigError(f"unknown generation default(s) {unknown}")
        values = {}
        for name, value in data.items():
            kind = _KIND[name]
            if name == "bad_words_ids":
                if not isinstance(value, list) or not all(_is_int(v) for v in value):
                    raise GenerationConfigError("bad_words_ids must be a list of token ids", field=name)
                value = tuple(value)
            elif not _has_kind(value, kind):
                raise GenerationConfigError(f"{name} must be {kind}, got {value!r}", field=name)
            elif kind == "float":
                value = float(value)
            values[name] = value
        missing = [name for name in ("decoder_start_token_id", "eos_token_id") if name not in values]
        if missing:
            raise GenerationConfigError(f"missing generation default(s) {missing}")
        defaults = cls(**values)
        if vocab_size is not None:
            check_vocabulary(defaults, vocab_size)
        if max_new_tokens is not None:
            problem = max_new_tokens_problem(defaults.max_new_tokens, max_new_tokens)
            if problem is not None:
                raise GenerationConfigError(problem, field="max_new_tokens")
        return defaults


def check_vocabulary(defaults: GenerationDefaults, vocab_size: int) -> None:
    """Every token id of the defaults inside the vocabulary: the server indexes its logits with them (import, export,
    verify and serve all ask here)."""
    for name in ID_FIELDS:
        token = getattr(defaults, name)
        if token is not None and token >= vocab_size:
            raise GenerationConfigError(f"{name}={token} is outside the vocabulary (vocab_size={vocab_size})",
                                        field=name)
    outside = [token for token in defaults.bad_words_ids if token >= vocab_size]
    if outside:
        raise GenerationConfigError(f"bad_words_ids {outside[:3]} are outside the vocabulary (vocab_size={vocab_size})",
                                    field="bad_words_ids")


def load(hf_dir: str | Path) -> GenerationDefaults:
    """generation_config.json of a Hugging Face model directory, with config.json's token ids as fallback."""
    hf_dir = Path(hf_dir)
    generation = _read(confined(hf_dir, GENERATION_CONFIG, GenerationConfigError))
    config = confined(hf_dir, "config.json", GenerationConfigError)
    model = _read(config) if config.is_file() else {}
    try:
        return from_generation_config(generation, model)
    except GenerationConfigError as exc:
        raise GenerationConfigError(f"{hf_dir / GENERATION_CONFIG}: {exc}") from None


def from_generation_config(generation: dict, model_config: dict | None = None) -> GenerationDefaults:
    """transformers' generation config (a dict) -> GenerationDefaults; refuses what seqserve cannot honour."""
    if not isinstance(generation, dict):
        raise GenerationConfigError("must be a JSON object")
    data = {k: v for k, v in generation.items() if k not in IGNORED}
    for name in ID_FIELDS:  # transformers falls back to the model config for these
        if data.get(name) is None and model_config and model_config.get(name) is not None:
            data[name] = model_config[name]
    for name, default in UNSUPPORTED.items():
        value = data.pop(name, None)
        if value not in (None, default, []):
            raise GenerationConfigError(f"{name}={value!r} is not supported by seqserve (transformers' default is "
                                        f"{default!r}; remove the field to serve the model without it)")
    out: dict = {}
    out["decoder_start_token_id"] = _token(data.pop("decoder_start_token_id", None), "decoder_start_token_id",
                                           required=True)
    out["eos_token_id"] = _single_token(data.pop("eos_token_id", None), "eos_token_id", required=True)
    for name in ("pad_token_id", "bos_token_id", "forced_bos_token_id"):
        out[name] = _token(data.pop(name, None), name)
    out["forced_eos_token_id"] = _single_token(data.pop("forced_eos_token_id", None), "forced_eos_token_id")
    max_length = data.pop("max_length", None)
    max_new = data.pop("max_new_tokens", None)
    positions = (model_config or {}).get("max_position_embeddings")
    cap = positions - 1 if _is_int(positions) and positions >= 2 else None  # the bundle's max_new_tokens
    if max_new is not None:
        out["max_new_tokens"] = _integer(max_new, "max_new_tokens", 1)
    elif max_length is not None:
        out["max_new_tokens"] = _integer(max_length, "max_length", 2) - 1  # max_length counts the decoder start token
    else:  # transformers' default, the start token added, within the decoder's positions
        out["max_new_tokens"] = min(HF_DEFAULT_MAX_NEW_TOKENS, cap) if cap else HF_DEFAULT_MAX_NEW_TOKENS
    problem = max_new_tokens_problem(out["max_new_tokens"], cap) if cap else None
    if problem is not None:  # beyond what any request may ask of this model
        given = "max_new_tokens" if max_new is not None else f"max_length={max_length} (max_new_tokens + 1)"
        raise GenerationConfigError(f"{given}: {problem} (max_position_embeddings={positions})")
    min_length, min_new = data.pop("min_length", None), data.pop("min_new_tokens", None)
    if min_new is not None:
        out["min_new_tokens"] = _integer(min_new, "min_new_tokens", 0)
    elif min_length is not None:
        out["min_new_tokens"] = max(0, _integer(min_length, "min_length", 0) - 1)
    bad = data.pop("bad_words_ids", None)
    if bad is not None:
        out["bad_words_ids"] = _bad_words(bad)
    early = data.pop("early_stopping", False)
    if early == "never":
        raise GenerationConfigError("early_stopping='never' is not supported (true or false)")
    if not isinstance(early, bool):
        raise GenerationConfigError(f"early_stopping: must be true or false, got {early!r}")
    out["early_stopping"] = early
    for name in ("renormalize_logits", "do_sample"):
        value = data.pop(name, False)
        if not isinstance(value, bool):
            raise GenerationConfigError(f"{name}: must be true or false, got {value!r}")
        out[name] = value
    for name in ("num_beams", "num_return_sequences", "top_k"):
        if name in data:
            out[name] = _integer(data.pop(name), name, 0 if name == "top_k" else 1)
    for name in ("length_penalty", "repetition_penalty", "temperature", "top_p"):
        if name in data:
            value = data.pop(name)
            if not _is_number(value):
                raise GenerationConfigError(f"{name}: must be a number, got {value!r}")
            out[name] = float(value)
    if data:
        raise GenerationConfigError(f"unknown field(s) {sorted(data)}: seqserve cannot tell whether it honours them")
    defaults = GenerationDefaults(**out)
    vocab_size = (model_config or {}).get("vocab_size")
    if _is_int(vocab_size):  # config.json's, the model's vocabulary (its own check refuses a malformed one)
        check_vocabulary(defaults, vocab_size)
    return defaults


def _read(path: Path) -> dict:
    return read_object(path, GenerationConfigError)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def _integer(value, name: str, minimum: int) -> int:
    if not _is_int(value) or value < minimum:
        raise GenerationConfigError(f"{name}: must be an integer >= {minimum}, got {value!r}")
    return value


def _token(value, name: str, required: bool = False) -> int | None:
    if value is None:
        if required:
            raise GenerationConfigError(f"{name}: missing (in generation_config.json and config.json)")
        return None
    return _integer(value, name, 0)


def _single_token(value, name: str, required: bool = False) -> int | None:
    """transformers allows a list of ids; seqserve ends on one token, so a list must name one id."""
    if isinstance(value, list):
        if len(set(value)) != 1:
            raise GenerationConfigError(f"{name}={value!r}: several end tokens are not supported (one id)")
        value = value[0]
    return _token(value, name, required)


def _bad_words(value) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(seq, list) and seq for seq in value):
        raise GenerationConfigError(f"bad_words_ids: must be a list of lists of token ids, got {value!r}")
    longer = [seq for seq in value if len(seq) > 1]
    if longer:
        raise GenerationConfigError(f"bad_words_ids: multi-token sequences such as {longer[0]!r} are not supported "
                                    "(single tokens only)")
    return tuple(_integer(seq[0], "bad_words_ids", 0) for seq in value)


_KIND = {"decoder_start_token_id": "int", "eos_token_id": "int", "pad_token_id": "int|None", "bos_token_id": "int|None",
         "max_new_tokens": "int", "min_new_tokens": "int", "num_beams": "int", "num_return_sequences": "int",
         "length_penalty": "float", "early_stopping": "bool", "bad_words_ids": "list",
         "forced_bos_token_id": "int|None",
         "forced_eos_token_id": "int|None", "renormalize_logits": "bool", "repetition_penalty": "float",
         "do_sample": "bool", "temperature": "float", "top_k": "int", "top_p": "float"}


def _has_kind(value, kind: str) -> bool:
    if kind.endswith("|None") and value is None:
        return True
    base = kind.split("|")[0]
    return {"int": _is_int, "float": _is_number, "bool": lambda v: isinstance(v, bool)}[base](value)


def _range_problem(d: GenerationDefaults) -> str | None:
    """The first value outside its range, or None; the message starts with the field's name. The float options
    take a request's ranges (contract/decoding.py), so a default never fails a request that leaves it unset."""
    for name in ID_FIELDS:
        token = getattr(d, name)
        if token is not None and token < 0:
            return f"{name} must be a token id >= 0, got {token}"
    if any(t < 0 for t in d.bad_words_ids):
        return f"bad_words_ids must be token ids >= 0, got {list(d.bad_words_ids)}"
    if d.eos_token_id in d.bad_words_ids:
        return f"bad_words_ids must not ban eos_token_id ({d.eos_token_id})"
    problem = lengths_problem(d.max_new_tokens, d.min_new_tokens) or num_beams_problem(d.num_beams) or beam_problem(
        d.num_beams, d.num_return_sequences, d.length_penalty, repetition_penalty=d.repetition_penalty)
    if problem is not None:
        return problem
    if d.do_sample and d.num_beams > 1:
        return "do_sample with num_beams > 1 (beam sampling) is not supported"
    sampled = ("temperature", "top_p") if d.do_sample else ()  # without do_sample they are never used
    for name in ("repetition_penalty", *sampled):
        value, allowed = getattr(d, name), FLOAT_RANGES[name]
        if value not in allowed:
            return f"{name} must be in {allowed}, got {value:g}"
    if d.top_k < 0:
        return f"top_k must be >= 0, got {d.top_k}"
    return None
