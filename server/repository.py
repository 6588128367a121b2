"""The models a server serves: from --bundle (NAME=DIR, repeatable) or a model repository, with what each may take.

A model repository is Triton's layout: each subdirectory is one bundle, named after the subdirectory. Only verified
bundles are taken (verified.json names the manifest's sha256, written last by `seqserve verify`), so a bundle still
being copied in is never loaded half-written; hidden subdirectories (`.staging`) are skipped, so a copy can be made
there and renamed into place. A bundle whose manifest digest changed is a new version of its model. A model leaves
only when its subdirectory does: one still there without a verified bundle (rewritten in place, its verified.json
stale or missing) is `unverified`, and its loaded version keeps serving until a verified one appears.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from seqserve.contract import names
from seqserve.contract.manifest import MANIFEST, Manifest, sha256_of
from seqserve.contract.verified import verified_digest
from seqserve.server.settings import MODEL_NAME, Settings

log = logging.getLogger("seqserve")
KV_ITEM_BYTES = 4  # K/V are float32 in every cache (fp16 bundles too, except the in-place fp16 cache: an upper bound)


@dataclass(frozen=True)
class Source:
    name: str
    path: Path
    digest: str  # the manifest's sha256: a new digest under the same name is a changed bundle


@dataclass(frozen=True)
class Models:
    """What one read of the settings' models found."""

    sources: dict[str, Source]  # the verified bundles, by name (sorted): the models to serve
    unverified: frozenset[str]  # model subdirectories there without a verified bundle now (being copied or rewritten)


def scan(settings: Settings) -> dict[str, Source]:
    """The models to serve now, by name (sorted), as the settings name them."""
    return read_models(settings).sources


def read_models(settings: Settings) -> Models:
    """The models to serve now, and the model subdirectories that hold no verified bundle at this moment."""
    if settings.model_repository is None:
        return Models({name: Source(name, path, sha256_of(path / MANIFEST))
                       for name, path in settings.bundles().items()}, frozenset())
    sources, unverified = {}, set()
    for entry in sorted(os.scandir(settings.model_repository), key=lambda e: e.name):
        path = Path(entry.path)
        if entry.name.startswith(".") or not entry.is_dir():
            continue
        has_manifest = (path / MANIFEST).is_file()
        if not MODEL_NAME.fullmatch(entry.name):
            if has_manifest:
                log.warning("model repository: skipped %s: not a valid model name (letters, digits, '.', '_', '-')",
                            path)
            continue
        digest = verified_digest(path)  # None without a manifest too
        if digest is None:
            unverified.add(entry.name)
            if has_manifest:
                log.warning("model repository: skipped %s: not verified (no verified.json naming its manifest; run "
                            "`seqserve verify %s`)", path, path)
            continue
        sources[entry.name] = Source(entry.name, path, digest)
    return Models(sources, frozenset(unverified))


def split_threads(threads: int, models: int) -> int:
    """Intra-op threads of each model: one model keeps --intra-op-threads as given (0 = onnxruntime's one per core);
    several share them, floor(threads / models) each and at least 1, threads 0 counting as the machine's cores."""
    if models <= 1:
        return threads
    return max(1, (threads or os.cpu_count() or 1) // models)


def memory_bytes(path: Path, manifest: Manifest, settings: Settings) -> int:
    """What a model may take in host memory: its variant's encoder and (larger) decoder graph files, the most its KV
    cache may hold (self- and cross-attention K/V of every token slot: --max-kv-tokens, or --max-batch-size rows of
    the bundle's max_new_tokens when the in-place cache preallocates more), and --max-encoded-bytes."""
    files = manifest.variants[settings.variant]
    decoders = [(path / files[g]["file"]).stat().st_size for g in (names.DECODER, names.DECODER_INPLACE) if g in files]
    graphs = (path / files[names.ENCODER]["file"]).stat().st_size + max(decoders)
    cfg = manifest.model
    per_token = 2 * int(cfg["n_decoder_layers"]) * int(cfg["d_model"]) * KV_ITEM_BYTES  # (K and V) x layers
    slots = max(settings.max_kv_tokens, settings.max_batch_size * int(manifest.max_new_tokens))
    return graphs + 2 * slots * per_token + settings.max_encoded_bytes  # 2: self- and cross-attention
