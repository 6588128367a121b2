"""Tiny random-weight Hugging Face Marian and BART directories (save_pretrained form) with tokenizers trained here.

Interim helper until tests/hf_fixtures.py lands: the tokenizer is a `tokenizers` file written into the directory.
"""
from __future__ import annotations

import random
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from seqserve.model.corpus import CorpusConfig, generate_splits


def sentences(n: int, seed: int = 0) -> list[str]:
    """Real multilingual text: number verbalisations (words, accents) from the default corpus, distinct."""
    pairs = generate_splits(CorpusConfig(n_train=4 * n, n_valid=0, n_test=0, seed=seed))["train"]
    out = list(dict.fromkeys(target for _, target in pairs))
    random.Random(seed).shuffle(out)
    return out[:n]


def _bpe(texts: list[str], specials: list[str], vocab: int) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials, show_progress=False,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def _randomise(model: torch.nn.Module, seed: int) -> None:
    """Larger weights than HF's init (std 0.02) so logits are far apart: argmax never rests on a rounding error."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" in name and p.requires_grad is False:
                continue
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 if p.dim() > 1 else 0.2) + (1.0 if "norm" in name and
                                                                                         name.endswith("weight")
                                                                                         else 0.0))
        for name, b in model.named_buffers():
            if name.endswith("final_logits_bias"):
                b.copy_(torch.randn(b.shape, generator=g) * 0.5)


def marian(directory: Path, seed: int = 0) -> Path:
    from transformers import GenerationConfig, MarianConfig, MarianMTModel

    texts = sentences(400, seed + 1)
    tok = _bpe(texts, ["</s>", "<unk>"], 300)
    pad = tok.get_vocab_size()
    tok.add_special_tokens(["<pad>"])  # last id, as in opus-mt
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 0)])
    vocab = tok.get_vocab_size()
    cfg = MarianConfig(vocab_size=vocab, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                       decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
                       activation_function="swish", scale_embedding=True, pad_token_id=pad, eos_token_id=0,
                       decoder_start_token_id=pad, forced_eos_token_id=0, bos_token_id=None)
    torch.manual_seed(seed)
    model = MarianMTModel(cfg).eval()
    _randomise(model, seed)
    with torch.no_grad():
        model.model.shared.weight[pad] = 0  # from_pretrained's padding row
        model.final_logits_bias[0, pad] = 4.0  # <pad> would often win: bad_words_ids=[[pad]] must ban it
    model.generation_config = GenerationConfig(bad_words_ids=[[pad]], decoder_start_token_id=pad, eos_token_id=0,
                                               forced_eos_token_id=0, max_length=64, num_beams=4, pad_token_id=pad,
                                               bos_token_id=0)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tok.save(str(directory / "tokenizer.json"))
    return directory


def bart(directory: Path, seed: int = 0) -> Path:
    from transformers import BartConfig, BartForConditionalGeneration, GenerationConfig

    texts = sentences(400, seed + 1)
    tok = _bpe(texts, ["<s>", "<pad>", "</s>", "<unk>"], 300)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    vocab = tok.get_vocab_size()
    cfg = BartConfig(vocab_size=vocab, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                     decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
                     activation_function="gelu", pad_token_id=1, bos_token_id=0, eos_token_id=2,
                     decoder_start_token_id=2, forced_eos_token_id=2)
    torch.manual_seed(seed)
    model = BartForConditionalGeneration(cfg).eval()
    _randomise(model, seed)
    model.generation_config = GenerationConfig(decoder_start_token_id=2, eos_token_id=2, forced_bos_token_id=0,
                                               forced_eos_token_id=2, max_length=64, num_beams=4, pad_token_id=1,
                                               bos_token_id=0, length_penalty=2.0)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tok.save(str(directory / "tokenizer.json"))
    return directory
