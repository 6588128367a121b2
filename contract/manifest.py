"""The bundle contract: manifest.json, written by `seqserve export` and checked by every loader.

This module imports neither torch nor onnx: the server loads bundles with it.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from seqserve.contract import names

FORMAT = "seqserve-bundle"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
TOKENIZER = "tokenizer.json"
VARIANTS = ("fp32", "int8", "fp16")


class BundleError(ValueError):
    """A bundle that must not be served: the message names the file at fault."""


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
    special_tokens: dict  # pad_id, bos_id, eos_id, unk_id
    tokenizer: dict  # file entry
    io: dict  # {"encoder": {"inputs": [...], "outputs": [...]}, "decoder": {...}}
    variants: dict  # name -> {"encoder": file entry, "decoder": file entry, "quality": {...}}
    opset: int
    ir_version: int
    max_new_tokens: int  # the longest generation the model was validated for
    heldout: dict | None = None  # file entry of HELDOUT
    training: dict = field(default_factory=dict)
    versions: dict = field(default_factory=dict)
    format: str = FORMAT
    format_version: int = FORMAT_VERSION

    @property
    def n_layers(self) -> int:
        return int(self.model["n_decoder_layers"])

    def to_json(self) -> str:
        return json.dumps(self.__dict__, indent=2, sort_keys=False) + "\n"

    def save(self, directory: Path) -> None:
        (Path(directory) / MANIFEST).write_text(self.to_json())


def expected_io(n_layers: int) -> dict:
    return {"encoder": {"inputs": names.encoder_inputs(), "outputs": names.encoder_outputs(n_layers)},
            "decoder": {"inputs": names.decoder_inputs(n_layers), "outputs": names.decoder_outputs(n_layers)}}


def load_manifest(directory: str | Path, check_files: bool = True) -> Manifest:
    """Reads and checks a bundle: format and version, I/O names, every listed file's presence and sha256."""
    directory = Path(directory)
    path = directory / MANIFEST
    if not path.is_file():
        raise BundleError(f"{path}: missing (is {directory} a seqserve bundle?)")
    try:
        data = json.loads(path.read_text())
        if data.get("format") != FORMAT:
            raise BundleError(f"{path}: format is {data.get('format')!r}, expected {FORMAT!r}")
        if data.get("format_version") != FORMAT_VERSION:
            raise BundleError(f"{path}: format_version {data.get('format_version')!r} is not supported "
                              f"(this seqserve reads version {FORMAT_VERSION}); re-export the bundle")
        manifest = Manifest(**data)
    except (json.JSONDecodeError, TypeError) as exc:
        raise BundleError(f"{path}: not a valid manifest: {exc}") from exc
    if manifest.io != expected_io(manifest.n_layers):
        raise BundleError(f"{path}: graph input/output names differ from this seqserve's contract (export/names.py)")
    if "fp32" not in manifest.variants:
        raise BundleError(f"{path}: no fp32 variant")
    if check_files:
        for entry in listed_files(manifest):
            check_file(directory, entry)
    return manifest


def listed_files(manifest: Manifest) -> list[dict]:
    entries = [manifest.tokenizer] + ([manifest.heldout] if manifest.heldout else [])
    for variant in manifest.variants.values():
        entries += [variant["encoder"], variant["decoder"]]
    return entries


def check_file(directory: Path, entry: dict) -> None:
    path = directory / entry["file"]
    if not path.is_file():
        raise BundleError(f"{path}: listed in {MANIFEST} but missing")
    actual = sha256_of(path)
    if actual != entry["sha256"]:
        raise BundleError(f"{path}: sha256 {actual[:12]}... does not match {MANIFEST} ({entry['sha256'][:12]}...); "
                          "the file was modified or corrupted")


def check_session_io(path: Path, session, graph: str, manifest: Manifest) -> None:
    """Refuses a graph whose onnxruntime inputs/outputs differ from the manifest's."""
    got = {"inputs": [i.name for i in session.get_inputs()], "outputs": [o.name for o in session.get_outputs()]}
    want = manifest.io[graph]
    if got != want:
        raise BundleError(f"{path}: graph inputs/outputs {got} do not match {MANIFEST} {want}")
