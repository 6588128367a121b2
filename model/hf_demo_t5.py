"""Random-weight T5-family directories in `save_pretrained` form (rows of model/hf_demo.py's table), built with
transformers' own classes and a Unigram tokenizer trained here:

- `build_t5`: T5 v1.0 (relu FFN, tied output scaled by d_model^-0.5), num_heads * d_kv == d_model;
- `build_flan_t5`: T5 v1.1 / Flan-T5 (gated-gelu, untied lm_head, no output scale), num_heads * d_kv != d_model
  (transformers 5.23 cannot generate with num_decoder_layers != num_layers: its cache has num_layers slots);
- `build_mt5`: mT5 (MT5ForConditionalGeneration: gated-gelu, untied lm_head).

transformers 5 always ties T5's lm_head when it builds one; an untied head is written into model.safetensors
beside shared.weight with tie_word_embeddings=false, which transformers loads untied (a real Flan-T5's layout).
The tiny buckets (8, max distance 20) put short sentences into the logarithmic buckets too.
"""
from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path

from seqserve.model.hf_demo_parts import SEED, TINY, training_strings

SUMMARIZE = "summarize: "
SENTINELS = 100  # <extra_id_0..99>, after the pieces
UNUSED_SCORE = -1000.0  # a padding piece's score: far below every real piece, so the Unigram never picks it
SHARED_SCALE = 0.1  # the embeddings' std beside transformers' default init (1.0), so outputs depend on the source
TASKS = {"summarization": {"prefix": SUMMARIZE, "num_beams": 4, "max_length": 40},
         "translation_en_to_de": {"prefix": "translate English to German: "}}
GATED_GELU = "gated-gelu"  # feed_forward_proj of T5 v1.1, Flan-T5 and mT5 (v1.0's is relu)


@dataclass(frozen=True)
class T5Size:
    d_model: int
    d_kv: int
    heads: int
    d_ff: int
    layers: int  # encoder and decoder each
    vocab: int | None = None  # the tokenizer's and config.json's, padded with pieces never emitted (None: no padding)
    buckets: int = 8
    max_distance: int = 20


T5_TINY = T5Size(d_model=32, d_kv=8, heads=4, d_ff=64, layers=2)
FLAN_TINY = T5Size(d_model=32, d_kv=16, heads=3, d_ff=48, layers=2)  # 3 heads x 16 = 48 beside d_model 32
BENCH_VOCAB = 32_128  # t5-small's and flan-t5-small's vocab_size
T5_SMALL = T5Size(d_model=512, d_kv=64, heads=8, d_ff=2048, layers=6, vocab=BENCH_VOCAB, buckets=32,
                  max_distance=128)
FLAN_T5_SMALL = T5Size(d_model=512, d_kv=64, heads=6, d_ff=1024, layers=8, vocab=BENCH_VOCAB, buckets=32,
                       max_distance=128)


def spm_bytes(texts: list[str], vocab: int) -> bytes:
    """A sentencepiece Unigram with T5's ids: <pad> 0, </s> 1, <unk> 2, no <s>."""
    import sentencepiece as spm

    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=out, vocab_size=vocab, model_type="unigram",
        character_coverage=1.0, hard_vocab_limit=False, num_threads=1, minloglevel=2, pad_id=0, eos_id=1,
        unk_id=2, bos_id=-1)
    return out.getvalue()


def t5_tokenizer(directory: Path, size: int | None = None):
    """A T5Tokenizer over a Unigram trained here: <pad> 0, </s> 1, <unk> 2, pieces, 100 sentinels; with size,
    padded with pieces it never emits to size tokens (a benchmark model's whole vocabulary)."""
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb
    from transformers import T5Tokenizer

    proto = spm_bytes(training_strings(), TINY.vocab)
    (directory / "spiece.model").write_bytes(proto)
    sp = spm.SentencePieceProcessor(model_proto=proto)
    scores = [(sp.id_to_piece(i), sp.get_score(i)) for i in range(sp.get_piece_size())]
    if size:
        scores += [(f"▁unused{i}", UNUSED_SCORE) for i in range(size - SENTINELS - len(scores))]
    model = pb.ModelProto()
    model.ParseFromString(proto)
    tok = T5Tokenizer(vocab=scores, _spm_precompiled_charsmap=model.normalizer_spec.precompiled_charsmap,
                      model_max_length=512)
    tok.save_pretrained(directory)
    return tok


def _build(directory: str | Path, size: T5Size, seed: int, mt5: bool = False, gated: bool = False) -> Path:
    """gated: T5 v1.1's layout (gated-gelu and an untied head); mT5 always has it."""
    import torch
    from transformers import (
        GenerationConfig,
        MT5Config,
        MT5ForConditionalGeneration,
        T5Config,
        T5ForConditionalGeneration,
    )

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    vocab_size = len(t5_tokenizer(directory, size.vocab))
    untied = gated or mt5
    config_class, model_class = (MT5Config, MT5ForConditionalGeneration) if mt5 else \
        (T5Config, T5ForConditionalGeneration)
    v11 = {"feed_forward_proj": GATED_GELU, "tie_word_embeddings": False} if untied else {}
    config = config_class(
        vocab_size=vocab_size, d_model=size.d_model, d_kv=size.d_kv, num_heads=size.heads, d_ff=size.d_ff,
        num_layers=size.layers, relative_attention_num_buckets=size.buckets,
        relative_attention_max_distance=size.max_distance, dropout_rate=0.1, pad_token_id=0, eos_token_id=1,
        decoder_start_token_id=0, task_specific_params=TASKS, **v11)
    torch.manual_seed(seed)
    model = model_class(config).eval()
    with torch.no_grad():  # a tied head over std-1 embeddings repeats the previous token whatever the source
        model.shared.weight.mul_(SHARED_SCALE)
    model.generation_config = GenerationConfig(decoder_start_token_id=0, eos_token_id=1, pad_token_id=0,
                                               num_beams=4, max_length=30)
    model.save_pretrained(directory)
    if untied:
        _untie(directory, vocab_size, size.d_model, seed)
    return directory


def _untie(directory: Path, vocab_size: int, d_model: int, seed: int) -> None:
    """Writes an lm_head of its own beside shared.weight, as T5 v1.1 and mT5 store one, and says so in config.json."""
    import torch
    from safetensors.torch import load_file, save_file

    weights = load_file(str(directory / "model.safetensors"))
    weights["lm_head.weight"] = torch.randn(vocab_size, d_model, generator=torch.Generator().manual_seed(seed + 1))
    save_file(weights, str(directory / "model.safetensors"), metadata={"format": "pt"})
    config_file = directory / "config.json"
    config_json = json.loads(config_file.read_text())
    config_json["tie_word_embeddings"] = False
    config_file.write_text(json.dumps(config_json, indent=2))


def build_t5(directory: str | Path, size: T5Size = T5_TINY, seed: int = SEED) -> Path:
    return _build(directory, size, seed)


def build_flan_t5(directory: str | Path, size: T5Size = FLAN_TINY, seed: int = SEED) -> Path:
    return _build(directory, size, seed, gated=True)


def build_mt5(directory: str | Path, size: T5Size = T5_TINY, seed: int = SEED) -> Path:
    return _build(directory, size, seed, mt5=True)
