"""Where the engine's time goes: Engine.generate over held-out inputs under cProfile, split by part of the engine.

    python -m seqserve.loadtest.engine_profile BUNDLE [-n 2000] [--batch-size 64] [--max-new-tokens 32] [--threads 1]
        [--min-new-tokens 0] [--num-beams 1] [--variant fp32] [--cpu-time]

Every function's own time is charged to the part its file belongs to; time inside onnxruntime's and numpy's compiled
functions is charged by caller (the decoder step, the encoder, or whoever called numpy). 1 intra-op thread and no
spinning by default, so the split is the engine's, not thread contention's.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from collections import defaultdict

from seqserve.contract.names import KV_CACHES
from seqserve.contract.tokenizer import load_tokenizer
from seqserve.contract.tsv import heldout_pairs
from seqserve.engine.build import offline
from seqserve.engine.request import Request, SamplingParams
from seqserve.engine.runtime.device import RuntimeConfig
from seqserve.engine.runtime.runner import Runner
from seqserve.loadtest.hf_models import random_sources

PARTS = (  # (part, substrings of the file or caller that put a function's time there), first match wins
    ("onnxruntime: decoder step", ("inplace_cache.py:run", "inplace_cache.py:_probe", "kv_cache.py:run")),
    ("onnxruntime: encoder", ("runner.py:run_encoder",)),
    ("KV cache, slots, IO binding", ("inplace_cache.py", "kv_cache.py", "slots.py", "runner.py", "onnxruntime")),
    ("scheduler and finish rules", ("scheduler.py", "finish.py")),
    ("detokenisation", ("detokenizer.py", "tokenizers")),
    ("metrics", ("prometheus_client", "metrics.py")),
    ("beam search: selection and bookkeeping", ("beam.py", "nbest.py")),
    ("token choice and bookkeeping", ("engine.py", "update.py", "greedy.py", "running.py", "sampling.py", "request.py",
                                      "numpy")),
)


def _where(func: tuple[str, int, str]) -> str:
    file, _, name = func
    return f"{file.rsplit('/', 1)[-1]}:{name}" if file != "~" else name


def split(stats: pstats.Stats) -> dict[str, float]:
    """Seconds per part; a compiled function's time goes to its callers' parts, in proportion to the time each
    caller spent in it (cumulative: through the wrapper, a caller's own time says nothing about the graph's)."""
    parts: dict[str, float] = defaultdict(float)
    for func, (_, _, own, _, callers) in stats.stats.items():
        compiled = func[0] == "~"
        if "run_with_iobinding" in func[2] and compiled:  # called through InferenceSession's Python wrapper
            callers = {up: c for wrapper in callers for up, c in stats.stats[wrapper][4].items()}
        if compiled and callers:
            total = sum(c[3] for c in callers.values()) or 1.0
            for caller, c in callers.items():
                parts[_part(_where(caller), func[2])] += own * c[3] / total
        else:
            parts[_part(_where(func), "")] += own
    return dict(parts)


def _part(where: str, compiled: str) -> str:
    """where: the function (or, for compiled code, its caller); compiled: the compiled function's name, if any."""
    inference = "run_with_iobinding" in compiled  # only onnxruntime's own run is inference
    for part, keys in PARTS:
        if part.startswith("onnxruntime") and not inference:
            continue
        if any(k in where for k in keys):
            return part
    return "other (Python, numpy outside the engine)"


def profile_sources(runner: Runner, tokenizer, n: int) -> list[list[int]]:
    """The first n held-out inputs; for a bundle without a held-out split (an imported model), the n random sources
    `seqserve bench --hf` decodes (seed 0)."""
    pairs = heldout_pairs(runner.bundle, n)
    if pairs:
        return [tokenizer.encode(s).ids for s, _ in pairs]
    special = runner.manifest.special_tokens
    return random_sources(n, int(runner.manifest.model["vocab_size"]), {int(i) for i in special.values()},
                          int(special["eos_id"]), seed=0)


def profile(bundle: str, n: int, batch_size: int, max_new: int, threads: int, kv_cache: str, min_new: int = 0,
            num_beams: int = 1, variant: str = "fp32", cpu_time: bool = False) -> dict:
    """batch_size counts requests; a beam request holds num_beams rows (early_stopping as `seqserve bench`).
    cpu_time: cProfile reads this process's CPU clock, so time other processes take from the cores is not charged."""
    rows = batch_size * num_beams
    runner = Runner(bundle, RuntimeConfig(device="cpu", intra_op_threads=threads, allow_spinning=False), variant,
                    capacity=rows, kv_cache=kv_cache)
    tokenizer = load_tokenizer(runner.bundle / runner.manifest.tokenizer["file"])
    sources = profile_sources(runner, tokenizer, n)

    def run() -> list[Request]:
        engine = offline(runner, tokenizer, max_batch_size=rows, max_waiting=len(sources), max_kv_tokens=1 << 30)
        params = SamplingParams(max_new_tokens=max_new, min_new_tokens=min_new, num_beams=num_beams,
                                early_stopping=num_beams > 1)
        return engine.generate([Request(s, params) for s in sources])

    run()  # warm-up: first-run allocations stay out of the profile
    profiler = cProfile.Profile(time.process_time) if cpu_time else cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    done = run()
    profiler.disable()
    wall = time.perf_counter() - start
    stats = pstats.Stats(profiler)
    parts = split(stats)
    total = sum(parts.values())
    return {"wall_s": wall, "tokens": sum(len(r.output_ids) for r in done), "kv_cache": runner.kv_cache,
            "parts": {k: v / total for k, v in sorted(parts.items(), key=lambda kv: -kv[1])},
            "per_step_ms": per_call_ms(stats)}


PER_STEP = (("engine step", "engine.py", "step"), ("decoder call", "runner.py", "step"),
            ("beam advance", "beam.py", "advance"), ("beam reorder", "runner.py", "reorder"))


def per_call_ms(stats: pstats.Stats) -> dict[str, float]:
    """Milliseconds per call (cumulative, under cProfile) of the engine step and the calls inside it that matter."""
    out = {}
    for label, file, name in PER_STEP:
        for (f, _, n), (_, calls, _, cum, _) in stats.stats.items():
            if f.endswith(file) and n == name and calls:
                out[label] = 1e3 * cum / calls
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle")
    p.add_argument("-n", type=int, default=2000, help="held-out inputs")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--kv-cache", default="auto", choices=KV_CACHES)
    p.add_argument("--min-new-tokens", type=int, default=0, help="the end token is suppressed until this many tokens")
    p.add_argument("--num-beams", type=int, default=1, help="beam search of this width (--batch-size counts sources)")
    p.add_argument("--variant", default="fp32", help="the bundle's precision variant")
    p.add_argument("--cpu-time", action="store_true",
                   help="profile on this process's CPU clock (a shared machine's load then only slows the run)")
    args = p.parse_args(argv)
    result = profile(args.bundle, args.n, args.batch_size, args.max_new_tokens, args.threads, args.kv_cache,
                     args.min_new_tokens, args.num_beams, args.variant, args.cpu_time)
    clock = "CPU" if args.cpu_time else "wall"
    print(f"{result['tokens']} tokens in {result['wall_s']:.2f} s under cProfile ({result['kv_cache']} KV cache, "
          f"{clock} clock)")
    for part, share in result["parts"].items():
        print(f"{share:7.1%}  {part}")
    print("per call, ms: " + ", ".join(f"{k} {v:.3f}" for k, v in result["per_step_ms"].items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
