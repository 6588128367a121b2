"""Architectures beside tests/hf_fixtures.py's Marian and BART, built from them (same tokenizers and sizes):
mBART (pre-LN with final LayerNorms, scaled embeddings) and a Marian with separate source, target and output
embeddings."""
from __future__ import annotations

from pathlib import Path

import hf_fixtures
import torch


def _replace_weights(directory: Path, model) -> Path:
    for f in directory.glob("*.safetensors"):
        f.unlink()
    model.save_pretrained(directory)
    return directory


def mbart(directory: Path) -> Path:
    from transformers import BartConfig, MBartConfig, MBartForConditionalGeneration

    hf_fixtures.build_bart(directory)  # tokenizer and generation_config.json
    bart = BartConfig.from_pretrained(directory).to_dict()
    keep = {k: bart[k] for k in ("vocab_size", "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads",
                                 "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim", "init_std",
                                 "max_position_embeddings", "pad_token_id", "bos_token_id", "eos_token_id",
                                 "decoder_start_token_id", "forced_eos_token_id")}
    torch.manual_seed(hf_fixtures.SEED)
    model = MBartForConditionalGeneration(MBartConfig(**keep, activation_function="gelu", scale_embedding=True)).eval()
    with torch.no_grad():
        model.final_logits_bias.normal_(0.0, hf_fixtures.LOGITS_BIAS_STD)
    return _replace_weights(directory, model)


def marian_untied(directory: Path) -> Path:
    from transformers import MarianConfig, MarianMTModel

    hf_fixtures.build_marian(directory)
    config = MarianConfig.from_pretrained(directory)
    config.share_encoder_decoder_embeddings = config.tie_word_embeddings = False
    torch.manual_seed(hf_fixtures.SEED + 1)
    model = MarianMTModel(config).eval()
    with torch.no_grad():
        for embedding in (model.model.encoder.embed_tokens, model.model.decoder.embed_tokens):
            embedding.weight[config.pad_token_id].zero_()
    return _replace_weights(directory, model)
