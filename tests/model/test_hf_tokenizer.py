"""model/hf_tokenizer.py: one tokenizer.json that encodes and decodes exactly as transformers' own tokenizer.

The oracle is transformers itself (MarianTokenizer over sentencepiece; BART's tokenizer), on models built here with
tokenizers trained here (tests/hf_fixtures.py), over >= 1,000 real strings.
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
from seqserve.model import hf_tokenizer
from seqserve.model.hf_tokenizer import TokenizerImportError
from seqserve.server.detokenizer import TextStream

N_RANDOM = 300  # random id sequences (a random-weight model's output looks like this), besides real target texts


@pytest.fixture(scope="module", params=hf_fixtures.FAMILIES)
def family(request, tmp_path_factory):
    """(family, HF directory, transformers' tokenizer, the converted tokenizer as the server loads it)."""
    from transformers import AutoTokenizer

    directory = hf_fixtures.build(request.param, tmp_path_factory.mktemp(request.param))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # MarianTokenizer recommends sacremoses, which it does not use to encode
        original = AutoTokenizer.from_pretrained(str(directory))
    path = hf_tokenizer.save(directory, tmp_path_factory.mktemp("converted") / "tokenizer.json")
    served = as_text_only(Tokenizer.from_file(str(path)))
    return request.param, directory, original, served


def test_the_corpus_is_at_least_1000_real_strings_with_unicode_and_odd_whitespace():
    strings = hf_fixtures.real_strings()
    assert len(strings) >= 1000 and len(set(strings)) == len(strings)
    joined = "".join(strings)
    for needed in ("ß", "é", "ü", "ñ", "\u00a0", "\t", "  ", "😀", "日本", "\u0301"):
        assert needed in joined, needed
    assert "" in strings and any(s != s.strip() for s in strings)
    assert any("Return" in s for s in strings)  # English sentences from the stdlib's docstrings


def test_ids_equal_the_original_tokenizer_on_every_real_string(family):
    name, _, original, served = family
    expected = [original(text).input_ids for text in hf_fixtures.real_strings()]
    got = [served.encode(text).ids for text in hf_fixtures.real_strings()]
    wrong = [(text, e, g) for text, e, g in zip(hf_fixtures.real_strings(), expected, got) if e != g]
    assert not wrong, f"{name}: {len(wrong)} strings differ, first {wrong[:3]}"
    eos = original.eos_token_id
    assert all(ids[-1] == eos for ids in got)  # the encoder input ends with EOS, from the tokenizer itself
    if name == hf_fixtures.BART:
        assert all(ids[0] == original.bos_token_id for ids in got)


def test_unseen_characters_become_the_originals_unk(family):
    name, _, original, served = family
    text = "ᚠᚢᚦ ꙮ"  # runes and a rare Cyrillic letter: in no training string
    assert served.encode(text).ids == original(text).input_ids
    if name == hf_fixtures.MARIAN:  # sentencepiece has no byte fallback here: the characters are <unk>
        assert original.unk_token_id in served.encode(text).ids


def test_special_tokens_inside_the_text_are_split_out_as_the_original_does(family):
    """The converted file keeps the original's special tokens; the server reads them as text (as_text_only)."""
    _, directory, original, _ = family
    tok = hf_tokenizer.convert(directory)
    for text in [f"one {original.eos_token} two", f"{original.unk_token}x", f"a{original.pad_token}b"]:
        assert tok.encode(text).ids == original(text).input_ids, text


def _id_sequences(original, vocab_size: int) -> list[list[int]]:
    """Ids of real target texts, and random ids with special ids anywhere (what a random model generates)."""
    rng = random.Random(0)
    texts = [original(text_target=text).input_ids for text in hf_fixtures.target_texts()]
    noise = [[rng.randrange(vocab_size) for _ in range(rng.randrange(0, 24))] for _ in range(N_RANDOM)]
    return texts + noise


def test_decoded_text_equals_the_originals_decode_skipping_special_tokens(family):
    name, _, original, served = family
    for ids in _id_sequences(original, served.get_vocab_size()):
        expected = original.decode(ids, skip_special_tokens=True)
        assert served.decode(ids, skip_special_tokens=True) == expected, (name, ids)


def test_streamed_text_equals_the_originals_decode(family):
    """The server's incremental path (server/detokenizer.py: DecodeStream, then the whole output once at the end)
    sends pieces that join to exactly the original's text, and never sends text it later takes back."""
    name, _, original, served = family
    for ids in _id_sequences(original, served.get_vocab_size()):
        stream, sent = TextStream(served), []
        for token_id in ids:
            sent.append(stream.push(token_id))
        streamed = "".join(sent)
        final = stream.close(ids)
        assert streamed + final == original.decode(ids, skip_special_tokens=True), (name, ids)


def test_missing_files_and_unknown_families_are_refused_naming_the_file(tmp_path, family):
    name, directory, _, _ = family
    copy = tmp_path / "copy"
    shutil.copytree(directory, copy)
    missing = "source.spm" if name == hf_fixtures.MARIAN else "tokenizer.json"
    (copy / missing).unlink()
    if name == hf_fixtures.BART:
        (copy / "vocab.json").unlink()
        missing = "vocab.json"
    with pytest.raises(TokenizerImportError, match=missing):
        hf_tokenizer.convert(copy)
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "model_type": "t5"}))
    with pytest.raises(TokenizerImportError, match=r"config.json: model_type 't5'.*marian, bart"):
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
