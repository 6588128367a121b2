"""Greedy decoding with a converted CTranslate2 model (export/ctranslate2.py writes it); torch-free.

CTranslate2 sees our ids as token strings (the converter registered the tokenizer's tokens in id order) and batches
by itself: translate_batch splits the inputs into batches of max_batch_size examples, a static batch each.
"""
from __future__ import annotations

from pathlib import Path

import ctranslate2
from tokenizers import Tokenizer

# int8: weights quantised when the Translator loads the model; fp16 runs on CUDA only
COMPUTE_TYPES = {"fp32": "float32", "int8": "int8", "fp16": "float16"}


def load_translator(model_dir: str | Path, precision: str = "fp32", device: str = "cpu",
                    threads: int = 0) -> ctranslate2.Translator:
    """One translator on one device; threads = intra-op threads (0 = CTranslate2's default)."""
    if precision not in COMPUTE_TYPES:
        raise ValueError(f"precision must be one of {sorted(COMPUTE_TYPES)}, got {precision!r}")
    return ctranslate2.Translator(str(model_dir), device=device, compute_type=COMPUTE_TYPES[precision],
                                  inter_threads=1, intra_threads=threads)


def greedy(translator: ctranslate2.Translator, tokenizer: Tokenizer, sources: list[list[int]], max_new_tokens: int,
           batch_size: int) -> list[list[int]]:
    """Greedy ids per source without the end token, in input order; at most max_new_tokens each, as in
    model.decoding.greedy_decode and the engine (max_decoding_length has the same meaning)."""
    tokens = [[tokenizer.id_to_token(i) for i in s] for s in sources]
    # min_decoding_length=0: </s> may come first (an empty output), as in ours; max_input_length=0: never truncate.
    results = translator.translate_batch(tokens, max_batch_size=batch_size, batch_type="examples", beam_size=1,
                                         max_decoding_length=max_new_tokens, min_decoding_length=0,
                                         max_input_length=0)
    return [[tokenizer.token_to_id(t) for t in r.hypotheses[0]] for r in results]
