"""A copy of a bundle whose fp32 decoder_inplace ends with the token-choice outputs (export/token_choice.py), its
manifest entry rewritten: the CPU provider then runs the very graph shape the CUDA variant has."""
from __future__ import annotations

import shutil
from pathlib import Path

import onnx

from seqserve.contract import manifest as mf
from seqserve.contract import names
from seqserve.engine.runtime.runner import Runner
from seqserve.export.token_choice import add_token_choice


def with_token_choice(bundle: Path, out: Path) -> Path:
    shutil.copytree(bundle, out)
    path = out / names.DECODER_INPLACE_FILE
    onnx.save(add_token_choice(onnx.load(str(path))), str(path))
    manifest = mf.load_manifest(out, check_files=False)
    entry = manifest.variants["fp32"][names.DECODER_INPLACE]
    entry.update(mf.file_entry(out, names.DECODER_INPLACE_FILE), token_choice=list(names.TOKEN_CHOICE_OUTPUTS))
    manifest.save(out)
    return out


class Recording(Runner):
    """The real runner, recording which outputs each step copied to the host."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fetched: list[tuple[str, ...]] = []

    def run_step(self, need):
        out = super().run_step(need)
        pairs = ((names.LOGITS, out.logits), (names.NEXT_TOKEN_IDS, out.ids), (names.TOP_TOKEN_IDS, out.top_ids),
                 (names.TOP_LOGPROBS, out.top_logprobs))
        self.fetched.append(tuple(name for name, value in pairs if value is not None))  # the outputs it copied
        return out
