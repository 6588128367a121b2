"""The tokenizer contract the trainer and the server rely on: special ids, trailing EOS, digits, round-trips."""
from __future__ import annotations

import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models

from seqserve.contract.tokenizer import EOS, SPECIAL_TOKENS, load_tokenizer, special_ids
from seqserve.model.corpus import CorpusConfig, generate_splits
from seqserve.model.tokenizer import train_tokenizer


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    pairs = generate_splits(CorpusConfig(n_train=2000, n_valid=0, n_test=0, seed=5))["train"]
    return train_tokenizer([text for pair in pairs for text in pair], vocab_size=500)


def test_special_tokens_have_ids_0_to_3(tok):
    assert SPECIAL_TOKENS == ("<pad>", "<s>", "</s>", "<unk>")
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3]
    assert special_ids(tok) == {"pad_id": 0, "bos_id": 1, "eos_id": 2, "unk_id": 3}
    assert 100 < tok.get_vocab_size() <= 500


def test_special_ids_rejects_other_orders():
    wrong = Tokenizer(models.WordLevel({"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}, unk_token="<unk>"))
    with pytest.raises(ValueError):
        special_ids(wrong)


def test_encoding_ends_with_a_single_eos_and_no_bos(tok):
    for text in ["<fr> 1 234 567", "zéro", ""]:
        ids = tok.encode(text).ids
        assert ids[-1] == 2 and ids.count(2) == 1 and 1 not in ids and 0 not in ids


def test_every_digit_is_its_own_token(tok):
    enc = tok.encode("1234567")
    assert len(enc.ids) == 8
    assert [tok.decode([i]) for i in enc.ids[:-1]] == list("1234567")
    assert enc.tokens[-1] == EOS
    assert len(tok.encode("<de> 3.456,78 €").ids) >= 6 + 1  # six digits at least, never merged


@pytest.mark.parametrize("text", [
    "<fr> 1 234 567", "é", "€12.50", "日本語のテキスト", "🙂👍🏽", "a  b   c", "  leading and trailing  ",
    "tab\there", "two\nlines", "e\u0301", "Größe straße", "<unk> and </s> as text", "",
])
def test_decode_inverts_encode(tok, text):
    ids = tok.encode(text).ids
    assert 3 not in ids and ids.count(2) == 1  # nothing is unknown; a literal "</s>" stays text
    assert tok.decode(ids, skip_special_tokens=True) == unicodedata.normalize("NFC", text)


def test_save_and_load_give_identical_ids(tok, tmp_path: Path):
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    loaded = load_tokenizer(path)
    texts = ["<es> 12,50 €", "doce euros con cincuenta céntimos", "日本 🙂", "1234567", "a </s> b"]
    assert [e.ids for e in loaded.encode_batch(texts)] == [e.ids for e in tok.encode_batch(texts)]
    assert special_ids(loaded) == special_ids(tok)
    assert loaded.encode("a </s> b").ids.count(2) == 1  # the text-only flag is not in the JSON; load restores it


def test_digits_stay_apart_even_when_numbers_repeat():
    # Repeated numbers would be merged by plain BPE; the Digits pre-tokenizer must forbid it.
    tok = train_tokenizer(["<en> 1234567 1,234,567", "2024 12 34 56 99"] * 100, vocab_size=400)
    assert tok.encode("1234567").tokens == list("1234567") + [EOS]
    assert all(len(t) == 1 for t in tok.encode("<en> 2024 1,234,567").tokens if any(c.isdigit() for c in t))


def test_training_is_deterministic():
    texts = ["<en> 12\ttwelve", "<fr> 12 douze", "<de> 12 zwölf"] * 50
    a, b = train_tokenizer(texts, vocab_size=300), train_tokenizer(texts, vocab_size=300)
    assert a.to_str() == b.to_str()


def test_module_does_not_import_torch():
    code = "import sys, model.tokenizer; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])
