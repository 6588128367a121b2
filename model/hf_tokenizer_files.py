"""The tokenizer files of a Hugging Face model directory, checked before sentencepiece, `tokenizers` or transformers
parse them: each confined to the directory (symlinks included), bounded in bytes and JSON nesting, and typed field
by field (an int is not a float is not a bool), so a hostile file is refused naming the file and the field.
"""
from __future__ import annotations

from pathlib import Path

from seqserve.contract.jsonfile import confined, read_bytes, read_object
from seqserve.contract.schema import MAX_VOCAB

TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP = "tokenizer_config.json", "special_tokens_map.json"
ADDED_TOKENS, VOCAB, MERGES, TOKENIZER_JSON = "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.json"
SPM_FILES = ("source.spm", "target.spm", "sentencepiece.bpe.model")
# Every tokenizer file the supported families' tokenizers (ours and transformers') read from the directory
FILES = (TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP, ADDED_TOKENS, VOCAB, MERGES, TOKENIZER_JSON, *SPM_FILES)
MAX_MODEL_BYTES = 64 << 20  # a sentencepiece model or merges.txt of a 250k vocabulary is a few MB
SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")
TOKEN_LISTS = ("additional_special_tokens", "extra_special_tokens")
ADDED_TOKEN_FLAGS = ("lstrip", "rstrip", "normalized", "single_word", "special")  # tokenizers.AddedToken's
# tokenizer_config.json fields the conversion reads besides the special tokens: each null or of this type
TYPED_SETTINGS = {"tokenizer_class": str, "language_codes": str, "src_lang": str, "tgt_lang": str,
                  "source_lang": str, "target_lang": str, "legacy_behaviour": bool, "separate_vocabs": bool,
                  "clean_up_tokenization_spaces": bool}


class TokenizerImportError(ValueError):
    """A tokenizer that cannot be converted exactly: the message names the file and the field."""


def path_of(hf_dir: Path, name: str) -> Path:
    """hf_dir/name, refused when it resolves outside hf_dir (`..`, a symlink leading out)."""
    return confined(hf_dir, name, TokenizerImportError)


def read_json(hf_dir: Path, name: str) -> dict:
    """A JSON object file of the directory (confined, bounded in bytes and depth)."""
    return read_object(path_of(hf_dir, name), TokenizerImportError)


def read_model_bytes(path: Path) -> bytes:
    """A binary or text model file: present, readable, not empty, bounded."""
    try:
        raw = read_bytes(path, TokenizerImportError, MAX_MODEL_BYTES)
    except OSError as exc:
        raise TokenizerImportError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if not raw:
        raise TokenizerImportError(f"{path}: empty (0 bytes)")
    return raw


def check_directory(hf_dir: Path) -> None:
    """Checks every tokenizer file present in hf_dir (FILES); raises TokenizerImportError naming the first problem."""
    for name in FILES:
        path = path_of(hf_dir, name)
        if not path.exists() and not path.is_symlink():
            continue
        if name in SPM_FILES:
            spm_proto(path)
        elif name == MERGES:
            _check_merges(path)
        elif name == TOKENIZER_JSON:
            _check_tokenizer_json(path)
        else:
            data = _read(path)
            {TOKENIZER_CONFIG: _check_config, SPECIAL_TOKENS_MAP: _check_special_map, ADDED_TOKENS: _check_ids,
             VOCAB: _check_ids}[name](path, data)


def _read(path: Path) -> dict:
    try:
        return read_object(path, TokenizerImportError)
    except OSError as exc:
        raise TokenizerImportError(f"{path}: cannot be read ({exc.strerror or exc})") from None


def token_text(path: Path, field: str, value) -> str | None:
    """A special token's text: a string, or an AddedToken object (`{"content": "</s>", "lstrip": false, ...}`, as
    save_pretrained writes them); None when absent. Anything else is refused naming the field."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str) \
            and set(value) <= {"content", "__type", *ADDED_TOKEN_FLAGS} \
            and value.get("__type", "AddedToken") == "AddedToken" \
            and all(isinstance(value[flag], bool) for flag in ADDED_TOKEN_FLAGS if flag in value):
        return value["content"]
    raise TokenizerImportError(f"{path}: {field} must be a token (a string, or an AddedToken object with a string "
                               f"content and boolean flags), got {_short(value)}")


def special_token(hf_dir: Path, config: dict, name: str, default: str) -> str:
    """tokenizer_config.json's special token `name` (checked), else the default."""
    text = token_text(hf_dir / TOKENIZER_CONFIG, name, config.get(name))
    return default if text is None else text


def _check_config(path: Path, config: dict) -> None:
    _check_special_map(path, {key: config[key] for key in (*SPECIAL_TOKEN_KEYS, *TOKEN_LISTS) if key in config})
    for key, kind in TYPED_SETTINGS.items():
        value = config.get(key)
        if value is not None and type(value) is not kind:
            raise TokenizerImportError(f"{path}: {key} must be a {kind.__name__}, got {_short(value)}")
    added = config.get("added_tokens_decoder", {})
    if not isinstance(added, dict):
        raise TokenizerImportError(f"{path}: added_tokens_decoder must be an object of id -> token")
    for key, token in added.items():
        if not key.isdigit() or int(key) >= MAX_VOCAB or not isinstance(token, dict):
            raise TokenizerImportError(f"{path}: added_tokens_decoder[{_short(key)}] must map a token id below "
                                       f"{MAX_VOCAB} to an AddedToken object")
        token_text(path, f"added_tokens_decoder[{key!r}]", token)


def _check_special_map(path: Path, data: dict) -> None:
    for key, value in data.items():
        if key in TOKEN_LISTS:
            values = list(value.values()) if isinstance(value, dict) else value
            if not isinstance(values, list):
                raise TokenizerImportError(f"{path}: {key} must be a list of tokens, got {_short(value)}")
            for i, token in enumerate(values):
                token_text(path, f"{key}[{i}]", token)
        else:
            token_text(path, key, value)


def _check_ids(path: Path, vocab: dict) -> None:
    """vocab.json / added_tokens.json: token -> an integer id in the vocabulary's range."""
    for token, token_id in vocab.items():
        if type(token_id) is not int or not 0 <= token_id < MAX_VOCAB:
            raise TokenizerImportError(f"{path}: the id of {_short(token)} must be an integer in 0..{MAX_VOCAB - 1}, "
                                       f"got {_short(token_id)}")


def _check_merges(path: Path) -> None:
    """merges.txt: UTF-8 lines of two space-separated tokens (a leading `#version` line allowed)."""
    try:
        text = read_model_bytes(path).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TokenizerImportError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    for number, line in enumerate(text.split("\n"), 1):
        if line and not (number == 1 and line.startswith("#version")) and len(line.split(" ")) != 2:
            raise TokenizerImportError(f"{path}: line {number} must be two tokens separated by one space, got "
                                       f"{_short(line)}")


def _check_tokenizer_json(path: Path) -> None:
    """tokenizer.json: a bounded JSON object that `tokenizers` itself parses (its message names the field)."""
    from tokenizers import Tokenizer

    try:
        read_object(path, TokenizerImportError)
        Tokenizer.from_file(str(path))
    except OSError as exc:
        raise TokenizerImportError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except TokenizerImportError:
        raise
    except Exception as exc:  # tokenizers raises a plain Exception naming the field
        raise TokenizerImportError(f"{path}: not a `tokenizers` tokenizer: {str(exc).splitlines()[0][:200]}") from None


def spm_proto(path: Path):
    """The sentencepiece ModelProto of a model file, refused when it is missing, empty, unreadable, not a
    sentencepiece model or has no pieces."""
    from google.protobuf.message import DecodeError
    from sentencepiece import sentencepiece_model_pb2

    raw = read_model_bytes(path)
    proto = sentencepiece_model_pb2.ModelProto()
    try:
        proto.ParseFromString(raw)
    except DecodeError:
        raise TokenizerImportError(f"{path}: not a sentencepiece model") from None
    if not proto.pieces:
        raise TokenizerImportError(f"{path}: not a sentencepiece model (pieces: none)")
    return proto


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
