"""Tiny random-weight Hugging Face models for the tests: the product's own builders (model/hf_demo.py, what
`seqserve hf-demo` writes), plus what only tests need: the languages the multilingual tests use, real target
sentences, and `python tests/hf_fixtures.py marian DIR --size base` for the benchmark's opus-mt-size model.
transformers, sentencepiece and torch are imported inside the builders, so importing this module costs nothing.
"""
from __future__ import annotations

from seqserve.model import hf_demo, tokenizer_texts
from seqserve.model.hf_demo import BART, M2M100, MARIAN, MBART50, MULTILINGUAL, NLLB, SIZES, build  # noqa: F401
from seqserve.model.hf_demo_models import (  # noqa: F401
    build_bart, build_m2m100, build_marian, build_mbart50, build_nllb)
from seqserve.model.hf_demo_parts import (  # noqa: F401
    LOGITS_BIAS_STD, MARIAN_BASE, SEED, TINY, HfSize, real_strings, train_sentencepiece, training_strings)

# the BART-layout families' names, in the table's order (tests/hf_t5.py has the T5 ones)
FAMILIES = tuple(name for name, family in hf_demo.FAMILIES.items() if not family.t5)
BUILDERS = {name: hf_demo.FAMILIES[name].build for name in FAMILIES}
_train_sentencepiece = train_sentencepiece


def target_texts(n: int = 200) -> list[str]:
    """Real target-side sentences (number words in four languages) whose ids test decoding."""
    return [target for _, target in tokenizer_texts.pairs(SEED + 1, n)]


# Source and target languages the multilingual tests use: the model's own codes
TEST_LANGUAGES = {M2M100: ("en", ("fr", "de", "ja")), NLLB: ("eng_Latn", ("fra_Latn", "deu_Latn", "zho_Hans")),
                  MBART50: ("en_XX", ("fr_XX", "de_DE", "ro_RO"))}


def main(argv: list[str] | None = None) -> int:
    """`python tests/hf_fixtures.py marian DIR --size base`: the benchmark's opus-mt-size random model."""
    import argparse

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("family", choices=FAMILIES)
    p.add_argument("out", help="directory to write the save_pretrained files to")
    p.add_argument("--size", choices=sorted(SIZES), default="tiny")
    p.add_argument("--seed", type=int, default=SEED)
    args = p.parse_args(argv)
    print(build(args.family, args.out, SIZES[args.size], args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
