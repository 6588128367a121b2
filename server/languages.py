"""A request's languages, checked against the model's (the manifest's languages: contract/languages.py).

`resolve` is the one validation of source_language / target_language; whichever request path calls it turns a
LanguageRefused into INVALID_ARGUMENT with its message (which names the field and points to GetModelInfo).
Decision: on a multilingual model both are required, as transformers' translation pipeline requires src_lang and
tgt_lang (a default English source would silently mistranslate every other language); the model's own
forced_bos_token_id, if any, is replaced by the request's target language.
"""
from __future__ import annotations

from dataclasses import dataclass

from seqserve.contract.languages import Languages
from seqserve.server.echo import quoted

FIELDS = ("source_language", "target_language")
_SHOWN = 8  # codes quoted in a refusal (GetModelInfo lists them all)


class LanguageRefused(ValueError):
    """A missing, unknown or unexpected language: the message names the field."""


@dataclass(frozen=True)
class RequestLanguages:
    source: str  # the source language's code
    target_token: int  # the target language's token: the row's forced first token


def resolve(languages: Languages | None, source: str, target: str,
            target_field: str = "target_language") -> RequestLanguages | None:
    """The request's languages (None for a model without languages), or LanguageRefused naming the field
    (target_field: the target's name in the request, e.g. "target_languages[3]" in a batch)."""
    given = {FIELDS[0]: source, target_field: target}
    if languages is None:
        for field, value in given.items():
            if value:
                raise LanguageRefused(f"{field} is not accepted: this model has no languages (GetModelInfo lists "
                                      f"none), got {quoted(value)}")
        return None
    for field, value in given.items():
        if not value:
            raise LanguageRefused(f"{field} is required by this multilingual model; GetModelInfo lists its "
                                  f"{len(languages.codes)} languages, e.g. {_examples(languages)}")
        if value not in languages.codes:
            raise LanguageRefused(f"{field} {quoted(value)} is not a language of this model; GetModelInfo lists its "
                                  f"{len(languages.codes)} languages, e.g. {_examples(languages)}")
    return RequestLanguages(source, languages.codes[target])


def _examples(languages: Languages) -> str:
    return ", ".join(sorted(languages.codes)[:_SHOWN])
