"""Loading a bundle's or checkpoint's tokenizer.json and checking its special-token contract (no torch).

Contract: every special id the manifest names (pad, bos, eos, unk, decoder start: anywhere in the vocabulary) is a
special token of the tokenizer, so decode(..., skip_special_tokens=True) drops it; `tok.encode(text).ids` is the
encoder input exactly (it ends with the end token). The tokenizers this project trains put <pad>, <s>, </s>, <unk>
at ids 0..3 (special_ids reads them by name); an imported model's ids are wherever its vocabulary has them.
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
    """Loads a saved tokenizer.json (always load through here); check_special_ids checks it against a model."""
    return as_text_only(Tokenizer.from_file(str(path)))


def check_special_ids(tok: Tokenizer, ids: dict[str, int]) -> list[str]:
    """Problems with a model's special ids ({"pad_id": 58100, ...}) in this tokenizer: each must be one of its
    special tokens (decoding with skip_special_tokens drops exactly those)."""
    special = {i for i, added in tok.get_added_tokens_decoder().items() if added.special}
    return [f"{name}={i} is not a special token of the tokenizer (id {i} is {tok.id_to_token(i)!r})"
            for name, i in ids.items() if i not in special]


def special_ids(tok: Tokenizer) -> dict[str, int]:
    """{"pad_id": 0, "bos_id": 1, "eos_id": 2, "unk_id": 3}, read from a tokenizer this project trained, checked."""
    ids = {name: tok.token_to_id(token) for name, token in zip(ID_NAMES, SPECIAL_TOKENS)}
    expected = dict(zip(ID_NAMES, range(len(SPECIAL_TOKENS))))
    if ids != expected:
        raise ValueError(f"tokenizer special ids {ids} differ from the required {expected}")
    return ids
