"""`seqserve verify --checkpoint` on an imported model whose engine and PyTorch pick different tokens at exact
near-ties: two vocabulary entries with the same embedding (the output projection is tied to it) and output biases
2e-5 apart, the order of the two flipped between the exported weights and the checkpoint. Every logit still agrees
within 1e-4, so verify must pass, report the margin, and decode for the model's own max_new_tokens."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from safetensors.torch import load_file, save_file

from seqserve.cli.main import main
from seqserve.contract.verified import VERIFIED

TWINS = (10, 11)  # two ordinary pieces of the vocabulary (not special: 0 is </s>, the last one <pad>)
BIAS = 20.0  # far above every other logit: one of the twins is the argmax at every step
GAP = 2e-5  # within 1e-4 + 1e-4 * 20, and ten times float32's spacing at 20


def _twin(checkpoint: Path, winner: int) -> None:
    """Makes TWINS one token for the model but for their biases; `winner` gets GAP more."""
    path = checkpoint / "model.safetensors"
    weights = load_file(str(path))
    embed, bias = weights["src_embed.weight"], weights["final_logits_bias"]
    embed[TWINS[1]] = embed[TWINS[0]]
    bias[list(TWINS)] = BIAS
    bias[winner] += GAP
    save_file(weights, str(path))


def test_verify_passes_an_engine_that_diverges_only_at_near_ties(marian_checkpoint, tmp_path, capsys):
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(marian_checkpoint, checkpoint)
    _twin(checkpoint, TWINS[1])  # the engine's graphs prefer the second twin
    assert main(["export", str(checkpoint), "--out", str(tmp_path / "bundle"), "--quiet"]) == 0
    _twin(checkpoint, TWINS[0])  # PyTorch prefers the first
    manifest = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    own = manifest["generation"]["max_new_tokens"]  # generation_config's max_length - 1 (tests/checks/conftest.py)
    assert own < manifest["max_new_tokens"]  # the positional limit, which verify used to decode to
    capsys.readouterr()

    assert main(["verify", str(tmp_path / "bundle"), "--checkpoint", str(checkpoint), "--quiet"]) == 0
    out = capsys.readouterr().out
    greedy = [line for line in out.splitlines() if line.startswith("greedy tokens")]
    assert len(greedy) == 2 and all(line.endswith("ok") for line in greedy)
    for line in greedy:  # every probe diverges at its first token, between the twins
        assert f"0/12 sequences identical (up to {own} tokens)" in line
        assert "12 diverge at a near-tie (widest margin" in line and "at token 0, limit" in line
        margin = float(line.split("widest margin ")[1].split()[0])
        assert 0.5 * GAP < margin < 2 * GAP
    assert " 0 failed" in out and (tmp_path / "bundle" / VERIFIED).is_file()
