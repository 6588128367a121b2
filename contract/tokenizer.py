"""Loading a bundle's or checkpoint's tokenizer.json and checking its special-token contract (no torch).

Contract: ids 0..3 are <pad>, <s>, </s>, <unk>; `tok.encode(text).ids` ends with </s> (the encoder input exactly);
decode(encode(s), skip_special_tokens=True) == NFC(s) for any string, even one containing "</s>".
"""
from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)  # trained in this order, so their ids are 0, 1, 2, 3
ID_NAMES = ("pad_id", "bos_id", "eos_id", "unk_id")


def as_text_only(tok: Tokenizer) -> Tokenizer:
    """A literal "</s>" typed by a user stays text (and round-trips), never EOS; tokenizer.json does not store this
    flag, so every load sets it again."""
    tok.encode_special_tokens = True
    return tok


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Loads a saved tokenizer.json and checks the special-token contract (always load through here)."""
    tok = as_text_only(Tokenizer.from_file(str(path)))
    special_ids(tok)
    return tok


def special_ids(tok: Tokenizer) -> dict[str, int]:
    """{"pad_id": 0, "bos_id": 1, "eos_id": 2, "unk_id": 3}, read from the tokenizer and checked."""
    ids = {name: tok.token_to_id(token) for name, token in zip(ID_NAMES, SPECIAL_TOKENS)}
    expected = dict(zip(ID_NAMES, range(len(SPECIAL_TOKENS))))
    if ids != expected:
        raise ValueError(f"tokenizer special ids {ids} differ from the required {expected}")
    return ids
