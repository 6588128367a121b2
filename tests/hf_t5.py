"""Tiny random-weight T5-family directories in `save_pretrained` form, built with transformers' own classes and a
Unigram tokenizer trained here (tests/hf_fixtures.py's corpus and sentencepiece trainer):

- `build_t5`: T5 v1.0 (relu FFN, tied output scaled by d_model^-0.5), num_heads * d_kv == d_model;
- `build_flan`: T5 v1.1 / Flan-T5 (gated-gelu, untied lm_head, no output scale), num_heads * d_kv != d_model and
  (transformers 5.23 cannot generate with num_decoder_layers != num_layers: its cache has num_layers slots);
- `build_mt5`: mT5 (MT5ForConditionalGeneration: gated-gelu, untied lm_head).

transformers 5 always ties T5's lm_head when it builds one; an untied head is written into model.safetensors
beside shared.weight with tie_word_embeddings=false, which transformers loads untied (a real Flan-T5's layout).
The buckets (8, max distance 20) put short sentences into the logarithmic buckets too.
"""
from __future__ import annotations

import json
from pathlib import Path

import hf_fixtures

T5, FLAN, MT5 = "t5", "flan_t5", "mt5"
SUMMARIZE = "summarize: "
SENTINELS = 100  # <extra_id_0..99>, after the pieces
UNUSED_SCORE = -1000.0  # a padding piece's score: far below every real piece, so the Unigram never picks it
SHARED_SCALE = 0.1  # the embeddings' std beside transformers' default init (1.0), so outputs depend on the source
TASKS = {"summarization": {"prefix": SUMMARIZE, "num_beams": 4, "max_length": 40},
         "translation_en_to_de": {"prefix": "translate English to German: "}}
SIZES = {T5: dict(d_model=32, d_kv=8, num_heads=4, d_ff=64, num_layers=2),
         FLAN: dict(d_model=32, d_kv=16, num_heads=3, d_ff=48, num_layers=2,
                    feed_forward_proj="gated-gelu", tie_word_embeddings=False),
         MT5: dict(d_model=32, d_kv=8, num_heads=4, d_ff=64, num_layers=2, feed_forward_proj="gated-gelu",
                   tie_word_embeddings=False)}
BENCH_VOCAB = 32_128  # t5-small's and flan-t5-small's vocab_size
# the full sizes of t5-small and flan-t5-small, for benchmarks only
T5_BUCKETS = dict(relative_attention_num_buckets=32, relative_attention_max_distance=128)  # t5-small's, Flan's
BENCH = {"t5-small": (T5, dict(d_model=512, d_kv=64, num_heads=8, d_ff=2048, num_layers=6, **T5_BUCKETS)),
         "flan-t5-small": (FLAN, dict(d_model=512, d_kv=64, num_heads=6, d_ff=1024, num_layers=8,
                                      feed_forward_proj="gated-gelu", tie_word_embeddings=False, **T5_BUCKETS))}


def _tokenizer(directory: Path, vocab: int, size: int | None = None):
    """A T5Tokenizer over a sentencepiece Unigram trained here: <pad> 0, </s> 1, <unk> 2, pieces, 100 sentinels;
    with size, padded with pieces it never emits to size tokens (a benchmark model's whole vocabulary)."""
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb
    from transformers import T5Tokenizer

    proto = spm_bytes(hf_fixtures.training_strings(), vocab)
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


def spm_bytes(texts: list[str], vocab: int) -> bytes:
    import io

    import sentencepiece as spm

    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=out, vocab_size=vocab, model_type="unigram",
        character_coverage=1.0, hard_vocab_limit=False, num_threads=1, minloglevel=2, pad_id=0, eos_id=1,
        unk_id=2, bos_id=-1)
    return out.getvalue()


def build(kind: str, directory: str | Path, seed: int = hf_fixtures.SEED, sizes: dict | None = None,
          vocab: int = hf_fixtures.TINY.vocab, vocab_size: int | None = None) -> Path:
    """vocab: the trained pieces' target size; vocab_size: the tokenizer's and config.json's, padded with pieces never
    emitted (None: the trained pieces and the sentinels)."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import (
        GenerationConfig,
        MT5Config,
        MT5ForConditionalGeneration,
        T5Config,
        T5ForConditionalGeneration,
    )

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tok = _tokenizer(directory, vocab, vocab_size)
    size = dict(sizes or SIZES[kind])
    config_class, model_class = (MT5Config, MT5ForConditionalGeneration) if kind == MT5 else \
        (T5Config, T5ForConditionalGeneration)
    vocab_size = len(tok)
    buckets = dict(relative_attention_num_buckets=8, relative_attention_max_distance=20)  # tiny: short inputs too
    config = config_class(vocab_size=vocab_size, dropout_rate=0.1, pad_token_id=0, eos_token_id=1,
                          decoder_start_token_id=0, task_specific_params=TASKS, **(buckets | size))
    torch.manual_seed(seed)
    model = model_class(config).eval()
    with torch.no_grad():  # a tied head over std-1 embeddings repeats the previous token whatever the source
        model.shared.weight.mul_(SHARED_SCALE)
    model.generation_config = GenerationConfig(decoder_start_token_id=0, eos_token_id=1, pad_token_id=0,
                                               num_beams=4, max_length=30)
    model.save_pretrained(directory)
    if size.get("tie_word_embeddings") is False:  # an untied head, as T5 v1.1 and mT5 store one
        weights = load_file(str(directory / "model.safetensors"))
        weights["lm_head.weight"] = torch.randn(vocab_size, size["d_model"], generator=torch.Generator().manual_seed(
            seed + 1))
        save_file(weights, str(directory / "model.safetensors"), metadata={"format": "pt"})
        config_file = directory / "config.json"
        config_json = json.loads(config_file.read_text())
        config_json["tie_word_embeddings"] = False
        config_file.write_text(json.dumps(config_json, indent=2))
    return directory


BUILDERS = {kind: (lambda directory, *args, kind=kind: build(kind, directory)) for kind in SIZES}


def main(argv: list[str] | None = None) -> int:
    """`python tests/hf_t5.py t5-small DIR`: a random model of t5-small's or flan-t5-small's size (vocabulary
    32,128, as theirs, the tokenizer padded with pieces never emitted), for benchmarks."""
    import argparse

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("size", choices=sorted(BENCH))
    p.add_argument("out", help="directory to write the save_pretrained files to")
    args = p.parse_args(argv)
    kind, sizes = BENCH[args.size]
    print(build(kind, args.out, sizes=sizes, vocab_size=BENCH_VOCAB))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
