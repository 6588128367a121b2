"""`seqserve bench --hf DIR`: a Hugging Face model directory made ready for every backend of the benchmark.

The directory is imported (`seqserve import`, model/hf_import.py) and exported (fp32 + int8) for the engine rows;
CTranslate2's own `TransformersConverter` converts the same directory for the CTranslate2 rows (not ours: the
point is the alternative a user would reach for), and the transformers rows load it with `from_pretrained`.
Sources are random ids of the model's vocabulary (special ids excluded) ending with its end token, SOURCE_TOKENS
long, as `--shape base` has: a random-weight model gives no meaning to real text.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from seqserve.export.bundle import export_bundle
from seqserve.loadtest.shapes import SOURCE_TOKENS, Prepared
from seqserve.model import checkpoint as ck
from seqserve.model.hf_import import import_model

MARKER = "hf.json"  # what a prepared directory holds; reused only when this matches exactly


def prepare(hf_dir: str | Path, work_dir: str | Path, with_ctranslate2: bool, progress: bool = True) -> Prepared:
    """checkpoint/, bundle/ (fp32 + int8) and, when asked, ctranslate2/ under work_dir; reused when work_dir was
    prepared from the same directory (same config.json and weights size) before."""
    hf_dir, work_dir = Path(hf_dir), Path(work_dir)
    weights = sorted(hf_dir.glob("*.safetensors"))
    marker = {"hf_dir": str(hf_dir.resolve()), "config": json.loads((hf_dir / "config.json").read_text()),
              "weights_bytes": sum(p.stat().st_size for p in weights), "ctranslate2": with_ctranslate2}
    ct2 = work_dir / "ctranslate2" if with_ctranslate2 else None
    done = Prepared(work_dir / "checkpoint", work_dir / "bundle", ct2)
    if _read(work_dir / MARKER) == marker:
        return done
    (work_dir / MARKER).unlink(missing_ok=True)
    import_model(hf_dir, done.checkpoint, progress=progress)
    export_bundle(done.checkpoint, done.bundle, int8=True, progress=progress)
    if with_ctranslate2:
        convert_with_ctranslate2(hf_dir, done.ctranslate2_dir)
    ck.write_json_atomic(work_dir / MARKER, marker)  # last: a half-prepared directory is never reused
    return done


def convert_with_ctranslate2(hf_dir: Path, out: Path) -> Path:
    """CTranslate2's own converter for Hugging Face models (float32; int8 is chosen when a Translator loads it)."""
    from ctranslate2.converters import TransformersConverter

    return Path(TransformersConverter(str(hf_dir)).convert(str(out), force=True))


def random_sources(n: int, vocab_size: int, special_ids: set[int], eos_id: int, seed: int,
                   length: int = SOURCE_TOKENS) -> list[list[int]]:
    """n sources of length - 1 random ordinary ids, then the end token (what the tokenizer would append)."""
    ordinary = np.array(sorted(set(range(vocab_size)) - special_ids))
    rng = np.random.default_rng(seed)
    picks = ordinary[rng.integers(0, len(ordinary), (n, length - 1))]  # (n, length - 1)
    return [row + [eos_id] for row in picks.tolist()]


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
