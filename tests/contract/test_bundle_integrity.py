"""The manifest says what the bundle holds, and a tampered or mismatched bundle is refused naming the file."""
from __future__ import annotations

import hashlib
import json
import shutil

import onnx
import pytest

from seqserve.contract import names
from seqserve.contract.manifest import DIGEST, FORMAT_VERSION, MANIFEST, BundleError, load_manifest
from seqserve.engine.runtime.device import RuntimeConfig
from seqserve.engine.runtime.runner import Runner

CPU = RuntimeConfig(device="cpu")


def write_signed(bundle, data: dict) -> None:
    """Rewrites manifest.json with its digest, as export would: the check under test is past the digest's."""
    text = json.dumps(data)
    (bundle / MANIFEST).write_text(text)
    (bundle / DIGEST).write_text(f"{hashlib.sha256(text.encode()).hexdigest()}  {MANIFEST}\n")


@pytest.fixture
def bundle_copy(tiny_bundle, tmp_path):
    out = tmp_path / "bundle"
    shutil.copytree(tiny_bundle, out)
    return out


def test_manifest_describes_the_bundle(tiny_bundle, tiny_checkpoint):
    data = json.loads((tiny_bundle / MANIFEST).read_text())
    config = json.loads((tiny_checkpoint / "config.json").read_text())
    assert data["format"] == "seqserve-bundle" and data["format_version"] == FORMAT_VERSION
    assert data["model"] == config
    assert data["special_tokens"] == {k: config[k] for k in ("pad_id", "bos_id", "eos_id", "unk_id",
                                                             "decoder_start_id")}
    assert config["decoder_start_id"] == config["bos_id"]  # the seeds' decoder starts from <s>
    assert data["tokenizer"]["file"] == "tokenizer.json"
    n = config["n_decoder_layers"]
    inplace = {"inputs": names.decoder_inplace_inputs(n), "outputs": names.decoder_inplace_outputs(n)}
    assert data["io"] == {"encoder": {"inputs": names.encoder_inputs(), "outputs": names.encoder_outputs(n)},
                          "decoder": {"inputs": names.decoder_inputs(n), "outputs": names.decoder_outputs(n)},
                          # exported since decoder_inplace exists (a SEQSERVE_TEST_ARTIFACTS bundle may predate it)
                          **({"decoder_inplace": inplace} if "decoder_inplace" in data["io"] else {})}
    fp32 = data["variants"]["fp32"]
    for entry in (fp32["encoder"], fp32["decoder"], data["tokenizer"], data["heldout"]):
        blob = (tiny_bundle / entry["file"]).read_bytes()
        assert entry["sha256"] == hashlib.sha256(blob).hexdigest() and entry["bytes"] == len(blob)
    for entry in (fp32["encoder"], fp32["decoder"]):
        graph = onnx.load(str(tiny_bundle / entry["file"]))
        assert data["opset"] == {o.domain: o.version for o in graph.opset_import}[""]
        assert data["ir_version"] == graph.ir_version
    assert data["training"]["test"]["n"] == 200 and "exact_match" in data["training"]["test"]
    assert {"torch", "onnx", "tokenizers"} <= set(data["versions"])
    assert {"onnxruntime", "onnxruntime-gpu"} & set(data["versions"])  # whichever the platform marker installed


def _flip_byte(path, at: int) -> None:
    blob = bytearray(path.read_bytes())
    blob[at] ^= 0x01
    path.write_bytes(bytes(blob))


def test_flipped_byte_is_refused(bundle_copy):
    path = bundle_copy / names.DECODER_FILE
    _flip_byte(path, path.stat().st_size // 2)
    with pytest.raises(BundleError, match=r"decoder\.onnx: sha256 .* does not match manifest\.json"):
        load_manifest(bundle_copy)
    with pytest.raises(BundleError, match=r"decoder\.onnx"):
        Runner(bundle_copy, CPU)  # the server's loader refuses it too


def test_missing_file_is_refused(bundle_copy):
    (bundle_copy / "tokenizer.json").unlink()
    with pytest.raises(BundleError, match=r"tokenizer\.json: listed in manifest\.json but missing"):
        load_manifest(bundle_copy)


def test_wrong_format_version_is_refused(bundle_copy):
    path = bundle_copy / MANIFEST
    data = json.loads(path.read_text())
    data["format_version"] = FORMAT_VERSION + 1
    write_signed(bundle_copy, data)
    with pytest.raises(BundleError, match=r"manifest\.json: format_version 2 is not supported"):
        load_manifest(bundle_copy)


def test_graph_whose_io_differs_from_the_manifest_is_refused(bundle_copy):
    """A consistent sha256 is not enough: the graph's own inputs/outputs must match the manifest's."""
    shutil.copyfile(bundle_copy / names.ENCODER_FILE, bundle_copy / names.DECODER_FILE)
    path = bundle_copy / MANIFEST
    data = json.loads(path.read_text())
    data["variants"]["fp32"]["decoder"] = data["variants"]["fp32"]["encoder"] | {"file": names.DECODER_FILE}
    write_signed(bundle_copy, data)
    load_manifest(bundle_copy)  # the hashes now agree
    with pytest.raises(BundleError, match=r"decoder\.onnx: graph inputs/outputs .* do not match manifest\.json"):
        Runner(bundle_copy, CPU, kv_cache="concat")  # the runner that loads decoder.onnx


def test_a_graph_onnxruntime_cannot_load_is_refused_naming_the_file_and_field(bundle_copy):
    """The runner loads decoder_inplace.onnx itself: a corrupted one (its sha256 updated) is a BundleError, not
    onnxruntime's InvalidProtobuf."""
    path = bundle_copy / names.DECODER_INPLACE_FILE
    path.write_bytes(path.read_bytes()[:1000])
    data = json.loads((bundle_copy / MANIFEST).read_text())
    data["variants"]["fp32"][names.DECODER_INPLACE]["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    write_signed(bundle_copy, data)
    with pytest.raises(BundleError, match=r"decoder_inplace\.onnx: onnxruntime cannot load it "
                                          r"\(variants\.fp32\.decoder_inplace in manifest\.json\)"):
        Runner(bundle_copy, CPU, kv_cache="inplace")


def test_verify_fails_on_a_tampered_bundle(bundle_copy, capsys):
    from seqserve.cli.main import main

    _flip_byte(bundle_copy / names.ENCODER_FILE, 1000)
    assert main(["verify", str(bundle_copy), "--quiet"]) == 1
    out = capsys.readouterr().out
    assert "encoder.onnx: sha256" in out and "FAIL" in out
