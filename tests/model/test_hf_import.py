"""`seqserve import` refuses what it cannot serve, with exit 2 and a message naming the file and the field."""
from __future__ import annotations

import json
import shutil

import hf_fixtures
import hf_variants
import pytest

from seqserve.cli.main import main
from seqserve.model.config import ModelConfig

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def marian_dir(tmp_path_factory):
    return hf_fixtures.build_marian(tmp_path_factory.mktemp("marian") / "hf")


@pytest.fixture
def copy(marian_dir, tmp_path):
    hf = tmp_path / "hf"
    shutil.copytree(marian_dir, hf)
    return hf


def _edit(path, **changes):
    data = json.loads(path.read_text())
    for key, value in changes.items():
        if value is KeyError:
            data.pop(key, None)
        else:
            data[key] = value
    path.write_text(json.dumps(data))


def _refused(hf, tmp_path, capsys) -> str:
    assert main(["import", str(hf), "--out", str(tmp_path / "out"), "--quiet", "--no-verify"]) == 2
    return capsys.readouterr().err


def test_an_imported_marian_checkpoint_has_the_familys_options(copy, tmp_path):
    # opus-mt's config.json still carries transformers 3's switches, at the values Marian's class implements
    _edit(copy / "config.json", static_position_embeddings=True, normalize_embedding=False, normalize_before=False,
          add_final_layer_norm=False, add_bias_logits=False)
    assert main(["import", str(copy), "--out", str(tmp_path / "out"), "--quiet", "--no-verify"]) == 0
    cfg = ModelConfig.load(tmp_path / "out" / "config.json")
    hf = json.loads((copy / "config.json").read_text())
    assert (cfg.positions, cfg.activation, cfg.scale_embeddings, cfg.final_logits_bias) == (
        "sinusoidal_halves", "silu", True, True)
    vocab = json.loads((copy / "vocab.json").read_text())
    assert (cfg.pad_id, cfg.eos_id, cfg.decoder_start_id, cfg.unk_id) == (
        hf["pad_token_id"], vocab["</s>"], hf["pad_token_id"], vocab["<unk>"])
    assert cfg.pad_id == cfg.vocab_size - 1 and cfg.eos_id != 2  # ids where opus-mt has them, not the seeds' 0..3
    generation = json.loads((tmp_path / "out" / "generation.json").read_text())
    assert generation["bad_words_ids"] == [hf["pad_token_id"]] and generation["num_beams"] == 4


@pytest.mark.parametrize("edit, message", [
    (lambda hf: _edit(hf / "config.json", model_type="pegasus"),
     "config.json: model_type 'pegasus' is not supported; supported: marian, bart, mbart, m2m_100, t5, mt5"),
    (lambda hf: (hf / "config.json").unlink(), "config.json: missing"),
    (lambda hf: (hf / "model.safetensors").unlink(), "model.safetensors: missing"),
    (lambda hf: (hf / "model.safetensors").rename(hf / "pytorch_model.bin"),
     "pytorch_model.bin: pickle weights are never loaded (a pickle can run code); convert it once with transformers: "
     "AutoModelForSeq2SeqLM.from_pretrained(d).save_pretrained(d, safe_serialization=True)"),
    (lambda hf: (hf / "vocab.json").unlink(), "vocab.json: missing"),
    (lambda hf: _edit(hf / "config.json", activation_function="gelu_new"),
     "config.json: activation_function 'gelu_new' is not supported; supported: relu, gelu, silu, swish"),
    (lambda hf: _edit(hf / "config.json", decoder_ffn_dim=128),
     "config.json: encoder_ffn_dim=64 differs from decoder_ffn_dim=128"),
    (lambda hf: _edit(hf / "config.json", decoder_vocab_size=7),
     "config.json: decoder_vocab_size=7 differs from vocab_size"),
    (lambda hf: _edit(hf / "generation_config.json", no_repeat_ngram_size=3),
     "generation_config.json: no_repeat_ngram_size=3 is not supported"),
    (lambda hf: (hf / "generation_config.json").unlink(), "generation_config.json: missing"),
    (lambda hf: _edit(hf / "generation_config.json", bad_words_ids=[[5, 6]]),
     "generation_config.json: bad_words_ids"),
    (lambda hf: _edit(hf / "generation_config.json", frobnicate=True),
     "generation_config.json: unknown field(s) ['frobnicate']"),
    (lambda hf: _edit(hf / "config.json", d_model=16), "model.safetensors: "),  # more weights: check_size
    (lambda hf: _edit(hf / "config.json", normalize_before=True),
     "config.json: normalize_before=True is not supported for model_type marian"),
], ids=["model_type", "no-config", "no-weights", "pickle-only", "no-tokenizer", "activation", "ffn-widths",
        "decoder-vocab", "no-repeat-ngram", "no-generation-config", "multi-token-bad-words",
        "unknown-generation-field", "shape", "legacy-pre-ln"])
def test_refusals_name_the_file_and_the_field(copy, tmp_path, capsys, edit, message):
    edit(copy)
    err = _refused(copy, tmp_path, capsys)
    assert message in err and str(copy) in err
    assert "Traceback" not in err and not (tmp_path / "out" / "metrics.json").exists()


@pytest.mark.parametrize("build", [hf_variants.mbart, hf_variants.marian_untied], ids=["mbart", "marian-untied"])
def test_other_architectures_import_with_transformers_logits(build, tmp_path, capsys):
    """mBART (pre-LN + final norms + embedding LayerNorm, scaled) and a Marian whose source, target and output
    embeddings are three matrices: `seqserve import` compares the logits with transformers' (exit 0 within 1e-4),
    and the exported graphs equal PyTorch (`seqserve verify --checkpoint`: decoder.onnx, decoder_inplace.onnx)."""
    from safetensors import safe_open

    hf = build(tmp_path / "hf")
    assert main(["import", str(hf), "--out", str(tmp_path / "ck"), "--quiet"]) == 0
    assert "1 passed, 0 failed" in capsys.readouterr().out
    cfg = ModelConfig.load(tmp_path / "ck" / "config.json")
    with safe_open(str(tmp_path / "ck" / "model.safetensors"), "pt") as f:
        stored = set(f.keys())
    if build is hf_variants.mbart:
        assert cfg.norm_first and cfg.embed_norm and cfg.scale_embeddings and cfg.positions == "learned"
    else:
        assert not cfg.tie_embeddings and not cfg.tie_output
        assert {"src_embed.weight", "tgt_embed.weight", "out_proj.weight"} <= stored
    assert main(["export", str(tmp_path / "ck"), "--out", str(tmp_path / "bundle"), "--quiet"]) == 0
    assert main(["verify", str(tmp_path / "bundle"), "--checkpoint", str(tmp_path / "ck"), "--quiet",
                 "--threads", "1"]) == 0
