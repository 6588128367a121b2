"""Loading one model for the server: its bundle checked, its memory within the budget, and its engine built and
warmed up (engine/build.py) before it takes calls. The edge reads the manifest itself; the engine it gets back is an
EngineClient (engine/api.py), the only way it ever talks to it."""
from __future__ import annotations

from dataclasses import dataclass

from seqserve.contract.integrity import check_graphs, open_bundle
from seqserve.contract.manifest import Manifest
from seqserve.contract.quality import below_bar
from seqserve.engine.api import EngineClient
from seqserve.engine.build import EngineConfig
from seqserve.engine.limits import Limits
from seqserve.engine.remote.engine_watch import Silence
from seqserve.engine.runtime.device import RuntimeConfig
from seqserve.engine.step.scheduler import SchedulerConfig
from seqserve.server.engine_client import start_engine
from seqserve.server.front_ends import Role, attach_engine
from seqserve.server.model_defaults import info_entries, model_limits, task_entries
from seqserve.server.outbox import Outbox
from seqserve.server.repository import Source, memory_bytes
from seqserve.server.settings import Settings, SettingsError, env_name


class ModelError(SettingsError):
    """A model that cannot be loaded (over the memory budget, a broken bundle): at start the server exits with it;
    on a reload that model alone is not loaded."""


@dataclass
class Loaded:
    """A model the app loaded: where from, its engine, the manifest and tokenizer the edge read, its limits and
    what it may take in memory; outbox: where its engine's reports go, once the app started it."""

    source: Source
    engine: EngineClient
    manifest: Manifest
    tokenizer: object
    limits: Limits
    memory_bytes: int
    outbox: Outbox | None = None


def load_model(s: Settings, source: Source, threads: int, used: int, role: Role | None = None) -> Loaded:
    """Runs in a worker thread: the memory budget, then the engine built and warmed up (not started).
    used: the bytes the models already loaded may take; threads: this model's intra-op threads; role: an attached
    front end's (server/front_ends.py), which connects to the engine process the first front end started."""
    bundle = source.path
    manifest, tokenizer = open_bundle(bundle)
    if s.variant in manifest.variants:  # probed on CPU too: an out-of-range gather may pass silently on a GPU
        check_graphs(bundle, manifest, s.variant)
        why = below_bar(manifest.variants[s.variant].get("quality", {}))
        if why:  # measured by `seqserve export`: serving it would answer with other tokens, or infinities
            raise ModelError(f"model {source.name!r} refused: variant {s.variant} {why} ({bundle}/manifest.json); "
                             "serve another variant")
    limits = model_limits(s, manifest)
    memory = memory_bytes(bundle, manifest, s) if s.variant in manifest.variants else 0
    if s.memory_budget_bytes and used + memory > s.memory_budget_bytes:
        raise ModelError(f"model {source.name!r} refused: it may take {memory} bytes and the models already "
                         f"loaded {used}, beyond --memory-budget-bytes / {env_name('memory_budget_bytes')} "
                         f"{s.memory_budget_bytes}")
    runtime = RuntimeConfig(device=s.device, intra_op_threads=threads,
                            inter_op_threads=s.inter_op_threads, allow_spinning=s.allow_spinning,
                            cuda_tf32=s.cuda_tf32, cuda_graphs=s.cuda_graphs)
    cfg = EngineConfig(bundle, variant=s.variant, runtime=runtime, kv_cache=s.kv_cache,
                       scheduler=SchedulerConfig.from_settings(s, 0), stream_interval=s.stream_interval)
    silence = Silence(s.engine_not_ready_seconds, s.engine_restart_seconds)
    if role is not None:
        engine = attach_engine(cfg, role, source.name, source.digest, silence)
    else:
        engine = start_engine(cfg, tokenizer, in_process=not s.engine_process, cpus=s.engine_cpus, name=source.name,
                              silence=silence, limits=limits)
    return Loaded(source, engine, manifest, tokenizer, limits, memory)


def model_info(engine: EngineClient, manifest: Manifest) -> dict:
    """GetModelInfo's facts of a loaded model (service.py types them): the engine's, and the model's generation
    defaults and task prefixes as config entries."""
    info = dict(engine.info.model_info)
    info["config"] = dict(info["config"]) | info_entries(manifest.generation) | task_entries(manifest.training)
    return info
