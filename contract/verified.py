"""The verified marker: `seqserve verify` writes verified.json naming the sha256 of the manifest it passed.

`make serve`, the trainer image and a model repository (server/repository.py) take only a bundle whose marker names
exactly its manifest: a re-export changes the manifest, so an old marker cannot vouch for new graphs.
"""
from __future__ import annotations

import json
from pathlib import Path

from seqserve.contract.manifest import MANIFEST, sha256_of

VERIFIED = "verified.json"


def verified_digest(bundle: str | Path) -> str | None:
    """The manifest's sha256 when the bundle's marker names it, else None (no marker, a stale one, or unreadable)."""
    try:
        digest = json.loads((Path(bundle) / VERIFIED).read_text())["manifest_sha256"]
        return digest if digest == sha256_of(Path(bundle) / MANIFEST) else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def is_verified(bundle: str | Path) -> bool:
    return verified_digest(bundle) is not None
