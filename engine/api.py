"""The engine's narrow interface: what an edge sends it (EngineRequest), what comes back (StepReport), and the calls.

Everything here is plain data by value, so the same interface serves an engine in the edge's own process (a thread:
engine/step/core.py) and one in its own process (msgpack over ZeroMQ: engine/remote/wire.py). An edge never reaches past
it
into the scheduler, the runner or a Request.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from seqserve.engine.request import Output as Output  # one request's news from one step (engine/request.py)
from seqserve.engine.request import SamplingParams

# The message an ERROR result carries; an edge's own failures answer with the same words.
from seqserve.engine.step.finish import ERROR_MESSAGE as ERROR_MESSAGE


class QueueFull(Exception):
    """The waiting queue cannot take the request (or the whole batch of them): the edge answers RESOURCE_EXHAUSTED."""


@dataclass(frozen=True)
class EngineRequest:
    """One generation the edge asks for; its id is the edge's, unique among the requests an engine holds."""

    id: int
    input_ids: tuple[int, ...]  # source ids as the encoder sees them (ending with the end token)
    params: SamplingParams
    stream: bool = False  # True: outputs carry the new ids and text as they come; False: only the final one
    deadline: float | None = None  # time.monotonic(): CLOCK_MONOTONIC is one clock for every process of a machine
    forced_bos: int | None = None  # this row's forced first token (a target language's), over the model's own
    arrival: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class StepStats:
    """What one step measured, as plain numbers: the edge turns them into its metrics (server/engine_metrics.py)."""

    input_tokens: int = 0  # source tokens encoded
    generated_tokens: int = 0  # returned tokens (an end token is not returned, so not counted)
    encoder_seconds: tuple[float, ...] = ()  # each encoder call
    decoder_seconds: tuple[float, ...] = ()  # each decoder step of the whole batch
    batch_rows: tuple[int, ...] = ()  # rows in each decoder step
    queue_seconds: tuple[float, ...] = ()  # arrival to joining the batch, per request that produced its first token
    first_token_seconds: tuple[float, ...] = ()  # arrival to its first token, the same requests
    inter_token_seconds: tuple[float, ...] = ()  # between two steps of a running batch (rows share it)
    finished: tuple[str, ...] = ()  # a FinishReason value per request that ended, each counted once
    running: int = 0  # rows in the running batch after the step
    waiting: int = 0  # requests queued after the step
    kv_cache_bytes: int = 0


@dataclass(frozen=True)
class StepReport:
    """Everything one step hands back, by value: the one way back from an engine."""

    outputs: tuple[Output, ...] = ()
    stats: StepStats = StepStats()


@dataclass(frozen=True)
class EngineInfo:
    """What an edge knows of a loaded engine, fixed for its life."""

    max_waiting: int  # requests the waiting queue holds
    forced_eos: bool  # the model forces its end token as the last one (options refuse what contradicts it)
    languages: dict | None  # a multilingual model's (the manifest's), else None
    model_info: dict  # GetModelInfo's facts: config, bundle_format_version, variant, provider, ...
    provider: str = ""  # the onnxruntime execution provider in use
    variant: str = ""


Deliver = Callable[[StepReport], None]


class EngineClient(Protocol):
    """An engine as an edge drives it. deliver gets every StepReport, in order; it may be called from another thread
    (hand it on with loop.call_soon_threadsafe)."""

    info: EngineInfo

    def start(self, deliver: Deliver) -> None: ...

    def add(self, requests: Sequence[EngineRequest]) -> None:
        """Queues every request or none: raises QueueFull, or (an engine in another process, which is not asked and
        waited for) refuses them all a moment later, each with an Output whose `refused` says why."""

    def abort(self, request_id: int, deadline: bool = False) -> None:
        """Ends a request at the engine's next step: DEADLINE when its call ran out of time, else CANCELLED. An id the
        engine no longer holds is ignored."""

    def stop(self, timeout: float = 10.0) -> bool:
        """Ends the engine; what it still holds ends CANCELLED, each with its output. True once that is done."""
