"""`seqserve bench`: the same N held-out inputs, greedy, decoded once by every engine, side by side.

Rows: PyTorch without a KV cache (the whole decoder recomputed each step), PyTorch with it, the seqserve engine on
onnxruntime (fp32 and int8; the server's own Runner/Scheduler/Engine, continuous batching with max_batch_size = the
row's batch size, every request submitted up-front), and CTranslate2 (fp32 and int8) from a converted checkpoint.
Every row runs in its own spawned process (loadtest/bench_rows.py), so its peak RSS is its own. The reference is the
cached PyTorch row with the smallest batch size; every row reports the share of inputs identical to it.
"""
from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from contextlib import ExitStack
from pathlib import Path

from tqdm import tqdm

from seqserve.contract.manifest import load_manifest
from seqserve.contract.tokenizer import load_tokenizer
from seqserve.contract.tsv import heldout_pairs
from seqserve.export.bundle import export_bundle
from seqserve.loadtest import bench_report
from seqserve.loadtest.bench_config import BenchConfig, from_args
from seqserve.loadtest.bench_rows import (
    CTRANSLATE2,
    ENGINE,
    PYTORCH_KV_CACHE,
    PYTORCH_NO_CACHE,
    RowRun,
    RowSpec,
    Workload,
    run_row,
)

# Each device's precisions: dynamic int8 is a CPU variant (the CUDA provider runs its integer ops on the host),
# fp16 a GPU one (the CPU provider casts most float16 ops back to float32). auto runs whichever the bundle has.
PRECISIONS = {"cpu": ("fp32", "int8"), "cuda": ("fp32", "fp16"), "auto": ("fp32", "int8", "fp16")}
CT2_PRECISIONS = {"cpu": ("fp32", "int8"), "cuda": ("fp32", "int8", "fp16"), "auto": ("fp32", "int8")}


def plan(cfg: BenchConfig, variants: list[str], with_ctranslate2: bool) -> list[RowSpec]:
    rows = [RowSpec(backend, "fp32", b) for backend in (PYTORCH_NO_CACHE, PYTORCH_KV_CACHE)
            for b in cfg.torch_batch_sizes]
    rows += [RowSpec(ENGINE, p, b) for p in PRECISIONS[cfg.device] if p in variants for b in cfg.batch_sizes]
    if with_ctranslate2:
        rows += [RowSpec(CTRANSLATE2, p, b) for p in CT2_PRECISIONS[cfg.device] for b in cfg.batch_sizes]
    return rows


def _bundle(cfg: BenchConfig, stack: ExitStack) -> Path:
    if cfg.bundle is not None:
        return cfg.bundle
    out = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="seqserve-bench-bundle-")))
    export_bundle(cfg.checkpoint, out, int8=True, progress=cfg.progress)  # quality is not our question
    return out


def _ctranslate2_model(cfg: BenchConfig, stack: ExitStack, skipped: list[str]) -> Path | None:
    if not cfg.ctranslate2:
        skipped.append("CTranslate2 rows (--no-ctranslate2)")
        return None
    try:
        from seqserve.export.ctranslate2 import convert
    except ImportError:
        skipped.append("CTranslate2 rows: ctranslate2 is not installed (pip install 'seqserve[bench]')")
        return None
    if cfg.ctranslate2_dir is not None:
        return cfg.ctranslate2_dir
    out = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="seqserve-bench-ct2-")))
    return convert(cfg.checkpoint, out / "model")


def _workload(cfg: BenchConfig, bundle: Path, ct2: Path | None) -> tuple[Workload, list[str]]:
    manifest = load_manifest(bundle)
    pairs = heldout_pairs(bundle, cfg.num_inputs)
    if not pairs:
        raise ValueError(f"{bundle} has no held-out inputs (heldout.tsv)")
    tokenizer = load_tokenizer(bundle / manifest.tokenizer["file"])
    sources = [tokenizer.encode(source).ids for source, _ in pairs]
    max_new = cfg.max_new_tokens or int(manifest.max_new_tokens)
    return Workload(sources, max_new, cfg.threads, cfg.device, cfg.checkpoint, bundle, ct2), list(manifest.variants)


def run_rows(specs: list[RowSpec], work: Workload, progress: bool) -> list[RowRun]:
    """Each row in a fresh spawned process (no fork: no torch or onnxruntime state is inherited)."""
    context = multiprocessing.get_context("spawn")
    runs = []
    with tqdm(specs, desc="bench", unit="row", disable=not progress, file=sys.stderr) as bar:
        for spec in bar:
            bar.set_postfix_str(spec.name)
            with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
                run = pool.submit(run_row, spec, work).result()
            generated = sum(map(len, run.outputs))
            bar.write(f"{spec.name}: {generated / run.wall_s:,.0f} tokens/s, peak RSS {run.peak_rss_mb:,.0f} MB",
                      file=sys.stderr)
            runs.append(run)
    return runs


def row_json(spec: RowSpec, run: RowRun, reference: list[list[int]]) -> dict:
    n = len(run.outputs)
    generated = sum(map(len, run.outputs))
    identical = sum(a == b for a, b in zip(run.outputs, reference))
    return {"name": spec.name, "backend": spec.backend, "precision": spec.precision, "batch_size": spec.batch_size,
            "device": run.device, "n_inputs": n, "generated_tokens": generated, "wall_s": round(run.wall_s, 6),
            "tokens_per_s": round(generated / run.wall_s, 2),
            "mean_latency_ms_batch1": round(1e3 * run.wall_s / n, 3) if spec.batch_size == 1 else None,
            "peak_rss_mb": round(run.peak_rss_mb, 1), "identical_to_reference": identical / n}


def bench(cfg: BenchConfig) -> dict:
    """Runs every row and returns the report (also written as JSON, and as markdown when asked)."""
    skipped: list[str] = []
    with ExitStack() as stack:
        bundle = _bundle(cfg, stack)
        ct2 = _ctranslate2_model(cfg, stack, skipped)
        work, variants = _workload(cfg, bundle, ct2)
        skipped += [f"engine {p} rows: the bundle has no {p} variant (export with --{p})"
                    for p in PRECISIONS[cfg.device] if p not in variants]
        specs = plan(cfg, variants, ct2 is not None)
        machine = bench_report.machine()
        runs = run_rows(specs, work, cfg.progress)
    ref = min((s for s in specs if s.backend == PYTORCH_KV_CACHE), key=lambda s: s.batch_size)
    reference = runs[specs.index(ref)].outputs
    rows = [row_json(spec, run, reference) for spec, run in zip(specs, runs)]
    machine["onnxruntime_providers_used"] = sorted({r["device"] for r in rows if r["backend"] == ENGINE})
    machine["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return {"command": cfg.command(work.max_new_tokens), "created": datetime.datetime.now().astimezone().isoformat(),
            "machine": machine,
            "settings": {"n_inputs": len(work.sources), "inputs": "the first n lines of the bundle's heldout.tsv",
                         "decoding": "greedy", "max_new_tokens": work.max_new_tokens, "threads": cfg.threads,
                         "device": cfg.device, "batch_sizes": list(cfg.batch_sizes),
                         "torch_batch_sizes": list(cfg.torch_batch_sizes), "checkpoint": str(cfg.checkpoint),
                         "bundle": str(cfg.bundle) if cfg.bundle else "exported from the checkpoint (temporary)"},
            "reference": ref.name, "fields": bench_report.FIELDS, "rows": rows,
            "engine_batching": bench_report.batching_summary(rows), "skipped": skipped}


def main(args: argparse.Namespace) -> int:
    cfg = from_args(args)
    report = bench(cfg)
    out = cfg.out_path
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(bench_report.text_table(report["rows"]))
    for line in report["skipped"]:
        print(f"skipped: {line}")
    if cfg.markdown is not None:
        cfg.markdown.parent.mkdir(parents=True, exist_ok=True)
        cfg.markdown.write_text(bench_report.markdown_section(report, f"`seqserve bench` on {cfg.checkpoint}") + "\n")
        print(f"markdown -> {cfg.markdown}")
    print(f"-> {out}")
    return 0
