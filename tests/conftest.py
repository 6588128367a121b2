"""Shared fixtures: the tiny model is trained once per test session and exported once."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """The `tiny` preset trained on its copy task (about 25 s on 2 cores)."""
    from model.presets import preset
    from model.train import train

    out = tmp_path_factory.mktemp("tiny_checkpoint")
    train(preset("tiny"), out, quiet=True)
    return out


@pytest.fixture(scope="session")
def tiny_bundle(tiny_checkpoint, tmp_path_factory) -> Path:
    """The tiny checkpoint exported to an fp32 bundle."""
    from export.bundle import export_fp32

    out = tmp_path_factory.mktemp("tiny_bundle")
    export_fp32(tiny_checkpoint, out)
    return out
