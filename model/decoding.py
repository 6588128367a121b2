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


def apply_generation_rules(logits: torch.Tensor, step: int, max_new_tokens: int, generation: dict) -> None:
    """In place, logits (B, V) of generated token number `step` (from 0): a model's generation_config rules as
    Hugging Face's processors apply them: bad_words_ids (single tokens) never chosen, forced_bos_token_id first,
    forced_eos_token_id as the last token max_new_tokens allows (engine/decoding/token_rules.py holds the engine's
    copy)."""
    for token in generation.get("bad_words_ids", []):
        logits[:, token] = -torch.inf
    for key, forced in (("forced_bos_token_id", step == 0), ("forced_eos_token_id", step == max_new_tokens - 1)):
        if forced and generation.get(key) is not None:
            logits[:] = -torch.inf
            logits[:, generation[key]] = 0.0


@torch.no_grad()
def greedy_decode(
    model: Transformer, sources: list[list[int]], max_new_tokens: int, use_cache: bool = True,
    generation: dict | None = None,
) -> list[list[int]]:
    """Batched greedy decoding; returns each row's generated ids without the end token.

    use_cache=False is the textbook loop: the whole decoder is recomputed over the prefix at every step.
    generation: the model's rules (a manifest's "generation"; apply_generation_rules).
    """
    cfg = model.cfg
    dev = next(model.parameters()).device  # the model's device (the benchmark runs it on CUDA too)
    src_ids, src_mask = pad_batch(sources, cfg.pad_id, dev)
    b = src_ids.shape[0]
    cross = model.cross_kv(model.encode(src_ids, src_mask))
    tokens = torch.full((b, 1), cfg.decoder_start_id, dtype=torch.int64, device=dev)  # (B, 1) the start token
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
        last = logits[:, -1].clone()  # (B, V)
        if generation:
            apply_generation_rules(last, step, max_new_tokens, generation)
        next_ids = last.argmax(-1)  # (B,)
        next_ids = torch.where(done, torch.full_like(next_ids, cfg.eos_id), next_ids)
        tokens = torch.cat([tokens, next_ids[:, None]], dim=1)  # (B, T+1)
        done |= next_ids == cfg.eos_id
        if bool(done.all()):
            break
    return [_strip(row[1:], cfg.eos_id) for row in tokens.tolist()]
