"""`seqserve hf-demo FAMILY --out DIR` writes, offline, a Hugging Face directory that `seqserve import` accepts (its
logits then match transformers', the import's own check); the tests' models come from the same builders."""
from __future__ import annotations

import json

import hf_fixtures
import pytest

from seqserve.cli.main import main
from seqserve.model import hf_demo

pytest.importorskip("transformers")


def test_a_demo_marian_imports_and_matches_transformers(tmp_path, capsys):
    hf, checkpoint = tmp_path / "hf", tmp_path / "checkpoint"
    assert main(["hf-demo", "marian", "--out", str(hf)]) == 0
    assert f"seqserve import {hf} --out CHECKPOINT" in capsys.readouterr().out
    assert {"config.json", "generation_config.json", "model.safetensors", "vocab.json", "source.spm"} <= \
        {p.name for p in hf.iterdir()}
    assert json.loads((hf / "config.json").read_text())["model_type"] == "marian"
    assert main(["import", str(hf), "--out", str(checkpoint), "--quiet"]) == 0  # exit 1 when logits differ
    table = capsys.readouterr().out
    assert "FAIL" not in table and "transformers" in table, table
    assert (checkpoint / "metrics.json").is_file()


def test_an_unknown_family_exits_2_listing_every_family(tmp_path, capsys):
    assert main(["hf-demo", "t9", "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("seqserve hf-demo: error: unknown family 't9'")
    assert all(f"{name} (" in err for name in hf_demo.FAMILIES)
    assert not (tmp_path / "hf").exists()


def test_the_tests_build_their_models_with_the_commands_builders():
    assert hf_fixtures.build is hf_demo.build
    assert hf_fixtures.BUILDERS == {name: family.build for name, family in hf_demo.FAMILIES.items()}
    assert hf_fixtures.FAMILIES == tuple(hf_demo.FAMILIES)


def test_docs_import_offers_the_command_for_every_family():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "import.md").read_text()
    section = doc[doc.index("## A model to try offline"):doc.index("## Supported families")]
    assert "seqserve hf-demo marian --out" in section and "seqserve import" in section
    assert all(name in section for name in hf_demo.FAMILIES)
