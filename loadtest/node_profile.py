"""Which onnxruntime kernels the decoder step spends its time in while the engine decodes: per-node time by operator.

    python -m seqserve.loadtest.node_profile BUNDLE [--variant int8] [-n 64] [--batch-size 64] [--max-new-tokens 32]
        [--min-new-tokens 32] [--num-beams 1] [--threads 1]

The runner's decoder session is replaced, before the first step, by one with onnxruntime's profiling on; the engine
then decodes the first n held-out inputs (batch-size requests at a time, each num_beams rows) and the profile's node
events are summed by operator type, and each node's median per step summed by operator type.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from collections import defaultdict
from pathlib import Path

import onnxruntime as ort

from seqserve.contract.tokenizer import load_tokenizer
from seqserve.engine.build import offline
from seqserve.engine.request import Request, SamplingParams
from seqserve.engine.runtime.device import RuntimeConfig
from seqserve.engine.runtime.runner import Runner
from seqserve.loadtest.engine_profile import profile_sources


def profile(bundle: str, variant: str, n: int, batch_size: int, max_new: int, min_new: int, num_beams: int,
            threads: int) -> tuple[dict[str, float], dict[str, tuple[float, int]]]:
    """Milliseconds of decoder node time per operator type, largest first; and per_step's medians."""
    rows = batch_size * num_beams
    runner = Runner(bundle, RuntimeConfig(device="cpu", intra_op_threads=threads, allow_spinning=False), variant,
                    capacity=rows, kv_cache="auto")
    with tempfile.TemporaryDirectory(prefix="seqserve-node-profile-") as tmp:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.enable_profiling, opts.profile_file_prefix = True, str(Path(tmp) / "decoder")
        graph = runner.manifest.variants[variant][runner.cache.graph]["file"]
        runner.decoder = ort.InferenceSession(str(runner.bundle / graph), opts, providers=["CPUExecutionProvider"])
        tokenizer = load_tokenizer(runner.bundle / runner.manifest.tokenizer["file"])
        sources = profile_sources(runner, tokenizer, n)
        params = SamplingParams(max_new_tokens=max_new, min_new_tokens=min_new, num_beams=num_beams,
                                early_stopping=num_beams > 1)
        engine = offline(runner, tokenizer, max_batch_size=rows, max_waiting=len(sources), max_kv_tokens=1 << 30)
        engine.generate([Request(s, params) for s in sources])
        events = json.loads(Path(runner.decoder.end_profiling()).read_text())
    per_op: dict[str, float] = defaultdict(float)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            per_op[e["args"].get("op_name", "?")] += e["dur"] / 1e3  # microseconds
    return dict(sorted(per_op.items(), key=lambda kv: -kv[1])), per_step(events)


def per_step(events: list[dict]) -> dict[str, tuple[float, int]]:
    """Per decoder step, by operator type: (sum over its nodes of each node's median microseconds, nodes). A median
    per node, so a node the machine's load preempted once does not count."""
    durations: dict[tuple[str, str], list[float]] = defaultdict(list)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            durations[e["args"].get("op_name", "?"), e["name"]].append(e["dur"])
    out: dict[str, tuple[float, int]] = {}
    for (op, _), d in durations.items():
        us, nodes = out.get(op, (0.0, 0))
        out[op] = (us + statistics.median(d), nodes + 1)
    return dict(sorted(out.items(), key=lambda kv: -kv[1][0]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle")
    p.add_argument("--variant", default="fp32")
    p.add_argument("-n", type=int, default=64, help="held-out inputs")
    p.add_argument("--batch-size", type=int, default=64, help="requests decoded together")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--min-new-tokens", type=int, default=32, help="forced length by default (random-weight shapes)")
    p.add_argument("--num-beams", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    per_op, step = profile(args.bundle, args.variant, args.n, args.batch_size, args.max_new_tokens,
                           args.min_new_tokens, args.num_beams, args.threads)
    total = sum(per_op.values())
    print(f"decoder node time {total:,.1f} ms ({args.variant})")
    for op, ms in per_op.items():
        print(f"{ms / total:7.1%}  {op}")
    step_us = sum(us for us, _ in step.values())
    print(f"per step, median per node: {step_us / 1e3:.2f} ms")
    for op, (us, nodes) in step.items():
        print(f"{us / step_us:7.1%}  {op}: {us / nodes:,.1f} us x {nodes} = {us / 1e3:.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
