"""The bundle contract: manifest.json, written by `seqserve export` and checked by every loader.

This module imports neither torch nor onnx: the server loads bundles with it.
"""
from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field, fields
from pathlib import Path

from seqserve.contract import graph_check, names, schema
from seqserve.contract.generation import GenerationConfigError, GenerationDefaults
from seqserve.contract.jsonfile import MAX_JSON_DEPTH, depth
from seqserve.contract.languages import Languages, LanguagesError

FORMAT = "seqserve-bundle"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
DIGEST = "bundle.sha256"  # `<sha256 of manifest.json>  manifest.json`, as sha256sum writes it (sha256sum -c works)
TOKENIZER = "tokenizer.json"
VARIANTS = ("fp32", "int8", "fp16")
# Bounds checked before anything is parsed: a real manifest is a few KiB and a few levels deep, a digest file one line.
MAX_MANIFEST_BYTES = 1 << 20
MAX_MANIFEST_DEPTH = MAX_JSON_DEPTH
MAX_DIGEST_BYTES = 4096


log = logging.getLogger(__name__)
_WARNED: set[str] = set()


class BundleError(ValueError):
    """A bundle that must not be served: the message names the file at fault (and the field, for the manifest)."""


class IntegrityError(BundleError):
    """A listed file is missing or its bytes differ from the digest recorded for it (corrupted or modified)."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def file_entry(directory: Path, name: str) -> dict:
    path = directory / name
    return {"file": name, "sha256": sha256_of(path), "bytes": path.stat().st_size}


@dataclass
class Manifest:
    model: dict  # ModelConfig.to_dict()
    special_tokens: dict  # pad_id, bos_id, eos_id, unk_id, decoder_start_id (anywhere in the vocabulary)
    tokenizer: dict  # file entry
    io: dict  # {"encoder": {"inputs": [...], "outputs": [...]}, "decoder": {...}, "decoder_inplace": {...}}
    # name -> {"encoder": entry, "decoder": entry, "decoder_inplace": entry (optional), "quality": {...}}; decoder
    # entries say their KV cache, "kv_cache": "concat" | "inplace" (inplace: "max_len", "kv_dtype", "contrib_ops")
    variants: dict
    opset: int
    ir_version: int
    max_new_tokens: int  # the longest generation the model was validated for
    heldout: dict | None = None  # file entry of HELDOUT
    training: dict = field(default_factory=dict)
    generation: dict = field(default_factory=dict)  # GenerationDefaults.to_dict() of an imported model, or {}
    languages: dict = field(default_factory=dict)  # Languages.to_dict() of a multilingual model, or {}
    versions: dict = field(default_factory=dict)
    format: str = FORMAT
    format_version: int = FORMAT_VERSION

    @property
    def n_layers(self) -> int:
        return int(self.model["n_decoder_layers"])

    @property
    def decoder_start_id(self) -> int:
        return int(self.special_tokens.get(schema.DECODER_START, self.special_tokens["bos_id"]))

    def to_json(self) -> str:
        return json.dumps(self.__dict__, indent=2, sort_keys=False) + "\n"

    def save(self, directory: Path) -> None:
        """Writes manifest.json and bundle.sha256, the digest that covers the manifest itself."""
        text = self.to_json()
        (Path(directory) / MANIFEST).write_text(text)
        (Path(directory) / DIGEST).write_text(f"{hashlib.sha256(text.encode()).hexdigest()}  {MANIFEST}\n")


def expected_io(n_layers: int) -> dict:
    return {"encoder": {"inputs": names.encoder_inputs(), "outputs": names.encoder_outputs(n_layers)},
            "decoder": {"inputs": names.decoder_inputs(n_layers), "outputs": names.decoder_outputs(n_layers)},
            names.DECODER_INPLACE: {"inputs": names.decoder_inplace_inputs(n_layers),
                                    "outputs": names.decoder_inplace_outputs(n_layers)}}


def load_manifest(directory: str | Path, check_files: bool = True) -> Manifest:
    """Reads and checks a bundle: the manifest's digest, its schema (every field's type and range), format and
    version, I/O names, paths inside the bundle, and every listed file's presence and sha256."""
    directory = Path(directory)
    path = directory / MANIFEST
    if not path.is_file():
        raise BundleError(f"{path}: missing (is {directory} a seqserve bundle?)")
    size = path.stat().st_size
    if size > MAX_MANIFEST_BYTES:  # before reading it: a huge manifest must not cost its size several times over
        raise BundleError(f"{path}: {size} bytes, more than a manifest may have ({MAX_MANIFEST_BYTES})")
    raw = path.read_bytes()
    check_digest(directory, raw)
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BundleError(f"{path}: not valid JSON: {exc}") from None
    except RecursionError:
        raise BundleError(f"{path}: nested more than {MAX_MANIFEST_DEPTH} levels deep") from None
    if depth(data) > MAX_MANIFEST_DEPTH:
        raise BundleError(f"{path}: nested more than {MAX_MANIFEST_DEPTH} levels deep")
    _check_schema(path, data)
    manifest = Manifest(**data)
    # encoder and decoder always; an optional graph (decoder_inplace) only in bundles that have it
    expected = {g: io for g, io in expected_io(manifest.n_layers).items() if g in names.GRAPHS or g in manifest.io}
    if manifest.io != expected:
        raise BundleError(f"{path}: graph input/output names differ from this seqserve's contract (export/names.py)")
    for variant, files in manifest.variants.items():
        for graph in files:
            if graph in names.ALL_GRAPHS and graph not in manifest.io:
                raise BundleError(f"{path}: variants.{variant}.{graph} is listed but io.{graph} is missing")
    if "fp32" not in manifest.variants:
        raise BundleError(f"{path}: no fp32 variant")
    if check_files:
        for entry in listed_files(manifest):
            check_file(directory, entry)
    return manifest


def check_generation(path: Path, generation: dict, vocab_size: int, max_new_tokens: int) -> None:
    """The ranges a request has (max_new_tokens: the bundle's, the most a request may ask), and every token id inside
    the vocabulary (import and export ask the same, export before it writes anything); BundleError naming path and
    generation.<field>."""
    try:
        GenerationDefaults.from_dict(generation, vocab_size=vocab_size, max_new_tokens=max_new_tokens)
    except GenerationConfigError as exc:
        raise BundleError(f"{path}: generation.{exc}" if exc.field else f"{path}: generation: {exc}") from None


def _check_schema(path: Path, data) -> None:
    if not isinstance(data, dict):
        raise BundleError(f"{path}: must be a JSON object, got {type(data).__name__}")
    if data.get("format") != FORMAT:
        raise BundleError(f"{path}: format is {data.get('format')!r}, expected {FORMAT!r}")
    if data.get("format_version") != FORMAT_VERSION:
        raise BundleError(f"{path}: format_version {data.get('format_version')!r} is not supported "
                          f"(this seqserve reads version {FORMAT_VERSION}); re-export the bundle")
    known = {f.name for f in fields(Manifest)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise BundleError(f"{path}: unknown field(s) {unknown} (format_version {FORMAT_VERSION} has {sorted(known)})")
    try:
        schema.manifest_schema(VARIANTS).check(data, "")
    except schema.SchemaError as exc:
        raise BundleError(f"{path}: {exc}") from None
    if data.get("generation"):
        check_generation(path, data["generation"], data["model"]["vocab_size"], data["max_new_tokens"])
    if data.get("languages"):
        try:
            languages = Languages.from_dict(data["languages"])
        except LanguagesError as exc:
            raise BundleError(f"{path}: {exc}") from None
        vocab = data["model"]["vocab_size"]
        outside = sorted(code for code, token in languages.codes.items() if token >= vocab)
        if outside:
            raise BundleError(f"{path}: languages.codes {outside[:3]} have token ids outside the vocabulary "
                              f"(vocab_size={vocab})")
    problems = schema.cross_field_problems(data)
    if problems:
        raise BundleError(f"{path}: {'; '.join(problems)}")


def check_digest(directory: Path, manifest_bytes: bytes) -> None:
    """bundle.sha256 must match manifest.json when present; a bundle without one (exported before it existed) is
    served with a warning."""
    path = Path(directory) / DIGEST
    if not path.is_file():
        if str(directory) not in _WARNED:  # once per bundle: quality checks and tests reload it many times
            _WARNED.add(str(directory))
            log.warning("%s: no %s, so %s is covered by no digest; re-export the bundle to add one", directory,
                        DIGEST, MANIFEST)
        return
    with open(path, "rb") as f:
        blob = f.read(MAX_DIGEST_BYTES + 1)
    if len(blob) > MAX_DIGEST_BYTES:
        raise BundleError(f"{path}: more than {MAX_DIGEST_BYTES} bytes; it holds one line, `<sha256>  {MANIFEST}`")
    try:
        text = blob.decode("ascii")
    except UnicodeDecodeError as exc:
        raise BundleError(f"{path}: not text (byte {exc.start} is not ASCII); it holds one line, "
                          f"`<sha256>  {MANIFEST}`") from None
    recorded = text.split(maxsplit=1)[0] if text.strip() else ""
    actual = hashlib.sha256(manifest_bytes).hexdigest()
    if recorded != actual:
        raise IntegrityError(f"{Path(directory) / MANIFEST}: sha256 {actual[:12]}... does not match {DIGEST} "
                             f"({recorded[:12] or 'empty'}...); the manifest was modified or corrupted")


def listed_files(manifest: Manifest) -> list[dict]:
    entries = [manifest.tokenizer] + ([manifest.heldout] if manifest.heldout else [])
    for variant in manifest.variants.values():
        entries += [variant[graph] for graph in names.ALL_GRAPHS if graph in variant]
    return entries


def check_file(directory: Path, entry: dict) -> None:
    path = directory / entry["file"]
    if not path.resolve().is_relative_to(Path(directory).resolve()):  # the schema refused `..`; this catches links
        raise BundleError(f"{path}: listed in {MANIFEST} but resolves outside the bundle directory")
    if not path.is_file():
        raise IntegrityError(f"{path}: listed in {MANIFEST} but missing")
    actual = sha256_of(path)
    if actual != entry["sha256"]:
        raise IntegrityError(f"{path}: sha256 {actual[:12]}... does not match {MANIFEST} ({entry['sha256'][:12]}...); "
                          "the file was modified or corrupted")


def check_session_io(path: Path, session, graph: str, manifest: Manifest) -> None:
    """Refuses a graph whose onnxruntime inputs/outputs differ from the manifest's. A decoder graph may end with the
    token-choice outputs (names.TOKEN_CHOICE_OUTPUTS, all of them; its variant entry lists them as token_choice)."""
    got = {"inputs": [i.name for i in session.get_inputs()], "outputs": [o.name for o in session.get_outputs()]}
    want = manifest.io[graph]
    choice = list(names.TOKEN_CHOICE_OUTPUTS)
    if graph != names.ENCODER and got["outputs"][-len(choice):] == choice:
        got["outputs"] = got["outputs"][: -len(choice)]
    if got != want:
        raise BundleError(f"{path}: graph inputs/outputs {got} do not match {MANIFEST} {want}")
    try:
        graph_check.check_graph(session, graph, manifest)
    except graph_check.GraphMismatch as exc:
        raise BundleError(f"{path}: {exc} ({MANIFEST})") from None


def load_error(path: Path, field: str, exc: Exception) -> BundleError:
    """onnxruntime could not load a listed graph: the file and its manifest field, and onnxruntime's first line."""
    lines = str(exc).split("Status Message:")[-1].strip().splitlines()
    reason = lines[0][:200] if lines else "no reason given"
    if isinstance(exc, UnicodeDecodeError):  # onnxruntime's message quoted bytes of the corrupted file
        reason = "its error message is not valid UTF-8 (the file is corrupted)"
    return BundleError(f"{path}: onnxruntime cannot load it ({field} in {MANIFEST}): {reason}")
