"""`seqserve verify` prints its table, says what it skipped, and exits 1 on a broken tolerance."""
from __future__ import annotations

import shutil

import torch
from safetensors.torch import load_file, save_file

from seqserve.cli.main import main
from seqserve.contract import names


def test_verify_with_checkpoint_passes_and_prints_the_table(full_bundle, tiny_checkpoint, capsys):
    assert main(["verify", str(full_bundle), "--checkpoint", str(tiny_checkpoint), "--quiet"]) == 0
    out = capsys.readouterr().out
    for output in names.encoder_outputs(2) + names.decoder_outputs(2):
        assert output in out
    for check in ("encoder vs torch", "decoder step vs torch", "teacher forcing", "top-1 agreement vs fp32", "no NaN",
                  "greedy tokens: engine (decoder.onnx, concat KV cache, CPUExecutionProvider) vs torch",
                  "greedy tokens: engine (decoder_inplace.onnx, inplace KV cache, CPUExecutionProvider) vs torch"):
        assert check in out
    assert out.count("200/200 sequences identical") == 2 and " 0 failed" in out and "FAIL" not in out


def test_verify_without_checkpoint_says_what_it_skipped(full_bundle, capsys):
    assert main(["verify", str(full_bundle), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "skipped: onnxruntime vs PyTorch" in out and "vs torch" not in out.split("skipped:")[0]


def test_verify_fails_when_onnxruntime_and_pytorch_disagree(full_bundle, tiny_checkpoint, tmp_path, capsys):
    """A checkpoint whose weights differ slightly from the exported ones breaks the parity tolerances."""
    other = tmp_path / "other"
    shutil.copytree(tiny_checkpoint, other)
    weights = load_file(str(other / "model.safetensors"))
    weights = {k: v + 1e-2 * torch.randn_like(v) if v.dtype == torch.float32 else v for k, v in weights.items()}
    save_file(weights, str(other / "model.safetensors"))
    assert main(["verify", str(full_bundle), "--checkpoint", str(other), "--n", "16", "--quiet"]) == 1
    failed = [line for line in capsys.readouterr().out.splitlines() if line.endswith("FAIL")]
    assert any("encoder vs torch" in line for line in failed) and any("logits" in line for line in failed)
