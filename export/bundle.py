"""`seqserve export`: checkpoint -> bundle directory (graphs, variants, tokenizer, held-out split, manifest).

Offline graph optimisation is deliberately not done. Measured on this 2-core CPU (onnxruntime 1.31, default-sized
decoder d_model 192 x 3 layers, one step, 2 intra-op threads, 15 interleaved rounds of 30 runs, median):
saving an ORT_ENABLE_BASIC graph (SessionOptions.optimized_model_filepath) and loading it with the server's own
level (ORT_ENABLE_ALL) gave 0.194 vs 0.194 ms at batch 1 and 1.56 vs 1.65 ms at batch 32 (run-to-run noise is
larger: a repeat gave 1.13 vs 1.06 ms). It only helped a session that disables optimisation (0.20 vs 0.30 ms).
The server optimises at load anyway, so the bundle keeps the plain exported graphs, which every provider reads.
"""
from __future__ import annotations

import importlib.metadata
import shutil
import sys
from pathlib import Path

import onnx
from tqdm import tqdm

from seqserve.contract import manifest as mf
from seqserve.contract import names
from seqserve.contract.names import DECODER_FILE, DECODER_INPLACE_FILE, ENCODER_FILE
from seqserve.contract.tsv import HELDOUT
from seqserve.export import variants as vr
from seqserve.export.inplace_decoder import export_inplace_decoder, manifest_fields
from seqserve.export.onnx_export import OPSET, export_decoder, export_encoder
from seqserve.model import checkpoint as ck


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


def export_fp32(checkpoint: str | Path, out: str | Path, bar: tqdm | None = None) -> mf.Manifest:
    """Writes the fp32 graphs, tokenizer, held-out split and a manifest listing the fp32 variant (quality empty)."""
    checkpoint, out = Path(checkpoint), Path(out)
    model, _ = ck.load_checkpoint(checkpoint)
    generation = ck.read_generation(checkpoint)
    training = ck.read_metrics(checkpoint)
    max_new_tokens = int(training.get("max_new_tokens", model.cfg.max_positions - 1))
    if generation:  # refused before anything is written: the manifest would refuse it only after the export
        mf.check_generation(checkpoint / ck.GENERATION, generation, model.cfg.vocab_size, max_new_tokens)
    out.mkdir(parents=True, exist_ok=True)
    _label(bar, "encoder.onnx")
    export_encoder(model, out / ENCODER_FILE)
    _tick(bar, "decoder.onnx")
    export_decoder(model, out / DECODER_FILE)
    export_inplace_decoder(model, out / DECODER_INPLACE_FILE)
    _tick(bar, "")
    ir_version = max(check_graph(out / f) for f in (ENCODER_FILE, DECODER_FILE, DECODER_INPLACE_FILE))
    shutil.copyfile(checkpoint / ck.TOKENIZER, out / mf.TOKENIZER)
    heldout = None
    if (checkpoint / HELDOUT).is_file():
        shutil.copyfile(checkpoint / HELDOUT, out / HELDOUT)
        heldout = mf.file_entry(out, HELDOUT)
    cfg = model.cfg
    manifest = mf.Manifest(
        model=cfg.to_dict(),
        special_tokens=ck.special_ids_of(cfg),
        tokenizer=mf.file_entry(out, mf.TOKENIZER),
        io=mf.expected_io(cfg.n_decoder_layers),
        variants={"fp32": {"encoder": mf.file_entry(out, ENCODER_FILE),
                           "decoder": mf.file_entry(out, DECODER_FILE) | {"kv_cache": names.KV_CONCAT},
                           names.DECODER_INPLACE: mf.file_entry(out, DECODER_INPLACE_FILE) | manifest_fields(model),
                           "quality": {}}},
        opset=OPSET,
        ir_version=ir_version,
        max_new_tokens=max_new_tokens,
        heldout=heldout,
        training={k: training[k] for k in ("preset", "task", "steps", "train_seconds", "parameters", "test",
                                           "imported_from") if k in training},
        generation=generation,
        languages=ck.read_languages(checkpoint),
        versions=package_versions(),
    )
    manifest.save(out)
    return manifest


def export_bundle(checkpoint: str | Path, out: str | Path, int8: bool = False, fp16: bool = False,
                  progress: bool = True) -> mf.Manifest:
    """The whole bundle: fp32 graphs and the requested variants (their quality is measured by checks/quality.py,
    which runs the engine: `seqserve export` does both)."""
    out = Path(out)
    chosen = [name for name, wanted in (("int8", int8), ("fp16", fp16)) if wanted]
    with tqdm(total=2 + len(chosen), desc="export", unit="step", disable=not progress, file=sys.stderr) as bar:
        _remove_stale_variants(out)
        manifest = export_fp32(checkpoint, out, bar)
        for name in chosen:
            _label(bar, f"{name} variant")
            vr.add_variant(out, manifest, name)
            _tick(bar, "")
        manifest.save(out)  # the variants must be listed before the server's Runner will load them
    return manifest


def _label(bar: tqdm | None, what: str) -> None:
    if bar is not None:
        bar.set_postfix_str(what)


def _tick(bar: tqdm | None, what_next: str) -> None:
    if bar is not None:
        bar.update(1)
        bar.set_postfix_str(what_next)


def _remove_stale_variants(out: Path) -> None:
    # A re-export without --int8 must not leave an old, unlisted encoder.int8.onnx next to the new graphs.
    for name in vr.BUILDERS:
        for file in names.graph_files(name).values():
            (out / file).unlink(missing_ok=True)
