"""`seqserve hf-demo FAMILY --out DIR`: a small random-weight Hugging Face model directory that `seqserve import`
accepts, written offline (no hub): config.json, generation_config.json, model.safetensors and the family's tokenizer
files, its tokenizer trained here. Its answers are random text: it shows the import, export and serving path, not a
translation. The tests build their Hugging Face models with the same builders.

One row per family: a family's name -> its builder (model/hf_demo_models.py, model/hf_demo_t5.py), what it is laid
out like and its sizes (tiny: seconds to build; base: the shape of the family's small hub model, for benchmarks).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from seqserve.model.hf_demo_models import build_bart, build_m2m100, build_marian, build_mbart50, build_nllb
from seqserve.model.hf_demo_parts import MARIAN_BASE, SEED, TINY, HfSize
from seqserve.model.hf_demo_t5 import (
    FLAN_T5_SMALL,
    FLAN_TINY,
    T5_SMALL,
    T5_TINY,
    T5Size,
    build_flan_t5,
    build_mt5,
    build_t5,
)

MARIAN, BART, M2M100, NLLB, MBART50 = "marian", "bart", "m2m_100", "nllb", "mbart50"
T5, FLAN_T5, MT5 = "t5", "flan-t5", "mt5"
TINY_SIZE = "tiny"  # every family's default size
SIZES = {TINY_SIZE: TINY, "base": MARIAN_BASE}  # base: opus-mt's size (d_model 512, 6 + 6 layers), for benchmarks


@dataclass(frozen=True)
class Family:
    build: Callable[..., Path]  # (directory, size, seed) -> directory
    layout: str  # the hub models it is laid out like
    sizes: Mapping[str, HfSize | T5Size] = field(default_factory=lambda: SIZES)  # --size's name -> the shape
    t5: bool = False  # T5's config keys and weight names (model/hf_t5.py), not BART's


FAMILIES: dict[str, Family] = {
    MARIAN: Family(build_marian, "Helsinki-NLP/opus-mt-*: Marian, sentencepiece"),
    BART: Family(build_bart, "facebook/bart-*: byte-level BPE"),
    M2M100: Family(build_m2m100, "facebook/m2m100_*: multilingual, sentencepiece"),
    NLLB: Family(build_nllb, "facebook/nllb-200-*: multilingual, BPE, model_type m2m_100"),
    MBART50: Family(build_mbart50, "facebook/mbart-large-50-*: multilingual, sentencepiece"),
    T5: Family(build_t5, "google-t5/t5-*: T5 v1.0, relu, tied output", {TINY_SIZE: T5_TINY, "base": T5_SMALL}, True),
    FLAN_T5: Family(build_flan_t5, "google/flan-t5-*: gated-gelu, untied, heads x d_kv != d_model",
                    {TINY_SIZE: FLAN_TINY, "base": FLAN_T5_SMALL}, True),
    MT5: Family(build_mt5, "google/mt5-*: MT5ForConditionalGeneration, gated-gelu, untied", {TINY_SIZE: T5_TINY},
                True),
}
MULTILINGUAL = (M2M100, NLLB, MBART50)


def build(family: str, directory: str | Path, size: HfSize | T5Size | None = None, seed: int = SEED) -> Path:
    """Writes the family's directory (created if missing) and returns it; size None: the family's tiny size."""
    row = FAMILIES[family]
    return row.build(Path(directory), row.sizes[TINY_SIZE] if size is None else size, seed)
