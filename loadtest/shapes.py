"""Random-weight models of standard sizes for `seqserve bench --shape base|small`: a checkpoint, its bundle, its
CTranslate2 model, and random sources, so the engine is measured at the sizes people deploy, not only on our small
trained model.

    base   d_model 512, 8 heads, 6 + 6 layers, d_ff 2048, vocabulary 8,000 (Transformer-base, MarianMT)
    small  d_model 256, 4 heads, 3 + 3 layers, d_ff 1024, vocabulary 8,000

The checkpoint is a real one (config.json, model.safetensors, tokenizer.json, heldout.tsv, metrics.json), so every
backend loads it the way it loads a trained model. Its tokenizer is a WordLevel vocabulary of exactly vocab_size
tokens: ids 0..3 are <pad> <s> </s> <unk>, then w4, w5, ...; encode() appends </s>. Its held-out split is random
sources of SOURCE_TOKENS tokens (the end token included). Weights come from the model's own initialisation under a
seed, so two runs with the same seed measure the same model.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from seqserve.contract.tokenizer import EOS, SPECIAL_TOKENS, UNK
from seqserve.contract.tsv import HELDOUT
from seqserve.export.bundle import export_bundle
from seqserve.model import checkpoint as ck
from seqserve.model import presets
from seqserve.model.config import ModelConfig
from seqserve.model.transformer import Transformer

SHAPES = {name: ModelConfig(vocab_size=presets.SHAPE_VOCAB, **asdict(arch)) for name, arch in presets.SHAPES.items()}
SOURCE_TOKENS = 16  # per random source, the end token included (the graph-loop setting)
MARKER = "shape.json"  # what a prepared directory holds; a directory is reused only when this matches exactly


@dataclass(frozen=True)
class Prepared:
    checkpoint: Path
    bundle: Path
    ctranslate2_dir: Path | None  # None when no converter was given


def word(i: int) -> str:
    return f"w{i}"


def tokenizer_for(vocab_size: int) -> Tokenizer:
    """A WordLevel tokenizer of exactly vocab_size ids, specials first; encode("w4 w5") -> [4, 5, </s>]."""
    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS)} | {word(i): i for i in range(len(SPECIAL_TOKENS), vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single=f"$A {EOS}", special_tokens=[(EOS, vocab[EOS])])
    tok.add_special_tokens(list(SPECIAL_TOKENS))  # already in the vocabulary: their ids stay 0..3
    return tok


def random_sources(n: int, vocab_size: int, seed: int, length: int = SOURCE_TOKENS) -> list[str]:
    """n sources of length - 1 random ordinary words (ids >= 4); the tokenizer adds </s>."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(len(SPECIAL_TOKENS), vocab_size, (n, length - 1))  # (n, length - 1)
    return [" ".join(map(word, row)) for row in ids.tolist()]


def write_checkpoint(cfg: ModelConfig, out: str | Path, seed: int, n_sources: int, max_new_tokens: int,
                     name: str = "random") -> Path:
    """A finished checkpoint directory of cfg's shape with seeded random weights (see the module docstring)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = Transformer(cfg).eval()
    cfg.save(out / ck.CONFIG)
    ck.save_weights(model, out / ck.WEIGHTS)
    tokenizer_for(cfg.vocab_size).save(str(out / ck.TOKENIZER))
    sources = random_sources(n_sources, cfg.vocab_size, seed)
    (out / HELDOUT).write_text("".join(f"{s}\t{s}\n" for s in sources))  # the target column is not used
    parameters = sum(p.numel() for p in model.parameters())
    ck.write_json_atomic(out / ck.METRICS, {"preset": name, "task": "random weights", "parameters": parameters,
                                            "max_new_tokens": max_new_tokens})  # the bundle's max_new_tokens
    return out


def prepare(shape: str, work_dir: str | Path, seed: int, n_sources: int, max_new_tokens: int,
            convert: Callable[[Path, Path], Path] | None = None, progress: bool = True,
            fp16: bool = False) -> Prepared:
    """checkpoint/, bundle/ (fp32 + int8, + fp16 when asked: a GPU variant) and, with convert, ctranslate2/ under
    work_dir; reused when work_dir was prepared with exactly these settings before (export takes minutes for base)."""
    work_dir = Path(work_dir)
    cfg = SHAPES[shape]
    cfg = replace(cfg, max_positions=max(cfg.max_positions, SOURCE_TOKENS, max_new_tokens + 1))
    marker = {"shape": shape, "config": cfg.to_dict(), "seed": seed, "n_sources": n_sources,
              "max_new_tokens": max_new_tokens, "ctranslate2": convert is not None, "fp16": fp16}
    done = Prepared(work_dir / "checkpoint", work_dir / "bundle", work_dir / "ctranslate2" if convert else None)
    if _read(work_dir / MARKER) == marker:
        return done
    (work_dir / MARKER).unlink(missing_ok=True)
    write_checkpoint(cfg, done.checkpoint, seed, n_sources, max_new_tokens, name=f"random-{shape}")
    export_bundle(done.checkpoint, done.bundle, int8=True, fp16=fp16, progress=progress)
    if convert is not None:
        convert(done.checkpoint, done.ctranslate2_dir)
    ck.write_json_atomic(work_dir / MARKER, marker)  # last: a half-prepared directory is never reused
    return done


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
