"""Loading one model for the server: its bundle checked, its memory within the budget, its onnxruntime sessions,
tokenizer, scheduler and engine built, and one warm-up generation before it takes calls."""
from __future__ import annotations

from dataclasses import dataclass

import onnxruntime as ort

from seqserve.contract.integrity import check_graphs, open_bundle
from seqserve.engine.device import RuntimeConfig
from seqserve.engine.engine import Engine
from seqserve.engine.request import Request, SamplingParams
from seqserve.engine.runner import Runner
from seqserve.engine.scheduler import Scheduler, SchedulerConfig
from seqserve.server.metrics import Metrics
from seqserve.server.model_defaults import default_max_new_tokens, info_entries
from seqserve.server.repository import Source, memory_bytes
from seqserve.server.settings import Settings, SettingsError, env_name

WARMUP_TEXT = "warm up"


class ModelError(SettingsError):
    """A model that cannot be loaded (over the memory budget, a broken bundle): at start the server exits with it;
    on a reload that model alone is not loaded."""


@dataclass
class Loaded:
    """A model the app loaded: where from, its runner and engine, what it may take in memory."""

    source: Source
    runner: Runner
    engine: Engine
    tokenizer: object
    limits: object
    memory_bytes: int


def load_model(s: Settings, metrics: Metrics, source: Source, threads: int, used: int) -> Loaded:
    """Runs in a worker thread: the memory budget, onnxruntime sessions, tokenizer, engine, one warm-up.
    used: the bytes the models already loaded may take; threads: this model's intra-op threads."""
    bundle = source.path
    manifest, tokenizer = open_bundle(bundle)
    if s.variant in manifest.variants:  # probed on CPU too: an out-of-range gather may pass silently on a GPU
        check_graphs(bundle, manifest, s.variant)
    limits = s.limits(int(manifest.model["max_positions"]), int(manifest.max_new_tokens),
                      default_max_new_tokens(manifest.generation))
    memory = memory_bytes(bundle, manifest, s) if s.variant in manifest.variants else 0
    if s.memory_budget_bytes and used + memory > s.memory_budget_bytes:
        raise ModelError(f"model {source.name!r} refused: it may take {memory} bytes and the models already "
                         f"loaded {used}, beyond --memory-budget-bytes / {env_name('memory_budget_bytes')} "
                         f"{s.memory_budget_bytes}")
    runtime = RuntimeConfig(device=s.device, intra_op_threads=threads,
                            inter_op_threads=s.inter_op_threads, allow_spinning=s.allow_spinning,
                            cuda_tf32=s.cuda_tf32, cuda_graphs=s.cuda_graphs)
    runner = Runner(bundle, runtime, s.variant, capacity=s.max_batch_size, kv_cache=s.kv_cache)
    scheduler = Scheduler(SchedulerConfig.from_settings(s, runner.cross_bytes_per_token))
    engine = Engine(runner, tokenizer, scheduler, metrics.for_model(source.name),
                    stream_interval=s.stream_interval)
    warm_up(engine, tokenizer)
    engine.start()
    return Loaded(source, runner, engine, tokenizer, limits, memory)


def warm_up(engine: Engine, tokenizer) -> None:
    """One short generation before SERVING, so the first client does not pay for onnxruntime's first run."""
    request = Request(tokenizer.encode(WARMUP_TEXT).ids, SamplingParams(max_new_tokens=2))
    exported, engine.metrics = engine.metrics, Metrics().for_model("")  # warm-up is not traffic: off /metrics
    try:
        engine.generate([request])
    finally:
        engine.metrics = exported
    if request.error is not None:
        raise RuntimeError(f"warm-up generation failed: {request.error}")


def model_info(runner: Runner) -> dict:
    """GetModelInfo's facts of a loaded model (service.py types them)."""
    manifest = runner.manifest
    quality = manifest.variants[runner.variant].get("quality", {})
    return dict(config=dict(manifest.model) | info_entries(manifest.generation),
                bundle_format_version=manifest.format_version, variant=runner.variant,
                execution_provider=runner.provider, onnxruntime_version=ort.__version__,
                quality={k: float(v) for k, v in quality.items() if isinstance(v, (int, float))})
