"""The pieces a demo Hugging Face model is built from (model/hf_demo.py): its sizes, the strings its tokenizer is
trained on, and the tokenizer trainers and vocabulary orders of each family's layout. Seeded and deterministic.

sentencepiece and tokenizers (the hf extra) are imported inside the functions that train a tokenizer.
"""
from __future__ import annotations

import io
import json
from dataclasses import dataclass

from seqserve.model import tokenizer_texts

SEED = 0


@dataclass(frozen=True)
class HfSize:
    d_model: int = 32
    layers: int = 2  # encoder and decoder each
    heads: int = 4
    ffn: int = 64
    vocab: int = 600  # the tokenizer's target size (sentencepiece may stop a little short of it)
    max_positions: int = 128
    # Weights larger than transformers' default init (0.02) so a random model's output depends on its input (with
    # the default, every source of the tiny model decodes to the same repeated token).
    init_std: float = 0.3


TINY = HfSize()
LOGITS_BIAS_STD = 0.05  # final_logits_bias: small beside the logits, but not zero
# opus-mt's size; a smaller init than TINY's keeps activations moderate at d_model 512
MARIAN_BASE = HfSize(d_model=512, layers=6, heads=8, ffn=2048, vocab=32_000, max_positions=512, init_std=0.08)


def real_strings() -> list[str]:
    """>= 1,000 distinct real strings (model/tokenizer_texts.py, which `seqserve verify --hf` samples too)."""
    return tokenizer_texts.real_strings(SEED)


def training_strings() -> list[str]:
    """The part of real_strings the tokenizers are trained on: every other one, so half the tests are unseen."""
    return [s for s in real_strings()[::2] if s.strip()]


def train_sentencepiece(texts: list[str], vocab: int) -> bytes:
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=model, vocab_size=vocab, model_type="unigram",
        character_coverage=1.0, hard_vocab_limit=False, num_threads=1, seed_sentencepiece_size=100_000,
        minloglevel=2,
    )
    return model.getvalue()


def marian_vocab(spm_bytes: bytes) -> dict[str, int]:
    """opus-mt's vocab.json order: </s> 0, <unk> 1, the pieces, <pad> last (unlike sentencepiece's own ids, so the
    import must map pieces through vocab.json)."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=spm_bytes)
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    ordered = ["</s>", "<unk>"] + [p for p in pieces if p not in ("<unk>", "<s>", "</s>")] + ["<pad>"]
    return {piece: i for i, piece in enumerate(ordered)}


def pad_vocab(vocab: dict[str, int], size: int) -> dict[str, int]:
    """Grows vocab.json to size entries with pieces the sentencepiece model never emits; <pad> stays last."""
    pieces = [p for p in sorted(vocab, key=vocab.get) if p != "<pad>"]
    pieces += [f"▁unused{i}" for i in range(size - len(pieces) - 1)]
    return {piece: i for i, piece in enumerate([*pieces, "<pad>"])}


BART_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")  # ids 0..3 as in facebook/bart-*; <mask> is the last id


def train_byte_level_bpe(texts: list[str], vocab: int):
    from tokenizers import ByteLevelBPETokenizer

    tok = ByteLevelBPETokenizer(add_prefix_space=False, trim_offsets=True)
    tok.train_from_iterator(texts, vocab_size=vocab, min_frequency=2, special_tokens=list(BART_SPECIALS),
                            show_progress=False)
    return tok


def fairseq_vocab(spm_bytes: bytes) -> dict[str, int]:
    """fairseq's dictionary order (M2M100's vocab.json): <s> 0, <pad> 1, </s> 2, <unk> 3, then the pieces."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=spm_bytes)
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    ordered = ["<s>", "<pad>", "</s>", "<unk>"] + [p for p in pieces if p not in ("<unk>", "<s>", "</s>")]
    return {piece: i for i, piece in enumerate(ordered)}


def sentencepiece_bpe(texts: list[str], vocab: int) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A BPE over '▁'-marked words, as NLLB's tokenizer.json holds one: (vocab with <s> <pad> </s> <unk> at 0..3,
    merges)."""
    from tokenizers import SentencePieceBPETokenizer

    bpe = SentencePieceBPETokenizer(replacement="▁", add_prefix_space=True)
    bpe.train_from_iterator(texts, vocab_size=vocab, special_tokens=["<s>", "<pad>", "</s>", "<unk>"],
                            show_progress=False)
    model = json.loads(bpe.to_str())["model"]
    return model["vocab"], [tuple(m) for m in model["merges"]]

