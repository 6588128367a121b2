"""Held-out quality: exact match and chrF (sacrebleu) of greedy outputs."""
from __future__ import annotations

import sacrebleu
from tokenizers import Tokenizer

from seqserve.model.corpus import Pair
from seqserve.model.decoding import greedy_decode
from seqserve.model.transformer import Transformer


def translate(model: Transformer, tok: Tokenizer, sources: list[str], max_new_tokens: int,
              batch_size: int = 64) -> list[str]:
    """Greedy outputs as text, decoded in batches sorted by length so padding stays small."""
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    out: list[str] = [""] * len(sources)
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        ids = [tok.encode(sources[i]).ids for i in idx]
        for i, gen in zip(idx, greedy_decode(model, ids, max_new_tokens)):
            out[i] = tok.decode(gen, skip_special_tokens=True)
    return out


def evaluate(model: Transformer, tok: Tokenizer, pairs: list[Pair], max_new_tokens: int) -> dict[str, float]:
    was_training = model.training
    model.eval()
    hyps = translate(model, tok, [s for s, _ in pairs], max_new_tokens)
    model.train(was_training)
    refs = [t for _, t in pairs]
    exact = sum(h == r for h, r in zip(hyps, refs)) / max(1, len(pairs))
    chrf = sacrebleu.corpus_chrf(hyps, [refs]).score
    return {"exact_match": exact, "chrf": chrf, "n": len(pairs)}
