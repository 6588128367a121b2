"""A random-weight Marian imported as a checkpoint (tests/hf_fixtures.py), for verify runs on an imported model."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

GENERATION_MAX_LENGTH = 16  # its generation_config's max_length: 15 new tokens, well under the 127 positions allow


@pytest.fixture(scope="session")
def marian_checkpoint(tmp_path_factory) -> Path:
    """`seqserve import` of a tiny random Marian whose generation default is shorter than its positional limit."""
    pytest.importorskip("transformers")
    import hf_fixtures

    from seqserve.cli.main import main

    root = tmp_path_factory.mktemp("marian")
    hf = hf_fixtures.build_marian(root / "hf")
    path = hf / "generation_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "max_length": GENERATION_MAX_LENGTH}))
    assert main(["import", str(hf), "--out", str(root / "checkpoint"), "--quiet", "--no-verify"]) == 0
    return root / "checkpoint"
