"""Tokenised examples and length-bucketed batches sized in tokens."""
from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from tokenizers import Tokenizer

from seqserve.model.corpus import Pair


@dataclass(frozen=True)
class Example:
    src: list[int]  # source ids ending with EOS (the tokenizer's post-processor adds it)
    tgt: list[int]  # target ids ending with EOS


@dataclass(frozen=True)
class Batch:
    src: torch.Tensor  # (B, S) int64
    src_mask: torch.Tensor  # (B, S) int64, 1 = token
    tgt_in: torch.Tensor  # (B, T) BOS + target
    tgt_mask: torch.Tensor  # (B, T)
    tgt_out: torch.Tensor  # (B, T) target + EOS, pad_id where padded (ignored by the loss)

    @property
    def n_tokens(self) -> int:
        return int(self.src_mask.sum() + self.tgt_mask.sum())


def tokenize_pairs(tok: Tokenizer, pairs: list[Pair], max_len: int) -> list[Example]:
    """Encodes in one batched call; pairs longer than max_len tokens on either side are an error, not a silent drop."""
    srcs = [e.ids for e in tok.encode_batch([s for s, _ in pairs])]
    tgts = [e.ids for e in tok.encode_batch([t for _, t in pairs])]
    too_long = [i for i, (s, t) in enumerate(zip(srcs, tgts)) if len(s) > max_len or len(t) + 1 > max_len]
    if too_long:
        raise ValueError(f"{len(too_long)} pairs exceed max_positions={max_len} tokens (first: {pairs[too_long[0]]})")
    return [Example(s, t) for s, t in zip(srcs, tgts)]


def collate(examples: list[Example], pad_id: int, bos_id: int) -> Batch:
    b = len(examples)
    s = max(len(e.src) for e in examples)
    t = max(len(e.tgt) for e in examples)
    src = torch.full((b, s), pad_id, dtype=torch.int64)
    tgt_in = torch.full((b, t), pad_id, dtype=torch.int64)
    tgt_out = torch.full((b, t), pad_id, dtype=torch.int64)
    for i, e in enumerate(examples):
        src[i, : len(e.src)] = torch.tensor(e.src)
        tgt_in[i, : len(e.tgt)] = torch.tensor([bos_id] + e.tgt[:-1])  # teacher forcing: shifted right
        tgt_out[i, : len(e.tgt)] = torch.tensor(e.tgt)
    return Batch(src, (src != pad_id).long(), tgt_in, (tgt_out != pad_id).long(), tgt_out)


def bucket_batches(examples: list[Example], max_tokens: int, seed: int) -> list[list[Example]]:
    """Groups similar lengths so little is padding; each batch holds at most max_tokens padded tokens."""
    rng = random.Random(seed)
    order = sorted(examples, key=lambda e: (len(e.tgt) + rng.random() * 2, len(e.src)))
    batches: list[list[Example]] = []
    current: list[Example] = []
    width = 0
    for e in order:
        w = max(width, len(e.src) + len(e.tgt))
        if current and w * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, w = [], len(e.src) + len(e.tgt)
        current.append(e)
        width = w
    if current:
        batches.append(current)
    rng.shuffle(batches)
    return batches
