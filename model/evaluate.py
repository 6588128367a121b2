"""Held-out quality: exact match, chrF and BLEU (sacrebleu) of greedy outputs, and teacher-forced loss."""
from __future__ import annotations

import sacrebleu
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from tqdm import tqdm

from seqserve.model.corpus import Pair
from seqserve.model.data import Example, bucket_batches, collate
from seqserve.model.decoding import greedy_decode
from seqserve.model.transformer import Transformer

DECODE_BATCH = 64  # sources decoded together
_LOSS_BATCH_TOKENS = 8_000  # padded tokens per teacher-forced batch (no gradients, so larger than training's)


def translate(model: Transformer, tok: Tokenizer, sources: list[str], max_new_tokens: int,
              batch_size: int = DECODE_BATCH, progress: str | None = None, leave: bool = False) -> list[str]:
    """Greedy outputs as text, decoded in batches sorted by length so padding stays small.

    progress: a label for a tqdm bar counting decoded lines (on stderr), or None for no bar; leave keeps the bar.
    """
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    out: list[str] = [""] * len(sources)
    with tqdm(total=len(sources), desc=progress, unit="line", disable=progress is None, leave=leave,
              dynamic_ncols=True) as bar:
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            ids = [tok.encode(sources[i]).ids for i in idx]
            for i, gen in zip(idx, greedy_decode(model, ids, max_new_tokens)):
                out[i] = tok.decode(gen, skip_special_tokens=True)
            bar.update(len(idx))
    return out


def scores(hyps: list[str], refs: list[str]) -> dict[str, float]:
    """Exact match (a fraction), chrF and BLEU (sacrebleu's corpus scores, 0-100) of hypotheses against references."""
    exact = sum(h == r for h, r in zip(hyps, refs)) / max(1, len(refs))
    return {"exact_match": exact, "chrf": sacrebleu.corpus_chrf(hyps, [refs]).score,
            "bleu": sacrebleu.corpus_bleu(hyps, [refs]).score, "n": len(refs)}


def evaluate(model: Transformer, tok: Tokenizer, pairs: list[Pair], max_new_tokens: int,
             progress: str | None = None, leave: bool = False) -> dict[str, float]:
    """Greedy-decodes the sources and scores them against the targets (see scores); progress as in translate."""
    was_training = model.training
    model.eval()
    hyps = translate(model, tok, [s for s, _ in pairs], max_new_tokens, progress=progress, leave=leave)
    model.train(was_training)
    return scores(hyps, [t for _, t in pairs])


@torch.no_grad()
def validation_loss(model: Transformer, examples: list[Example]) -> float:
    """Mean per-token cross-entropy of the targets under teacher forcing, without label smoothing (log-perplexity).

    Unlike the decoded scores it needs no decoding budget, never ties and never saturates, so it can rank any two
    checkpoints.
    """
    cfg = model.cfg
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for group in bucket_batches(examples, _LOSS_BATCH_TOKENS, seed=0):
        b = collate(group, cfg.pad_id, cfg.bos_id)
        logits = model(b.src, b.src_mask, b.tgt_in, b.tgt_mask)  # (B, T, V)
        total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), b.tgt_out.reshape(-1),
                                 ignore_index=cfg.pad_id, reduction="sum").item()
        count += int(b.tgt_mask.sum())
    model.train(was_training)
    return total / max(1, count)
