"""Greedy decoding and beam search with a converted CTranslate2 model (export/ctranslate2.py writes it); torch-free.

CTranslate2 sees our ids as token strings (the converter registered the tokenizer's tokens in id order) and batches
by itself: translate_batch splits the inputs into batches of max_batch_size examples, a static batch each.

Beam search is set to match ours (Hugging Face's rules with early_stopping=True, engine/decoding/beam.py) as closely as
CTranslate2 allows; read from CTranslate2's src/decoding.cc (BeamSearch::search, finalize_hypothesis_score):
  * score = cumulative log-probability / length ** length_penalty, as ours; return_end_token=True makes the length
    count the end token (it counts it only then), as ours and HF's do;
  * it keeps 2 x beam_size candidates per step and registers a finished hypothesis only from the first beam_size,
    replacing it by the next candidate that is not the end token: HF's rule;
  * with length_penalty != 0 it stops once beam_size x patience hypotheses are registered: patience=1 is HF's
    early_stopping=True. HF's default heuristic (early_stopping=False: stop when no live beam can still beat the
    worst kept hypothesis) has no CTranslate2 equivalent, so the benchmark runs our beams with early_stopping=True;
  * what still differs: CTranslate2 sums log-probabilities in float32 (ours in float64) and breaks ties its own way,
    so near-ties can pick a different hypothesis.
"""
from __future__ import annotations

from pathlib import Path

import ctranslate2
from tokenizers import Tokenizer

from seqserve.contract.tokenizer import EOS

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
           batch_size: int, min_new_tokens: int = 0) -> list[list[int]]:
    """Greedy ids per source without the end token, in input order; at most max_new_tokens each, as in
    model.decoding.greedy_decode and the engine (max_decoding_length has the same meaning), and the end token
    suppressed before min_new_tokens, as the engine's min_new_tokens (min_decoding_length has that meaning)."""
    return beam_search(translator, tokenizer, sources, max_new_tokens, batch_size, 1, min_new_tokens)


def beam_search(translator: ctranslate2.Translator, tokenizer: Tokenizer, sources: list[list[int]],
                max_new_tokens: int, batch_size: int, num_beams: int, min_new_tokens: int = 0,
                length_penalty: float = 1.0) -> list[list[int]]:
    """The best hypothesis' ids per source without the end token, in input order (num_beams 1 = greedy); batch_size
    counts sources (each holds num_beams rows). The module docstring says how the options match ours."""
    tokens = [[tokenizer.id_to_token(i) for i in s] for s in sources]
    # max_input_length=0: never truncate; min_decoding_length (default 1) set explicitly: </s> may come first.
    results = translator.translate_batch(tokens, max_batch_size=batch_size, batch_type="examples",
                                         beam_size=num_beams, patience=1, length_penalty=length_penalty,
                                         return_end_token=True, max_decoding_length=max_new_tokens,
                                         min_decoding_length=min_new_tokens, max_input_length=0)
    return [[tokenizer.token_to_id(t) for t in _without_end(r.hypotheses[0])] for r in results]


def _without_end(hypothesis: list[str]) -> list[str]:
    return hypothesis[:-1] if hypothesis and hypothesis[-1] == EOS else hypothesis
