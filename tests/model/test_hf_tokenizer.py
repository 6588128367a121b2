"""model/hf_tokenizer.py: one tokenizer.json that encodes and decodes exactly as transformers' own tokenizer.

The oracle is transformers itself (MarianTokenizer and M2M100Tokenizer over sentencepiece; BART's and mBART-50's
tokenizers), on models built here with tokenizers trained here (tests/hf_fixtures.py), over >= 1,000 real strings.
A multilingual tokenizer's source language token is placed by contract/languages.py (Languages.source_ids), checked
here for several source languages against the original with its src_lang set.
"""
from __future__ import annotations

import json
import random
import shutil
import warnings

import hf_fixtures
import pytest

pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")

from tokenizers import Tokenizer

from seqserve.contract.tokenizer import as_text_only
from seqserve.engine.decoding.detokenizer import TextStream
from seqserve.model import hf_tokenizer
from seqserve.model.hf_tokenizer import TokenizerImportError

N_RANDOM = 300  # random id sequences (a random-weight model's output looks like this), besides real target texts


@pytest.fixture(scope="module", params=hf_fixtures.FAMILIES)
def family(request, tmp_path_factory):
    """(family, HF directory, transformers' tokenizer, the converted tokenizer as the server loads it, its
    languages or None)."""
    from transformers import AutoTokenizer

    directory = hf_fixtures.build(request.param, tmp_path_factory.mktemp(request.param))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # MarianTokenizer recommends sacremoses, which it does not use to encode
        original = AutoTokenizer.from_pretrained(str(directory))
    path = hf_tokenizer.save(directory, tmp_path_factory.mktemp("converted") / "tokenizer.json")
    served = as_text_only(Tokenizer.from_file(str(path)))
    languages = hf_tokenizer.convert_multilingual(directory)[1]
    assert (languages is not None) == (request.param in hf_fixtures.MULTILINGUAL)
    return request.param, directory, original, served, languages


def _source_languages(name: str) -> list:
    """The source languages to check: None for a model without languages, else its test source and targets."""
    if name not in hf_fixtures.MULTILINGUAL:
        return [None]
    source, targets = hf_fixtures.TEST_LANGUAGES[name]
    return [source, *targets]


def _pair(family, text: str, lang) -> tuple[list[int], list[int]]:
    """(transformers' ids with src_lang = lang, the served ids: the converted encoding with lang placed)."""
    _, _, original, served, languages = family
    ids = served.encode(text).ids
    if lang is None:
        return original(text).input_ids, ids
    original.src_lang = lang
    return original(text).input_ids, languages.source_ids(ids, lang)


def test_the_corpus_is_at_least_1000_real_strings_with_unicode_and_odd_whitespace():
    strings = hf_fixtures.real_strings()
    assert len(strings) >= 1000 and len(set(strings)) == len(strings)
    joined = "".join(strings)
    for needed in ("ß", "é", "ü", "ñ", "\u00a0", "\t", "  ", "😀", "日本", "\u0301"):
        assert needed in joined, needed
    assert "" in strings and any(s != s.strip() for s in strings)
    assert any("Return" in s for s in strings)  # English sentences from the stdlib's docstrings


def test_ids_equal_the_original_tokenizer_on_every_real_string(family):
    name, _, original, _, languages = family
    for lang in _source_languages(name):
        pairs = [(text, *_pair(family, text, lang)) for text in hf_fixtures.real_strings()]
        wrong = [(text, e, g) for text, e, g in pairs if e != g]
        assert not wrong, f"{name} {lang}: {len(wrong)} strings differ, first {wrong[:3]}"
        got = [g for _, _, g in pairs]
        eos = original.eos_token_id
        if lang is None:
            assert all(ids[-1] == eos for ids in got)  # the encoder input ends with EOS, from the tokenizer itself
        else:  # M2M100, mBART-50: `[lang] text </s>`
            assert languages.source_placement == "prefix"
            assert all(ids[0] == languages.codes[lang] and ids[-1] == eos for ids in got)
    if name == hf_fixtures.BART:
        assert all(original(text).input_ids[0] == original.bos_token_id for text in hf_fixtures.real_strings())


def test_unseen_characters_become_the_originals_unk(family):
    name, _, original, _, _ = family
    text = "ᚠᚢᚦ ꙮ"  # runes and a rare Cyrillic letter: in no training string
    expected, got = _pair(family, text, _source_languages(name)[0])
    assert got == expected
    if name != hf_fixtures.BART:  # sentencepiece has no byte fallback here: the characters are <unk>
        assert original.unk_token_id in got


def test_special_tokens_inside_the_text_are_split_out_as_the_original_does(family):
    """The converted file keeps the original's special tokens; the server reads them as text (as_text_only)."""
    name, directory, original, _, languages = family
    tok = hf_tokenizer.convert(directory)
    lang = _source_languages(name)[0]
    for text in [f"one {original.eos_token} two", f"{original.unk_token}x", f"a{original.pad_token}b"]:
        ids = tok.encode(text).ids
        if lang is not None:
            original.src_lang = lang
            ids = languages.source_ids(ids, lang)
        assert ids == original(text).input_ids, text


def _id_sequences(original, vocab_size: int) -> list[list[int]]:
    """Ids of real target texts, and random ids with special ids anywhere (what a random model generates)."""
    rng = random.Random(0)
    texts = [original(text_target=text).input_ids for text in hf_fixtures.target_texts()]
    noise = [[rng.randrange(vocab_size) for _ in range(rng.randrange(0, 24))] for _ in range(N_RANDOM)]
    return texts + noise


def test_decoded_text_equals_the_originals_decode_skipping_special_tokens(family):
    """Language tokens included: the random ids cover the whole vocabulary, and a multilingual output starts with
    its target language's token."""
    name, _, original, served, _ = family
    for ids in _id_sequences(original, served.get_vocab_size()):
        expected = original.decode(ids, skip_special_tokens=True)
        assert served.decode(ids, skip_special_tokens=True) == expected, (name, ids)


def test_streamed_text_equals_the_originals_decode(family):
    """The server's incremental path (engine/decoding/detokenizer.py: DecodeStream, then the whole output once at the
    end)
    sends pieces that join to exactly the original's text, and never sends text it later takes back."""
    name, _, original, served, _ = family
    for ids in _id_sequences(original, served.get_vocab_size()):
        stream, sent = TextStream(served), []
        for token_id in ids:
            sent.append(stream.push(token_id))
        streamed = "".join(sent)
        final = stream.close(ids)
        assert streamed + final == original.decode(ids, skip_special_tokens=True), (name, ids)


def test_missing_files_and_unknown_families_are_refused_naming_the_file(tmp_path, family):
    name, directory, _, _, _ = family
    copy = tmp_path / "copy"
    shutil.copytree(directory, copy)
    missing = {hf_fixtures.MARIAN: "source.spm", hf_fixtures.BART: "vocab.json", hf_fixtures.M2M100:
               "sentencepiece.bpe.model", hf_fixtures.NLLB: "tokenizer_config.json",
               hf_fixtures.MBART50: "tokenizer_config.json"}[name]
    (copy / missing).unlink()
    if name == hf_fixtures.BART:
        (copy / "tokenizer.json").unlink()
    with pytest.raises(TokenizerImportError, match=missing):
        hf_tokenizer.convert(copy)
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "model_type": "pegasus"}))
    with pytest.raises(TokenizerImportError,
                       match=r"config.json: model_type 'pegasus'.*marian, bart, m2m_100, mbart, t5, mt5"):
        hf_tokenizer.convert(copy)


def test_a_marian_vocab_missing_source_pieces_is_refused(tmp_path):
    directory = hf_fixtures.build_marian(tmp_path / "marian")
    vocab = json.loads((directory / "vocab.json").read_text())
    dropped = [piece for piece in vocab if piece.startswith("▁")][:2]
    kept = [piece for piece in sorted(vocab, key=vocab.get) if piece not in dropped]
    (directory / "vocab.json").write_text(json.dumps({piece: i for i, piece in enumerate(kept)}))
    with pytest.raises(TokenizerImportError, match="vocab.json: 2 piece"):
        hf_tokenizer.convert(directory)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps({**config, "separate_vocabs": True}))
    with pytest.raises(TokenizerImportError, match="tokenizer_config.json: separate_vocabs"):
        hf_tokenizer.convert(directory)


def test_legacy_nllb_puts_the_source_language_after_the_end_token(tmp_path):
    """NllbTokenizer(legacy_behaviour=True): `text </s> [lang]`; the import records placement "suffix"."""
    from transformers import AutoTokenizer

    directory = hf_fixtures.build_nllb(tmp_path / "nllb", legacy=True)
    original = AutoTokenizer.from_pretrained(str(directory))
    tok, languages = hf_tokenizer.convert_multilingual(directory)
    assert languages.source_placement == "suffix" and len(languages.codes) == 202
    for lang in ("eng_Latn", "fra_Latn"):
        original.src_lang = lang
        for text in hf_fixtures.real_strings()[::10]:
            expected = original(text).input_ids
            assert languages.source_ids(as_text_only(tok).encode(text).ids, lang) == expected, text
            assert expected[-2:] == [original.eos_token_id, languages.codes[lang]]
