"""Each precision variant's quality on the bundle's held-out split, measured with the server's own pieces (no torch).

Exact match: the engine's greedy outputs (engine/step/engine.py, the numpy onnxruntime loop) against the references.
Top-1 agreement: the fraction of teacher-forced decoder steps, forcing fp32's greedy tokens through the server's
Runner, where the variant's argmax equals fp32's.
"""
from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer
from tqdm import tqdm

from seqserve.contract import names
from seqserve.contract.manifest import Manifest, load_manifest
from seqserve.contract.quality import MAX_EXACT_MATCH_DROP, below_bar
from seqserve.contract.tokenizer import load_tokenizer
from seqserve.contract.tsv import HELDOUT, heldout_pairs
from seqserve.engine.build import offline
from seqserve.engine.request import FinishReason, Request, SamplingParams
from seqserve.engine.runtime.device import RuntimeConfig
from seqserve.engine.runtime.runner import Runner
from seqserve.engine.runtime.slots import Joining
from seqserve.export import variants as vr
from seqserve.model.tokenizer_texts import real_strings

QUALITY_N = 500  # the first lines of the held-out split: a fixed evaluation set that keeps export quick
# An imported model's bundle has no held-out pairs: top-1 agreement is measured on real strings (no references)
PROBE_N, PROBE_MAX_NEW = 64, 32
PROBE_SPLIT = "probe strings (model/tokenizer_texts.py; no references: top-1 agreement only)"
BATCH = 32
CPU = RuntimeConfig(device="cpu")
INT8_NOTE = ("activations are quantised at run time with one scale per tensor over the whole batch, so an int8 row's "
             "logits depend on its batch mates: unlike fp32, continuous batching can change an int8 request's tokens")
FP16_CPU_NOTE = ("runs on the CPU provider, but onnxruntime has no float16 CPU kernel for the ops listed under "
                 "float32 and casts them back to float32: on CPU this measures float16 weights, not float16 arithmetic")


def generate(runner: Runner, tokenizer: Tokenizer, sources: list[list[int]], max_new_tokens: int) -> list[Request]:
    """Greedy generation through the server's engine; every request is finished on return."""
    engine = offline(runner, tokenizer, max_batch_size=min(BATCH, runner.slots.capacity))
    return engine.generate([Request(list(s), SamplingParams(max_new_tokens=max_new_tokens)) for s in sources])


def forced_targets(requests: list[Request], eos_id: int) -> list[list[int]]:
    """Each finished request's tokens as teacher-forcing targets (with the end token when it produced one)."""
    return [r.output_ids + ([eos_id] if r.finish_reason is FinishReason.EOS else []) for r in requests]


def teacher_forced(runner: Runner, sources: list[list[int]], targets: list[list[int]],
                   batch_size: int = BATCH) -> Iterator[tuple[int, np.ndarray]]:
    """Yields (first row, logits (B, T, V)) per chunk; step t feeds target t-1 (BOS first) at position t."""
    pad = runner.manifest.special_tokens["pad_id"]
    for start in range(0, len(sources), batch_size):
        rows = [Request(list(s), SamplingParams()) for s in sources[start : start + batch_size]]
        chunk = targets[start : start + batch_size]
        width = max(len(t) for t in chunk)
        forced = np.full((len(rows), width), pad, np.int64)  # (B, T) the token fed after step t; pads after the end
        for i, target in enumerate(chunk):
            forced[i, : len(target) - 1] = target[:-1]
        ids = [r.id for r in rows]
        cross, _ = runner.encode(ids, [r.input_ids for r in rows])
        at = np.array(runner.admit(Joining.of(rows), [cross[i] for i in ids]))  # (B,) each row's slot
        try:
            steps = []
            for t in range(width):
                steps.append(runner.step()[at].copy())  # (B, V)
                if t == width - 1:
                    break
                chosen = np.zeros(runner.slots.hi, np.int64)
                chosen[at] = forced[:, t]
                runner.slots.append(chosen, runner.slots.live[: runner.slots.hi])
        finally:
            runner.retire(ids)
        yield start, np.stack(steps, axis=1)


def top1(runner: Runner, sources: list[list[int]], targets: list[list[int]]) -> tuple[list[np.ndarray], bool]:
    """Each row's argmax at its forced steps, and whether every logit of the pass was finite."""
    argmax: list[np.ndarray] = []
    finite = True
    for start, logits in teacher_forced(runner, sources, targets):
        finite &= bool(np.isfinite(logits).all())
        best = logits.argmax(-1)  # (B, T)
        argmax += [best[i, : len(targets[start + i])] for i in range(best.shape[0])]
    return argmax, finite


def exact_match(requests: list[Request], references: list[str]) -> float:
    return sum(r.text == ref for r, ref in zip(requests, references)) / max(1, len(references))


def measure_quality(bundle: str | Path, variants: list[str], n: int = QUALITY_N, progress: bool = True,
                    runtime: RuntimeConfig = CPU) -> dict:
    """{variant: quality entry} for fp32 and the given variants; warns loudly on stderr about a lossy variant."""
    bundle = Path(bundle)
    manifest = load_manifest(bundle)
    pairs = heldout_pairs(bundle, n)
    tok = load_tokenizer(bundle / manifest.tokenizer["file"])
    max_new, split = manifest.max_new_tokens, HELDOUT
    if not pairs and "imported_from" not in manifest.training:
        return {v: {"skipped": f"the bundle has no {HELDOUT}"} for v in ["fp32", *variants]}
    if pairs:
        sources, references = [tok.encode(s).ids for s, _ in pairs], [t for _, t in pairs]
    else:  # an imported model: its top-1 agreement on real strings, cut to the model's longest source
        texts = [t for t in real_strings() if t.strip()][:: 7][: min(n, PROBE_N)]
        sources = [tok.encode(t).ids[: manifest.model["max_positions"]] for t in texts]
        references, max_new, split = None, min(max_new, PROBE_MAX_NEW), PROBE_SPLIT
    eos = manifest.special_tokens["eos_id"]
    bar = tqdm(total=1 + len(variants), desc="quality", unit="variant", disable=not progress, file=sys.stderr)
    runner = Runner(bundle, runtime, "fp32")
    reference = generate(runner, tok, sources, max_new)
    targets = forced_targets(reference, eos)
    ref_top1, finite = top1(runner, sources, targets)
    fp32 = {"n": len(sources), "split": split, "nan_free": finite}
    if references is not None:
        fp32["exact_match"] = exact_match(reference, references)
    results = {"fp32": fp32}
    bar.update(1)
    for variant in variants:
        runner = Runner(bundle, runtime, variant)
        got, finite = top1(runner, sources, targets)
        agree = sum(int((a == b).sum()) for a, b in zip(got, ref_top1))
        steps = sum(len(a) for a in ref_top1)
        results[variant] = {"n": len(sources), "split": split, "top1_agreement": agree / max(1, steps),
                            "top1_steps": steps, "nan_free": finite, **_notes(bundle, manifest.model, variant)}
        if references is not None:
            em = exact_match(generate(runner, tok, sources, max_new), references)
            results[variant] |= {"exact_match": em,
                                 "exact_match_drop_points": round(100 * (fp32["exact_match"] - em), 3)}
        _warn(variant, results[variant])
        bar.update(1)
    bar.close()
    return results


def _notes(bundle: Path, model: dict, variant: str) -> dict:
    if variant == "int8":
        return {"note": INT8_NOTE}
    if variant == "fp16":
        kernels = vr.cpu_kernel_precision(bundle / names.graph_files("fp16")["decoder"], model)
        note = {"note": FP16_CPU_NOTE} if kernels["float32"] else {}
        return {"cpu_provider": {"runs": True, "kernels": kernels, **note}}
    return {}


def _warn(variant: str, quality: dict) -> None:
    problems = []
    if quality.get("exact_match_drop_points", 0) > MAX_EXACT_MATCH_DROP:
        problems.append(f"loses {quality['exact_match_drop_points']:.2f} points of exact match against fp32 "
                        f"(limit {MAX_EXACT_MATCH_DROP:g})")
    if below_bar(quality):
        problems.append(below_bar(quality) + "; the server refuses to serve it")
    if problems:
        quality["warning"] = "; ".join(problems)
        bar = "!" * 78
        lines = "held-out lines" if quality["split"] == HELDOUT else "probe strings"
        print(f"{bar}\nWARNING: variant {variant} {quality['warning']} on {quality['n']} {lines}\n{bar}",
              file=sys.stderr)


def record_quality(bundle: str | Path, n: int = QUALITY_N, progress: bool = True) -> Manifest:
    """Measures every variant of an exported bundle and writes the figures into its manifest (`seqserve export`)."""
    bundle = Path(bundle)
    manifest = load_manifest(bundle)
    for name, quality in measure_quality(bundle, [v for v in manifest.variants if v != "fp32"], n, progress).items():
        manifest.variants[name]["quality"] = quality
    manifest.save(bundle)
    return manifest
