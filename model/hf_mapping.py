"""The Hugging Face weights of a BART-layout family (Marian, BART, mBART, M2M100) by our state-dict names, and the
one mapping of any family's tensors into our Transformer (every tensor used exactly once, shapes checked)."""
from __future__ import annotations

from pathlib import Path

import torch

from seqserve.model import checkpoint as ck
from seqserve.model.config import ModelConfig
from seqserve.model.hf_weights import HF_WEIGHTS
from seqserve.model.transformer import Transformer

HF_CONFIG = "config.json"


class ImportRefused(ValueError):
    """A directory `seqserve import` cannot turn into a checkpoint; the message names the file and the field."""


def bart_names(cfg: ModelConfig) -> dict[str, list[str]]:
    """Our state-dict name -> the Hugging Face names that may hold it (first present wins; names without
    "model."). Tied weights list every alias, since save_pretrained keeps only one of them."""
    emb = ["shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight"]
    names: dict[str, list[str]] = {
        "src_embed.weight": emb if cfg.tie_embeddings else ["encoder.embed_tokens.weight", "shared.weight"]}
    if not cfg.tie_embeddings:
        names["tgt_embed.weight"] = ["decoder.embed_tokens.weight"] + (["lm_head.weight"] if cfg.tie_output else [])
    if not cfg.tie_output:
        names["out_proj.weight"] = ["lm_head.weight"]
    names["final_logits_bias"] = ["final_logits_bias"]
    if cfg.positions == "learned":
        names["positions.table"] = ["encoder.embed_positions.weight"]
        names["tgt_positions.table"] = ["decoder.embed_positions.weight"]
    for ours, theirs in (("src_embed_norm", "encoder.layernorm_embedding"), ("tgt_embed_norm",
                         "decoder.layernorm_embedding"), ("enc_norm", "encoder.layer_norm"),
                         ("dec_norm", "decoder.layer_norm")):
        if (cfg.embed_norm if "embed" in ours else cfg.norm_first):
            for p in ("weight", "bias"):
                names[f"{ours}.{p}"] = [f"{theirs}.{p}"]
    blocks = {"encoder": {"self_attn": "self_attn", "res_attn.norm": "self_attn_layer_norm", "ffn.w1": "fc1",
                          "ffn.w2": "fc2", "res_ffn.norm": "final_layer_norm"},
              "decoder": {"self_attn": "self_attn", "res_self.norm": "self_attn_layer_norm",
                          "cross_attn": "encoder_attn", "res_cross.norm": "encoder_attn_layer_norm", "ffn.w1": "fc1",
                          "ffn.w2": "fc2", "res_ffn.norm": "final_layer_norm"}}
    for stack, n in (("encoder", cfg.n_encoder_layers), ("decoder", cfg.n_decoder_layers)):
        for i in range(n):
            for ours, theirs in blocks[stack].items():
                subs = ([("q_proj", "q_proj"), ("k_proj", "k_proj"), ("v_proj", "v_proj"), ("o_proj", "out_proj")]
                        if ours.endswith("attn") else [("", "")])
                for o, t in subs:
                    for p in ("weight", "bias"):
                        a = ".".join(x for x in (f"{stack}.{i}.{ours}", o, p) if x)
                        names[a] = [".".join(x for x in (f"{stack}.layers.{i}.{theirs}", t, p) if x)]
    return names


IGNORED = ("encoder.embed_positions.weight", "decoder.embed_positions.weight")  # sinusoid tables are computed


def map_weights(hf_dir: Path, cfg: ModelConfig, tensors: dict[str, torch.Tensor],
                names: dict[str, list[str]], prefix: str = "model.") -> Transformer:
    """Our Transformer with the Hugging Face weights (every tensor used exactly once, shapes checked); prefix: what
    the family's files put before the names (BART's "model.", none in T5's)."""
    model = Transformer(cfg).eval()
    where = hf_dir / HF_WEIGHTS
    expected = model.state_dict()
    state, used = {}, set()
    for ours, candidates in names.items():
        present = [c for c in candidates if c in tensors]
        if not present:
            if ours == "final_logits_bias":  # HF creates it as zeros when a checkpoint lacks it
                state[ours] = torch.zeros(cfg.vocab_size)
                continue
            raise ImportRefused(f"{where}: tensor {prefix + candidates[0]!r} is missing")
        value = tensors[present[0]].reshape(expected[ours].shape) if ours == "final_logits_bias" else \
            tensors[present[0]]
        for alias in present[1:]:  # a tied copy that save_pretrained kept must hold the same numbers
            if not torch.equal(tensors[alias], value):
                raise ImportRefused(f"{where}: {alias} differs from {present[0]}, but {HF_CONFIG} ties them")
        if tuple(value.shape) != tuple(expected[ours].shape):
            raise ImportRefused(f"{where}: {present[0]} has shape {tuple(value.shape)}, the config implies "
                                f"{tuple(expected[ours].shape)}")
        state[ours] = value
        used.update(present)
    left = sorted(k for k in set(tensors) - used if k not in IGNORED or cfg.positions == "learned")
    if left:
        raise ImportRefused(f"{where}: tensor(s) {left[:5]} have no place in a {cfg.positions}-position "
                            f"seqserve model (an architecture option it cannot honour)")
    missing, unexpected = model.load_state_dict(state, strict=False)
    if set(missing) - ck.tied_names(model) or unexpected:
        raise ImportRefused(f"{where}: missing {sorted(set(missing) - ck.tied_names(model))}, unexpected "
                            f"{sorted(unexpected)}")
    return model
