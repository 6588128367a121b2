"""A seqserve checkpoint's own weights in a transformers MarianMTModel: the `transformers-marian` benchmark rows.

`seqserve bench --shape base|small` (and `--transformers` on a trained checkpoint) runs transformers' `generate` on
the very weights the engine's bundle was exported from, on the same device, as the speed anchor a user would reach
for. The mapping is exact, not a look-alike: every tensor of the checkpoint lands in one MarianMTModel parameter
(model/hf_import.py's name table, read backwards), and Marian's sinusoid tables are overwritten with the checkpoint's
own (seqserve's shapes interleave sin and cos, Marian puts them in halves), so greedy decoding gives the engine's
tokens. A checkpoint Marian's architecture cannot compute (pre-LN, an embedding LayerNorm, learned or fairseq
positions, untied embeddings) is refused with the reason, and its rows are skipped.
"""
from __future__ import annotations

from pathlib import Path

from seqserve.model.checkpoint import CONFIG, load_model, tied_names
from seqserve.model.config import ModelConfig
from seqserve.model.hf_mapping import bart_names

MODEL_PREFIX = "model."  # MarianMTModel's state-dict names, but lm_head and final_logits_bias, start with it
MARIAN_POSITIONS = ("sinusoidal", "sinusoidal_halves")  # a fixed sinusoid table: Marian's embed_positions holds it


def refusal(cfg: ModelConfig) -> str | None:
    """Why a MarianMTModel cannot compute this checkpoint's model, or None when it can."""
    problems = [why for bad, why in (
        (cfg.positions not in MARIAN_POSITIONS, f"{cfg.positions} positions (Marian's are a fixed sinusoid table)"),
        (cfg.norm_first, "pre-LN layers (Marian is post-LN)"),
        (cfg.embed_norm, "an embedding LayerNorm (Marian has none)"),
        (not cfg.tie_embeddings or not cfg.tie_output, "untied embeddings (Marian shares one table)"),
    ) if bad]
    return "; ".join(problems) or None


def marian_config(cfg: ModelConfig):
    from transformers import MarianConfig

    return MarianConfig(
        vocab_size=cfg.vocab_size, decoder_vocab_size=cfg.vocab_size, d_model=cfg.d_model,
        encoder_layers=cfg.n_encoder_layers, decoder_layers=cfg.n_decoder_layers,
        encoder_attention_heads=cfg.n_heads, decoder_attention_heads=cfg.n_heads, encoder_ffn_dim=cfg.d_ff,
        decoder_ffn_dim=cfg.d_ff, activation_function=cfg.activation, max_position_embeddings=cfg.max_positions,
        scale_embedding=cfg.scale_embeddings, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
        pad_token_id=cfg.pad_id, eos_token_id=cfg.eos_id, bos_token_id=cfg.bos_id,
        decoder_start_token_id=cfg.decoder_start_id, forced_eos_token_id=None,  # MarianConfig's default forces 0
        share_encoder_decoder_embeddings=True, tie_word_embeddings=True)


def generation_config(cfg: ModelConfig):
    """Plain greedy/beam decoding under the checkpoint's ids: no forced, banned or renormalised tokens (the engine
    applies none for a checkpoint without generation.json)."""
    from transformers import GenerationConfig

    return GenerationConfig(decoder_start_token_id=cfg.decoder_start_id, eos_token_id=cfg.eos_id,
                            pad_token_id=cfg.pad_id, bos_token_id=cfg.bos_id)


def load(checkpoint: str | Path):
    """The checkpoint's model as a MarianMTModel in eval mode, fp32 on the CPU (every parameter set, see the module
    docstring); raises ValueError naming the checkpoint when refusal() has a reason."""
    import torch
    from transformers import MarianMTModel

    checkpoint = Path(checkpoint)
    cfg = ModelConfig.load(checkpoint / CONFIG)
    why = refusal(cfg)
    if why:
        raise ValueError(f"{checkpoint / CONFIG}: a transformers MarianMTModel cannot compute this model: {why}")
    ours = load_model(checkpoint)
    theirs = {hf: name for name, candidates in bart_names(cfg).items() for hf in candidates}
    own = ours.state_dict()
    table = ours.positions.table  # (P, D): the checkpoint's own sinusoids, whatever their layout
    model = MarianMTModel(marian_config(cfg)).eval()
    state, used = {}, set()
    for key, target in model.state_dict().items():
        short = key.removeprefix(MODEL_PREFIX)
        if short.endswith("embed_positions.weight"):
            value = table
        elif short == "final_logits_bias":
            value = own["final_logits_bias"] if cfg.final_logits_bias else torch.zeros(cfg.vocab_size)
        elif short in theirs:
            value = own[theirs[short]]
            used.add(theirs[short])
        else:
            raise ValueError(f"{checkpoint}: MarianMTModel parameter {key} has no seqserve counterpart")
        state[key] = value.reshape(target.shape).to(target.dtype)
    left = set(own) - used - tied_names(ours) - {"final_logits_bias"}
    if left:
        raise ValueError(f"{checkpoint}: tensor(s) {sorted(left)[:5]} have no place in a MarianMTModel")
    model.load_state_dict(state, strict=True)
    model.generation_config = generation_config(cfg)
    return model
