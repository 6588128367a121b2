"""The torch-free half of `seqserve verify`: bundle integrity, graphs load with the manifest's I/O, NaN checks, and
each variant against fp32. With --checkpoint the command adds onnxruntime against PyTorch (checks/parity.py).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from seqserve.checks.quality import CPU, QUALITY_N, measure_quality
from seqserve.checks.table import Check
from seqserve.contract import names
from seqserve.contract.manifest import MANIFEST, BundleError, Manifest, listed_files, load_manifest, sha256_of
from seqserve.contract.quality import MAX_EXACT_MATCH_DROP, MIN_TOP1
from seqserve.contract.verified import VERIFIED, is_verified  # noqa: F401 (is_verified: deploy/bundle.sh)
from seqserve.engine.runtime.device import RuntimeConfig
from seqserve.engine.runtime.runner import Runner
from seqserve.export import ort_io


def verify(bundle: str | Path, quality_n: int = QUALITY_N, progress: bool = True,
           runtime: RuntimeConfig = CPU) -> list[Check]:
    """The torch-free checks: integrity, graphs load, NaN, each variant against fp32 (parity.py adds PyTorch's).

    runtime is where the server's own pieces (Runner, Engine) run: `--device cuda` checks the variants on the CUDA
    provider; the plain graph checks always use the CPU provider.
    """
    bundle = Path(bundle)
    try:
        manifest = load_manifest(bundle)
    except BundleError as exc:
        return [Check("bundle integrity", MANIFEST, str(exc), "sha256, format, io names", False)]
    rows = [Check("bundle integrity", f"{len(listed_files(manifest))} files", "sha256, format, io names match",
                  f"format v{manifest.format_version}", True)]
    variants = list(manifest.variants)
    bar = tqdm(total=2, desc="verify", unit="stage", disable=not progress, file=sys.stderr)
    bar.set_postfix_str("graphs")
    rows += [_graphs_load(bundle, variant, runtime) for variant in variants]
    rows += [_weights_finite(bundle, manifest, variant) for variant in variants]
    rows += [_nan_check(bundle, manifest, variant) for variant in variants]
    bar.update(1)
    bar.set_postfix_str("variants vs fp32")
    rows += _quality_rows(measure_quality(bundle, [v for v in variants if v != "fp32"], quality_n, progress=False,
                                          runtime=runtime))
    bar.update(1)
    bar.close()
    return rows


def _graphs_load(bundle: Path, variant: str, runtime: RuntimeConfig) -> Check:
    """The server's own loader: sessions on the runtime's provider whose inputs/outputs match the manifest."""
    try:
        runner = Runner(bundle, runtime, variant)
        return Check(f"graphs load ({runner.provider})", variant, "inputs/outputs match manifest", "-", True)
    except Exception as exc:  # a refusal is a failed row, not a crash of the whole table
        return Check(f"graphs load (--device {runtime.device})", variant, str(exc), "-", False)


def _weights_finite(bundle: Path, manifest: Manifest, variant: str) -> Check:
    """Every floating-point initializer of the variant's graphs: a NaN weight that no probe input reaches (one
    embedding row) would otherwise pass every comparison here."""
    try:
        import onnx  # the train extra; the serving install lacks it
        from onnx import numpy_helper
    except ImportError:
        return Check("weights finite", variant, "not read: the onnx package is not installed", "finite", True)
    bad: list[str] = []
    for graph in names.ALL_GRAPHS:
        entry = manifest.variants[variant].get(graph)
        if entry is None:
            continue
        for init in onnx.load(str(bundle / entry["file"])).graph.initializer:
            w = numpy_helper.to_array(init)
            if w.dtype.kind == "f" and not bool(np.isfinite(w).all()):
                bad.append(f"{entry['file']}:{init.name}")
    value = "finite" if not bad else f"non-finite values in {len(bad)} initializers: {', '.join(bad[:3])}"
    return Check("weights finite", variant, value, "finite", not bad)


def _nan_check(bundle: Path, manifest: Manifest, variant: str) -> Check:
    """A step where one row attends to no source token and no past slot must still give finite logits."""
    session = ort_io.cpu_session(bundle / names.graph_files(variant)["decoder"])
    outputs = session.run(None, ort_io.random_decoder_feeds(manifest.model, batch=3, past_len=4, src_len=5))
    finite = all(bool(np.isfinite(o).all()) for o in outputs)
    return Check("no NaN: fully masked row", variant, "finite" if finite else "NaN/inf", "finite", finite)


def _quality_rows(quality: dict) -> list[Check]:
    fp32 = quality["fp32"]
    if "skipped" in fp32:
        return [Check("held-out quality", "all", fp32["skipped"], "-", True)]
    held_out = "exact_match" in fp32  # else an imported model's probe strings: top-1 agreement only
    rows = [Check("exact match (engine)", "fp32", f"{fp32['exact_match']:.2%} of {fp32['n']}", "-", True)] \
        if held_out else []
    for variant, q in quality.items():
        rows.append(Check(f"no NaN: {'held-out' if held_out else 'probe'} teacher forcing", variant,
                          "finite" if q["nan_free"] else "NaN/inf", "finite", q["nan_free"]))
        if variant == "fp32":
            continue
        finite = q["nan_free"] and fp32["nan_free"]  # argmaxes of NaN logits can agree: no agreement without it
        if held_out:  # the value is the change against fp32 (a drop is negative); the limit is on the drop
            drop = q["exact_match_drop_points"]
            rows.append(Check("exact match (engine)", variant, f"{q['exact_match']:.2%} ({-drop:+.2f} pt vs fp32)",
                              f"drop <= {MAX_EXACT_MATCH_DROP:g} pt", finite and drop <= MAX_EXACT_MATCH_DROP))
        agreement, passes = f"{q['top1_agreement']:.2%} of {q['top1_steps']} steps", q["top1_agreement"] >= MIN_TOP1
        if not held_out and not passes:  # recorded in the manifest; the server refuses to load the variant
            agreement, passes = agreement + ": below the bar, the server refuses this variant", True
        rows.append(Check("top-1 agreement vs fp32", variant, agreement, f">= {MIN_TOP1:.0%}", finite and passes))
    return rows


def clear_marker(bundle: str | Path) -> None:
    (Path(bundle) / VERIFIED).unlink(missing_ok=True)


def write_marker(bundle: str | Path, rows: list[Check], with_pytorch: bool) -> None:
    """Records a passed verify for exactly this manifest (its sha256): `make serve` serves only a verified bundle,
    and a re-export changes the manifest, so an old marker cannot vouch for new graphs."""
    bundle = Path(bundle)
    marker = {"manifest_sha256": sha256_of(bundle / MANIFEST), "checks_passed": len(rows),
              "with_pytorch": with_pytorch, "verified_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    tmp = bundle / (VERIFIED + ".tmp")
    tmp.write_text(json.dumps(marker, indent=2) + "\n")
    tmp.replace(bundle / VERIFIED)  # atomic: a crash never leaves a half-written marker
