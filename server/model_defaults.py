"""A model's own decoding defaults (the manifest's "generation": contract/generation.py's GenerationDefaults, from
its generation_config.json) as the values of request fields left unset: max_new_tokens, min_new_tokens, num_beams,
num_return_sequences, length_penalty, early_stopping, and with do_sample its temperature, top_k, top_p and
repetition_penalty. The token rules (bad words, forced BOS/EOS) are engine/decoding/token_rules.py's: they hold for
every
request."""
from __future__ import annotations

from dataclasses import replace

from seqserve.engine.limits import Limits
from seqserve.engine.request import SamplingParams


def default_max_new_tokens(generation: dict) -> int | None:
    """max_new_tokens of a request that leaves it unset, as the model says (None: the server's own default)."""
    return generation.get("max_new_tokens")


def request_defaults(generation: dict, max_new_tokens: int, max_num_beams: int) -> SamplingParams:
    """The values unset request fields take (a model default beyond a server limit is clipped to it)."""
    defaults = SamplingParams(max_new_tokens=max_new_tokens)
    if not generation:
        return defaults
    g = generation
    beams = min(int(g.get("num_beams", 1)), max_num_beams)
    sampled = dict(temperature=float(g.get("temperature", 1.0)), top_k=int(g.get("top_k", 0)),
                   top_p=float(g.get("top_p", 1.0))) if g.get("do_sample") else {}
    return replace(defaults, num_beams=beams, num_return_sequences=min(int(g.get("num_return_sequences", 1)), beams),
                   min_new_tokens=min(int(g.get("min_new_tokens", 0)), max_new_tokens),
                   length_penalty=float(g.get("length_penalty", 1.0)), early_stopping=bool(g.get("early_stopping")),
                   repetition_penalty=float(g.get("repetition_penalty", 1.0)), **sampled)


def info_entries(generation: dict) -> dict:
    """GetModelInfo's config entries for the model's generation defaults, named generation.<field> (typed values)."""
    return {f"generation.{k}": v for k, v in sorted(generation.items())}


def model_limits(settings, manifest) -> Limits:
    """The request limits of a model (its manifest) under these settings: SettingsError for a cap beyond the model's."""
    return settings.limits(int(manifest.model["max_positions"]), int(manifest.max_new_tokens),
                           default_max_new_tokens(manifest.generation))


def task_entries(training: dict) -> dict:
    """GetModelInfo's config entries for an imported model's task prefixes (config.json's task_specific_params),
    named task.<name>.prefix: the text a client puts before its input for that task."""
    imported = training.get("imported_from")
    prefixes = imported.get("task_prefixes") if isinstance(imported, dict) else None
    if not isinstance(prefixes, dict):  # the manifest's training section is free-form: show only what is well typed
        return {}
    return {f"task.{name}.prefix": prefix for name, prefix in sorted(prefixes.items()) if isinstance(prefix, str)}
