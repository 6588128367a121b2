"""`seqserve verify BUNDLE [--checkpoint CKPT]`: the parity suite on held-out inputs, as a table and an exit code.

Without a checkpoint only the torch-free checks run (bundle integrity, graphs load with the manifest's I/O, NaN
checks, each variant against fp32); with one, onnxruntime is also compared with PyTorch (export/parity.py).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import numpy as np
from tqdm import tqdm

from export import ort_io
from export import variants as vr
from export.manifest import MANIFEST, BundleError, Manifest, listed_files, load_manifest
from export.quality import CPU, MAX_EXACT_MATCH_DROP, MIN_TOP1, QUALITY_N, measure_quality
from server.device import RuntimeConfig
from server.runner import Runner

PARITY_N = 256  # held-out lines compared with PyTorch


@dataclass(frozen=True)
class Check:
    check: str  # what was compared
    subject: str  # the output, variant or file it was compared on
    value: str  # what was measured
    limit: str  # the tolerance
    ok: bool


def verify(bundle: str | Path, checkpoint: str | Path | None = None, n: int = PARITY_N,
           quality_n: int = QUALITY_N, progress: bool = True,
           runtime: RuntimeConfig = CPU) -> tuple[list[Check], list[str]]:
    """Runs every check that applies; returns the table's rows and the skipped checks with their reason.

    runtime is where the server's own pieces (Runner, Engine) run: `--device cuda` checks the CUDA provider's
    outputs against PyTorch and the variants there; the plain graph checks always use the CPU provider.
    """
    bundle = Path(bundle)
    try:
        manifest = load_manifest(bundle)
    except BundleError as exc:
        return [Check("bundle integrity", MANIFEST, str(exc), "sha256, format, io names", False)], ["all other checks"]
    rows = [Check("bundle integrity", f"{len(listed_files(manifest))} files", "sha256, format, io names match",
                  f"format v{manifest.format_version}", True)]
    variants = list(manifest.variants)
    bar = tqdm(total=2 + bool(checkpoint), desc="verify", unit="stage", disable=not progress, file=sys.stderr)
    bar.set_postfix_str("graphs")
    rows += [_graphs_load(bundle, variant, runtime) for variant in variants]
    rows += [_nan_check(bundle, manifest, variant) for variant in variants]
    bar.update(1)
    bar.set_postfix_str("variants vs fp32")
    rows += _quality_rows(measure_quality(bundle, [v for v in variants if v != "fp32"], quality_n, progress=False,
                                          runtime=runtime))
    bar.update(1)
    skipped = []
    if checkpoint is None:
        skipped.append("onnxruntime vs PyTorch (encoder and decoder-step outputs, teacher forcing, greedy tokens): "
                       "no --checkpoint given; these need torch and the checkpoint the bundle was exported from")
    else:
        bar.set_postfix_str("onnxruntime vs PyTorch")
        from export.parity import torch_parity  # torch only when asked for

        rows += torch_parity(bundle, Path(checkpoint), n, runtime)
        bar.update(1)
    bar.close()
    return rows, skipped


def _graphs_load(bundle: Path, variant: str, runtime: RuntimeConfig) -> Check:
    """The server's own loader: sessions on the runtime's provider whose inputs/outputs match the manifest."""
    try:
        runner = Runner(bundle, runtime, variant)
        return Check(f"graphs load ({runner.provider})", variant, "inputs/outputs match manifest", "-", True)
    except Exception as exc:  # a refusal is a failed row, not a crash of the whole table
        return Check(f"graphs load (--device {runtime.device})", variant, str(exc), "-", False)


def _nan_check(bundle: Path, manifest: Manifest, variant: str) -> Check:
    """A step where one row attends to no source token and no past slot must still give finite logits."""
    session = ort_io.cpu_session(bundle / vr.files(variant)["decoder"])
    outputs = session.run(None, ort_io.random_decoder_feeds(manifest.model, batch=3, past_len=4, src_len=5))
    finite = all(bool(np.isfinite(o).all()) for o in outputs)
    return Check("no NaN: fully masked row", variant, "finite" if finite else "NaN/inf", "finite", finite)


def _quality_rows(quality: dict) -> list[Check]:
    fp32 = quality["fp32"]
    if "skipped" in fp32:
        return [Check("held-out quality", "all", fp32["skipped"], "-", True)]
    rows = [Check("exact match (engine)", "fp32", f"{fp32['exact_match']:.2%} of {fp32['n']}", "-", True)]
    for variant, q in quality.items():
        rows.append(Check("no NaN: held-out teacher forcing", variant, "finite" if q["nan_free"] else "NaN/inf",
                          "finite", q["nan_free"]))
        if variant == "fp32":
            continue
        drop = q["exact_match_drop_points"]
        rows.append(Check("exact match (engine)", variant, f"{q['exact_match']:.2%} ({drop:+.2f} pt vs fp32)",
                          f"drop <= {MAX_EXACT_MATCH_DROP:g} pt", drop <= MAX_EXACT_MATCH_DROP))
        rows.append(Check("top-1 agreement vs fp32", variant, f"{q['top1_agreement']:.2%} of {q['top1_steps']} steps",
                          f">= {MIN_TOP1:.0%}", q["top1_agreement"] >= MIN_TOP1))
    return rows


def format_table(rows: list[Check], skipped: list[str]) -> str:
    header = Check("check", "subject", "value", "limit", True)
    cells = [(r.check, r.subject, r.value, r.limit, "ok" if r.ok else "FAIL") for r in rows]
    head = (header.check, header.subject, header.value, header.limit, "status")
    widths = [max(len(c[i]) for c in cells + [head]) for i in range(5)]
    line = "  ".join("-" * w for w in widths)
    out = ["  ".join(h.ljust(w) for h, w in zip(head, widths)), line]
    out += ["  ".join(c.ljust(w) for c, w in zip(cell, widths)).rstrip() for cell in cells]
    failed = sum(not r.ok for r in rows)
    out += [line, f"{len(rows) - failed} passed, {failed} failed"]
    out += [f"skipped: {s}" for s in skipped]
    return "\n".join(out)


def main(bundle: str, checkpoint: str | None, n: int, quality_n: int, progress: bool = True,
         stream: TextIO | None = None, device: str = "cpu") -> int:
    """Prints the table; 1 when any tolerance is broken (or the bundle is refused), 0 otherwise."""
    rows, skipped = verify(bundle, checkpoint, n, quality_n, progress, RuntimeConfig(device=device))
    print(format_table(rows, skipped), file=stream or sys.stdout)
    return 0 if all(r.ok for r in rows) else 1
