"""Beam rows against CTranslate2 in rounds, on CPU time:

    python -m seqserve.loadtest.beam_rounds DIR [--hf] [--precision int8] [--rounds 6] [--batch-size 16] [--num-beams 4]

DIR is a `seqserve bench --shape-dir` directory (checkpoint/, bundle/, ctranslate2/). Each round runs the engine's row
and CTranslate2's, each in a fresh spawned process (loadtest/bench_rows.py), back to back; a row is tokens per CPU
second of its process. On a shared 2-core machine one row moves by 5-10% from run to run, so the figure is the median
of the per-round ratios, with their range. The sources are the bench's: the bundle's held-out lines, or with --hf
random ids (`bench --hf`), forced to max_new_tokens.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
from pathlib import Path

from seqserve.contract.manifest import load_manifest
from seqserve.loadtest.bench import inputs, run_rows
from seqserve.loadtest.bench_rows import CTRANSLATE2, ENGINE, RowSpec, Workload


def workload(directory: Path, hf: bool, n: int, max_new_tokens: int) -> Workload:
    """The bench's inputs (`bench.inputs`), every backend forced to max_new_tokens (one short of a forced end token)."""
    bundle = directory / "bundle"
    sources, forced = inputs(bundle, load_manifest(bundle), hf, n, seed=0)
    return Workload(sources, max_new_tokens, 1, "cpu", directory / "checkpoint", bundle, directory / "ctranslate2",
                    min_new_tokens=max_new_tokens - (1 if forced else 0), forced_eos=forced)


def rounds(work: Workload, precision: str, batch_size: int, num_beams: int, n_rounds: int) -> dict:
    """Per round: engine and CTranslate2 tokens per CPU second, their ratio; the median ratio and whether the two
    backends' outputs were identical (fp32: they should be)."""
    specs = [RowSpec(ENGINE, precision, batch_size, num_beams), RowSpec(CTRANSLATE2, precision, batch_size, num_beams)]
    per_round, digests = [], set()
    for _ in range(n_rounds):
        engine, ct2 = run_rows(specs, work, progress=False)
        tps = [sum(map(len, run.outputs)) / run.cpu_s for run in (engine, ct2)]
        per_round.append({"engine": round(tps[0], 1), "ctranslate2": round(tps[1], 1),
                          "ratio": round(tps[0] / tps[1], 3), "load": round(os.getloadavg()[0], 2)})
        digests |= {hashlib.sha256(json.dumps(run.outputs).encode()).hexdigest() for run in (engine, ct2)}
    ratios = [r["ratio"] for r in per_round]
    return {"precision": precision, "batch_size": batch_size, "num_beams": num_beams, "rounds": per_round,
            "median_ratio": statistics.median(ratios), "min_ratio": min(ratios), "max_ratio": max(ratios),
            "identical_outputs": len(digests) == 1}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("directory", type=Path, help="a `seqserve bench --shape-dir` directory")
    p.add_argument("--hf", action="store_true", help="the directory holds an imported model (random sources)")
    p.add_argument("--precision", choices=("fp32", "int8"), default="int8")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=16, help="sources decoded together")
    p.add_argument("--num-beams", type=int, default=4)
    p.add_argument("-n", "--num-inputs", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=32)
    args = p.parse_args(argv)
    for name, value, low in (("--rounds", args.rounds, 1), ("--batch-size", args.batch_size, 1),
                             ("--num-beams", args.num_beams, 1), ("--num-inputs", args.num_inputs, 1),
                             ("--max-new-tokens", args.max_new_tokens, 2)):
        if not low <= value <= 4096:
            p.error(f"{name} must lie in [{low}, 4096], got {value}")
    work = workload(args.directory, args.hf, args.num_inputs, args.max_new_tokens)
    result = rounds(work, args.precision, args.batch_size, args.num_beams, args.rounds)
    for i, r in enumerate(result["rounds"], 1):
        print(f"round {i}: engine {r['engine']} / CTranslate2 {r['ctranslate2']} tokens per CPU s = {r['ratio']}x "
              f"(load {r['load']})")
    print(f"median {result['median_ratio']:.3f}x (range {result['min_ratio']:.3f}-{result['max_ratio']:.3f}), "
          f"identical outputs: {result['identical_outputs']}")
    return result


if __name__ == "__main__":
    main()
