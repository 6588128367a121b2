"""contract/generation.py: generation_config.json -> GenerationDefaults, what it honours and what it refuses."""
from __future__ import annotations

import json

import pytest

from seqserve.contract.generation import GenerationConfigError, GenerationDefaults, from_generation_config, load

# opus-mt-en-de's generation_config.json as published (ids of its 58,101-token vocabulary)
OPUS_MT = {"bad_words_ids": [[58100]], "bos_token_id": 0, "decoder_start_token_id": 58100, "eos_token_id": 0,
           "forced_eos_token_id": 0, "max_length": 512, "num_beams": 4, "pad_token_id": 58100,
           "renormalize_logits": True, "transformers_version": "4.34.0.dev0"}
# facebook/bart-large-cnn's, less no_repeat_ngram_size (which seqserve refuses, below)
BART_CNN = {"bos_token_id": 0, "decoder_start_token_id": 2, "early_stopping": True, "eos_token_id": 2,
            "forced_bos_token_id": 0, "forced_eos_token_id": 2, "length_penalty": 2.0, "max_length": 142,
            "min_length": 56, "num_beams": 4, "pad_token_id": 1}


def test_opus_mt_defaults():
    d = from_generation_config(OPUS_MT)
    assert (d.num_beams, d.max_new_tokens, d.bad_words_ids, d.decoder_start_token_id, d.eos_token_id) == \
        (4, 511, (58100,), 58100, 0)
    assert d.forced_eos_token_id == 0 and d.forced_bos_token_id is None and d.renormalize_logits
    assert d.length_penalty == 1.0 and not d.early_stopping and not d.do_sample


def test_bart_cnn_defaults():
    d = from_generation_config(BART_CNN)
    assert (d.num_beams, d.max_new_tokens, d.min_new_tokens, d.length_penalty, d.early_stopping) == \
        (4, 141, 55, 2.0, True)
    assert (d.decoder_start_token_id, d.forced_bos_token_id, d.forced_eos_token_id) == (2, 0, 2)


@pytest.mark.parametrize("config", [OPUS_MT, BART_CNN])
def test_the_manifest_copy_round_trips_through_json(config):
    d = from_generation_config(config)
    assert GenerationDefaults.from_dict(json.loads(json.dumps(d.to_dict()))) == d


def test_token_ids_missing_from_generation_config_come_from_config_json():
    d = from_generation_config({"num_beams": 2}, {"decoder_start_token_id": 7, "eos_token_id": [3], "d_model": 8})
    assert (d.decoder_start_token_id, d.eos_token_id, d.num_beams, d.max_new_tokens) == (7, 3, 2, 20)  # no max_length


@pytest.mark.parametrize("field, value", [
    ("no_repeat_ngram_size", 3), ("num_beam_groups", 2), ("diversity_penalty", 0.5), ("suppress_tokens", [5]),
    ("forced_decoder_ids", [[1, 5]]), ("typical_p", 0.9), ("exponential_decay_length_penalty", [5, 1.1]),
    ("sequence_bias", {"5": -1.0}), ("some_future_option", 1),
])
def test_an_option_seqserve_cannot_honour_is_refused_naming_it(field, value):
    with pytest.raises(GenerationConfigError, match=field):
        from_generation_config({**OPUS_MT, field: value})


@pytest.mark.parametrize("field", ["no_repeat_ngram_size", "num_beam_groups", "suppress_tokens", "typical_p"])
def test_an_unsupported_option_at_transformers_default_is_accepted(field):
    default = {"no_repeat_ngram_size": 0, "num_beam_groups": 1, "suppress_tokens": None, "typical_p": 1.0}[field]
    assert from_generation_config({**OPUS_MT, field: default}) == from_generation_config(OPUS_MT)


@pytest.mark.parametrize("change, field", [
    ({"bad_words_ids": [[5, 6]]}, "bad_words_ids"), ({"bad_words_ids": 5}, "bad_words_ids"),
    ({"early_stopping": "never"}, "early_stopping"), ({"num_beams": 0}, "num_beams"),
    ({"max_length": 1}, "max_length"), ({"max_length": "512"}, "max_length"),
    ({"eos_token_id": [0, 1]}, "eos_token_id"),
    ({"decoder_start_token_id": -1}, "decoder_start_token_id"), ({"length_penalty": float("nan")}, "length_penalty"),
    ({"repetition_penalty": 1.2}, "repetition_penalty"), ({"do_sample": True}, "do_sample"),
    ({"num_return_sequences": 5}, "num_return_sequences"), ({"bad_words_ids": [[0]]}, "bad_words_ids"),
])
def test_out_of_range_values_are_refused_naming_the_field(change, field):
    with pytest.raises(GenerationConfigError, match=field):
        from_generation_config({**OPUS_MT, **change})


def test_a_missing_decoder_start_is_refused():
    config = {k: v for k, v in OPUS_MT.items() if k != "decoder_start_token_id"}
    with pytest.raises(GenerationConfigError, match="decoder_start_token_id: missing"):
        from_generation_config(config)


def test_load_names_the_file(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({**OPUS_MT, "no_repeat_ngram_size": 3}))
    with pytest.raises(GenerationConfigError, match=r"generation_config.json: no_repeat_ngram_size=3"):
        load(tmp_path)
    (tmp_path / "generation_config.json").unlink()
    with pytest.raises(GenerationConfigError, match="generation_config.json: missing"):
        load(tmp_path)


def test_from_dict_refuses_a_corrupted_manifest_copy():
    data = from_generation_config(OPUS_MT).to_dict()
    for change in ({"num_beams": "4"}, {"extra": 1}, {"bad_words_ids": [[1]]}, {"max_new_tokens": 0}):
        with pytest.raises(GenerationConfigError):
            GenerationDefaults.from_dict({**data, **change})


def test_max_and_min_length_count_the_decoder_start_as_transformers_does(tmp_path):
    """max_new_tokens = max_length - 1 and min_new_tokens = min_length - 1, checked against transformers' generate."""
    pytest.importorskip("transformers")
    import hf_fixtures
    import torch
    from transformers import AutoModelForSeq2SeqLM

    directory = hf_fixtures.build_bart(tmp_path / "bart")
    model = AutoModelForSeq2SeqLM.from_pretrained(str(directory)).eval()
    d = from_generation_config({**json.loads((directory / "generation_config.json").read_text()),
                                "max_length": 9, "min_length": 9, "num_beams": 1})
    with torch.no_grad():
        out = model.generate(torch.tensor([[0, 100, 200, 2]]), max_length=9, min_length=9, num_beams=1)
    assert out.shape[1] - 1 == d.max_new_tokens == d.min_new_tokens == 8  # out starts with the decoder start token
