"""An imported checkpoint's PyTorch model against the Hugging Face model it came from, loaded by transformers.

Teacher forcing over the same padded batch: the logits of every target position must agree within 1e-4 (atol and
rtol, as checks/parity.py); transformers is imported here only (the `hf` extra).
"""
from __future__ import annotations

from pathlib import Path

import torch

from seqserve.checks.parity import LIMIT, PROBE_TEXTS, MaxDiff
from seqserve.checks.table import Check
from seqserve.model.checkpoint import load_checkpoint
from seqserve.model.decoding import pad_batch


@torch.no_grad()
def hf_parity(checkpoint: Path, hf_dir: Path, texts: tuple[str, ...] = PROBE_TEXTS, seed: int = 0) -> list[Check]:
    from transformers import AutoModelForSeq2SeqLM

    model, tok = load_checkpoint(checkpoint)
    theirs = AutoModelForSeq2SeqLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
    cfg = model.cfg
    sources = [tok.encode(t).ids[: cfg.max_positions] for t in texts]
    src, src_mask = pad_batch(sources, cfg.pad_id)  # (B, S) right-padded, rows of different lengths
    g = torch.Generator().manual_seed(seed)
    lengths = [int(n) for n in torch.randint(1, min(12, cfg.max_positions), (len(texts),), generator=g)]
    # Decoder inputs: the start token, then any ids but pad (special ones included). A pad inside a sequence would
    # shift the later positions of M2M100's fairseq positions (they count non-pad tokens) in teacher forcing only.
    targets = [[cfg.decoder_start_id] + [t + (t >= cfg.pad_id) for t in torch.randint(
        0, cfg.vocab_size - 1, (n - 1,), generator=g).tolist()] for n in lengths]
    tgt, tgt_mask = pad_batch(targets, cfg.pad_id)  # (B, T)
    ours = model(src, src_mask, tgt, tgt_mask)  # (B, T, V)
    want = theirs(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt,
                  decoder_attention_mask=tgt_mask).logits  # (B, T, V)
    diff = MaxDiff()
    for i, n in enumerate(lengths):
        diff.add("logits", ours[i, :n].numpy(), want[i, :n].double())
    rows = diff.rows(f"PyTorch vs transformers {type(theirs).__name__} (teacher forcing)")
    return rows or [Check("PyTorch vs transformers", "logits", "nothing compared", LIMIT, False)]
