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

from pathlib import Path

from seqserve.contract.generation import GenerationConfigError, GenerationDefaults
from seqserve.contract.generation import load as load_generation
from seqserve.contract.jsonfile import confined, read_bytes, read_object
from seqserve.contract.languages import LANGUAGES_FILE, Languages
from seqserve.contract.schema import ID, MODEL_CAPS, Int, Nullable, SchemaError
from seqserve.model import checkpoint as ck
from seqserve.model import hf_t5
from seqserve.model.config import ModelConfig
from seqserve.model.hf_families import FAMILIES, REFUSED
from seqserve.model.hf_mapping import HF_CONFIG, ImportRefused, bart_names, map_weights
from seqserve.model.hf_tokenizer import TokenizerImportError, convert_multilingual, unk_token
from seqserve.model.hf_weights import TensorEntry, read_headers, read_weights, weight_files

HF_GENERATION = "generation_config.json"
NOTICES = ("README.md", "LICENSE")  # a model's terms travel with it
MAX_NOTICE_BYTES = 16 << 20
MAX_PREFIX_CHARS = 1000  # a task's input prefix ("summarize: ") shown in GetModelInfo
# config.json's sizes -> the ModelConfig field each becomes, checked against that field's cap (contract/schema.py
# MODEL_CAPS, the manifest's own) before anything is sized from it.
SIZES = {"vocab_size": "vocab_size", "d_model": "d_model", "encoder_attention_heads": "n_heads",
         "decoder_attention_heads": "n_heads", "encoder_layers": "n_encoder_layers",
         "decoder_layers": "n_decoder_layers", "encoder_ffn_dim": "d_ff", "decoder_ffn_dim": "d_ff",
         "max_position_embeddings": "max_positions"}
OPTIONAL_SIZES = {"decoder_vocab_size": "vocab_size"}
SWITCHES = ("scale_embedding", "share_encoder_decoder_embeddings", "tie_word_embeddings")  # true/false when present


ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "silu": "silu", "swish": "silu"}


def _read_json(path: Path) -> dict:
    path = confined(path.parent, path.name, ImportRefused)  # every file read is one of the directory's own
    return read_object(path, ImportRefused, "missing (a Hugging Face model directory as save_pretrained writes it)")


def read_hf_config(hf_dir: Path) -> tuple[str, dict]:
    config = _read_json(hf_dir / HF_CONFIG)
    model_type = config.get("model_type")
    if isinstance(model_type, str) and model_type in REFUSED:
        raise ImportRefused(f"{hf_dir / HF_CONFIG}: model_type {model_type} is not supported: {REFUSED[model_type]}")
    if not isinstance(model_type, str) or model_type not in FAMILIES:
        raise ImportRefused(f"{hf_dir / HF_CONFIG}: model_type {model_type!r} is not supported; supported: "
                            f"{', '.join(FAMILIES)}")
    if FAMILIES[model_type].layout == "t5":
        hf_t5.check_config(hf_dir / HF_CONFIG, config, ImportRefused)
    else:
        check_config(hf_dir / HF_CONFIG, config)
    return model_type, config


def check_config(where: Path, config: dict) -> None:
    """Each value the import reads has its type (an int is not a float is not a bool) and each size its cap."""
    for key, field in [*SIZES.items(), *OPTIONAL_SIZES.items()]:
        if config.get(key) is None:
            if key in SIZES:
                raise ImportRefused(f"{where}: {key} is missing")
            continue
        try:
            Int(1, MODEL_CAPS[field]).check(config[key], key)
        except SchemaError as exc:
            cap = f" (the largest {field} a bundle may have)" if "<=" in str(exc) else ""
            raise ImportRefused(f"{where}: {exc}{cap}") from None
    for key, spec in (("pad_token_id", ID), ("bos_token_id", Nullable(ID))):
        try:
            spec.check(config.get(key), key)
        except SchemaError as exc:
            raise ImportRefused(f"{where}: {exc}") from None
    if not isinstance(config.get("activation_function"), str):
        raise ImportRefused(f"{where}: activation_function must be a string, got {config.get('activation_function')!r}")
    for key in SWITCHES:
        if not isinstance(config.get(key, False), (bool, type(None))):
            raise ImportRefused(f"{where}: {key} must be true or false, got {config[key]!r}")
    for key in ("encoder_layerdrop", "decoder_layerdrop"):  # training-only, but say so if a value is odd
        value = config.get(key, 0.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ImportRefused(f"{where}: {key} must be a number, got {value!r}")


def task_prefixes(where: Path, config: dict) -> dict[str, str]:
    """config.json's task_specific_params, each task's input prefix (T5: "summarize: "): GetModelInfo shows them."""
    tasks = config.get("task_specific_params") or {}
    if not isinstance(tasks, dict) or not all(isinstance(v, dict) for v in tasks.values()):
        raise ImportRefused(f"{where}: task_specific_params must be an object of task name -> object, got "
                            f"{str(tasks)[:60]}")
    for name, params in tasks.items():
        if not isinstance(params.get("prefix", ""), str) or len(params.get("prefix", "")) > MAX_PREFIX_CHARS:
            raise ImportRefused(f"{where}: task_specific_params.{name}.prefix must be a string of at most "
                                f"{MAX_PREFIX_CHARS} characters")
    return {name: params["prefix"] for name, params in tasks.items() if params.get("prefix")}


def _switch(config: dict, key: str, default: bool) -> bool:
    return default if config.get(key) is None else config[key]


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
    eos = _single_id(where, "eos_token_id", need("eos_token_id"))
    pad = need("pad_token_id")
    start = generation.decoder_start_token_id  # generation_config.json's, else config.json's
    if generation.eos_token_id != eos:
        raise ImportRefused(f"{hf_dir / HF_GENERATION}: eos_token_id={generation.eos_token_id} differs from "
                            f"{HF_CONFIG}'s {eos}; seqserve's model has one end token")
    bos = config.get("bos_token_id")
    if bos is None or bos in (eos, unk_id):  # Marian has no <s>: its start token stands for one
        bos = start
    tie_embeddings = _switch(config, "share_encoder_decoder_embeddings", True)  # BART always shares
    try:
        return ModelConfig(
            vocab_size=vocab, d_model=need("d_model"), n_heads=need("encoder_attention_heads"),
            n_encoder_layers=need("encoder_layers"), n_decoder_layers=need("decoder_layers"),
            d_ff=need("encoder_ffn_dim"), dropout=0.0, max_positions=need("max_position_embeddings"),
            norm_first=family.norm_first, tie_embeddings=tie_embeddings,
            tie_output=_switch(config, "tie_word_embeddings", True), positions=family.positions,
            position_offset=pad + 1 if family.offset_after_pad else family.position_offset,
            embed_norm=family.embed_norm,
            activation=ACTIVATIONS[activation], scale_embeddings=_switch(config, "scale_embedding", False),
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


def model_elements(cfg: ModelConfig) -> tuple[int, int]:
    """(values Transformer(cfg) takes from the weight files, values of the position table it computes itself):
    known from the config alone, before anything is allocated."""
    vocab, width, ff = cfg.vocab_size, cfg.d_model, cfg.d_ff
    attention, ffn, norm = 4 * (width * width + width), 2 * width * ff + ff + width, 2 * width
    layers = (cfg.n_encoder_layers * (attention + ffn + 2 * norm)
              + cfg.n_decoder_layers * (2 * attention + ffn + 3 * norm))
    embeddings = vocab * width * (1 + (not cfg.tie_embeddings) + (not cfg.tie_output))
    norms = norm * 2 * (cfg.embed_norm + cfg.norm_first)
    table = (cfg.max_positions + cfg.position_offset) * width
    learned = cfg.positions == "learned"
    return embeddings + layers + norms + (2 * table if learned else 0), 0 if learned else table


def check_size(hf_dir: Path, cfg: ModelConfig, headers: dict[Path, list[TensorEntry]]) -> None:
    """A config whose sizes, each within its cap, multiply to more weights than the files hold is refused before
    the model is built: what the import allocates stays proportional to the weight files' size."""
    held = sum(entry.numel for entries in headers.values() for entry in entries)
    stored, computed = model_elements(cfg)
    where = hf_dir / HF_CONFIG
    if stored > held:
        raise ImportRefused(
            f"{where}: vocab_size={cfg.vocab_size}, d_model={cfg.d_model}, encoder_layers={cfg.n_encoder_layers}, "
            f"decoder_layers={cfg.n_decoder_layers}, encoder_ffn_dim={cfg.d_ff} and max_position_embeddings="
            f"{cfg.max_positions} describe {stored:,} weights; the weight files hold {held:,} values")
    if computed > held:
        raise ImportRefused(f"{where}: max_position_embeddings={cfg.max_positions} x d_model={cfg.d_model} is a "
                            f"position table of {computed:,} values, more than the weight files' {held:,}")


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


def _check_languages(hf_dir: Path, cfg: ModelConfig, languages: Languages | None) -> None:
    """Each language token lies inside the model's vocabulary."""
    outside = [code for code, token in (languages.codes.items() if languages else ()) if token >= cfg.vocab_size]
    if outside:
        raise ImportRefused(f"{hf_dir / HF_CONFIG}: vocab_size={cfg.vocab_size} leaves out the token(s) of language "
                            f"code(s) {outside[:3]}")


def _write_languages(out: Path, languages: Languages | None) -> None:
    """languages.json for a multilingual model."""
    (out / LANGUAGES_FILE).unlink(missing_ok=True)
    if languages is not None:
        ck.write_json_atomic(out / LANGUAGES_FILE, languages.to_dict())


def _check_out(hf_dir: Path, out: Path) -> None:
    """The checkpoint is written beside the model directory, never into it (nor the model into the checkpoint)."""
    source, target = hf_dir.resolve(), out.resolve()
    if target == source or target.is_relative_to(source) or source.is_relative_to(target):
        where = "is" if target == source else "lies inside" if target.is_relative_to(source) else "contains"
        raise ImportRefused(f"{out}: --out {where} the model directory {hf_dir}; writing there would overwrite the "
                            "files being imported. Choose a directory outside it")


def import_model(hf_dir: str | Path, out: str | Path, progress: bool = True) -> ModelConfig:
    """Writes the seqserve checkpoint of hf_dir into out; returns its ModelConfig. Everything is read and checked
    before the first byte is written."""
    hf_dir, out = Path(hf_dir), Path(out)
    if not hf_dir.is_dir():
        raise ImportRefused(f"{hf_dir}: not a directory")
    _check_out(hf_dir, out)
    model_type, config = read_hf_config(hf_dir)
    files = weight_files(hf_dir, ImportRefused)  # refuses a missing or pickle-only checkpoint before the tokenizer
    headers = read_headers(files, ImportRefused)
    notices = {}
    for name in NOTICES:
        path = confined(hf_dir, name, ImportRefused)
        if path.is_file():
            notices[name] = read_bytes(path, ImportRefused, MAX_NOTICE_BYTES)
    try:
        generation = load_generation(hf_dir)
    except GenerationConfigError as exc:
        raise ImportRefused(str(exc)) from None
    prefixes = task_prefixes(hf_dir / HF_CONFIG, config)
    tokenizer, unk_id, languages = _tokenizer(hf_dir)
    t5 = FAMILIES[model_type].layout == "t5"
    if t5:
        held = {entry.name.removeprefix("model.") for entries in headers.values() for entry in entries}
        cfg = hf_t5.model_config(hf_dir / HF_CONFIG, model_type, config, unk_id, generation, held, ImportRefused)
    else:
        cfg = model_config(hf_dir, model_type, config, unk_id, generation)
    if tokenizer.get_vocab_size() > cfg.vocab_size:
        raise ImportRefused(f"{hf_dir}: the tokenizer has {tokenizer.get_vocab_size()} tokens, more than "
                            f"vocab_size={cfg.vocab_size} ({HF_CONFIG})")
    _check_languages(hf_dir, cfg, languages)
    if t5:
        hf_t5.check_size(hf_dir / HF_CONFIG, cfg, headers, ImportRefused)
    else:
        check_size(hf_dir, cfg, headers)
    names = hf_t5.hf_names(cfg) if t5 else bart_names(cfg)
    model = map_weights(hf_dir, cfg, read_weights(headers, ImportRefused, progress), names, "" if t5 else "model.")
    out.mkdir(parents=True, exist_ok=True)
    cfg.save(out / ck.CONFIG)
    ck.save_weights(model, out / ck.WEIGHTS)
    tokenizer.save(str(out / ck.TOKENIZER))
    ck.write_json_atomic(out / ck.GENERATION, generation.to_dict())
    _write_languages(out, languages)
    for name, text in notices.items():
        (out / name).write_bytes(text)
    ck.write_json_atomic(out / ck.METRICS, {"imported_from": {"model_type": model_type, "directory": str(hf_dir),
                                                               "weights": [f.name for f in files],
                                                               "task_prefixes": prefixes}})
    return cfg
