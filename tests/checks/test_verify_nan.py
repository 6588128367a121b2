"""`seqserve verify` refuses non-finite weights and non-finite logits: exit 1, no verified.json, and a FAIL line that
names the problem. The bad bundles are made by rewriting the exported graphs' initializers (their sha256 in the
manifest and the manifest's digest updated, so that the integrity check passes and the weights check is reached)."""
from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from seqserve.checks.parity import PROBE_TEXTS
from seqserve.cli.main import main
from seqserve.contract import names
from seqserve.contract.manifest import load_manifest
from seqserve.contract.tokenizer import load_tokenizer
from seqserve.contract.verified import VERIFIED

onnx = pytest.importorskip("onnx")
from onnx import numpy_helper  # noqa: E402


@pytest.fixture(scope="module")
def marian_bundle(marian_checkpoint, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("marian_bundle") / "bundle"
    assert main(["export", str(marian_checkpoint), "--out", str(out), "--quiet"]) == 0
    return out


def _rewrite(bundle: Path, edit: Callable[[str, np.ndarray], np.ndarray | None]) -> None:
    """edit(file, weight) -> the new weight (None: unchanged), for every initializer of every graph; then the
    graphs' sha256 in the manifest and the manifest's digest (bundle.sha256) are rewritten."""
    manifest = load_manifest(bundle)
    for variant in manifest.variants.values():
        for graph in names.ALL_GRAPHS:
            if graph not in variant:
                continue
            path = bundle / variant[graph]["file"]
            model = onnx.load(str(path))
            for init in model.graph.initializer:
                new = edit(path.name, numpy_helper.to_array(init))
                if new is not None:
                    init.CopyFrom(numpy_helper.from_array(new.astype(numpy_helper.to_array(init).dtype), init.name))
            onnx.save(model, str(path))
            blob = path.read_bytes()
            variant[graph].update(sha256=hashlib.sha256(blob).hexdigest(), bytes=len(blob))
    manifest.save(bundle)


def _verify(bundle: Path, capsys, *extra: str) -> tuple[int, list[str]]:
    (bundle / VERIFIED).write_text("{}")  # a stale marker: a failed verify must remove it
    capsys.readouterr()
    code = main(["verify", str(bundle), "--quiet", *extra])
    return code, [line for line in capsys.readouterr().out.splitlines() if line.endswith("FAIL")]


def test_one_nan_embedding_row_no_probe_reads_fails_verify(marian_bundle, marian_checkpoint, tmp_path, capsys):
    """The encoder's embedding row of a token none of the probe sources contains: no output shows the NaN."""
    bundle = tmp_path / "bundle"
    shutil.copytree(marian_bundle, bundle)
    manifest = load_manifest(bundle)
    tok = load_tokenizer(bundle / manifest.tokenizer["file"])
    used = {i for text in PROBE_TEXTS for i in tok.encode(text).ids} | set(manifest.special_tokens.values())
    unread = max(set(range(manifest.model["vocab_size"])) - used)
    vocab = manifest.model["vocab_size"]

    def nan_row(file: str, w: np.ndarray) -> np.ndarray | None:
        if file != names.ENCODER_FILE or w.shape != (vocab, manifest.model["d_model"]):
            return None
        w = w.copy()
        w[unread] = np.nan
        return w

    _rewrite(bundle, nan_row)
    for extra in ((), ("--checkpoint", str(marian_checkpoint))):
        code, failed = _verify(bundle, capsys, *extra)
        assert code == 1 and not (bundle / VERIFIED).exists()
        assert len(failed) == 1, failed
        assert failed[0].startswith("weights finite") and "non-finite values in 1 initializers: encoder.onnx:" in (
            failed[0])


def test_all_nan_weights_fail_every_check_that_compares_them(marian_bundle, marian_checkpoint, tmp_path, capsys):
    """A checkpoint and a bundle whose weights are all NaN: equal NaN argmaxes on both sides are no agreement."""
    bundle, checkpoint = tmp_path / "bundle", tmp_path / "checkpoint"
    shutil.copytree(marian_bundle, bundle)
    shutil.copytree(marian_checkpoint, checkpoint)
    _rewrite(bundle, lambda file, w: np.full_like(w, np.nan) if w.dtype.kind == "f" else None)
    path = checkpoint / "model.safetensors"
    save_file({k: torch.full_like(v, torch.nan) for k, v in load_file(str(path)).items()}, str(path))

    code, failed = _verify(bundle, capsys, "--checkpoint", str(checkpoint))
    assert code == 1 and not (bundle / VERIFIED).exists()
    greedy = [line for line in failed if line.startswith("greedy tokens")]
    assert len(greedy) == 2 and all("non-finite reference logits" in line for line in greedy)
    checks = {line.split("  ")[0] for line in failed}
    assert {"weights finite", "checkpoint weights finite", "no NaN: fully masked row", "encoder vs torch",
            "decoder step vs torch"} <= checks
