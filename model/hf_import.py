"""`seqserve import`: a Hugging Face model directory (save_pretrained form) -> a seqserve checkpoint.

Reads config.json, generation_config.json (contract/generation.py), model.safetensors (or its shards) and the
tokenizer files (model/hf_tokenizer.py); writes config.json (ModelConfig with the family's architecture options),
model.safetensors (our names), tokenizer.json (one Hugging Face `tokenizers` file), generation.json (the model's
GenerationDefaults) and metrics.json (what was imported: the file a finished checkpoint has). Weights are read with
safetensors only: nothing loads a pickle, and transformers is not needed here (checks/hf_parity.py compares against
it).

Every refusal is an ImportRefused (a ValueError: `seqserve import` exits 2) naming the file and the field.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch
from safetensors import safe_open
from tqdm import tqdm

from seqserve.contract.generation import GenerationConfigError, GenerationDefaults
from seqserve.contract.generation import load as load_generation
from seqserve.contract.jsonfile import read_object
from seqserve.contract.languages import LANGUAGES_FILE, Languages
from seqserve.model import checkpoint as ck
from seqserve.model.config import ModelConfig
from seqserve.model.hf_families import FAMILIES
from seqserve.model.hf_tokenizer import TokenizerImportError, convert_multilingual, unk_token
from seqserve.model.transformer import Transformer

HF_CONFIG, HF_GENERATION, HF_WEIGHTS = "config.json", "generation_config.json", "model.safetensors"
HF_WEIGHTS_INDEX = "model.safetensors.index.json"  # sharded weights
PICKLES = ("pytorch_model.bin", "pytorch_model.bin.index.json")
PROGRESS_MIN_BYTES = 100 << 20  # show a progress bar when the weights are at least this large
CONVERT_HINT = ("convert it once with transformers: AutoModelForSeq2SeqLM.from_pretrained(d)"
                ".save_pretrained(d, safe_serialization=True)")


class ImportRefused(ValueError):
    """A directory `seqserve import` cannot turn into a checkpoint; the message names the file and the field."""


ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "silu": "silu", "swish": "silu"}


def _read_json(path: Path) -> dict:
    return read_object(path, ImportRefused, "missing (a Hugging Face model directory as save_pretrained writes it)")


def read_hf_config(hf_dir: Path) -> tuple[str, dict]:
    config = _read_json(hf_dir / HF_CONFIG)
    model_type = config.get("model_type")
    if model_type not in FAMILIES:
        raise ImportRefused(f"{hf_dir / HF_CONFIG}: model_type {model_type!r} is not supported; supported: "
                            f"{', '.join(FAMILIES)}")
    return model_type, config


def model_config(hf_dir: Path, model_type: str, config: dict, unk_id: int,
                 generation: GenerationDefaults) -> ModelConfig:
    """The ModelConfig of a Hugging Face config.json (every option checked: what we cannot honour is refused)."""
    where = hf_dir / HF_CONFIG
    family = FAMILIES[model_type]

    def need(key: str):
        if config.get(key) is None:
            raise ImportRefused(f"{where}: {key} is missing")
        return config[key]

    for key, want in [("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim")]:
        if need(key) != need(want):
            raise ImportRefused(f"{where}: {key}={config[key]} differs from {want}={config[want]}; seqserve's "
                                "encoder and decoder share one width")
    for key, want in family.legacy.items():  # transformers 5 ignores these; a value that disagrees is a model
        if config.get(key) is not None and config[key] != want:  # the family's class would not compute
            raise ImportRefused(f"{where}: {key}={config[key]!r} is not supported for model_type {model_type} "
                                f"(its architecture has {key}={want})")
    activation = need("activation_function")
    if activation not in ACTIVATIONS:
        raise ImportRefused(f"{where}: activation_function {activation!r} is not supported; supported: "
                            f"{', '.join(ACTIVATIONS)}")
    vocab = need("vocab_size")
    if config.get("decoder_vocab_size") not in (None, vocab):
        raise ImportRefused(f"{where}: decoder_vocab_size={config['decoder_vocab_size']} differs from "
                            f"vocab_size={vocab}; seqserve's source and target share one vocabulary")
    for key in ("encoder_layerdrop", "decoder_layerdrop"):  # training-only, but say so if a value is odd
        if not isinstance(config.get(key, 0.0), (int, float)):
            raise ImportRefused(f"{where}: {key} must be a number")
    eos = _single_id(where, "eos_token_id", need("eos_token_id"))
    pad = need("pad_token_id")
    start = generation.decoder_start_token_id  # generation_config.json's, else config.json's
    if generation.eos_token_id != eos:
        raise ImportRefused(f"{hf_dir / HF_GENERATION}: eos_token_id={generation.eos_token_id} differs from "
                            f"{HF_CONFIG}'s {eos}; seqserve's model has one end token")
    bos = config.get("bos_token_id")
    if bos is None or bos in (eos, unk_id):  # Marian has no <s>: its start token stands for one
        bos = start
    tie_embeddings = bool(config.get("share_encoder_decoder_embeddings", True))  # BART always shares
    try:
        return ModelConfig(
            vocab_size=vocab, d_model=need("d_model"), n_heads=need("encoder_attention_heads"),
            n_encoder_layers=need("encoder_layers"), n_decoder_layers=need("decoder_layers"),
            d_ff=need("encoder_ffn_dim"), dropout=0.0, max_positions=need("max_position_embeddings"),
            norm_first=family.norm_first, tie_embeddings=tie_embeddings,
            tie_output=bool(config.get("tie_word_embeddings", True)), positions=family.positions,
            position_offset=pad + 1 if family.offset_after_pad else family.position_offset,
            embed_norm=family.embed_norm,
            activation=ACTIVATIONS[activation], scale_embeddings=bool(config.get("scale_embedding", False)),
            final_logits_bias=True, pad_id=pad, bos_id=bos, eos_id=eos, unk_id=unk_id, decoder_start_id=start)
    except (TypeError, ValueError) as exc:
        raise ImportRefused(f"{where}: {exc}") from None


def _single_id(where: Path, key: str, value) -> int:
    if isinstance(value, list):
        if len(value) != 1:
            raise ImportRefused(f"{where}: {key}={value}: one end token is supported")
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ImportRefused(f"{where}: {key} must be a token id, got {value!r}")
    return value


def _weight_files(hf_dir: Path) -> list[Path]:
    if (hf_dir / HF_WEIGHTS).is_file():
        return [hf_dir / HF_WEIGHTS]
    if (hf_dir / HF_WEIGHTS_INDEX).is_file():
        shards = sorted(set(_read_json(hf_dir / HF_WEIGHTS_INDEX).get("weight_map", {}).values()))
        missing = [s for s in shards if not (hf_dir / s).is_file()]
        if not shards or missing:
            raise ImportRefused(f"{hf_dir / HF_WEIGHTS_INDEX}: shard(s) {missing or 'none listed'} missing")
        return [hf_dir / s for s in shards]
    pickles = [p for p in PICKLES if (hf_dir / p).is_file()]
    if pickles:
        raise ImportRefused(f"{hf_dir / pickles[0]}: pickle weights are never loaded (a pickle can run code); "
                            f"{CONVERT_HINT}, which writes {HF_WEIGHTS}")
    raise ImportRefused(f"{hf_dir / HF_WEIGHTS}: missing")


def read_weights(hf_dir: Path, progress: bool = True) -> dict[str, torch.Tensor]:
    files = _weight_files(hf_dir)
    size = sum(f.stat().st_size for f in files)
    tensors: dict[str, torch.Tensor] = {}
    with tqdm(total=size, unit="B", unit_scale=True, desc="read weights", disable=not progress or
              size < PROGRESS_MIN_BYTES, file=sys.stderr) as bar:
        for file in files:
            with safe_open(str(file), framework="pt") as f:
                keys = list(f.keys())
                for key in keys:
                    tensors[key.removeprefix("model.")] = f.get_tensor(key).to(torch.float32)  # fp16 files too
                    bar.update(file.stat().st_size / len(keys))
    return tensors


def _hf_names(cfg: ModelConfig) -> dict[str, list[str]]:
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


def map_weights(hf_dir: Path, cfg: ModelConfig, tensors: dict[str, torch.Tensor]) -> Transformer:
    """Our Transformer with the Hugging Face weights (every tensor used exactly once, shapes checked)."""
    model = Transformer(cfg).eval()
    where = hf_dir / HF_WEIGHTS
    expected = model.state_dict()
    state, used = {}, set()
    for ours, candidates in _hf_names(cfg).items():
        present = [c for c in candidates if c in tensors]
        if not present:
            if ours == "final_logits_bias":  # HF creates it as zeros when a checkpoint lacks it
                state[ours] = torch.zeros(cfg.vocab_size)
                continue
            raise ImportRefused(f"{where}: tensor {'model.' + candidates[0]!r} is missing")
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


def _tokenizer(hf_dir: Path):
    """(one `tokenizers` Tokenizer equal to the model's own (model/hf_tokenizer.py), the id of its unknown token,
    the model's languages or None)."""
    try:
        tok, languages = convert_multilingual(hf_dir)
        unk = unk_token(hf_dir)
    except TokenizerImportError as exc:
        raise ImportRefused(str(exc)) from None
    unk_id = tok.token_to_id(unk)
    if unk_id is None:
        raise ImportRefused(f"{hf_dir / 'tokenizer_config.json'}: unk_token {unk!r} is not in the tokenizer's "
                            "vocabulary")
    return tok, unk_id, languages


def _write_languages(hf_dir: Path, out: Path, cfg: ModelConfig, languages: Languages | None) -> None:
    """languages.json for a multilingual model (each language token inside the model's vocabulary)."""
    (out / LANGUAGES_FILE).unlink(missing_ok=True)
    if languages is None:
        return
    outside = [code for code, token in languages.codes.items() if token >= cfg.vocab_size]
    if outside:
        raise ImportRefused(f"{hf_dir / HF_CONFIG}: vocab_size={cfg.vocab_size} leaves out the token(s) of language "
                            f"code(s) {outside[:3]}")
    ck.write_json_atomic(out / LANGUAGES_FILE, languages.to_dict())


def import_model(hf_dir: str | Path, out: str | Path, progress: bool = True) -> ModelConfig:
    """Writes the seqserve checkpoint of hf_dir into out; returns its ModelConfig."""
    hf_dir, out = Path(hf_dir), Path(out)
    if not hf_dir.is_dir():
        raise ImportRefused(f"{hf_dir}: not a directory")
    model_type, config = read_hf_config(hf_dir)
    files = _weight_files(hf_dir)  # refuses a missing or pickle-only checkpoint before the tokenizer's work
    try:
        generation = load_generation(hf_dir)
    except GenerationConfigError as exc:
        raise ImportRefused(str(exc)) from None
    tokenizer, unk_id, languages = _tokenizer(hf_dir)
    cfg = model_config(hf_dir, model_type, config, unk_id, generation)
    if tokenizer.get_vocab_size() > cfg.vocab_size:
        raise ImportRefused(f"{hf_dir}: the tokenizer has {tokenizer.get_vocab_size()} tokens, more than "
                            f"vocab_size={cfg.vocab_size} ({HF_CONFIG})")
    model = map_weights(hf_dir, cfg, read_weights(hf_dir, progress))
    out.mkdir(parents=True, exist_ok=True)
    cfg.save(out / ck.CONFIG)
    ck.save_weights(model, out / ck.WEIGHTS)
    tokenizer.save(str(out / ck.TOKENIZER))
    ck.write_json_atomic(out / ck.GENERATION, generation.to_dict())
    _write_languages(hf_dir, out, cfg, languages)
    for name in ("README.md", "LICENSE"):  # a model's terms travel with it
        if (hf_dir / name).is_file():
            shutil.copyfile(hf_dir / name, out / name)
    ck.write_json_atomic(out / ck.METRICS, {"imported_from": {"model_type": model_type, "directory": str(hf_dir),
                                                               "weights": [f.name for f in files]}})
    return cfg
