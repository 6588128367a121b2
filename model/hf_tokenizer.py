"""A Hugging Face model directory's tokenizer as ONE `tokenizers` tokenizer.json, so the server needs neither
transformers nor sentencepiece.

The result encodes a source exactly as the original tokenizer does, special tokens included (Marian: the source
sentencepiece model mapped through vocab.json, then </s>; BART: <s> ... </s>), and decodes generated ids exactly as
the original's `decode(ids, skip_special_tokens=True)`, also one id at a time through `tokenizers.decoders.
DecodeStream` (tests/model/test_hf_tokenizer.py holds both against transformers). The end-of-source token comes
from the tokenizer's own post-processor, so the manifest needs no flag for it.

transformers, sentencepiece and protobuf are imported inside the functions: only `seqserve import` needs them.
"""
from __future__ import annotations

from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from seqserve.contract.languages import PREFIX, SUFFIX, Languages
from seqserve.model.hf_tokenizer_files import (
    TOKENIZER_CONFIG,
    TokenizerImportError,
    check_directory,
    path_of,
    read_json,
    special_token,
    spm_proto,
)

MARIAN, BART, M2M100, MBART = "marian", "bart", "m2m_100", "mbart"
T5_TYPES = ("t5", "mt5")  # a Unigram that transformers 5 runs on `tokenizers` (T5Tokenizer), appending </s>
FAMILIES = (MARIAN, BART, M2M100, MBART, *T5_TYPES)
# tokenizer_config.json's tokenizer_class of the multilingual tokenizers that transformers 5 runs on `tokenizers`
# (their module's FAIRSEQ_LANGUAGE_CODES, and where the source language token goes)
BACKEND_MULTILINGUAL = {"NllbTokenizer": ("nllb", "tokenization_nllb"),
                        "MBart50Tokenizer": ("mbart50", "tokenization_mbart50"),
                        "MBartTokenizer": ("mbart", "tokenization_mbart")}
SPIECE_UNDERLINE = "▁"
# Python's str.strip() removes exactly these (str.isspace); MarianTokenizer.convert_tokens_to_string ends with it.
_PY_WHITESPACE = "".join(c for c in map(chr, range(0x110000)) if c.isspace())
# A vocab.json piece the source sentencepiece model never emits (specials, target-only pieces): far below every
# real score, so Unigram takes it only where sentencepiece itself would find no other segmentation.
_NEVER_SCORE_BELOW = 1000.0


def convert(hf_dir: str | Path) -> Tokenizer:
    """The model directory's tokenizer (config.json's model_type picks the family) as one `tokenizers` Tokenizer
    (a multilingual one without its source language token: see convert_multilingual)."""
    return convert_multilingual(hf_dir)[0]


def convert_multilingual(hf_dir: str | Path) -> tuple[Tokenizer, Languages | None]:
    """(the tokenizer, the model's languages or None). A multilingual tokenizer encodes `text </s>`; the source
    language token is placed by Languages.source_ids (contract/languages.py)."""
    hf_dir = Path(hf_dir)
    family = model_type(hf_dir)
    check_directory(hf_dir)  # every tokenizer file confined, bounded and typed before anything parses it
    if family == MARIAN:
        return marian_tokenizer(hf_dir), None
    if family == BART or (family == MBART and (hf_dir / "merges.txt").is_file()):  # mBART's architecture, BART's BPE
        return bart_tokenizer(hf_dir), None
    if family in T5_TYPES:
        return t5_tokenizer(hf_dir), None
    if family in (M2M100, MBART):
        settings = path_of(hf_dir, TOKENIZER_CONFIG)
        name = (read_json(hf_dir, TOKENIZER_CONFIG).get("tokenizer_class") or "").removesuffix("Fast")
        if name in BACKEND_MULTILINGUAL:
            return backend_multilingual(hf_dir, name)
        if family == M2M100 and name in ("M2M100Tokenizer", ""):
            return m2m100_tokenizer(hf_dir)
        raise TokenizerImportError(f"{settings}: tokenizer_class {name!r} is not supported for model_type {family} "
                                   f"(supported: {', '.join(['M2M100Tokenizer', *BACKEND_MULTILINGUAL])})")
    raise TokenizerImportError(f"{hf_dir / 'config.json'}: model_type {family!r} has no tokenizer conversion "
                               f"(supported: {', '.join(FAMILIES)})")


def save(hf_dir: str | Path, out: str | Path) -> Path:
    """Converts and writes tokenizer.json to out (a file path)."""
    out = Path(out)
    convert(hf_dir).save(str(out))
    return out


def model_type(hf_dir: Path) -> str:
    return str(read_json(hf_dir, "config.json").get("model_type"))


def unk_token(hf_dir: Path) -> str:
    """The unknown token tokenizer_config.json names (checked), else `<unk>`."""
    return special_token(hf_dir, _settings(hf_dir), "unk_token", "<unk>")


def _settings(hf_dir: Path) -> dict:
    """tokenizer_config.json, or {} when the directory has none."""
    return read_json(hf_dir, TOKENIZER_CONFIG) if path_of(hf_dir, TOKENIZER_CONFIG).is_file() else {}


# -- Marian -----------------------------------------------------------------------------------------------------

def marian_tokenizer(hf_dir: Path) -> Tokenizer:
    """MarianTokenizer (transformers 5, a Python tokenizer over sentencepiece) rebuilt as a Unigram tokenizer.

    Encoding: the source.spm's normalizer (its precompiled nmt_nfkc map), whitespace runs collapsed and trimmed,
    pieces chosen by the source model's scores, each piece's id read from vocab.json (which orders pieces unlike
    sentencepiece: opus-mt has </s> 0, <unk> 1, <pad> last), then </s>. Decoding: the pieces joined, '▁' as a space,
    and the result stripped, as MarianTokenizer.convert_tokens_to_string does.
    """
    config = _settings(hf_dir)
    for flag in ("separate_vocabs", "clean_up_tokenization_spaces"):
        if config.get(flag):
            raise TokenizerImportError(f"{hf_dir / 'tokenizer_config.json'}: {flag}=true is not supported")
    vocab = read_json(hf_dir, "vocab.json")
    if any(piece.startswith(">>") and piece.endswith("<<") for piece in vocab):
        raise TokenizerImportError(f"{hf_dir / 'vocab.json'}: target-language codes (>>xx<<) are not supported yet")
    return _spm_vocab_tokenizer(hf_dir, "source.spm", vocab, config, ("eos_token", "unk_token", "pad_token"), [])


def m2m100_tokenizer(hf_dir: Path) -> tuple[Tokenizer, Languages]:
    """M2M100Tokenizer (a Python tokenizer over sentencepiece, as Marian's) rebuilt the same way from
    sentencepiece.bpe.model and vocab.json; its language tokens `__fr__` follow vocab.json (id len(vocab) + i, in
    transformers' FAIRSEQ_LANGUAGE_CODES order), named by their code (`fr`), placed before the source."""
    from transformers.models.m2m_100.tokenization_m2m_100 import FAIRSEQ_LANGUAGE_CODES

    config = _settings(hf_dir)
    family = config.get("language_codes", "m2m100")
    if family not in FAIRSEQ_LANGUAGE_CODES:
        raise TokenizerImportError(f"{hf_dir / 'tokenizer_config.json'}: language_codes {family!r} is not one of "
                                   f"{sorted(FAIRSEQ_LANGUAGE_CODES)}")
    vocab = read_json(hf_dir, "vocab.json")
    codes = FAIRSEQ_LANGUAGE_CODES[family]
    added = [(f"__{code}__", len(vocab) + i) for i, code in enumerate(codes)]
    tok = _spm_vocab_tokenizer(hf_dir, "sentencepiece.bpe.model", vocab, config,
                               ("bos_token", "eos_token", "unk_token", "pad_token"), added)
    return tok, Languages({code: token for code, (_, token) in zip(codes, added)}, PREFIX)


def _spm_vocab_tokenizer(hf_dir: Path, spm_name: str, vocab: dict[str, int], config: dict, special_names: tuple,
                         added: list[tuple[str, int]]) -> Tokenizer:
    """A Python sentencepiece tokenizer whose ids come from vocab.json (Marian, M2M100) as one Unigram tokenizer:
    `text </s>`, with `added` special tokens (token, id) appended after vocab.json in id order."""
    defaults = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
    specials = {name: special_token(hf_dir, config, name, defaults[name]) for name in special_names}
    for name, token in specials.items():
        if token not in vocab:
            raise TokenizerImportError(f"{hf_dir / 'vocab.json'}: no entry for {name} {token!r}")
    proto = _spm_proto(path_of(hf_dir, spm_name))
    pieces = _unigram_vocab(hf_dir, proto, vocab)
    tok = Tokenizer(models.Unigram(pieces, unk_id=vocab[specials["unk_token"]], byte_fallback=False))
    tok.normalizer = _spm_normalizer(proto)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPIECE_UNDERLINE, prepend_scheme="always", split=True)
    tok.decoder = decoders.Sequence([
        decoders.Replace(SPIECE_UNDERLINE, " "),
        decoders.Fuse(),  # one string, so the strip below acts on the whole text as str.strip() does
        decoders.Replace(Regex(f"^[{_PY_WHITESPACE}]+|[{_PY_WHITESPACE}]+$"), ""),
    ])
    # The Python tokenizer splits its special tokens out of the text before sentencepiece sees it.
    tok.add_special_tokens([AddedToken(specials[name], special=True, normalized=False) for name in special_names])
    tok.add_special_tokens([AddedToken(token, special=True, normalized=False) for token, _ in added])
    wrong = [(token, want, tok.token_to_id(token)) for token, want in added if tok.token_to_id(token) != want]
    if wrong:
        raise TokenizerImportError(f"{hf_dir / 'vocab.json'}: token {wrong[0][0]!r} would get id {wrong[0][2]}, "
                                   f"the model's is {wrong[0][1]}")
    eos = specials["eos_token"]
    tok.post_processor = processors.TemplateProcessing(single=f"$A {eos}", pair=f"$A $B {eos}",
                                                       special_tokens=[(eos, vocab[eos])])
    tok.no_padding()
    tok.no_truncation()
    return tok


def _spm_proto(path: Path):
    """The source sentencepiece model (hf_tokenizer_files.spm_proto), refused when it uses what we cannot convert."""
    proto = spm_proto(path)
    spec, norm = proto.trainer_spec, proto.normalizer_spec
    unsupported = {
        "trainer_spec.model_type (only unigram)": spec.model_type != 1,
        "trainer_spec.byte_fallback": spec.byte_fallback,
        "normalizer_spec.add_dummy_prefix=false": not norm.add_dummy_prefix,
        "normalizer_spec.remove_extra_whitespaces=false": not norm.remove_extra_whitespaces,
        "normalizer_spec.escape_whitespaces=false": not norm.escape_whitespaces,
        "denormalizer_spec (a decoding rule set)": bool(proto.denormalizer_spec.precompiled_charsmap),
    }
    refused = [name for name, bad in unsupported.items() if bad]
    if refused:
        raise TokenizerImportError(f"{path}: {', '.join(refused)} is not supported")
    return proto


def _unigram_vocab(hf_dir: Path, proto, vocab: dict[str, int]) -> list[tuple[str, float]]:
    """(piece, score) in vocab.json's id order; every piece the source model can emit must be in vocab.json
    (MarianTokenizer would map a missing one to <unk>, which a Unigram model cannot express)."""
    ids = sorted(vocab.values())
    if ids != list(range(len(vocab))):
        raise TokenizerImportError(f"{hf_dir / 'vocab.json'}: ids must be 0..{len(vocab) - 1}, each once")
    normal = {p.piece: p.score for p in proto.pieces if p.type in (1, 4)}  # NORMAL, USER_DEFINED
    missing = sorted(set(normal) - set(vocab))
    if missing:
        raise TokenizerImportError(f"{hf_dir / 'vocab.json'}: {len(missing)} piece(s) of source.spm are missing, "
                                   f"e.g. {missing[:3]}")
    never = min(normal.values(), default=0.0) - _NEVER_SCORE_BELOW
    by_id = sorted(vocab.items(), key=lambda item: item[1])
    return [(piece, normal.get(piece, never)) for piece, _ in by_id]


def _spm_normalizer(proto) -> normalizers.Normalizer:
    """sentencepiece's normalization: its character map, then whitespace trimmed and runs collapsed (the dummy
    prefix comes from the Metaspace pre-tokenizer)."""
    steps = [normalizers.Strip(left=True, right=True), normalizers.Replace(Regex(" {2,}"), " ")]
    charsmap = proto.normalizer_spec.precompiled_charsmap
    if charsmap:
        steps.insert(0, normalizers.Precompiled(charsmap))
    return normalizers.Sequence(steps)


# -- BART -------------------------------------------------------------------------------------------------------

def bart_tokenizer(hf_dir: Path) -> Tokenizer:
    """BART's tokenizer is a byte-level BPE that transformers 5 already runs on `tokenizers` (BartTokenizer is
    RobertaTokenizer): its backend, post-processor <s> $A </s> included, is the tokenizer."""
    for name in ("vocab.json", "merges.txt"):
        if not path_of(hf_dir, name).is_file() and not path_of(hf_dir, "tokenizer.json").is_file():
            raise TokenizerImportError(f"{hf_dir / name}: missing (and no tokenizer.json)")
    _, tok = _backend(hf_dir)
    tok.no_padding()
    tok.no_truncation()
    return tok


def t5_tokenizer(hf_dir: Path) -> Tokenizer:
    """T5Tokenizer (spiece.model or tokenizer.json, Unigram) is a `tokenizers` tokenizer in transformers 5: its
    backend, the post-processor that appends </s> included, is the tokenizer."""
    if not path_of(hf_dir, "tokenizer.json").is_file() and not path_of(hf_dir, "spiece.model").is_file():
        raise TokenizerImportError(f"{hf_dir / 'spiece.model'}: missing (and no tokenizer.json)")
    _, tok = _backend(hf_dir)
    tok.no_padding()
    tok.no_truncation()
    return tok


def _backend(hf_dir: Path) -> tuple[object, Tokenizer]:
    """transformers' own tokenizer of the directory, and a copy of its `tokenizers` backend."""
    from transformers import AutoTokenizer

    try:
        original = AutoTokenizer.from_pretrained(str(hf_dir))
    except Exception as exc:  # its files passed check_directory; whatever else transformers refuses, it says why
        first = (str(exc).splitlines() or [""])[0][:200]
        raise TokenizerImportError(f"{hf_dir}: transformers cannot load its tokenizer: {type(exc).__name__}: "
                                   f"{first}") from None
    backend = getattr(original, "backend_tokenizer", None)
    if backend is None:
        raise TokenizerImportError(f"{hf_dir}: transformers loaded {type(original).__name__}, which has no "
                                   "`tokenizers` backend")
    return original, Tokenizer.from_str(backend.to_str())


# -- NLLB, mBART-50, mBART (transformers 5 runs them on `tokenizers`) -------------------------------------------

def backend_multilingual(hf_dir: Path, class_name: str) -> tuple[Tokenizer, Languages]:
    """The tokenizer's own `tokenizers` backend with its post-processor made language-free (`text </s>`), and its
    language codes (those of the class's FAIRSEQ_LANGUAGE_CODES that are special tokens of the tokenizer).
    Source placement: NLLB puts the source language first unless legacy_behaviour (then after </s>); mBART-50
    first; mBART-cc25 after </s>."""
    import importlib

    package, module = BACKEND_MULTILINGUAL[class_name]
    codes = importlib.import_module(f"transformers.models.{package}.{module}").FAIRSEQ_LANGUAGE_CODES
    original, tok = _backend(hf_dir)
    eos, eos_id = original.eos_token, original.eos_token_id
    tok.post_processor = processors.TemplateProcessing(single=f"$A {eos}", pair=f"$A $B {eos}",
                                                       special_tokens=[(eos, eos_id)])
    tok.no_padding()
    tok.no_truncation()
    special = {i for i, added in tok.get_added_tokens_decoder().items() if added.special}
    found = {code: tok.token_to_id(code) for code in codes if tok.token_to_id(code) in special}
    if not found:
        raise TokenizerImportError(f"{hf_dir}: {class_name} has none of its language codes as special tokens")
    legacy = class_name == "MBartTokenizer" or bool(getattr(original, "legacy_behaviour", False))
    return tok, Languages(found, SUFFIX if legacy else PREFIX)
