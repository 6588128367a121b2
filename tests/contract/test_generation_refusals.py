"""A model's generation defaults are checked when the model is loaded, in one place (contract/generation.py): every
token id inside the vocabulary and every option inside the range a request's own value has (contract/decoding.py).
`seqserve import` refuses a generation_config.json (or config.json) with one, naming the file and the field;
`seqserve export`, `verify` and `serve` refuse a manifest with one naming generation.<field>. All exit 2, no traceback.
"""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from seqserve.cli.main import main
from seqserve.contract.generation import GenerationDefaults
from seqserve.contract.manifest import DIGEST, MANIFEST, load_manifest
from seqserve.model.checkpoint import GENERATION

VOCAB = 260  # the tiny model's vocabulary (model.vocab_size of its manifest, checked below)
PLAIN = GenerationDefaults(decoder_start_token_id=1, eos_token_id=2).to_dict()
# (id, the manifest's generation (or the checkpoint's generation.json), what the message must name)
CASES = [
    ("forced_bos-outside-vocab", {**PLAIN, "forced_bos_token_id": 10**9},
     f"generation.forced_bos_token_id=1000000000 is outside the vocabulary (vocab_size={VOCAB})"),
    ("forced_bos-at-vocab_size", {**PLAIN, "forced_bos_token_id": VOCAB},
     f"generation.forced_bos_token_id={VOCAB} is outside the vocabulary"),
    ("forced_eos-outside-vocab", {**PLAIN, "forced_eos_token_id": VOCAB + 1},
     f"generation.forced_eos_token_id={VOCAB + 1} is outside the vocabulary"),
    ("bad_words-outside-vocab", {**PLAIN, "bad_words_ids": [5, 10**12]},
     "generation.bad_words_ids [1000000000000] are outside the vocabulary"),
    ("length_penalty-1e30", {**PLAIN, "length_penalty": 1e30},
     "generation.length_penalty must be finite and in [-10, 10], got 1e+30"),
    ("repetition_penalty-1e30", {**PLAIN, "repetition_penalty": 1e30},
     "generation.repetition_penalty must be in (0, 100], got 1e+30"),
    ("sampled-temperature-1e30", {**PLAIN, "do_sample": True, "temperature": 1e30},
     "generation.temperature must be in [0, 100], got 1e+30"),
    # beyond what any request may ask: the bundle's max_new_tokens (the tiny model's 40), and MAX_NUM_BEAMS
    ("num_beams-1e9", {**PLAIN, "num_beams": 10**9},
     "generation.num_beams must be in [1, 1024] (max_num_beams), got 1000000000"),
    ("max_new_tokens-1e12", {**PLAIN, "max_new_tokens": 10**12},
     "generation.max_new_tokens must be in [1, 40], got 1000000000000"),
]
BEYOND_REQUESTS = CASES[-2:]


def _bundle(tiny_bundle: Path, tmp_path: Path, generation: dict) -> Path:
    """A copy of the tiny bundle whose manifest records these generation defaults (digest recomputed, as export
    writes it, so the check under test is reached)."""
    out = tmp_path / "bundle"
    shutil.copytree(tiny_bundle, out, ignore=shutil.ignore_patterns("verified.json"))
    data = json.loads((out / MANIFEST).read_text())
    assert data["model"]["vocab_size"] == VOCAB
    data["generation"] = generation
    blob = json.dumps(data, indent=2).encode()
    (out / MANIFEST).write_bytes(blob)
    (out / DIGEST).write_text(f"{hashlib.sha256(blob).hexdigest()}  {MANIFEST}\n")
    return out


@pytest.mark.parametrize("generation, message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_serve_and_verify_exit_2_naming_the_generation_field(tiny_bundle, tmp_path, capsys, generation, message):
    bundle = _bundle(tiny_bundle, tmp_path, generation)
    for argv in (["serve", "--bundle", str(bundle), "--port", "0", "--metrics-port", "-1", "--device", "cpu"],
                 ["verify", str(bundle), "--quiet"]):
        assert main(argv) == 2, argv[0]
        err = capsys.readouterr().err
        assert f"seqserve {argv[0]}: error: {bundle / MANIFEST}: {message}" in err, (argv[0], err)
        assert "Traceback" not in err
        print(f"\nexit 2: {err.strip().replace(str(bundle) + '/', '')}")  # docs/security.md lists these
    assert not (bundle / "verified.json").exists()


def test_defaults_at_the_limits_of_their_ranges_and_the_vocabulary_load(tiny_bundle, tmp_path):
    """The limits themselves are accepted: the refusals above are of values outside them, not of the fields."""
    edge = {**PLAIN, "forced_bos_token_id": VOCAB - 1, "forced_eos_token_id": 2, "bad_words_ids": [VOCAB - 1],
            "length_penalty": -10.0, "repetition_penalty": 100.0, "do_sample": True, "temperature": 100.0,
            "top_p": 1.0}
    assert load_manifest(_bundle(tiny_bundle, tmp_path, edge)).generation == edge
    sampled_only = {**PLAIN, "temperature": 1e30}  # without do_sample the temperature is never used
    assert load_manifest(_bundle(tiny_bundle, tmp_path / "2", sampled_only)).generation == sampled_only


@pytest.mark.parametrize("generation, message", [c[1:] for c in CASES[:1] + CASES[3:5] + BEYOND_REQUESTS],
                         ids=[c[0] for c in CASES[:1] + CASES[3:5] + BEYOND_REQUESTS])
def test_export_exits_2_naming_the_generation_field(tiny_checkpoint, tmp_path, capsys, generation, message):
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(tiny_checkpoint, checkpoint)
    (checkpoint / GENERATION).write_text(json.dumps(generation))
    assert main(["export", str(checkpoint), "--out", str(tmp_path / "bundle"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"seqserve export: error: {checkpoint / GENERATION}: {message}" in err, err
    assert not (tmp_path / "bundle").exists()  # refused before anything was written


# -- seqserve import: the same check with config.json's vocab_size -----------------------------------------------

@pytest.fixture(scope="module")
def marian_dir(tmp_path_factory):
    pytest.importorskip("transformers")
    import hf_fixtures

    return hf_fixtures.build_marian(tmp_path_factory.mktemp("marian") / "hf")


def _edited(marian_dir: Path, tmp_path: Path, name: str, **changes) -> Path:
    hf = tmp_path / "hf"
    shutil.copytree(marian_dir, hf)
    data = json.loads((hf / name).read_text())
    data.update(changes)
    (hf / name).write_text(json.dumps(data))
    return hf


@pytest.mark.parametrize("name, changes, message", [
    ("generation_config.json", {"forced_bos_token_id": 10**9}, "forced_bos_token_id=1000000000 is outside the"),
    ("generation_config.json", {"bad_words_ids": [[10**12]]}, "bad_words_ids [1000000000000] are outside the"),
    ("config.json", {"forced_bos_token_id": 10**9}, "forced_bos_token_id=1000000000 is outside the"),
    ("generation_config.json", {"forced_eos_token_id": 10**9}, "forced_eos_token_id=1000000000 is outside the"),
    ("generation_config.json", {"length_penalty": 1e30}, "length_penalty must be finite and in [-10, 10], got 1e+30"),
    ("generation_config.json", {"do_sample": True, "num_beams": 1, "temperature": 1e30},
     "temperature must be in [0, 100], got 1e+30"),
    ("generation_config.json", {"num_beams": 1, "repetition_penalty": 1e30},
     "repetition_penalty must be in (0, 100], got 1e+30"),
    ("generation_config.json", {"num_beams": 10**9, "num_return_sequences": 1},
     "num_beams must be in [1, 1024] (max_num_beams), got 1000000000"),
    ("generation_config.json", {"max_length": 10**12},
     "max_length=1000000000000 (max_new_tokens + 1): max_new_tokens must be in [1, 127], got 999999999999 "
     "(max_position_embeddings=128)"),
], ids=["forced_bos", "bad_words", "forced_bos-from-config.json", "forced_eos", "length_penalty", "temperature",
        "repetition_penalty", "num_beams-1e9", "max_length-1e12"])
def test_import_exits_2_naming_the_file_and_the_field(marian_dir, tmp_path, capsys, name, changes, message):
    hf = _edited(marian_dir, tmp_path, name, **changes)
    if name == "config.json":  # generation_config.json leaves it out, so transformers reads config.json's
        _edited_in_place(hf / "generation_config.json", "forced_bos_token_id")
    vocab = json.loads((hf / "config.json").read_text())["vocab_size"]
    assert main(["import", str(hf), "--out", str(tmp_path / "out"), "--quiet", "--no-verify"]) == 2
    err = capsys.readouterr().err
    assert f"seqserve import: error: {hf / 'generation_config.json'}: {message}" in err, err
    if "vocabulary" in message:
        assert f"(vocab_size={vocab})" in err
    assert not (tmp_path / "out" / GENERATION).exists()


def _edited_in_place(path: Path, drop: str) -> None:
    data = json.loads(path.read_text())
    data.pop(drop, None)
    path.write_text(json.dumps(data))
