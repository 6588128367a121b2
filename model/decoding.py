"""Reference greedy decoding in PyTorch: the ground truth for the ONNX and server parity tests."""
from __future__ import annotations

import torch

from seqserve.model.transformer import Transformer


def pad_batch(seqs: list[list[int]], pad_id: int,
              device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pads token lists -> ids (B, S) int64 and mask (B, S) int64 (1 = token)."""
    width = max(1, max(len(s) for s in seqs))
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.int64)
    mask = torch.zeros((len(seqs), width), dtype=torch.int64)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s, dtype=torch.int64)
        mask[i, : len(s)] = 1
    return ids.to(device), mask.to(device)


def _strip(row: list[int], eos_id: int) -> list[int]:
    return row[: row.index(eos_id)] if eos_id in row else row


@torch.no_grad()
def greedy_decode(
    model: Transformer, sources: list[list[int]], max_new_tokens: int, use_cache: bool = True
) -> list[list[int]]:
    """Batched greedy decoding; returns each row's generated ids without the end token.

    use_cache=False is the textbook loop: the whole decoder is recomputed over the prefix at every step.
    """
    cfg = model.cfg
    dev = next(model.parameters()).device  # the model's device (the benchmark runs it on CUDA too)
    src_ids, src_mask = pad_batch(sources, cfg.pad_id, dev)
    b = src_ids.shape[0]
    cross = model.cross_kv(model.encode(src_ids, src_mask))
    tokens = torch.full((b, 1), cfg.bos_id, dtype=torch.int64, device=dev)  # (B, 1) all rows start with BOS
    done = torch.zeros(b, dtype=torch.bool, device=dev)
    past = None
    for step in range(max_new_tokens):
        if use_cache:
            positions = torch.full((b, 1), step, dtype=torch.int64, device=dev)  # (B, 1)
            self_mask = torch.ones((b, step + 1), dtype=torch.int64, device=dev)  # (B, P+1)
            logits, past = model.decode(tokens[:, -1:], positions, self_mask, src_mask, cross, past, causal=False)
        else:
            t = tokens.shape[1]
            positions = torch.arange(t, device=dev).expand(b, t)  # (B, T)
            self_mask = torch.ones((b, t), dtype=torch.int64, device=dev)  # (B, T)
            logits, _ = model.decode(tokens, positions, self_mask, src_mask, cross)
        next_ids = logits[:, -1].argmax(-1)  # (B,)
        next_ids = torch.where(done, torch.full_like(next_ids, cfg.eos_id), next_ids)
        tokens = torch.cat([tokens, next_ids[:, None]], dim=1)  # (B, T+1)
        done |= next_ids == cfg.eos_id
        if bool(done.all()):
            break
    return [_strip(row[1:], cfg.eos_id) for row in tokens.tolist()]
