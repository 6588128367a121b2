"""A whole bundle checked before it is served or verified: the manifest (digest, schema, files), the tokenizer
against the manifest, and optionally every graph against the manifest (on the CPU provider).

Every refusal is a BundleError whose message names the file and the field: `seqserve serve` and `seqserve verify`
print it and exit 2.
"""
from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from seqserve.contract import names
from seqserve.contract.manifest import MANIFEST, BundleError, Manifest, check_session_io, load_error, load_manifest
from seqserve.contract.tokenizer import load_tokenizer, special_ids


def open_bundle(directory: str | Path, check_files: bool = True, graphs: bool = False) -> tuple[Manifest, Tokenizer]:
    """The manifest and the tokenizer, both checked; graphs=True also loads and probes every variant's graphs."""
    directory = Path(directory)
    manifest = load_manifest(directory, check_files=check_files)
    tokenizer = checked_tokenizer(directory, manifest)
    if graphs:
        for variant in manifest.variants:
            check_graphs(directory, manifest, variant)
    return manifest, tokenizer


def checked_tokenizer(directory: Path, manifest: Manifest) -> Tokenizer:
    """The bundle's tokenizer, refused when it does not parse or disagrees with the manifest's special ids or
    vocabulary size."""
    path = Path(directory) / manifest.tokenizer["file"]
    try:
        tokenizer = load_tokenizer(path)
    except Exception as exc:  # tokenizers raises plain Exception for a file it cannot parse
        raise BundleError(f"{path}: not a usable tokenizer: {str(exc).splitlines()[0][:200]}") from None
    actual = special_ids(tokenizer)
    for name, want in manifest.special_tokens.items():
        if actual.get(name) != want:
            raise BundleError(f"{Path(directory) / MANIFEST}: special_tokens.{name}={want} but {path.name} has id "
                              f"{actual.get(name)} for that token")
    size, vocab = tokenizer.get_vocab_size(), manifest.model["vocab_size"]
    if size > vocab:
        raise BundleError(f"{path}: {size} tokens, more than the model's vocab_size={vocab} ({MANIFEST})")
    return tokenizer


def check_graphs(directory: Path, manifest: Manifest, variant: str) -> None:
    """Loads every graph the variant lists (the in-place decoder too) on the CPU provider and checks it against the
    manifest."""
    import onnxruntime as ort  # only here: loading a manifest needs no onnxruntime

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 4  # the probes' expected failures are reported by us, not as ORT error lines
    for graph, entry in manifest.variants[variant].items():
        if graph not in names.ALL_GRAPHS:
            continue  # quality
        path = Path(directory) / entry["file"]
        try:
            session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise load_error(path, f"variants.{variant}.{graph}", exc) from None
        check_session_io(path, session, graph, manifest)

