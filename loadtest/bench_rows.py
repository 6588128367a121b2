"""One benchmark row = one backend, precision and batch size, run alone in a fresh process.

run_row() is the child's whole life: load the model, warm up on one batch, decode every input once (timed), report
its outputs and the process's peak RSS. Each backend's libraries are imported inside its loader, so an engine row's
process never loads torch and its memory is its own.
"""
from __future__ import annotations

import resource
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

PYTORCH_NO_CACHE, PYTORCH_KV_CACHE = "pytorch-no-cache", "pytorch-kv-cache"
ENGINE, CTRANSLATE2 = "seqserve-engine", "ctranslate2"
WARMUP_TOKENS = 2

Generate = Callable[[list[list[int]], int], list[list[int]]]  # (sources, max_new_tokens) -> ids per source


@dataclass(frozen=True)
class Workload:
    """What every row decodes, and with what; identical for all rows of one run."""

    sources: list[list[int]]  # encoder inputs (tokenizer ids ending with </s>), in held-out order
    max_new_tokens: int
    threads: int
    device: str  # engine and CTranslate2: cpu | cuda | auto
    checkpoint: Path
    bundle: Path
    ctranslate2_dir: Path | None = None


@dataclass(frozen=True)
class RowSpec:
    backend: str
    precision: str  # fp32 | int8
    batch_size: int

    @property
    def name(self) -> str:
        return f"{self.backend} {self.precision} b{self.batch_size}"


@dataclass(frozen=True)
class RowRun:
    outputs: list[list[int]]  # generated ids per input, end token excluded
    wall_s: float  # decoding every input once, after model load and warm-up
    peak_rss_mb: float  # peak RSS of this row's own process (model, libraries and interpreter included)
    device: str  # where it actually ran, e.g. CPUExecutionProvider


def run_row(spec: RowSpec, work: Workload) -> RowRun:
    """Runs in a fresh (spawned) process; see the module docstring."""
    generate, device = LOADERS[spec.backend](spec, work)
    generate(work.sources[: spec.batch_size], WARMUP_TOKENS)  # first-run allocations and lazy init stay untimed
    start = time.perf_counter()
    outputs = generate(work.sources, work.max_new_tokens)
    wall = time.perf_counter() - start
    return RowRun(outputs, wall, peak_rss_mb(), device)


def peak_rss_mb() -> float:
    """This process's peak RSS. Linux: VmHWM, which exec resets; ru_maxrss is not used there because a spawned
    child inherits its parent's peak across fork + exec (every row would report the parent's figure)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024  # macOS: bytes; elsewhere kB


def _pytorch(spec: RowSpec, work: Workload) -> tuple[Generate, str]:
    import torch

    from seqserve.model.checkpoint import load_checkpoint
    from seqserve.model.decoding import greedy_decode

    torch.set_num_threads(work.threads)
    device = "cuda" if work.device != "cpu" and torch.cuda.is_available() else "cpu"
    model, _ = load_checkpoint(work.checkpoint)
    model = model.to(device)
    use_cache = spec.backend == PYTORCH_KV_CACHE

    def generate(sources: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        step = spec.batch_size  # static batches in input order, each decoded until all its rows end
        return [ids for i in range(0, len(sources), step)
                for ids in greedy_decode(model, sources[i : i + step], max_new_tokens, use_cache)]

    return generate, f"torch-{device}"


def _engine(spec: RowSpec, work: Workload) -> tuple[Generate, str]:
    from seqserve.contract.manifest import load_manifest
    from seqserve.contract.tokenizer import load_tokenizer
    from seqserve.server.device import RuntimeConfig
    from seqserve.server.engine import Engine
    from seqserve.server.metrics import Metrics
    from seqserve.server.request import Request, SamplingParams
    from seqserve.server.runner import Runner
    from seqserve.server.scheduler import Scheduler, SchedulerConfig

    runner = Runner(work.bundle, RuntimeConfig(device=work.device, intra_op_threads=work.threads), spec.precision,
                    capacity=spec.batch_size)
    tokenizer = load_tokenizer(work.bundle / load_manifest(work.bundle).tokenizer["file"])

    def generate(sources: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        # The server's continuous batching; the KV budget is raised so only max_batch_size limits admission.
        need = spec.batch_size * max(len(s) + max_new_tokens for s in sources)
        scheduler = Scheduler(SchedulerConfig(max_batch_size=spec.batch_size, max_waiting=len(sources),
                                              max_kv_tokens=max(SchedulerConfig.max_kv_tokens, need),
                                              cross_bytes_per_token=runner.cross_bytes_per_token))
        engine = Engine(runner, tokenizer, scheduler, Metrics())
        requests = engine.generate([Request(list(s), SamplingParams(max_new_tokens=max_new_tokens)) for s in sources])
        failed = [r.error for r in requests if r.error]
        if failed:
            raise RuntimeError(f"{len(failed)} engine requests failed: {failed[0]}")
        return [r.output_ids for r in requests]

    return generate, runner.provider


def _ctranslate2(spec: RowSpec, work: Workload) -> tuple[Generate, str]:
    import ctranslate2

    from seqserve.contract.tokenizer import load_tokenizer
    from seqserve.export.ctranslate2_greedy import greedy, load_translator

    device = work.device if work.device != "auto" else ("cuda" if ctranslate2.get_cuda_device_count() else "cpu")
    translator = load_translator(work.ctranslate2_dir, spec.precision, device, work.threads)
    tokenizer = load_tokenizer(work.checkpoint / "tokenizer.json")

    def generate(sources: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        return greedy(translator, tokenizer, sources, max_new_tokens, spec.batch_size)

    return generate, f"ctranslate2-{device}"


LOADERS: dict[str, Callable[[RowSpec, Workload], tuple[Generate, str]]] = {
    PYTORCH_NO_CACHE: _pytorch, PYTORCH_KV_CACHE: _pytorch, ENGINE: _engine, CTRANSLATE2: _ctranslate2}
