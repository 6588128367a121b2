"""`seqserve import` of T5's layout (model_type t5, mt5: T5 v1.0, T5 v1.1, Flan-T5, mT5): config.json's keys and
checks, the ModelConfig they become, and the weight names (transformers' modeling_t5.py is the reference).

Decisions: feed_forward_proj "relu" or "gated-gelu" only (other values refused by name); the output head is untied
exactly when model.safetensors stores lm_head.weight (save_pretrained drops a tied one, and transformers unties a
stored one); T5 (not mT5) scales the decoder output by d_model^-0.5 unless config.json says
tie_word_embeddings=false, as transformers does; n_positions (default 512) caps source and target lengths.
"""
from __future__ import annotations

from pathlib import Path

from seqserve.contract.generation import GenerationDefaults
from seqserve.contract.schema import ID, MAX_POSITIONS, MAX_WIDTH, MODEL_CAPS, Int, SchemaError
from seqserve.model.config import ModelConfig
from seqserve.model.hf_weights import TensorEntry

FFN = {"relu": ("relu", False), "gated-gelu": ("gelu_tanh", True)}  # feed_forward_proj -> (activation, gated)
DEFAULT_POSITIONS = 512  # T5's n_positions when config.json has none: the longest source or target served
SIZES = {"vocab_size": MODEL_CAPS["vocab_size"], "d_model": MAX_WIDTH, "d_kv": MAX_WIDTH,
         "d_ff": MODEL_CAPS["d_ff"], "num_layers": MODEL_CAPS["n_encoder_layers"],
         "num_heads": MODEL_CAPS["n_heads"], "relative_attention_num_buckets": MAX_POSITIONS,
         "relative_attention_max_distance": MAX_POSITIONS}
OPTIONAL_SIZES = {"num_decoder_layers": MODEL_CAPS["n_decoder_layers"], "n_positions": MAX_POSITIONS}
LM_HEAD = "lm_head.weight"


def check_config(where: Path, config: dict, error: type[Exception]) -> None:
    """Each value the import reads has its type and each size its cap; the FFN and buckets are ones T5 computes."""
    for key, cap in [*SIZES.items(), *OPTIONAL_SIZES.items()]:
        if config.get(key) is None:
            if key in SIZES:
                raise error(f"{where}: {key} is missing")
            continue
        try:
            Int(1, cap).check(config[key], key)
        except SchemaError as exc:
            raise error(f"{where}: {exc}") from None
    for key in ("pad_token_id", "eos_token_id"):
        try:
            ID.check(config.get(key), key)
        except SchemaError as exc:
            raise error(f"{where}: {exc} (T5 has one end token)") from None
    proj = config.get("feed_forward_proj", "relu")
    if proj not in FFN:
        raise error(f"{where}: feed_forward_proj {proj!r} is not supported; supported: {', '.join(FFN)}")
    eps = config.get("layer_norm_epsilon", 1e-6)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
        raise error(f"{where}: layer_norm_epsilon must be a number in (0, 1), got {eps!r}")
    if not isinstance(config.get("tie_word_embeddings", False), (bool, type(None))):
        raise error(f"{where}: tie_word_embeddings must be true or false, got {config['tie_word_embeddings']!r}")
    buckets, distance = config["relative_attention_num_buckets"], config["relative_attention_max_distance"]
    if buckets < 4 or distance <= buckets // 2:  # the bucket formula's log needs max_distance > its exact buckets
        raise error(f"{where}: relative_attention_num_buckets={buckets} and relative_attention_max_distance="
                    f"{distance}: T5's buckets need at least 4 buckets and a max_distance above half of them")


def model_config(where: Path, model_type: str, config: dict, unk_id: int, generation: GenerationDefaults,
                 weight_names: set[str], error: type[Exception]) -> ModelConfig:
    """The ModelConfig of a checked T5 config.json (weight_names: the tensors the weight files hold)."""
    if generation.eos_token_id != config["eos_token_id"]:
        raise error(f"{where.parent / 'generation_config.json'}: eos_token_id={generation.eos_token_id} differs "
                    f"from config.json's {config['eos_token_id']}; seqserve's model has one end token")
    activation, gated = FFN[config.get("feed_forward_proj", "relu")]
    start = generation.decoder_start_token_id
    try:
        return ModelConfig(
            vocab_size=config["vocab_size"], d_model=config["d_model"], n_heads=config["num_heads"],
            n_encoder_layers=config["num_layers"], n_decoder_layers=config.get("num_decoder_layers") or
            config["num_layers"], d_ff=config["d_ff"], dropout=0.0,
            max_positions=config.get("n_positions") or DEFAULT_POSITIONS, norm_first=True, tie_embeddings=True,
            tie_output=LM_HEAD not in weight_names, positions="relative", embed_norm=False, activation=activation,
            scale_embeddings=False, final_logits_bias=False, pad_id=config["pad_token_id"], bos_id=start,
            eos_id=config["eos_token_id"], unk_id=unk_id, decoder_start_id=start, d_kv=config["d_kv"], bias=False,
            norm="rms", norm_eps=float(config.get("layer_norm_epsilon", 1e-6)), scale_attention=False,
            gated_ffn=gated, relative_buckets=config["relative_attention_num_buckets"],
            relative_max_distance=config["relative_attention_max_distance"],
            scale_output=model_type == "t5" and config.get("tie_word_embeddings") is not False)
    except (TypeError, ValueError) as exc:
        raise error(f"{where}: {exc}") from None


def elements(cfg: ModelConfig) -> int:
    """The values Transformer(cfg) takes from the weight files, known from the config alone."""
    width, inner, ff = cfg.d_model, cfg.n_heads * cfg.head_dim, cfg.d_ff
    attention, ffn = 4 * width * inner, (2 + cfg.gated_ffn) * width * ff
    layers = cfg.n_encoder_layers * (attention + ffn + 2 * width) + cfg.n_decoder_layers * (
        2 * attention + ffn + 3 * width)
    heads = 2 * cfg.relative_buckets * cfg.n_heads
    return cfg.vocab_size * width * (1 + (not cfg.tie_output)) + layers + heads + 2 * width


def check_size(where: Path, cfg: ModelConfig, headers: dict[Path, list[TensorEntry]], error: type[Exception]) -> None:
    """Sizes that multiply to more weights than the files hold are refused before the model is built."""
    held = sum(entry.numel for entries in headers.values() for entry in entries)
    if elements(cfg) > held:
        raise error(f"{where}: vocab_size={cfg.vocab_size}, d_model={cfg.d_model}, d_kv={cfg.head_dim}, "
                    f"num_heads={cfg.n_heads}, d_ff={cfg.d_ff}, num_layers={cfg.n_encoder_layers} and "
                    f"num_decoder_layers={cfg.n_decoder_layers} describe {elements(cfg):,} weights; the weight "
                    f"files hold {held:,} values")


def hf_names(cfg: ModelConfig) -> dict[str, list[str]]:
    """Our state-dict name -> the T5 names that may hold it (first present wins; tied aliases listed)."""
    names = {"src_embed.weight": ["shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight"]
             + ([LM_HEAD] if cfg.tie_output else [])}
    if not cfg.tie_output:
        names["out_proj.weight"] = [LM_HEAD]
    for ours, stack in (("enc", "encoder"), ("dec", "decoder")):
        names[f"{ours}_relative.embedding.weight"] = [
            f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"]
        names[f"{ours}_norm.weight"] = [f"{stack}.final_layer_norm.weight"]
    ffn = {"w1": "wi_0", "w3": "wi_1", "w2": "wo"} if cfg.gated_ffn else {"w1": "wi", "w2": "wo"}
    blocks = {"encoder": [("self_attn", "res_attn", "SelfAttention"), ("ffn", "res_ffn", "DenseReluDense")],
              "decoder": [("self_attn", "res_self", "SelfAttention"), ("cross_attn", "res_cross", "EncDecAttention"),
                          ("ffn", "res_ffn", "DenseReluDense")]}
    for stack, n in (("encoder", cfg.n_encoder_layers), ("decoder", cfg.n_decoder_layers)):
        for i in range(n):
            for j, (ours, norm, theirs) in enumerate(blocks[stack]):
                hf = f"{stack}.block.{i}.layer.{j}"
                names[f"{stack}.{i}.{norm}.norm.weight"] = [f"{hf}.layer_norm.weight"]
                subs = ffn.items() if ours == "ffn" else [(f"{p}_proj", p) for p in "qkvo"]
                for o, t in subs:
                    names[f"{stack}.{i}.{ours}.{o}.weight"] = [f"{hf}.{theirs}.{t}.weight"]
    return names
