"""A seqserve checkpoint as a CTranslate2 Transformer model: a speed reference and an independent check of decoding.

The spec is CTranslate2's own encoder-decoder Transformer (ctranslate2.specs.TransformerSpec), set to our
architecture: post-LN or pre-LN (`norm_first`), ReLU FFN, embeddings scaled by sqrt(d_model), our LayerNorm
epsilon, start token <s>, end token </s>. One float32 model directory serves both precisions: CTranslate2
quantises to int8 when a Translator loads it with compute_type="int8".

Our sinusoid table interleaves sin/cos (PE(pos, 2i) = sin, PE(pos, 2i+1) = cos) while CTranslate2's built-in table
concatenates [sin..., cos...], so the converter writes our table into the position encoder explicitly.

Running a converted model lives in export/ctranslate2_greedy.py: ctranslate2.specs and .converters import torch,
plain `import ctranslate2` does not, and the benchmark measures a torch-free process.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from ctranslate2.converters import Converter
from ctranslate2.converters.utils import fuse_linear
from ctranslate2.specs import common_spec, transformer_spec
from tokenizers import Tokenizer

from seqserve.contract.tokenizer import BOS, EOS, UNK
from seqserve.model.checkpoint import load_checkpoint
from seqserve.model.config import ModelConfig
from seqserve.model.transformer import Transformer


def _array(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().numpy().copy()


def _linear(spec: common_spec.LinearSpec, layer: torch.nn.Linear) -> common_spec.LinearSpec:
    spec.weight = _array(layer.weight)  # (out, in): CTranslate2 stores torch's layout
    if layer.bias is not None:
        spec.bias = _array(layer.bias)
    return spec


def _norm(spec: common_spec.LayerNormSpec, norm: torch.nn.LayerNorm) -> None:
    spec.gamma, spec.beta = _array(norm.weight), _array(norm.bias)


def _attention(spec, attn, norm: torch.nn.LayerNorm, self_attention: bool) -> None:
    # Self-attention: one fused [Q; K; V] projection; cross-attention: Q, then a fused [K; V] over the memory.
    k, v = (_linear(common_spec.LinearSpec(), p) for p in (attn.k_proj, attn.v_proj))
    if self_attention:
        fuse_linear(spec.linear[0], [_linear(common_spec.LinearSpec(), attn.q_proj), k, v])
    else:
        _linear(spec.linear[0], attn.q_proj)
        fuse_linear(spec.linear[1], [k, v])
    _linear(spec.linear[-1], attn.o_proj)
    _norm(spec.layer_norm, norm)  # post-LN: applied after the residual; pre-LN: before the sublayer


def _ffn(spec, ffn, norm: torch.nn.LayerNorm) -> None:
    _linear(spec.linear_0, ffn.w1)
    _linear(spec.linear_1, ffn.w2)
    _norm(spec.layer_norm, norm)


def _inputs(spec, embedding: torch.nn.Embedding, model: Transformer) -> None:
    target = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings  # the encoder has a list
    target.weight = _array(embedding.weight)  # (V, D)
    spec.scale_embeddings = True  # x * sqrt(d_model) before adding positions (paper 3.4)
    spec.position_encodings.encodings = _array(model.positions.table)  # (P, D) our interleaved sin/cos


def transformer_spec_of(model: Transformer, tokenizer: Tokenizer) -> transformer_spec.TransformerSpec:
    """Our weights in CTranslate2's Transformer spec, vocabularies and special tokens registered."""
    cfg = model.cfg
    seeds = ModelConfig(vocab_size=cfg.vocab_size)
    differ = [k for k in ("positions", "embed_norm", "activation", "scale_embeddings", "final_logits_bias")
              if getattr(cfg, k) != getattr(seeds, k)]  # ties need no check: every weight is written out
    if differ or cfg.decoder_start_id != cfg.bos_id:  # an imported model: CTranslate2's own converter reads it
        raise ValueError(f"this converter takes the seeds' architecture; the model differs in {differ or ['start']} "
                         "(convert a Hugging Face directory with ctranslate2.converters.TransformersConverter)")
    spec = transformer_spec.TransformerSpec.from_config(
        (cfg.n_encoder_layers, cfg.n_decoder_layers), cfg.n_heads, pre_norm=cfg.norm_first,
        activation=common_spec.Activation.RELU)
    enc, dec = spec.encoder, spec.decoder
    _inputs(enc, model.src_embed, model)
    _inputs(dec, model.tgt_embed, model)
    for layer_spec, layer in zip(enc.layer, model.encoder):
        _attention(layer_spec.self_attention, layer.self_attn, layer.res_attn.norm, self_attention=True)
        _ffn(layer_spec.ffn, layer.ffn, layer.res_ffn.norm)
    for layer_spec, layer in zip(dec.layer, model.decoder):
        _attention(layer_spec.self_attention, layer.self_attn, layer.res_self.norm, self_attention=True)
        _attention(layer_spec.attention, layer.cross_attn, layer.res_cross.norm, self_attention=False)
        _ffn(layer_spec.ffn, layer.ffn, layer.res_ffn.norm)
    if cfg.norm_first:  # pre-LN's final LayerNorm on each stack; post-LN has none (from_config leaves it out)
        _norm(enc.layer_norm, model.enc_norm)
        _norm(dec.layer_norm, model.dec_norm)
    _linear(dec.projection, model.out_proj)
    tokens = vocabulary(tokenizer)
    spec.register_source_vocabulary(tokens)
    spec.register_target_vocabulary(tokens)
    spec.config.layer_norm_epsilon = next(m.eps for m in model.modules() if isinstance(m, torch.nn.LayerNorm))
    spec.config.unk_token, spec.config.bos_token, spec.config.eos_token = UNK, BOS, EOS
    spec.config.decoder_start_token = BOS  # our decoder starts from <s> at position 0
    spec.config.add_source_bos = spec.config.add_source_eos = False  # our encodings already end with </s>
    return spec


def vocabulary(tokenizer: Tokenizer) -> list[str]:
    """Token strings in id order (CTranslate2 maps tokens to ids by their index in this list)."""
    by_id = {i: t for t, i in tokenizer.get_vocab(with_added_tokens=True).items()}
    if sorted(by_id) != list(range(len(by_id))):
        raise ValueError("tokenizer ids are not contiguous from 0; cannot build a CTranslate2 vocabulary")
    return [by_id[i] for i in range(len(by_id))]


class SeqserveConverter(Converter):
    """ctranslate2.converters.Converter for a seqserve checkpoint directory."""

    def __init__(self, checkpoint: str | Path) -> None:
        self.checkpoint = Path(checkpoint)

    def _load(self) -> transformer_spec.TransformerSpec:
        model, tokenizer = load_checkpoint(self.checkpoint)
        return transformer_spec_of(model, tokenizer)


def convert(checkpoint: str | Path, out: str | Path) -> Path:
    """Writes a float32 CTranslate2 model directory (model.bin, vocabularies, config.json) to out, replacing it."""
    return Path(SeqserveConverter(checkpoint).convert(str(out), force=True))
