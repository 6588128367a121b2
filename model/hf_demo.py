"""`seqserve hf-demo FAMILY --out DIR`: a small random-weight Hugging Face model directory that `seqserve import`
accepts, written offline (no hub): config.json, generation_config.json, model.safetensors and the family's tokenizer
files, its tokenizer trained here. Its answers are random text: it shows the import, export and serving path, not a
translation. The tests build their Hugging Face models with the same builders.

One row per family: a family's name -> its builder (model/hf_demo_models.py) and what it is laid out like.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from seqserve.model.hf_demo_models import build_bart, build_m2m100, build_marian, build_mbart50, build_nllb
from seqserve.model.hf_demo_parts import MARIAN_BASE, SEED, TINY, HfSize  # noqa: F401 (SEED: the default seed)

MARIAN, BART, M2M100, NLLB, MBART50 = "marian", "bart", "m2m_100", "nllb", "mbart50"


@dataclass(frozen=True)
class Family:
    build: Callable[..., Path]  # (directory, size, seed) -> directory
    layout: str  # the hub models it is laid out like


FAMILIES: dict[str, Family] = {
    MARIAN: Family(build_marian, "Helsinki-NLP/opus-mt-*: Marian, sentencepiece"),
    BART: Family(build_bart, "facebook/bart-*: byte-level BPE"),
    M2M100: Family(build_m2m100, "facebook/m2m100_*: multilingual, sentencepiece"),
    NLLB: Family(build_nllb, "facebook/nllb-200-*: multilingual, BPE, model_type m2m_100"),
    MBART50: Family(build_mbart50, "facebook/mbart-large-50-*: multilingual, sentencepiece"),
}
MULTILINGUAL = (M2M100, NLLB, MBART50)
SIZES = {"tiny": TINY, "base": MARIAN_BASE}  # base: opus-mt's size (d_model 512, 6 + 6 layers), for benchmarks


def build(family: str, directory: str | Path, size: HfSize = TINY, seed: int = SEED) -> Path:
    """Writes the family's directory (created if missing) and returns it."""
    return FAMILIES[family].build(Path(directory), size, seed)
