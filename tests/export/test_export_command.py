"""`seqserve export` writes the whole bundle (the fixture full_bundle is that command's output)."""
from __future__ import annotations

BUNDLE_FILES = {"manifest.json", "bundle.sha256", "tokenizer.json", "heldout.tsv", "encoder.onnx", "decoder.onnx",
                "decoder_inplace.onnx", "encoder.int8.onnx", "decoder.int8.onnx", "decoder_inplace.int8.onnx",
                "encoder.fp16.onnx", "decoder.fp16.onnx", "decoder_inplace.fp16.onnx"}


def test_export_writes_every_file(full_bundle):
    assert {p.name for p in full_bundle.iterdir()} == BUNDLE_FILES
