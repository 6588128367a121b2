"""Shared fixtures: the tiny model is trained once per test session and exported once.

SEQSERVE_TEST_ARTIFACTS=DIR keeps them in DIR/tiny and DIR/tiny-bundle across sessions (made on first use), so a
GPU machine can run tests/server on artifacts made here (SEQSERVE_TEST_DEVICE=cuda, see tests/grpc_harness.py).
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

KEEP = os.environ.get("SEQSERVE_TEST_ARTIFACTS")


def _directory(tmp_path_factory, name: str, written_last: str) -> tuple[Path, bool]:
    """(where the artifact lives, whether it must still be made: its last-written file is missing)."""
    if KEEP:
        path = Path(KEEP) / name
        return path, not (path / written_last).is_file()
    return tmp_path_factory.mktemp(name), True


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """The `tiny` preset trained on its copy task (about 25 s on 2 cores)."""
    out, make = _directory(tmp_path_factory, "tiny", "metrics.json")
    if make:
        from seqserve.model.presets import preset
        from seqserve.model.train import train

        train(preset("tiny"), out, quiet=True)
    return out


@pytest.fixture(scope="session")
def tiny_bundle(tiny_checkpoint, tmp_path_factory) -> Path:
    """The tiny checkpoint exported to an fp32 bundle."""
    out, make = _directory(tmp_path_factory, "tiny-bundle", "manifest.json")
    if make:
        from seqserve.export.bundle import export_fp32

        export_fp32(tiny_checkpoint, out)
    return out
