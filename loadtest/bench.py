"""`seqserve bench`: the same N inputs decoded once by every engine, side by side.

Greedy rows: PyTorch without a KV cache (the whole decoder recomputed each step), PyTorch with it, the seqserve
engine on onnxruntime (fp32 and int8; the server's own Runner/Scheduler/Engine, continuous batching with
max_batch_size = the row's batch size, every request submitted up-front), graph-loop (the same ONNX graphs driven
by a bare static-batch loop: the engine's ceiling, loadtest/graph_loop.py), and CTranslate2 (fp32 and int8) from a
converted checkpoint, and transformers-marian (fp32; fp16 too on cuda): the checkpoint's own weights in a transformers
MarianMTModel decoded by its generate on the same device (loadtest/marian_twin.py), the anchor a user would reach
for; on by default for base/small, --transformers adds it to a trained checkpoint. Beam rows: the engine with
num_beams beside CTranslate2's beam_size and transformers' num_beams on the same inputs.

--shape default runs the given checkpoint on its held-out inputs; base and small run random-weight models of those
sizes on random sources (loadtest/shapes.py), every backend forced to the same output length (min_new_tokens =
max_new_tokens), PyTorch rows skipped. Every row runs in its own spawned process (loadtest/bench_rows.py), so its
peak RSS is its own. Greedy rows are compared with the cached PyTorch row of the smallest batch size (without
PyTorch rows: the fp32 graph-loop row), beam rows with the fp32 engine beam row of the smallest batch size.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
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
from seqserve.loadtest import bench_report, hf_models, shapes
from seqserve.loadtest.bench_config import BenchConfig, from_args
from seqserve.loadtest.bench_rows import (
    BEAM_EARLY_STOPPING,
    CTRANSLATE2,
    ENGINE,
    GRAPH_LOOP,
    PYTORCH_KV_CACHE,
    PYTORCH_NO_CACHE,
    TRANSFORMERS,
    TRANSFORMERS_MARIAN,
    RowRun,
    RowSpec,
    Workload,
    run_row,
)
from seqserve.loadtest.marian_twin import refusal
from seqserve.model.checkpoint import CONFIG
from seqserve.model.config import ModelConfig

# Each device's precisions: dynamic int8 is a CPU variant (the CUDA provider runs its integer ops on the host),
# fp16 a GPU one (the CPU provider casts most float16 ops back to float32). auto runs whichever the bundle has.
PRECISIONS = {"cpu": ("fp32", "int8"), "cuda": ("fp32", "fp16"), "auto": ("fp32", "int8", "fp16")}
CT2_PRECISIONS = {"cpu": ("fp32", "int8"), "cuda": ("fp32", "int8", "fp16"), "auto": ("fp32", "int8")}
TRANSFORMERS_PRECISIONS = {"cpu": ("fp32",), "cuda": ("fp32", "fp16"), "auto": ("fp32",)}  # torch's fp16 is a GPU one


def plan(cfg: BenchConfig, variants: list[str], with_ctranslate2: bool, with_pytorch: bool = True,
         with_transformers: bool = False) -> list[RowSpec]:
    rows = [RowSpec(backend, "fp32", b) for backend in (PYTORCH_NO_CACHE, PYTORCH_KV_CACHE)
            for b in cfg.torch_batch_sizes] if with_pytorch else []
    if cfg.hf_dir is not None:  # the original model's own generate: the reference of every row's tokens
        rows += [RowSpec(TRANSFORMERS, "fp32", b) for b in cfg.torch_batch_sizes]
        rows += [RowSpec(TRANSFORMERS, "fp32", min(cfg.beam_batch_sizes), cfg.num_beams)] if cfg.num_beams > 1 else []
    ours = [p for p in PRECISIONS[cfg.device] if p in variants]
    rows += [RowSpec(backend, p, b) for p in ours for backend in (ENGINE, GRAPH_LOOP) for b in cfg.batch_sizes]
    theirs = CT2_PRECISIONS[cfg.device] if with_ctranslate2 else ()
    rows += [RowSpec(CTRANSLATE2, p, b) for p in theirs for b in cfg.batch_sizes]
    anchor = TRANSFORMERS_PRECISIONS[cfg.device] if with_transformers else ()
    rows += [RowSpec(TRANSFORMERS_MARIAN, p, b) for p in anchor for b in cfg.batch_sizes]
    if cfg.num_beams > 1:
        rows += [RowSpec(ENGINE, p, b, cfg.num_beams) for p in ours for b in cfg.beam_batch_sizes]
        rows += [RowSpec(CTRANSLATE2, p, b, cfg.num_beams) for p in theirs for b in cfg.beam_batch_sizes]
        rows += [RowSpec(TRANSFORMERS_MARIAN, p, b, cfg.num_beams) for p in anchor for b in cfg.beam_batch_sizes]
    return rows


def _models(cfg: BenchConfig, stack: ExitStack, skipped: list[str]) -> tuple[Path | None, Path, Path | None]:
    """(checkpoint, bundle, CTranslate2 model or None) of the run."""
    convert = _converter(cfg, skipped)
    if cfg.hf_dir is not None:
        work = cfg.shape_dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="seqserve-bench-hf-")))
        made, refused = hf_models.prepare(cfg.hf_dir, work, convert is not None, cfg.progress)
        skipped += [refused] if refused else []
        return made.checkpoint, made.bundle, made.ctranslate2_dir
    if cfg.random:
        work = cfg.shape_dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="seqserve-bench-shape-")))
        made = shapes.prepare(cfg.shape, work, cfg.seed, cfg.num_inputs, cfg.resolved_max_new(0),
                              convert, cfg.progress, fp16=cfg.device != "cpu")  # fp16: the GPU's engine rows
        return made.checkpoint, made.bundle, made.ctranslate2_dir
    bundle = cfg.bundle
    if bundle is None:
        bundle = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="seqserve-bench-bundle-")))
        export_bundle(cfg.checkpoint, bundle, int8=True, progress=cfg.progress)  # quality is not our question
    if convert is None or cfg.ctranslate2_dir is not None:
        return cfg.checkpoint, bundle, cfg.ctranslate2_dir if convert else None
    out = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="seqserve-bench-ct2-")))
    return cfg.checkpoint, bundle, convert(cfg.checkpoint, out / "model")


def _converter(cfg: BenchConfig, skipped: list[str]):
    if not cfg.ctranslate2:
        skipped.append("CTranslate2 rows (--no-ctranslate2)")
        return None
    try:
        from seqserve.export.ctranslate2 import convert
    except ImportError:
        skipped.append("CTranslate2 rows: ctranslate2 is not installed (pip install 'seqserve[bench]')")
        return None
    return convert


def inputs(bundle: Path, manifest, hf: bool, n: int, seed: int) -> tuple[list[list[int]], bool]:
    """(sources, forced_eos): the bench's inputs, n random ids for an imported model (`--hf`) or the bundle's first n
    held-out lines; and whether the model forces its end token at max_new_tokens (an imported generation config)."""
    if hf:
        special = {int(i) for i in manifest.special_tokens.values()}
        sources = hf_models.random_sources(n, int(manifest.model["vocab_size"]), special,
                                           int(manifest.special_tokens["eos_id"]), seed)
    else:
        pairs = heldout_pairs(bundle, n)
        if not pairs:
            raise ValueError(f"{bundle} has no held-out inputs (heldout.tsv)")
        tokenizer = load_tokenizer(bundle / manifest.tokenizer["file"])
        sources = [tokenizer.encode(source).ids for source, _ in pairs]
    return sources, hf and (manifest.generation or {}).get("forced_eos_token_id") is not None


def _workload(cfg: BenchConfig, checkpoint: Path | None, bundle: Path, ct2: Path | None) -> tuple[Workload, list[str]]:
    manifest = load_manifest(bundle)
    sources, forced_eos = inputs(bundle, manifest, cfg.hf_dir is not None, cfg.num_inputs, cfg.seed)
    max_new = cfg.resolved_max_new(int(manifest.max_new_tokens))
    # A forced end token is the last of max_new_tokens: the forced length stops one token short of it.
    min_new = cfg.resolved_min_new(max_new) - (1 if forced_eos and cfg.min_new_tokens is None else 0)
    work = Workload(sources, max_new, cfg.threads, cfg.device, checkpoint, bundle, ct2, min_new_tokens=min_new,
                    kv_cache=cfg.kv_cache, hf_dir=cfg.hf_dir, forced_eos=forced_eos)
    return work, list(manifest.variants)


def _pytorch_skipped(cfg: BenchConfig, work: Workload) -> str | None:
    if cfg.hf_dir is not None:
        return "PyTorch rows: --hf has transformers' own rows instead (the reference)"
    if cfg.random:
        return f"PyTorch rows: --shape {cfg.shape} has random weights (the fp32 graph-loop row is the reference)"
    if work.min_new_tokens:
        return "PyTorch rows: model.decoding.greedy_decode has no min_new_tokens (the fp32 graph-loop row is the " \
               "reference)"
    return None


def _transformers_skipped(cfg: BenchConfig, work: Workload) -> str | None:
    """Why the transformers-marian rows asked for cannot run, or None (also None when they were not asked for)."""
    if not cfg.with_transformers:
        return "transformers-marian rows (--no-transformers)" if cfg.transformers is False else None
    if importlib.util.find_spec("transformers") is None:
        return "transformers-marian rows: transformers is not installed (pip install 'seqserve[hf]')"
    why = refusal(ModelConfig.load(work.checkpoint / CONFIG))
    return f"transformers-marian rows: a MarianMTModel cannot compute {work.checkpoint}: {why}" if why else None


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
            "num_beams": spec.num_beams, "device": run.device, "graph": run.graph, "n_inputs": n,
            "generated_tokens": generated, "wall_s": round(run.wall_s, 6),
            "tokens_per_s": round(generated / run.wall_s, 2),
            "mean_latency_ms_batch1": round(1e3 * run.wall_s / n, 3) if spec.batch_size == 1 else None,
            "peak_rss_mb": round(run.peak_rss_mb, 1), "identical_to_reference": identical / n,
            "output_lengths": [min(map(len, run.outputs)), max(map(len, run.outputs))]}


def references(specs: list[RowSpec]) -> dict[int, RowSpec]:
    """Per beam width: the row every row of that width is compared with (see the module docstring)."""
    refs = {}
    for width in sorted({s.num_beams for s in specs}):
        rows = [s for s in specs if s.num_beams == width and s.precision == "fp32"]
        present = {s.backend for s in rows}
        backend = next(b for b in (TRANSFORMERS, PYTORCH_KV_CACHE, GRAPH_LOOP, ENGINE, CTRANSLATE2) if b in present)
        refs[width] = min((s for s in rows if s.backend == backend), key=lambda s: s.batch_size)
    return refs


def _settings(cfg: BenchConfig, work: Workload) -> dict:
    beams = (f"; beam rows: num_beams {cfg.num_beams}, num_return_sequences 1, length_penalty 1, early_stopping "
             f"{str(BEAM_EARLY_STOPPING).lower()} (CTranslate2: beam_size {cfg.num_beams}, patience 1)"
             if cfg.num_beams > 1 else "")
    inputs = (f"{shapes.SOURCE_TOKENS}-token random sources (seed {cfg.seed})" if cfg.random
              else "the first n lines of the bundle's heldout.tsv")
    inputs += ", ids of the imported vocabulary, special ids excluded" if cfg.hf_dir else ""
    if work.forced_eos:
        inputs += ("; the model forces its end token at max_new_tokens (the engine and transformers apply it, "
                   "CTranslate2 cannot and decodes max_new_tokens - 1)")
    return {"shape": cfg.shape, "n_inputs": len(work.sources), "inputs": inputs, "decoding": "greedy" + beams,
            "max_new_tokens": work.max_new_tokens, "min_new_tokens": work.min_new_tokens, "threads": cfg.threads,
            "device": cfg.device, "kv_cache": cfg.kv_cache, "batch_sizes": list(cfg.batch_sizes),
            "torch_batch_sizes": list(cfg.torch_batch_sizes), "num_beams": cfg.num_beams,
            "beam_batch_sizes": list(cfg.beam_batch_sizes), "seed": cfg.seed if cfg.random else None,
            "checkpoint": str(work.checkpoint), "hf_dir": str(cfg.hf_dir) if cfg.hf_dir else None,
            "bundle": str(cfg.bundle) if cfg.bundle else f"exported from the checkpoint ({work.bundle})"}


def bench(cfg: BenchConfig) -> dict:
    """Runs every row and returns the report (also written as JSON, and as markdown when asked)."""
    skipped: list[str] = []
    with ExitStack() as stack:
        checkpoint, bundle, ct2 = _models(cfg, stack, skipped)
        work, variants = _workload(cfg, checkpoint, bundle, ct2)
        skipped += [f"engine and graph-loop {p} rows: the bundle has no {p} variant (export with --{p})"
                    for p in PRECISIONS[cfg.device] if p not in variants]
        no_torch = _pytorch_skipped(cfg, work)
        skipped += [no_torch] if no_torch else []
        no_transformers = _transformers_skipped(cfg, work)
        skipped += [no_transformers] if no_transformers else []
        specs = plan(cfg, variants, ct2 is not None, with_pytorch=no_torch is None,
                     with_transformers=cfg.with_transformers and no_transformers is None)
        machine = bench_report.machine()
        runs = run_rows(specs, work, cfg.progress)
    refs = references(specs)
    rows = [row_json(spec, run, runs[specs.index(refs[spec.num_beams])].outputs) for spec, run in zip(specs, runs)]
    machine["onnxruntime_providers_used"] = sorted({r["device"] for r in rows if r["backend"] in (ENGINE, GRAPH_LOOP)})
    machine["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return {"command": cfg.command(work.max_new_tokens, work.min_new_tokens),
            "created": datetime.datetime.now().astimezone().isoformat(), "machine": machine,
            "settings": _settings(cfg, work), "reference": refs[1].name,
            "beam_reference": refs[cfg.num_beams].name if cfg.num_beams in refs and cfg.num_beams > 1 else None,
            "fields": bench_report.FIELDS, "rows": rows, "ratios": bench_report.ratios(rows),
            "engine_batching": bench_report.batching_summary(rows), "skipped": skipped}


def main(args: argparse.Namespace) -> int:
    cfg = from_args(args)
    report = bench(cfg)
    out = cfg.out_path
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(bench_report.text_table(report["rows"]))
    print()
    print(bench_report.ratio_text(report["ratios"]))
    for line in report["skipped"]:
        print(f"skipped: {line}")
    if cfg.markdown is not None:
        cfg.markdown.parent.mkdir(parents=True, exist_ok=True)
        title = (f"`seqserve bench --hf {cfg.hf_dir}`" if cfg.hf_dir else f"`seqserve bench --shape {cfg.shape}`"
                 + (f" on {cfg.checkpoint}" if cfg.checkpoint else ""))
        cfg.markdown.write_text(bench_report.markdown_section(report, title) + "\n")
        print(f"markdown -> {cfg.markdown}")
    print(f"-> {out}")
    return 0
