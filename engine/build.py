"""Building an engine: served (`build`: runner, scheduler, engine, one warm-up, behind the narrow interface) or
offline (`offline`: an Engine over a runner the caller holds, which checks/ and loadtest/ run with Engine.generate).

EngineConfig is everything the engine takes, by value: the edge makes it from its settings, and an engine process
(engine/remote/engine_process.py) receives it whole.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import onnxruntime as ort

from seqserve.contract.integrity import open_bundle
from seqserve.engine.api import EngineInfo
from seqserve.engine.request import Request, SamplingParams
from seqserve.engine.runtime.device import RuntimeConfig
from seqserve.engine.runtime.runner import Runner
from seqserve.engine.step.core import EngineCore
from seqserve.engine.step.engine import Engine
from seqserve.engine.step.scheduler import Scheduler, SchedulerConfig

WARMUP_TEXT = "warm up"


@dataclass(frozen=True)
class EngineConfig:
    bundle: Path
    variant: str = "fp32"
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    kv_cache: str = "auto"
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)  # cross_bytes_per_token: set from the model
    stream_interval: int = 1  # a stream's output carries this many tokens (the last one fewer)


def build(cfg: EngineConfig, tokenizer=None) -> EngineCore:
    """The engine of one bundle, warmed up, not started. tokenizer: the bundle's, if the caller has it loaded."""
    tokenizer = tokenizer or open_bundle(cfg.bundle)[1]
    runner = Runner(cfg.bundle, cfg.runtime, cfg.variant, capacity=cfg.scheduler.max_batch_size, kv_cache=cfg.kv_cache)
    engine = offline(runner, tokenizer, cfg.scheduler, stream_interval=cfg.stream_interval)
    warm_up(engine, tokenizer)
    return EngineCore(engine, info(runner, cfg.scheduler.max_waiting))


def offline(runner: Runner, tokenizer, scheduler: SchedulerConfig | None = None, stream_interval: int = 1,
            **fields) -> Engine:
    """An engine over `runner` that nobody else steps (run it with Engine.generate): the scheduler's settings are
    `scheduler`'s (default: SchedulerConfig's, with max_batch_size the runner's capacity) with `fields` over them,
    and the model's cross_bytes_per_token always (encode-ahead's budget counts in it)."""
    base = scheduler or SchedulerConfig(max_batch_size=runner.slots.capacity)
    cfg = replace(base, **fields, cross_bytes_per_token=runner.cross_bytes_per_token)
    return Engine(runner, tokenizer, Scheduler(cfg), stream_interval=stream_interval)


def warm_up(engine: Engine, tokenizer) -> None:
    """One short generation before serving, so the first client does not pay for onnxruntime's first run (its
    reports go nowhere: warm-up is not traffic)."""
    request = Request(tokenizer.encode(WARMUP_TEXT).ids, SamplingParams(max_new_tokens=2))
    engine.generate([request])
    if request.error is not None:
        raise RuntimeError(f"warm-up generation failed: {request.error}")


def info(runner: Runner, max_waiting: int) -> EngineInfo:
    manifest = runner.manifest
    quality = manifest.variants[runner.variant].get("quality", {})
    model_info = dict(config=dict(manifest.model), bundle_format_version=manifest.format_version,
                      variant=runner.variant, execution_provider=runner.provider,
                      onnxruntime_version=ort.__version__,
                      quality={k: float(v) for k, v in quality.items() if isinstance(v, (int, float))})
    return EngineInfo(max_waiting=max_waiting, forced_eos=manifest.generation.get("forced_eos_token_id") is not None,
                      languages=manifest.languages or None, model_info=model_info, provider=runner.provider,
                      variant=runner.variant)
