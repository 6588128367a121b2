"""Tiny random-weight Hugging Face models in `save_pretrained` form, built here (the hub is unreachable), and a
corpus of real strings to test tokenizers on.

`build_marian(dir)` / `build_bart(dir)` / `build_m2m100(dir)` / `build_nllb(dir)` / `build_mbart50(dir)` write
config.json, generation_config.json, model.safetensors and the tokenizer files of a model laid out like opus-mt
(Marian), facebook/bart (BART), facebook/m2m100, facebook/nllb-200 or facebook/mbart-large-50, with a tokenizer
trained here: sentencepiece for Marian, M2M100 and mBART-50, a BPE from `tokenizers` for NLLB, a byte-level BPE for
BART. Seeded and deterministic; the default sizes
build in seconds. `build_marian(dir, MARIAN_BASE)` is opus-mt's size, for benchmarks only.

`real_strings()` is >= 1,000 real strings: number sentences in four languages (model/verbalise.py), English
sentences from the Python standard library's docstrings, and odd cases (whitespace runs, NBSP, emoji, CJK,
combining marks, the empty string). The tokenizers are trained on `training_strings()`, a part of it.
transformers, sentencepiece and torch are imported inside the functions, so importing this module costs nothing.
"""
from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path

from seqserve.checks import tokenizer_texts

SEED = 0
MARIAN, BART, M2M100, NLLB, MBART50 = "marian", "bart", "m2m_100", "nllb", "mbart50"
FAMILIES = (MARIAN, BART, M2M100, NLLB, MBART50)
MULTILINGUAL = (M2M100, NLLB, MBART50)


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
    """>= 1,000 distinct real strings (checks/tokenizer_texts.py, which `seqserve verify --hf` samples too)."""
    return tokenizer_texts.real_strings(SEED)


def training_strings() -> list[str]:
    """The part of real_strings the tokenizers are trained on: every other one, so half the tests are unseen."""
    return [s for s in real_strings()[::2] if s.strip()]


def target_texts(n: int = 200) -> list[str]:
    """Real target-side sentences (number words in four languages) whose ids test decoding."""
    return [target for _, target in tokenizer_texts.pairs(SEED + 1, n)]


# -- Marian (opus-mt layout) ------------------------------------------------------------------------------------

def _train_sentencepiece(texts: list[str], vocab: int) -> bytes:
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=model, vocab_size=vocab, model_type="unigram",
        character_coverage=1.0, hard_vocab_limit=False, num_threads=1, seed_sentencepiece_size=100_000,
        minloglevel=2,
    )
    return model.getvalue()


def _marian_vocab(spm_bytes: bytes) -> dict[str, int]:
    """opus-mt's vocab.json order: </s> 0, <unk> 1, the pieces, <pad> last (unlike sentencepiece's own ids, so the
    import must map pieces through vocab.json)."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=spm_bytes)
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    ordered = ["</s>", "<unk>"] + [p for p in pieces if p not in ("<unk>", "<s>", "</s>")] + ["<pad>"]
    return {piece: i for i, piece in enumerate(ordered)}


def build_marian(directory: str | Path, size: HfSize = TINY, seed: int = SEED) -> Path:
    import torch
    from transformers import GenerationConfig, MarianConfig, MarianMTModel, MarianTokenizer

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    spm_bytes = _train_sentencepiece(training_strings(), min(size.vocab, TINY.vocab))
    for name in ("source.spm", "target.spm"):  # one joint model, as many opus-mt pairs ship
        (directory / name).write_bytes(spm_bytes)
    vocab = _marian_vocab(spm_bytes)
    if size.vocab > len(vocab):  # a benchmark model: pad the vocabulary to its size with pieces never emitted
        vocab = _pad_vocab(vocab, size.vocab)
    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False, indent=2))
    pad, eos = vocab["<pad>"], vocab["</s>"]
    config = MarianConfig(
        vocab_size=len(vocab), d_model=size.d_model, encoder_layers=size.layers, decoder_layers=size.layers,
        encoder_attention_heads=size.heads, decoder_attention_heads=size.heads, encoder_ffn_dim=size.ffn,
        decoder_ffn_dim=size.ffn, max_position_embeddings=size.max_positions, activation_function="swish",
        scale_embedding=True, pad_token_id=pad, eos_token_id=eos, bos_token_id=eos, decoder_start_token_id=pad,
        forced_eos_token_id=eos, share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
        init_std=size.init_std, dropout=0.1, attention_dropout=0.0, activation_dropout=0.0,
    )
    torch.manual_seed(seed)
    model = MarianMTModel(config).eval()
    with torch.no_grad():
        model.get_input_embeddings().weight[pad].zero_()  # opus-mt's pad row is zero (it is the decoder start)
        model.final_logits_bias.normal_(0.0, LOGITS_BIAS_STD, generator=torch.Generator().manual_seed(seed))
    model.generation_config = GenerationConfig(
        bad_words_ids=[[pad]], bos_token_id=eos, decoder_start_token_id=pad, eos_token_id=eos,
        forced_eos_token_id=eos, max_length=min(size.max_positions, 512), num_beams=4, pad_token_id=pad,
        renormalize_logits=True,
    )
    model.save_pretrained(directory)
    files = [str(directory / name) for name in ("source.spm", "target.spm", "vocab.json")]
    tokenizer = MarianTokenizer(*files, source_lang="en", target_lang="de", model_max_length=size.max_positions)
    tokenizer.save_pretrained(directory)
    return directory


def _pad_vocab(vocab: dict[str, int], size: int) -> dict[str, int]:
    """Grows vocab.json to size entries with pieces the sentencepiece model never emits; <pad> stays last."""
    pieces = [p for p in sorted(vocab, key=vocab.get) if p != "<pad>"]
    pieces += [f"▁unused{i}" for i in range(size - len(pieces) - 1)]
    return {piece: i for i, piece in enumerate([*pieces, "<pad>"])}


# -- BART (facebook/bart layout) ---------------------------------------------------------------------------------

BART_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")  # ids 0..3 as in facebook/bart-*; <mask> is the last id


def _train_byte_level_bpe(texts: list[str], vocab: int):
    from tokenizers import ByteLevelBPETokenizer

    tok = ByteLevelBPETokenizer(add_prefix_space=False, trim_offsets=True)
    tok.train_from_iterator(texts, vocab_size=vocab, min_frequency=2, special_tokens=list(BART_SPECIALS),
                            show_progress=False)
    return tok


def build_bart(directory: str | Path, size: HfSize = TINY, seed: int = SEED) -> Path:
    import torch
    from transformers import BartConfig, BartForConditionalGeneration, BartTokenizer, GenerationConfig

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    bpe = _train_byte_level_bpe(training_strings(), size.vocab)
    bpe.save_model(str(directory))  # vocab.json, merges.txt
    tokenizer = BartTokenizer(vocab=str(directory / "vocab.json"), merges=str(directory / "merges.txt"),
                              model_max_length=size.max_positions)
    tokenizer.add_special_tokens({"mask_token": "<mask>"})
    tokenizer.save_pretrained(directory)
    bos, pad, eos = (tokenizer.convert_tokens_to_ids(t) for t in ("<s>", "<pad>", "</s>"))
    config = BartConfig(
        vocab_size=len(tokenizer), d_model=size.d_model, encoder_layers=size.layers, decoder_layers=size.layers,
        encoder_attention_heads=size.heads, decoder_attention_heads=size.heads, encoder_ffn_dim=size.ffn,
        decoder_ffn_dim=size.ffn, max_position_embeddings=size.max_positions, activation_function="gelu",
        scale_embedding=False, pad_token_id=pad, bos_token_id=bos, eos_token_id=eos, decoder_start_token_id=eos,
        forced_bos_token_id=bos, forced_eos_token_id=eos, tie_word_embeddings=True, init_std=size.init_std,
    )
    torch.manual_seed(seed)
    model = BartForConditionalGeneration(config).eval()
    with torch.no_grad():
        model.final_logits_bias.normal_(0.0, LOGITS_BIAS_STD, generator=torch.Generator().manual_seed(seed))
    model.generation_config = GenerationConfig(
        bos_token_id=bos, decoder_start_token_id=eos, eos_token_id=eos, forced_bos_token_id=bos,
        forced_eos_token_id=eos, pad_token_id=pad, num_beams=4, max_length=min(size.max_positions, 62),
        min_length=0, length_penalty=2.0, early_stopping=True, no_repeat_ngram_size=0,
    )
    model.save_pretrained(directory)
    return directory


# -- multilingual: M2M100 (facebook/m2m100 layout) and mBART-50 (facebook/mbart-large-50 layout) -------------------

def _fairseq_vocab(spm_bytes: bytes) -> dict[str, int]:
    """fairseq's dictionary order (M2M100's vocab.json): <s> 0, <pad> 1, </s> 2, <unk> 3, then the pieces."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=spm_bytes)
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    ordered = ["<s>", "<pad>", "</s>", "<unk>"] + [p for p in pieces if p not in ("<unk>", "<s>", "</s>")]
    return {piece: i for i, piece in enumerate(ordered)}


def build_m2m100(directory: str | Path, size: HfSize = TINY, seed: int = SEED) -> Path:
    """M2M100: sentencepiece.bpe.model + vocab.json (fairseq order), 100 language tokens `__xx__` after it, fairseq
    sinusoidal positions, pre-LN, relu; the target language is forced as the first generated token."""
    import torch
    from transformers import GenerationConfig, M2M100Config, M2M100ForConditionalGeneration, M2M100Tokenizer

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    spm_bytes = _train_sentencepiece(training_strings(), size.vocab)
    (directory / "sentencepiece.bpe.model").write_bytes(spm_bytes)
    vocab = _fairseq_vocab(spm_bytes)
    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False, indent=2))
    from transformers.models.m2m_100.tokenization_m2m_100 import FAIRSEQ_LANGUAGE_CODES

    # the language tokens are special, as facebook/m2m100's tokenizer_config.json lists them (transformers 5 does
    # not add them itself)
    tokenizer = M2M100Tokenizer(str(directory / "vocab.json"), str(directory / "sentencepiece.bpe.model"),
                                src_lang="en", tgt_lang="fr", model_max_length=size.max_positions,
                                additional_special_tokens=[f"__{c}__" for c in FAIRSEQ_LANGUAGE_CODES["m2m100"]])
    tokenizer.save_pretrained(directory)
    # The vocabulary ends with the language tokens. (A vocab_size beyond the tokenizer, e.g. for M2M100Tokenizer's
    # num_madeup_words, leaves ids that transformers decodes as "<unk>" and seqserve as nothing; a random model
    # would generate them, a trained one does not.)
    config = M2M100Config(
        vocab_size=len(vocab) + len(tokenizer.lang_code_to_id), d_model=size.d_model,
        encoder_layers=size.layers, decoder_layers=size.layers, encoder_attention_heads=size.heads,
        decoder_attention_heads=size.heads, encoder_ffn_dim=size.ffn, decoder_ffn_dim=size.ffn,
        max_position_embeddings=size.max_positions, activation_function="relu", scale_embedding=True,
        pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, init_std=size.init_std,
        encoder_layerdrop=0.0, decoder_layerdrop=0.0,
    )
    torch.manual_seed(seed)
    model = M2M100ForConditionalGeneration(config).eval()
    model.generation_config = GenerationConfig(bos_token_id=0, decoder_start_token_id=2, eos_token_id=2,
                                               pad_token_id=1, max_length=min(size.max_positions, 200), num_beams=5,
                                               early_stopping=True)
    model.save_pretrained(directory)
    return directory


def _sentencepiece_bpe(texts: list[str], vocab: int) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A BPE over '▁'-marked words, as NLLB's tokenizer.json holds one: (vocab with <s> <pad> </s> <unk> at 0..3,
    merges)."""
    from tokenizers import SentencePieceBPETokenizer

    bpe = SentencePieceBPETokenizer(replacement="▁", add_prefix_space=True)
    bpe.train_from_iterator(texts, vocab_size=vocab, special_tokens=["<s>", "<pad>", "</s>", "<unk>"],
                            show_progress=False)
    model = json.loads(bpe.to_str())["model"]
    return model["vocab"], [tuple(m) for m in model["merges"]]


def build_nllb(directory: str | Path, size: HfSize = TINY, seed: int = SEED, legacy: bool = False) -> Path:
    """NLLB: M2M100's architecture (model_type m2m_100) with NllbTokenizer (a BPE on `tokenizers`, 202 language
    codes `fra_Latn` after the vocabulary, then <mask>); the source language token comes first, or after </s> with
    legacy_behaviour."""
    import torch
    from transformers import GenerationConfig, M2M100Config, M2M100ForConditionalGeneration, NllbTokenizer

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    vocab, merges = _sentencepiece_bpe(training_strings(), size.vocab)
    tokenizer = NllbTokenizer(vocab=vocab, merges=merges, src_lang="eng_Latn", tgt_lang="fra_Latn",
                              legacy_behaviour=legacy, model_max_length=size.max_positions)
    tokenizer.save_pretrained(directory)
    config = M2M100Config(
        vocab_size=len(tokenizer), d_model=size.d_model, encoder_layers=size.layers, decoder_layers=size.layers,
        encoder_attention_heads=size.heads, decoder_attention_heads=size.heads, encoder_ffn_dim=size.ffn,
        decoder_ffn_dim=size.ffn, max_position_embeddings=size.max_positions, activation_function="relu",
        scale_embedding=True, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
        init_std=size.init_std, encoder_layerdrop=0.0, decoder_layerdrop=0.0, tokenizer_class="NllbTokenizer",
    )
    torch.manual_seed(seed)
    model = M2M100ForConditionalGeneration(config).eval()
    model.generation_config = GenerationConfig(bos_token_id=0, decoder_start_token_id=2, eos_token_id=2,
                                               pad_token_id=1, max_length=min(size.max_positions, 200))
    model.save_pretrained(directory)
    return directory


def build_mbart50(directory: str | Path, size: HfSize = TINY, seed: int = SEED) -> Path:
    """mBART-50: sentencepiece.bpe.model converted by transformers' MBart50Tokenizer (fairseq ids, then 52 language
    codes `en_XX`, then <mask>), learned positions + 2, pre-LN with final norms, embedding LayerNorm, gelu."""
    import torch
    from transformers import GenerationConfig, MBart50Tokenizer, MBartConfig, MBartForConditionalGeneration

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "sentencepiece.bpe.model").write_bytes(_train_sentencepiece(training_strings(), size.vocab))
    tokenizer = MBart50Tokenizer.from_pretrained(str(directory), src_lang="en_XX", tgt_lang="ro_RO",
                                                 model_max_length=size.max_positions)
    tokenizer.save_pretrained(directory)
    config = MBartConfig(
        vocab_size=len(tokenizer), d_model=size.d_model, encoder_layers=size.layers, decoder_layers=size.layers,
        encoder_attention_heads=size.heads, decoder_attention_heads=size.heads, encoder_ffn_dim=size.ffn,
        decoder_ffn_dim=size.ffn, max_position_embeddings=size.max_positions, activation_function="gelu",
        scale_embedding=True, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
        forced_eos_token_id=2, init_std=size.init_std, encoder_layerdrop=0.0, decoder_layerdrop=0.0,
    )
    torch.manual_seed(seed)
    model = MBartForConditionalGeneration(config).eval()
    with torch.no_grad():
        model.final_logits_bias.normal_(0.0, LOGITS_BIAS_STD, generator=torch.Generator().manual_seed(seed))
    model.generation_config = GenerationConfig(bos_token_id=0, decoder_start_token_id=2, eos_token_id=2,
                                               forced_eos_token_id=2, pad_token_id=1,
                                               max_length=min(size.max_positions, 200), num_beams=5,
                                               early_stopping=True)
    model.save_pretrained(directory)
    return directory


# Source and target languages the multilingual tests use: the model's own codes
TEST_LANGUAGES = {M2M100: ("en", ("fr", "de", "ja")), NLLB: ("eng_Latn", ("fra_Latn", "deu_Latn", "zho_Hans")),
                  MBART50: ("en_XX", ("fr_XX", "de_DE", "ro_RO"))}

BUILDERS = {MARIAN: build_marian, BART: build_bart, M2M100: build_m2m100, NLLB: build_nllb, MBART50: build_mbart50}


def build(family: str, directory: str | Path, size: HfSize = TINY, seed: int = SEED) -> Path:
    return BUILDERS[family](directory, size, seed)
SIZES = {"tiny": TINY, "base": MARIAN_BASE}


def main(argv: list[str] | None = None) -> int:
    """`python tests/hf_fixtures.py marian DIR --size base`: the benchmark's opus-mt-size random model."""
    import argparse

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("family", choices=FAMILIES)
    p.add_argument("out", help="directory to write the save_pretrained files to")
    p.add_argument("--size", choices=sorted(SIZES), default="tiny")
    p.add_argument("--seed", type=int, default=SEED)
    args = p.parse_args(argv)
    print(build(args.family, args.out, SIZES[args.size], args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
