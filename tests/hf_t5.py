"""The tests' T5-family directories: the product's builders (model/hf_demo_t5.py, what `seqserve hf-demo t5`,
`flan-t5` and `mt5` write) at their tiny sizes, under the names the T5 tests use.

- T5: T5 v1.0 (relu FFN, tied output scaled by d_model^-0.5), num_heads * d_kv == d_model;
- FLAN: T5 v1.1 / Flan-T5 (gated-gelu, untied lm_head, no output scale), num_heads * d_kv != d_model;
- MT5: mT5 (MT5ForConditionalGeneration: gated-gelu, untied lm_head).
"""
from __future__ import annotations

from pathlib import Path

from seqserve.model import hf_demo
from seqserve.model.hf_demo_t5 import SUMMARIZE  # noqa: F401

T5, FLAN, MT5 = hf_demo.T5, hf_demo.FLAN_T5, hf_demo.MT5
SIZES = {kind: hf_demo.FAMILIES[kind].sizes[hf_demo.TINY_SIZE] for kind in (T5, FLAN, MT5)}


def build(kind: str, directory: str | Path, seed: int = hf_demo.SEED) -> Path:
    return hf_demo.build(kind, directory, SIZES[kind], seed)
