"""server/languages.py: a request's source_language / target_language against the model's languages, and the
refusal a model without languages gives (INVALID_ARGUMENT naming the field, pointing to GetModelInfo)."""
from __future__ import annotations

import grpc
import pytest

from seqserve.contract.languages import PREFIX, SUFFIX, Languages, LanguagesError
from seqserve.server.languages import LanguageRefused, RequestLanguages, resolve
from seqserve.v1 import seqserve_pb2 as pb

NLLB = Languages({"eng_Latn": 7, "fra_Latn": 8, "deu_Latn": 9}, PREFIX)


def test_known_languages_give_the_source_code_and_the_target_token():
    assert resolve(NLLB, "eng_Latn", "fra_Latn") == RequestLanguages("eng_Latn", 8)
    assert resolve(None, "", "") is None


@pytest.mark.parametrize("source, target, message", [
    ("", "fra_Latn", ("source_language is required by this multilingual model; GetModelInfo lists its 3 "
                      "languages, e.g. deu_Latn, eng_Latn, fra_Latn")),
    ("eng_Latn", "", "target_language is required"),
    ("eng_Latn", "fr", "target_language 'fr' is not a language of this model; GetModelInfo lists"),
    ("en", "fra_Latn", "source_language 'en' is not a language of this model"),
])
def test_missing_and_unknown_languages_name_the_field(source, target, message):
    with pytest.raises(LanguageRefused, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        resolve(NLLB, source, target)


def test_a_language_on_a_model_without_languages_is_refused():
    with pytest.raises(LanguageRefused, match="target_language is not accepted: this model has no languages"):
        resolve(None, "", "fr")


def test_the_source_token_is_placed_as_the_tokenizer_places_it():
    assert NLLB.source_ids([5, 6, 2], "eng_Latn") == [7, 5, 6, 2]  # NLLB (non-legacy), M2M100, mBART-50
    legacy = Languages(NLLB.codes, SUFFIX)
    assert legacy.source_ids([5, 6, 2], "eng_Latn") == [5, 6, 2, 7]  # legacy NLLB, mBART-cc25: after </s>
    assert Languages.from_dict(NLLB.to_dict()) == NLLB and Languages.from_dict({}) is None
    with pytest.raises(LanguagesError, match="source_placement"):
        Languages({"en": 1}, "middle")


@pytest.mark.parametrize("field", ["source_language", "target_language"])
def test_the_served_model_without_languages_refuses_a_language(served, field):
    info = served.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
    assert not info.languages and info.source_language_placement == ""
    for call in (lambda: served.stub.Generate(pb.GenerateRequest(input="b 5 9 k", **{field: "fr"}), timeout=10),
                 lambda: served.stub.GenerateBatch(pb.GenerateBatchRequest(inputs=["b 5 9 k"], **{field: "fr"}),
                                                   timeout=10)):
        with pytest.raises(grpc.RpcError) as err:
            call()
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details().startswith(f"{field} is not accepted: this model has no languages")


def test_per_input_target_languages_on_a_model_without_languages_are_refused(served):
    with pytest.raises(grpc.RpcError) as err:
        served.stub.GenerateBatch(pb.GenerateBatchRequest(inputs=["b 5 9 k", "b 5"], target_languages=["", "fr"]),
                                  timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith("target_languages[1] is not accepted: this model has no languages")
