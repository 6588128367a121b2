"""`seqserve export`: checkpoint -> bundle directory (graphs, tokenizer, held-out split, manifest)."""
from __future__ import annotations

import importlib.metadata
import shutil
from pathlib import Path

import onnx

from export import manifest as mf
from export.onnx_export import OPSET, export_decoder, export_encoder
from export.names import DECODER_FILE, ENCODER_FILE
from model import checkpoint as ck


def package_versions() -> dict[str, str]:
    versions = {}
    for pkg in ("seqserve", "torch", "onnx", "onnxscript", "onnxruntime-gpu", "onnxruntime", "tokenizers"):
        try:
            versions[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def check_graph(path: Path) -> int:
    """Full onnx.checker pass (with shape inference); returns the graph's IR version."""
    onnx.checker.check_model(str(path), full_check=True)
    return onnx.load(str(path), load_external_data=False).ir_version


def export_fp32(checkpoint: str | Path, out: str | Path) -> mf.Manifest:
    """Writes the fp32 graphs, tokenizer, held-out split and a manifest listing the fp32 variant."""
    checkpoint, out = Path(checkpoint), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model, tok = ck.load_checkpoint(checkpoint)
    export_encoder(model, out / ENCODER_FILE)
    export_decoder(model, out / DECODER_FILE)
    ir_version = max(check_graph(out / ENCODER_FILE), check_graph(out / DECODER_FILE))
    shutil.copyfile(checkpoint / ck.TOKENIZER, out / mf.TOKENIZER)
    heldout = None
    if (checkpoint / ck.HELDOUT).is_file():
        shutil.copyfile(checkpoint / ck.HELDOUT, out / mf.HELDOUT)
        heldout = mf.file_entry(out, mf.HELDOUT)
    cfg = model.cfg
    training = ck.read_metrics(checkpoint)
    manifest = mf.Manifest(
        model=cfg.to_dict(),
        special_tokens={"pad_id": cfg.pad_id, "bos_id": cfg.bos_id, "eos_id": cfg.eos_id, "unk_id": cfg.unk_id},
        tokenizer=mf.file_entry(out, mf.TOKENIZER),
        io=mf.expected_io(cfg.n_decoder_layers),
        variants={"fp32": {"encoder": mf.file_entry(out, ENCODER_FILE), "decoder": mf.file_entry(out, DECODER_FILE),
                           "quality": {}}},
        opset=OPSET,
        ir_version=ir_version,
        max_new_tokens=int(training.get("max_new_tokens", cfg.max_positions - 1)),
        heldout=heldout,
        training={k: training[k] for k in ("preset", "task", "steps", "train_seconds", "parameters", "test")
                  if k in training},
        versions=package_versions(),
    )
    manifest.save(out)
    return manifest
