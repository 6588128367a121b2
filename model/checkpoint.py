"""Checkpoints: safetensors weights + config.json + tokenizer.json + metrics.json (never pickles)."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer

from seqserve.contract.tokenizer import load_tokenizer
from seqserve.model.config import ModelConfig
from seqserve.model.transformer import Transformer

WEIGHTS = "model.safetensors"
CONFIG = "config.json"
TOKENIZER = "tokenizer.json"
METRICS = "metrics.json"
TRAIN_CONFIG = "train_config.json"
LAST_WEIGHTS = "last.safetensors"  # the latest step, for --resume (model.safetensors is the best)
OPTIMIZER = "optimizer.safetensors"
STATE = "state.json"


def state_dict_for_save(model: Transformer) -> dict[str, torch.Tensor]:
    # Tied weights share storage; safetensors refuses aliases, so drop the tied copies (re-tied on load).
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if model.cfg.tie_embeddings:
        state.pop("tgt_embed.weight", None)
        state.pop("out_proj.weight", None)
    return state


def save_weights(model: Transformer, path: Path) -> None:
    save_file(state_dict_for_save(model), str(path))


def load_weights(model: Transformer, path: Path) -> None:
    missing, unexpected = model.load_state_dict(load_file(str(path)), strict=False)
    tied = {"tgt_embed.weight", "out_proj.weight"} if model.cfg.tie_embeddings else set()
    if set(missing) - tied or unexpected:
        raise ValueError(f"{path}: missing {sorted(set(missing) - tied)}, unexpected {sorted(unexpected)}")


def load_checkpoint(directory: str | Path) -> tuple[Transformer, Tokenizer]:
    """The best model of a checkpoint directory, in eval mode, with its tokenizer."""
    directory = Path(directory)
    for name in (WEIGHTS, CONFIG, TOKENIZER):
        if not (directory / name).is_file():
            raise FileNotFoundError(f"checkpoint {directory} has no {name}")
    model = Transformer(ModelConfig.load(directory / CONFIG))
    load_weights(model, directory / WEIGHTS)
    return model.eval(), load_tokenizer(directory / TOKENIZER)


def read_metrics(directory: str | Path) -> dict:
    path = Path(directory) / METRICS
    return json.loads(path.read_text()) if path.is_file() else {}
