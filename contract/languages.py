"""A multilingual model's languages (M2M100, NLLB, mBART-50): each language code's token and where the source
language token goes (json and dataclasses only; `seqserve import` writes it, the manifest records it, the server
reads it).

The bundle's tokenizer.json encodes a source as `text </s>` with no language token; the server adds the request's
source language token where the model's tokenizer puts it:
  * prefix: `[lang] text </s>` (M2M100Tokenizer `__en__`, NllbTokenizer in transformers 5's default non-legacy
    behaviour `eng_Latn`, MBart50Tokenizer `en_XX`);
  * suffix: `text </s> [lang]` (NllbTokenizer with legacy_behaviour=True, mBART-cc25's MBartTokenizer).
The target language's token is the first generated token (transformers' forced_bos_token_id).
"""
from __future__ import annotations

from dataclasses import dataclass

PREFIX, SUFFIX = "prefix", "suffix"
PLACEMENTS = (PREFIX, SUFFIX)
LANGUAGES_FILE = "languages.json"  # in a checkpoint: Languages.to_dict() of an imported multilingual model


class LanguagesError(ValueError):
    """A languages record that is malformed: the message names the field."""


@dataclass(frozen=True)
class Languages:
    codes: dict[str, int]  # the model's own language code (fr, fra_Latn, fr_XX) -> its token id
    source_placement: str = PREFIX  # one of PLACEMENTS

    def __post_init__(self) -> None:
        if not self.codes:
            raise LanguagesError("languages.codes: must name at least one language")
        for code, token in self.codes.items():
            if not isinstance(code, str) or not code or isinstance(token, bool) or not isinstance(token, int) \
                    or token < 0:
                raise LanguagesError(f"languages.codes: {code!r} -> {token!r} must be a code and a token id >= 0")
        if self.source_placement not in PLACEMENTS:
            raise LanguagesError(f"languages.source_placement must be one of {PLACEMENTS}, "
                                 f"got {self.source_placement!r}")

    def to_dict(self) -> dict:
        return {"codes": dict(self.codes), "source_placement": self.source_placement}

    @classmethod
    def from_dict(cls, data) -> Languages | None:
        """The manifest's record back ({} or None: a model without languages)."""
        if not data:
            return None
        if not isinstance(data, dict) or set(data) != {"codes", "source_placement"} or \
                not isinstance(data["codes"], dict):
            raise LanguagesError("languages must be an object with codes (an object) and source_placement")
        return cls(dict(data["codes"]), data["source_placement"])

    def source_ids(self, ids: list[int], code: str) -> list[int]:
        """The encoder input of a source encoded as `text </s>` in language `code` (a known code)."""
        token = self.codes[code]
        return [token, *ids] if self.source_placement == PREFIX else [*ids, token]
