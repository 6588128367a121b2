"""The manifest's schema: every field's type and range, checked before anything reads it.

A small declarative checker rather than JSON Schema: its errors name the field as a path into manifest.json
(`variants.fp32.decoder.file`), and the same specs say which paths a bundle may name (relative, inside the bundle).
"""
from __future__ import annotations

import re
from pathlib import PurePosixPath


class SchemaError(ValueError):
    """A manifest value of the wrong type or range; the message starts with the field's path."""


def _kind(value) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), type(value).__name__)


def _fail(where: str, expected: str, value) -> None:
    shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
    raise SchemaError(f"{where or 'the manifest'} must be {expected}, got {_kind(value)} {shown}")


class Anything:
    def check(self, value, where: str) -> None:
        pass


class Int:
    def __init__(self, min: int | None = None, max: int | None = None) -> None:
        self.min, self.max = min, max

    def check(self, value, where: str) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            _fail(where, "an integer", value)
        if self.min is not None and value < self.min:
            raise SchemaError(f"{where} must be >= {self.min}, got {value}")
        if self.max is not None and value > self.max:
            shown = value if len(str(value)) <= 24 else f"a {len(str(value))}-digit number"
            raise SchemaError(f"{where} must be <= {self.max}, got {shown}")


class Str:
    def __init__(self, pattern: str | None = None, what: str = "a string") -> None:
        self.pattern, self.what = pattern, what

    def check(self, value, where: str) -> None:
        if not isinstance(value, str) or (self.pattern and not re.fullmatch(self.pattern, value)):
            _fail(where, self.what, value)


class RelPath:
    """A file inside the bundle: relative, no `..`, no backslash or drive (paths are POSIX in every manifest)."""

    def check(self, value, where: str) -> None:
        if not isinstance(value, str) or not value:
            _fail(where, "a non-empty relative path", value)
        path = PurePosixPath(value)
        if path.is_absolute() or ".." in path.parts or "\\" in value or ":" in value or "\0" in value:
            raise SchemaError(f"{where} must be a path inside the bundle directory (relative, no '..'), got {value!r}")


class Nullable:
    def __init__(self, spec) -> None:
        self.spec = spec

    def check(self, value, where: str) -> None:
        if value is not None:
            self.spec.check(value, where)


class List:
    def __init__(self, item) -> None:
        self.item = item

    def check(self, value, where: str) -> None:
        if not isinstance(value, list):
            _fail(where, "a list", value)
        for i, v in enumerate(value):
            self.item.check(v, f"{where}[{i}]")


class Obj:
    """An object with required fields, optional ones, and a spec for any other field (None: others refused)."""

    def __init__(self, required: dict | None = None, optional: dict | None = None, extra=None) -> None:
        self.required, self.optional, self.extra = required or {}, optional or {}, extra

    def check(self, value, where: str) -> None:
        if not isinstance(value, dict):
            _fail(where, "an object", value)
        prefix = f"{where}." if where else ""
        for name, spec in self.required.items():
            if name not in value:
                raise SchemaError(f"{prefix}{name} is missing")
            spec.check(value[name], prefix + name)
        for name, v in value.items():
            if not isinstance(name, str):
                _fail(where, "an object with string keys", value)
            if name in self.required:
                continue
            spec = self.optional.get(name, self.extra)
            if spec is None:
                raise SchemaError(f"{prefix}{name} is not a known field")
            spec.check(v, prefix + name)


class Map:
    """An object whose keys are names (from `keys`, if given) and whose values all follow one spec."""

    def __init__(self, value, keys: tuple[str, ...] | None = None, needs: tuple[str, ...] = ()) -> None:
        self.value, self.keys, self.needs = value, keys, needs

    def check(self, value, where: str) -> None:
        if not isinstance(value, dict):
            _fail(where, "an object", value)
        for name in self.needs:
            if name not in value:
                raise SchemaError(f"{where}.{name} is missing")
        for name, v in value.items():
            if self.keys is not None and name not in self.keys:
                raise SchemaError(f"{where}.{name}: unknown name (known: {', '.join(self.keys)})")
            self.value.check(v, f"{where}.{name}")


# Upper bounds keep every size derived from the config (positional probes, cache shapes, request limits) allocatable;
# each is far above any encoder-decoder model served here. New optional config fields get their own bounds.
MAX_POSITIONS = 1 << 16
MAX_VOCAB = 1 << 22
MAX_WIDTH = 1 << 16  # d_model
MAX_FF = 1 << 18  # d_ff
MAX_HEADS = MAX_LAYERS = 1024
MAX_FILE_BYTES = 1 << 40
ID = Int(min=0, max=MAX_VOCAB - 1)
SHA256 = Str(r"[0-9a-f]{64}", "64 lowercase hex digits (a sha256)")
# A listed file; further keys describe the graph it holds (e.g. its KV-cache kind), so they are allowed.
FILE_ENTRY = Obj({"file": RelPath(), "sha256": SHA256, "bytes": Int(min=0, max=MAX_FILE_BYTES)}, extra=Anything())
SPECIAL_IDS = ("pad_id", "bos_id", "eos_id", "unk_id")
DECODER_START = "decoder_start_id"  # the decoder's first input; absent (bundles before it existed) = bos_id
# ModelConfig's sizes -> their largest value: one table for the manifest's `model` and for `seqserve import`.
MODEL_CAPS = {"vocab_size": MAX_VOCAB, "d_model": MAX_WIDTH, "n_heads": MAX_HEADS, "n_encoder_layers": MAX_LAYERS,
              "n_decoder_layers": MAX_LAYERS, "d_ff": MAX_FF, "max_positions": MAX_POSITIONS}
MODEL = Obj({name: Int(1, cap) for name, cap in MODEL_CAPS.items()},
            optional={name: ID for name in SPECIAL_IDS + (DECODER_START,)},
            extra=Anything())  # other ModelConfig fields pass through
# Every graph of a variant is a file entry: encoder and decoder always, optional graphs (decoder_inplace) beside them.
VARIANT = Obj({"encoder": FILE_ENTRY, "decoder": FILE_ENTRY}, optional={"quality": Obj(extra=Anything())},
              extra=FILE_ENTRY)
IO = Map(Obj({"inputs": List(Str()), "outputs": List(Str())}))


def manifest_schema(variants: tuple[str, ...]) -> Obj:
    """The top level (fields the Manifest dataclass has beyond these are checked by the caller)."""
    return Obj({"format": Str(), "format_version": Int(), "model": MODEL,
                "special_tokens": Obj({name: ID for name in SPECIAL_IDS}, optional={DECODER_START: ID}),
                "tokenizer": FILE_ENTRY, "io": IO,
                "variants": Map(VARIANT, keys=variants, needs=("fp32",)), "opset": Int(1, 1000),
                "ir_version": Int(1, 1000),
                "max_new_tokens": Int(1, MAX_POSITIONS)},
               optional={"heldout": Nullable(FILE_ENTRY), "training": Obj(extra=Anything()),
                         "generation": Obj(extra=Anything()),  # contract/generation.py checks its fields
                         "languages": Obj(extra=Anything()),  # contract/languages.py checks its fields
                         "versions": Obj(extra=Anything())}, extra=Anything())


def cross_field_problems(data: dict) -> list[str]:
    """Consistency a per-field type cannot express (run after the schema passed)."""
    model, special = data["model"], data["special_tokens"]
    problems = []
    d_kv = model.get("d_kv")
    if d_kv is not None and (isinstance(d_kv, bool) or not isinstance(d_kv, int) or not 0 < d_kv <= MAX_WIDTH):
        problems.append(f"model.d_kv={d_kv!r} must be an integer in [1, {MAX_WIDTH}] or null")
    elif d_kv is None and model["d_model"] % model["n_heads"]:
        problems.append(f"model.d_model={model['d_model']} is not a multiple of model.n_heads={model['n_heads']}")
    if data["max_new_tokens"] > model["max_positions"]:
        problems.append(f"max_new_tokens={data['max_new_tokens']} exceeds model.max_positions={model['max_positions']} "
                        "(the decoder's positions)")
    for name in [n for n in SPECIAL_IDS + (DECODER_START,) if n in special]:
        if special[name] >= model["vocab_size"]:
            problems.append(f"special_tokens.{name}={special[name]} is outside the vocabulary "
                            f"(model.vocab_size={model['vocab_size']})")
        if name in model and model[name] != special[name]:
            problems.append(f"model.{name}={model[name]} differs from special_tokens.{name}={special[name]}")
    # Ids may sit anywhere and the start token may be another special token (Marian starts from <pad>, BART from
    # </s>); a model without its own <s> (Marian) names its start token as bos_id. pad, eos, unk must differ.
    distinct = [special[n] for n in ("pad_id", "eos_id", "unk_id")]
    if len(set(distinct)) != 3 or special["bos_id"] in (special["eos_id"], special["unk_id"]):
        problems.append(f"special_tokens pad_id, eos_id and unk_id must be three different ids and bos_id differ "
                        f"from eos_id and unk_id, got {special}")
    return problems
