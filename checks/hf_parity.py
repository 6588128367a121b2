"""An imported checkpoint's PyTorch model against the Hugging Face model it came from, loaded by transformers.

Teacher forcing over the same padded batch: the logits of every target position must agree within 1e-4 (atol and
rtol, as checks/parity.py). With a bundle, its tokenizer.json (loaded as the server loads it) must also give the
ids transformers' own tokenizer of the directory gives, on every real string of model/tokenizer_texts.py: logits
alone cannot see a tokenizer converted from the wrong files. transformers is imported here only (the `hf` extra).
"""
from __future__ import annotations

import warnings
from pathlib import Path

import torch

from seqserve.checks.parity import LIMIT, PROBE_TEXTS, MaxDiff
from seqserve.checks.table import Check
from seqserve.model.tokenizer_texts import real_strings
from seqserve.contract.integrity import open_bundle
from seqserve.contract.languages import Languages
from seqserve.model.checkpoint import load_checkpoint
from seqserve.model.decoding import pad_batch

TOKENIZER_CHECK = "tokenizer ids vs transformers"


@torch.no_grad()
def hf_parity(checkpoint: Path, hf_dir: Path, texts: tuple[str, ...] = PROBE_TEXTS, seed: int = 0,
              bundle: Path | None = None) -> list[Check]:
    """The logits rows, and with `bundle` the row of its tokenizer against transformers' (tokenizer_parity)."""
    rows = _logits(checkpoint, hf_dir, texts, seed)
    if bundle is not None:
        manifest, tokenizer = open_bundle(bundle, check_files=False)  # a modified file is the integrity row's
        rows.append(tokenizer_parity(tokenizer, Languages.from_dict(manifest.languages), hf_dir,
                                     str(Path(bundle) / manifest.tokenizer["file"])))
    return rows


def tokenizer_parity(tokenizer, languages: Languages | None, hf_dir: Path, subject: str,
                     texts: list[str] | None = None) -> Check:
    """The encoder input ids of `tokenizer` (a multilingual one with the source language token placed as the server
    places it, for the original's src_lang) against transformers' tokenizer of hf_dir, string by string; the row
    names the first string that differs."""
    from transformers import AutoTokenizer

    texts = real_strings() if texts is None else texts
    limit = f"identical ids on {len(texts)} strings"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # MarianTokenizer recommends sacremoses, which it does not use to encode
            original = AutoTokenizer.from_pretrained(str(hf_dir))
    except Exception as exc:  # the row fails, the table still prints
        return Check(TOKENIZER_CHECK, subject, f"transformers cannot load {hf_dir}: {exc}"[:200], limit, False)
    lang = None
    if languages is not None:
        lang = getattr(original, "src_lang", None)
        lang = lang if lang in languages.codes else next(iter(languages.codes))
        original.src_lang = lang
    for i, text in enumerate(texts):
        ours = tokenizer.encode(text).ids
        ours = ours if lang is None else languages.source_ids(ours, lang)
        theirs = original(text).input_ids
        if ours != theirs:
            return Check(TOKENIZER_CHECK, subject, f"string {i} {text[:60]!r} differs: {ours[:8]} vs transformers' "
                         f"{theirs[:8]}", limit, False)
    return Check(TOKENIZER_CHECK, subject, f"{len(texts)}/{len(texts)} strings identical", limit, True)


def _logits(checkpoint: Path, hf_dir: Path, texts: tuple[str, ...], seed: int) -> list[Check]:
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
