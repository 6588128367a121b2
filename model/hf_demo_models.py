"""Tiny random-weight Hugging Face models in `save_pretrained` form, one builder per family (model/hf_demo.py is the
table): config.json, generation_config.json, model.safetensors and the tokenizer files of a model laid out like
opus-mt (Marian), facebook/bart (BART), facebook/m2m100, facebook/nllb-200 or facebook/mbart-large-50, with a
tokenizer trained here: sentencepiece for Marian, M2M100 and mBART-50, a BPE from `tokenizers` for NLLB, a byte-level
BPE for BART. Seeded and deterministic; TINY builds in seconds, MARIAN_BASE is opus-mt's size (benchmarks).
"""
from __future__ import annotations

import json
from pathlib import Path

from seqserve.model.hf_demo_parts import (
    LOGITS_BIAS_STD, SEED, TINY, HfSize, fairseq_vocab, marian_vocab, pad_vocab, sentencepiece_bpe,
    train_byte_level_bpe, train_sentencepiece, training_strings)


def build_marian(directory: str | Path, size: HfSize = TINY, seed: int = SEED) -> Path:
    import torch
    from transformers import GenerationConfig, MarianConfig, MarianMTModel, MarianTokenizer

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    spm_bytes = train_sentencepiece(training_strings(), min(size.vocab, TINY.vocab))
    for name in ("source.spm", "target.spm"):  # one joint model, as many opus-mt pairs ship
        (directory / name).write_bytes(spm_bytes)
    vocab = marian_vocab(spm_bytes)
    if size.vocab > len(vocab):  # a benchmark model: pad the vocabulary to its size with pieces never emitted
        vocab = pad_vocab(vocab, size.vocab)
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


def build_bart(directory: str | Path, size: HfSize = TINY, seed: int = SEED) -> Path:
    import torch
    from transformers import BartConfig, BartForConditionalGeneration, BartTokenizer, GenerationConfig

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    bpe = train_byte_level_bpe(training_strings(), size.vocab)
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


def build_m2m100(directory: str | Path, size: HfSize = TINY, seed: int = SEED) -> Path:
    """M2M100: sentencepiece.bpe.model + vocab.json (fairseq order), 100 language tokens `__xx__` after it, fairseq
    sinusoidal positions, pre-LN, relu; the target language is forced as the first generated token."""
    import torch
    from transformers import GenerationConfig, M2M100Config, M2M100ForConditionalGeneration, M2M100Tokenizer

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    spm_bytes = train_sentencepiece(training_strings(), size.vocab)
    (directory / "sentencepiece.bpe.model").write_bytes(spm_bytes)
    vocab = fairseq_vocab(spm_bytes)
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


def build_nllb(directory: str | Path, size: HfSize = TINY, seed: int = SEED, legacy: bool = False) -> Path:
    """NLLB: M2M100's architecture (model_type m2m_100) with NllbTokenizer (a BPE on `tokenizers`, 202 language
    codes `fra_Latn` after the vocabulary, then <mask>); the source language token comes first, or after </s> with
    legacy_behaviour."""
    import torch
    from transformers import GenerationConfig, M2M100Config, M2M100ForConditionalGeneration, NllbTokenizer

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    vocab, merges = sentencepiece_bpe(training_strings(), size.vocab)
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
    (directory / "sentencepiece.bpe.model").write_bytes(train_sentencepiece(training_strings(), size.vocab))
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

