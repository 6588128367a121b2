"""Training the byte-level BPE tokenizer (Hugging Face `tokenizers`); loading it is contract/tokenizer.py's job.

Every digit is its own token, and byte-level BPE means any text round-trips:
decode(encode(s), skip_special_tokens=True) == NFC(s) for any string, even one containing "</s>".
"""
from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from seqserve.contract.tokenizer import EOS, SPECIAL_TOKENS, UNK, as_text_only, special_ids


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
    return as_text_only(tok)


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
