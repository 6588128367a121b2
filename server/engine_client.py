"""The one choice of where a served model's engine runs: in this process (a thread) or in its own (--engine-process).

Both answer the same interface (engine/api.py EngineClient), so the edge drives either the same way.
"""
from __future__ import annotations

from seqserve.engine.api import EngineClient
from seqserve.engine.build import EngineConfig, build
from seqserve.engine.limits import Limits
from seqserve.engine.remote.engine_watch import Silence
from seqserve.engine.remote.remote_engine import RemoteEngine


def start_engine(cfg: EngineConfig, tokenizer=None, in_process: bool = True, cpus: str = "", name: str = "",
                 silence: Silence = Silence(), limits: Limits | None = None) -> EngineClient:
    """A loaded, warmed-up engine, not yet started (the caller calls start(deliver)). tokenizer: the bundle's, if
    loaded (an engine process loads its own); cpus: where an engine process runs (taskset -c syntax); name: the
    model's; silence: the bounds on an engine process that answers nothing; limits: the model's request limits, which
    an engine process checks each request against again (engine/remote/request_bounds.py)."""
    if in_process:
        return build(cfg, tokenizer)
    return RemoteEngine(cfg, cpus=cpus, name=name, silence=silence, limits=limits)
