"""Byte-level BPE tokenizer (Hugging Face `tokenizers`) shared by training and the gRPC server.

No torch import here: the server loads tokenizer.json through this module. Contract: ids 0..3 are
<pad>, <s>, </s>, <unk>; `tok.encode(text).ids` ends with </s> (the encoder input exactly); every digit is its
own token; decode(encode(s), skip_special_tokens=True) == NFC(s) for any string, even one containing "</s>".
"""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)  # trained in this order, so their ids are 0, 1, 2, 3
_ID_NAMES = ("pad_id", "bos_id", "eos_id", "unk_id")


def _empty_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.normalizer = normalizers.NFC()
    # Digits first so numbers are spelled digit by digit; byte-level so any text round-trips without <unk>.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.no_padding()  # callers batch and pad themselves
    tok.no_truncation()  # over-long inputs are reported by the caller, not silently cut
    return _as_text_only(tok)


def _as_text_only(tok: Tokenizer) -> Tokenizer:
    # A literal "</s>" typed by a user must stay text (and round-trip), not become EOS. tokenizer.json does not
    # store this flag, so every load goes through load_tokenizer to set it again.
    tok.encode_special_tokens = True
    return tok


def train_tokenizer(texts: Iterable[str], vocab_size: int = 2000, min_frequency: int = 2) -> Tokenizer:
    """Trains BPE on texts; the result appends </s> to every encoding."""
    tok = _empty_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes, so unseen characters still encode
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    eos_id = special_ids(tok)["eos_id"]
    # The server feeds exactly tok.encode(text).ids to the encoder, so EOS must come from the tokenizer itself.
    tok.post_processor = processors.TemplateProcessing(single=f"$A {EOS}", special_tokens=[(EOS, eos_id)])
    return tok


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Loads a saved tokenizer.json and checks the special-token contract (always load through here)."""
    tok = _as_text_only(Tokenizer.from_file(str(path)))
    special_ids(tok)
    return tok


def special_ids(tok: Tokenizer) -> dict[str, int]:
    """{"pad_id": 0, "bos_id": 1, "eos_id": 2, "unk_id": 3}, read from the tokenizer and checked."""
    ids = {name: tok.token_to_id(token) for name, token in zip(_ID_NAMES, SPECIAL_TOKENS)}
    expected = dict(zip(_ID_NAMES, range(len(SPECIAL_TOKENS))))
    if ids != expected:
        raise ValueError(f"tokenizer special ids {ids} differ from the required {expected}")
    return ids
