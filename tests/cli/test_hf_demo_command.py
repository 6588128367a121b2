"""`seqserve hf-demo FAMILY --out DIR` writes, offline, a Hugging Face directory that `seqserve import` accepts (its
logits then match transformers', the import's own check); the tests' models come from the same builders."""
from __future__ import annotations

import json

import hf_fixtures
import hf_t5
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


def test_a_demo_t5_imports_and_matches_transformers(tmp_path, capsys):
    hf, checkpoint = tmp_path / "hf", tmp_path / "checkpoint"
    assert main(["hf-demo", "t5", "--out", str(hf)]) == 0
    assert f"seqserve import {hf} --out CHECKPOINT" in capsys.readouterr().out
    assert {"config.json", "generation_config.json", "model.safetensors", "spiece.model"} <= \
        {p.name for p in hf.iterdir()}
    config = json.loads((hf / "config.json").read_text())
    assert (config["model_type"], config["feed_forward_proj"], config["d_model"]) == ("t5", "relu", 32)
    assert main(["import", str(hf), "--out", str(checkpoint), "--quiet"]) == 0  # exit 1 when logits differ
    table = capsys.readouterr().out
    assert "FAIL" not in table and "transformers" in table, table
    assert (checkpoint / "metrics.json").is_file()


def test_the_t5_base_sizes_are_t5_small_and_flan_t5_small():
    """The hub's config.json values of google-t5/t5-small and google/flan-t5-small."""
    t5, flan = hf_demo.FAMILIES["t5"].sizes["base"], hf_demo.FAMILIES["flan-t5"].sizes["base"]
    shape = lambda s: (s.d_model, s.layers, s.heads, s.d_kv, s.d_ff, s.vocab, s.buckets, s.max_distance)
    assert shape(t5) == (512, 6, 8, 64, 2048, 32128, 32, 128)
    assert shape(flan) == (512, 8, 6, 64, 1024, 32128, 32, 128)


def test_a_size_the_family_lacks_exits_2_naming_its_sizes(tmp_path, capsys):
    assert main(["hf-demo", "mt5", "--out", str(tmp_path / "hf"), "--size", "base"]) == 2
    assert "unknown size 'base' for mt5; its sizes are: tiny" in capsys.readouterr().err
    assert not (tmp_path / "hf").exists()


def test_an_unknown_family_exits_2_listing_every_family(tmp_path, capsys):
    assert main(["hf-demo", "t9", "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("seqserve hf-demo: error: unknown family 't9'")
    assert all(f"{name} (" in err for name in hf_demo.FAMILIES)
    assert not (tmp_path / "hf").exists()


def test_the_tests_build_their_models_with_the_commands_builders():
    assert hf_fixtures.build is hf_demo.build
    assert hf_fixtures.BUILDERS == {name: family.build for name, family in hf_demo.FAMILIES.items() if not family.t5}
    assert hf_fixtures.FAMILIES + (hf_t5.T5, hf_t5.FLAN, hf_t5.MT5) == tuple(hf_demo.FAMILIES)
    assert hf_t5.SIZES == {name: family.sizes["tiny"] for name, family in hf_demo.FAMILIES.items() if family.t5}


def test_the_help_lists_every_family(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # argparse would wrap "flan-t5" at its hyphen
    with pytest.raises(SystemExit):
        main(["hf-demo", "--help"])
    out = capsys.readouterr().out
    assert all(name in out for name in hf_demo.FAMILIES), out


def test_docs_import_offers_the_command_for_every_family():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "import.md").read_text()
    section = doc[doc.index("## A model to try offline"):doc.index("## Supported families")]
    assert "seqserve hf-demo marian --out" in section and "seqserve import" in section
    assert all(name in section for name in hf_demo.FAMILIES)
