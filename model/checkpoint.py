"""Checkpoints: safetensors weights + config.json + tokenizer.json + metrics.json (never pickles).

A finished checkpoint is one with metrics.json: `seqserve train` writes model.safetensors and then metrics.json
only at the very end, each atomically (a temporary name, then os.replace), so a crashed or killed run never
leaves files that look finished (the Makefile's target is metrics.json).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer

from seqserve.contract.languages import LANGUAGES_FILE
from seqserve.contract.tokenizer import check_special_ids, load_tokenizer
from seqserve.model.config import ModelConfig
from seqserve.model.transformer import Transformer

WEIGHTS = "model.safetensors"  # the selected (best) weights, written when training ends
CONFIG = "config.json"
TOKENIZER = "tokenizer.json"
METRICS = "metrics.json"  # written last: its presence means the checkpoint is finished
TRAIN_CONFIG = "train_config.json"
BEST_WEIGHTS = "best.safetensors"  # the best weights so far, while training runs (renamed to WEIGHTS at the end)
LAST_WEIGHTS = "last.safetensors"  # the latest step, for --resume
OPTIMIZER = "optimizer.safetensors"
STATE = "state.json"
GENERATION = "generation.json"  # an imported model's decoding defaults (contract/generation.py GenerationDefaults)
_TMP_SUFFIX = ".tmp"


def temporary(path: Path) -> Path:
    """Where `path` is written before os.replace moves it into place (same directory, so the rename is atomic)."""
    return path.with_name(path.name + _TMP_SUFFIX)


def write_text_atomic(path: Path, text: str) -> None:
    tmp = temporary(path)
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_json_atomic(path: Path, data: dict) -> None:
    write_text_atomic(path, json.dumps(data, indent=2) + "\n")


def save_tensors_atomic(tensors: dict[str, torch.Tensor], path: Path) -> None:
    tmp = temporary(path)
    save_file(tensors, str(tmp))
    os.replace(tmp, path)


def state_dict_for_save(model: Transformer) -> dict[str, torch.Tensor]:
    # Tied weights share storage; safetensors refuses aliases, so drop the tied copies (re-tied on load).
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    for name in tied_names(model):
        state.pop(name, None)
    return state


def tied_names(model: Transformer) -> set[str]:
    """The state-dict names that alias another weight (the safetensors file stores each tensor once)."""
    cfg, names = model.cfg, set()
    if cfg.tie_embeddings:
        names.add("tgt_embed.weight")
    if cfg.tie_output:
        names.add("out_proj.weight")
    if model.tgt_positions is model.positions:
        names |= {k for k in model.state_dict() if k.startswith("tgt_positions.")}
    return names


def save_weights(model: Transformer, path: Path) -> None:
    save_tensors_atomic(state_dict_for_save(model), Path(path))


def load_weights(model: Transformer, path: Path) -> None:
    missing, unexpected = model.load_state_dict(load_file(str(path)), strict=False)
    tied = tied_names(model)
    if set(missing) - tied or unexpected:
        raise ValueError(f"{path}: missing {sorted(set(missing) - tied)}, unexpected {sorted(unexpected)}")


def load_model(directory: str | Path, weights: str = WEIGHTS) -> Transformer:
    """A checkpoint directory's model (config.json + the named weights file), in eval mode."""
    directory = Path(directory)
    model = Transformer(ModelConfig.load(directory / CONFIG))
    load_weights(model, directory / weights)
    return model.eval()


def load_checkpoint(directory: str | Path) -> tuple[Transformer, Tokenizer]:
    """The best model of a finished checkpoint directory, in eval mode, with its tokenizer."""
    directory = Path(directory)
    for name in (WEIGHTS, CONFIG, TOKENIZER):
        if not (directory / name).is_file():
            unfinished = " (training has not finished: no metrics.json)" if not (directory / METRICS).is_file() else ""
            raise FileNotFoundError(f"checkpoint {directory} has no {name}{unfinished}")
    model, tok = load_model(directory), load_tokenizer(directory / TOKENIZER)
    problems = check_special_ids(tok, special_ids_of(model.cfg))
    if problems:
        raise ValueError(f"{directory / TOKENIZER}: {'; '.join(problems)} ({CONFIG})")
    return model, tok


def special_ids_of(cfg: ModelConfig) -> dict[str, int]:
    """The manifest's special_tokens of a model: every id the engine treats specially."""
    return {name: getattr(cfg, name) for name in ("pad_id", "bos_id", "eos_id", "unk_id", "decoder_start_id")}


def read_generation(directory: str | Path) -> dict:
    """The model's decoding defaults (an imported model's generation_config.json, as the manifest records them)."""
    path = Path(directory) / GENERATION
    return json.loads(path.read_text()) if path.is_file() else {}


def read_languages(directory: str | Path) -> dict:
    """A multilingual model's languages (contract/languages.py's Languages.to_dict()), or {}."""
    path = Path(directory) / LANGUAGES_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def read_metrics(directory: str | Path) -> dict:
    path = Path(directory) / METRICS
    return json.loads(path.read_text()) if path.is_file() else {}
