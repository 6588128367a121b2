"""`seqserve serve`: builds each model's engine and the service, serves gRPC (with health and reflection) and /metrics.

Lifecycle: bind with health NOT_SERVING -> load each model and warm it up (off the event loop) -> SERVING.
Several models (server/repository.py): each has its own engine and batch and its own health service name
(`seqserve.v1.Generation/<name>`). SIGHUP re-reads the models (Triton's explicit model control): a new or changed
bundle is loaded and warmed up before it takes calls; a removed or replaced version drains, its calls finish.
SIGTERM/SIGINT: NOT_SERVING -> new calls UNAVAILABLE -> in-flight calls finish within the grace period -> calls
still in flight get UNAVAILABLE -> new calls are held until their arrival pauses for arrivals.QUIET_SECONDS (at most
drain_backlog_seconds) -> server.stop begins and the held calls get UNAVAILABLE (clients retry UNAVAILABLE, not the
CANCELLED gRPC core gives a call it holds when it stops) -> engine.stop -> exit 0.
Security (docs/security.md): TLS / mutual TLS, bearer tokens, the bind addresses, reflection on or off.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc

from seqserve.server import sched
from seqserve.server.arrivals import hold_arrivals
from seqserve.server.auth import TokenAuth
from seqserve.server.edge import Edge
from seqserve.server.engine_metrics import EngineMetrics
from seqserve.server.front_ends import FrontEnds, Role
from seqserve.server.handlers import add_refusing
from seqserve.server.health import Health
from seqserve.server.loading import Loaded, load_model, model_info
from seqserve.server.metrics import Metrics
from seqserve.server.metrics_http import MetricsEndpoint
from seqserve.server.model_defaults import request_defaults
from seqserve.server.outbox import Outbox
from seqserve.server.port_claim import PortInUse, claim_port
from seqserve.server.repository import Source, read_models, scan, split_threads
from seqserve.server.served_model import ServedModel
from seqserve.server.service import SERVICE_NAME, GenerationService
from seqserve.server.settings import Settings, SettingsError, env_name
from seqserve.server.tls import server_credentials

log = logging.getLogger("seqserve")
ABORT_SECONDS = 5.0  # after the grace period: how long calls get to send their UNAVAILABLE before server.stop
FLUSH_SECONDS = 1.0  # server.stop's own grace: lets the last statuses and responses reach their clients
FRONTS_MARGIN_SECONDS = 10.0  # beyond the other front ends' own drain: their start-up, their exit
LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")
SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


def health_name(model: str) -> str:
    """A model's service name in the health service, beside the whole server's "" and SERVICE_NAME."""
    return f"{SERVICE_NAME}/{model}"


class App:
    def __init__(self, settings: Settings, metrics: Metrics | None = None, role: Role | None = None) -> None:
        """role: an attached front end's (server/front_ends.py); None for the server the user starts."""
        self.settings, self.role = settings, role
        self.fronts: FrontEnds | None = None  # --front-ends N: the others, started by this one
        self._claim = None  # --front-ends N: this server's claim on its port (server/port_claim.py)
        self._fronts_stopping: asyncio.Future | None = None
        self.metrics = metrics or Metrics()
        self.service = GenerationService(self.metrics, settings.max_inflight_bytes)
        self.health = Health(settings.max_health_watches, self.metrics)
        self.server: grpc.aio.Server | None = None
        self.models: dict[str, Loaded] = {}  # the versions taking calls, by name
        self.draining_models: set[asyncio.Task] = set()  # replaced or removed versions finishing their calls
        self._retiring: list[Loaded] = []  # their engines (stopped by close if it comes first)
        self.port = self.metrics_port = None
        self._http = None
        self._reload_lock = asyncio.Lock()
        self._started = asyncio.Event()  # a SIGHUP before the first models are loaded waits for them

    async def start(self) -> None:
        """Listens at once (health NOT_SERVING), then loads and warms up each model in a thread, then SERVING. An
        attached front end listens only once its models are attached: the port it shares sends it connections as
        soon as it listens."""
        if self.role is None:
            await self._listen()
        try:
            await self._serve_metrics()
            sources = scan(self.settings)
            if not sources:
                raise SettingsError(f"no model to serve: {self.settings.model_repository} holds no verified bundle "
                                    f"(--model-repository / {env_name('model_repository')})")
            for source in sources.values():
                await self._load_model(source, len(sources))
            if self.role is not None:
                await self._listen()
            await self._set_health(SERVING)
            self._started.set()
            if self.role is None and self.settings.front_ends > 1:
                self.fronts = FrontEnds(self.settings.front_ends, self.models, self.port)
                self.fronts.start()
            info = next(iter(self.models.values())).engine.info  # every model runs on the same settings
            log.info("serving %s on %s:%d (%s, %s); %s", ", ".join(self.models), self.settings.bind, self.port,
                     info.provider, info.variant, "metrics disabled" if self.metrics_port is None else
                     f"metrics on {self.settings.metrics_bind}:{self.metrics_port}/metrics")
        except BaseException:
            await self.close(grace=0)
            raise

    async def _load_model(self, source: Source, n_models: int) -> None:
        """Loads and warms up one model off the event loop, then it takes calls (its earlier version drains)."""
        earlier = self.models.get(source.name)
        if earlier is None:  # a changed model's earlier version serves (SERVING) until the new one takes over
            await self.health.set(health_name(source.name), NOT_SERVING)
        used = sum(m.memory_bytes for n, m in self.models.items() if n != source.name)  # a new version replaces
        loaded = await asyncio.to_thread(sched.with_default_policy, self._load, source,  # the engine's threads
                                         split_threads(self.settings.intra_op_threads, n_models), used)
        loaded.outbox = Outbox(asyncio.get_running_loop(), EngineMetrics(self.metrics.for_model(source.name)))
        try:
            await asyncio.to_thread(sched.with_default_policy, loaded.engine.start, loaded.outbox.deliver)
        except BaseException:
            await asyncio.to_thread(loaded.engine.stop)
            raise
        self.models[source.name] = loaded
        self._follow_engine(source.name, loaded)
        if self.role is None and self.settings.front_ends > 1:  # a restarted engine process: tell the others
            loop = asyncio.get_running_loop()
            loaded.engine.on_up = lambda address: loop.call_soon_threadsafe(self._engines_moved)
        self._report_gauges(source.name)
        defaults = request_defaults(loaded.manifest.generation, loaded.limits.default_max_new_tokens,
                                    loaded.limits.max_num_beams)  # the model's generation defaults
        replaced = self.service.open(loaded.engine, loaded.outbox, loaded.tokenizer, loaded.limits,
                                     model_info(loaded.engine, loaded.manifest), defaults, name=source.name,
                                     memory_bytes=loaded.memory_bytes)
        await self.health.set(health_name(source.name), SERVING)
        if replaced is not None:
            log.info("model %s: its new version takes calls; the earlier one drains %d in flight", source.name,
                     len(replaced.calls))
            self._drain_later(replaced, earlier, gone=False)

    def _follow_engine(self, name: str, loaded: Loaded) -> None:
        """An engine process's silence and restarts reach its model's health, model_ready and restart counter."""
        if not hasattr(loaded.engine, "on_state"):  # an engine in this process: it has no process to lose
            return
        loop = asyncio.get_running_loop()

        def heard(ready: bool, cause: str | None) -> None:  # on the engine's socket thread
            with contextlib.suppress(RuntimeError):  # the loop has closed: the server has stopped
                loop.call_soon_threadsafe(self._engine_state, name, loaded, ready, cause)
        loaded.engine.on_state = heard

    def _engine_state(self, name: str, loaded: Loaded, ready: bool, cause: str | None) -> None:
        """On the event loop: the model's health name and model_ready follow its engine; a restart is counted."""
        if self.models.get(name) is not loaded:  # a replaced or removed version: the name is not its own now
            return
        metrics = self.metrics.for_model(name)
        if cause is not None:
            metrics.engine_restarts.labels(cause).inc()
        metrics.model_state.set(int(ready))
        asyncio.ensure_future(self.health.set(health_name(name), SERVING if ready else NOT_SERVING))

    def _engines_moved(self) -> None:
        if self.fronts is not None:
            self.fronts.write()

    def _report_gauges(self, name: str) -> None:
        """A model's running, waiting and KV-cache gauges add up its versions (a replaced one still draining
        included), each engine's values as its latest report left them, so two versions never overwrite each other."""
        def total(i: int):
            def read() -> float:  # at scrape time: the versions serving or draining then
                versions = [m for m in (self.models.get(name), *self._retiring) if m and m.source.name == name]
                return sum(m.outbox.metrics.gauge(i) for m in versions if m.outbox is not None)
            return read

        for i, gauge in enumerate((self.metrics.running, self.metrics.waiting, self.metrics.kv_cache_bytes)):
            gauge.labels(name).set_function(total(i))

    def _drain_later(self, served: ServedModel, loaded: Loaded | None, gone: bool) -> None:
        if loaded is not None:
            self._retiring.append(loaded)
        task = asyncio.ensure_future(self._drain_model(served, loaded, gone))
        self.draining_models.add(task)
        task.add_done_callback(self.draining_models.discard)

    async def _drain_model(self, served: ServedModel, loaded: Loaded | None, gone: bool) -> None:
        """A version that takes no new call finishes its calls (UNAVAILABLE after --grace-seconds), then stops."""
        grace = self.settings.grace_seconds
        if not await served.wait_idle(grace):
            log.warning("model %s: %d calls still in flight after %.1fs get UNAVAILABLE", served.name,
                        served.abort(), grace)
            await served.wait_idle(ABORT_SECONDS)
        if loaded is not None:
            await asyncio.to_thread(loaded.engine.stop)
            self._retiring.remove(loaded)
        if served.name not in self.models and not self._draining(served.name):  # its last version's last call
            self.metrics.forget(served.name)  # was counted: every series of that name leaves /metrics
            await self.health.forget(health_name(served.name))
        log.info("model %s: %s version drained and stopped", served.name, "removed" if gone else "replaced")

    def _draining(self, name: str) -> bool:
        """Whether a version of this model is still finishing its calls."""
        return any(m.source.name == name for m in self._retiring)

    async def reload(self) -> None:
        """SIGHUP: re-reads the models; loads new and changed ones (each warmed up before it takes calls), drains
        removed ones (their directory gone). A model that fails to load, or whose directory holds no verified bundle
        at the moment, is logged and its loaded version, if any, keeps serving; the others keep serving."""
        await self._started.wait()
        async with self._reload_lock:
            try:
                found = read_models(self.settings)
            except (OSError, SettingsError) as exc:
                log.error("reload: cannot read the models: %s", exc)
                return
            sources = found.sources
            for name in [n for n in self.models if n in found.unverified]:
                log.warning("reload: model %s: its directory holds no verified bundle now (being rewritten?): its "
                            "loaded version keeps serving until a verified one appears", name)
            for name in [n for n in self.models if n not in sources and n not in found.unverified]:
                await self.health.set(health_name(name), NOT_SERVING)
                served = self.service.remove(name)
                log.info("reload: model %s removed: it drains %d calls in flight", name, len(served.calls))
                self._drain_later(served, self.models.pop(name), gone=True)
            for source in sources.values():
                current = self.models.get(source.name)
                if current is not None and current.source.digest == source.digest:
                    continue
                log.info("reload: model %s %s: loading it", source.name, "changed" if current else "added")
                try:
                    await self._load_model(source, len(sources))
                except Exception as exc:
                    log.error("reload: model %s not loaded: %s", source.name, exc)
                    if current is None:  # the earlier version, if any, keeps serving
                        await self.health.forget(health_name(source.name))
                        if not self._draining(source.name):  # the series its engine made before it failed
                            self.metrics.forget(source.name)
            log.info("reload done: serving %s", ", ".join(sorted(self.models)) or "no model")
            if self.fronts is not None:
                self.fronts.reloaded()

    async def _listen(self) -> None:
        s = self.settings
        tokens = s.tokens()
        interceptors = [TokenAuth(tokens, self.metrics, SERVICE_NAME, s.auth_exempt_health)] if tokens else []
        interceptors.append(Edge(self.metrics, SERVICE_NAME))  # innermost: a call auth refused is counted once
        # so_reuseport off: a second server on a taken port must fail, not silently share it (on with --front-ends N:
        # its front ends share it, server/front_ends.py, and server/port_claim.py keeps others out). gRPC core keeps
        # calls the event loop has not taken yet; past its soft limit (default 1,000) it drops some at random and past
        # its hard limit (3,000) all, CANCELLED and unseen by the service: one limit for both, max_pending_calls.
        self.server = grpc.aio.server(interceptors=interceptors, options=[
            ("grpc.so_reuseport", int(s.front_ends > 1)),
            ("grpc.max_receive_message_length", s.max_receive_message_bytes),
            ("grpc.server.max_pending_requests", s.max_pending_calls),
            ("grpc.server.max_pending_requests_hard_limit", s.max_pending_calls)])
        self.service.add_to(self.server)
        # health and reflection are grpcio's servicers, registered with decoders that never raise (handlers.py)
        add_refusing(health_pb2_grpc.add_HealthServicer_to_server, self.health, self.server)
        if s.reflection:
            names = (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME)
            add_refusing(reflection_pb2_grpc.add_ServerReflectionServicer_to_server,
                         reflection.aio.ReflectionServicer(names), self.server)
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        address = f"{s.bind}:{s.port}"
        try:
            if s.front_ends > 1 and self.role is None and s.port:  # its own front ends join it; nobody else may
                self._claim = claim_port(s.bind, s.port)
            if s.tls_cert_file is None:
                self.port = self.server.add_insecure_port(address)
            else:
                self.port = self.server.add_secure_port(address, server_credentials(
                    s.tls_cert_file, s.tls_key_file, s.tls_client_ca_file))
        except (RuntimeError, PortInUse) as exc:
            raise SettingsError(f"cannot listen on {address} (--bind / {env_name('bind')}, --port / "
                                f"{env_name('port')}): {exc}") from exc
        await self.server.start()
        if tokens and s.tls_cert_file is None and s.bind not in LOOPBACK:
            log.warning("bearer tokens travel in plaintext: %s is reachable from other machines without TLS "
                        "(--tls-cert-file)", address)

    async def _serve_metrics(self) -> None:
        if self.settings.metrics_port < 0:
            return
        self._http = MetricsEndpoint(self.metrics.registry)
        try:
            await self._http.start(self.settings.metrics_bind, self.settings.metrics_port)
        except OSError as exc:
            self._http = None
            raise SettingsError(f"cannot serve metrics on {self.settings.metrics_bind}:{self.settings.metrics_port} "
                                f"(--metrics-bind / {env_name('metrics_bind')}, --metrics-port / "
                                f"{env_name('metrics_port')}): {exc}") from exc
        self.metrics_port = self._http.port

    def _load(self, source: Source, threads: int, used: int) -> Loaded:
        """Runs in a worker thread (server/loading.py): the memory budget, sessions, tokenizer, engine, warm-up."""
        return load_model(self.settings, source, threads, used, self.role)

    async def _set_health(self, status) -> None:
        for service in ("", SERVICE_NAME):  # "" is the whole server, as load balancers ask
            await self.health.set(service, status)

    async def drain(self) -> bool:
        """Graceful stop; True when every in-flight call finished within the grace period."""
        grace = self.settings.grace_seconds
        log.info("draining: health NOT_SERVING, refusing new calls, waiting up to %.1fs for in-flight ones", grace)
        if self.fronts is not None:  # the other front ends drain meanwhile; the engines stop after them (close)
            self._fronts_stopping = asyncio.ensure_future(self.fronts.stop(
                grace + ABORT_SECONDS + self.settings.drain_backlog_seconds + FLUSH_SECONDS + FRONTS_MARGIN_SECONDS))
        await self.health.enter_graceful_shutdown()
        self.service.begin_drain()
        inflight = self.service.inflight
        finished = await inflight.wait_idle(grace)
        if not finished:
            aborted = inflight.abort()
            log.warning("grace period of %.1fs over: %d calls still in flight get UNAVAILABLE", grace, aborted)
            if not await inflight.wait_idle(ABORT_SECONDS):
                log.error("calls still in flight %.1fs after their abort: server.stop cancels them", ABORT_SECONDS)
        await self._hold_arrivals()
        await self.close(grace=FLUSH_SECONDS)
        return finished

    async def _hold_arrivals(self) -> None:
        await hold_arrivals(self.service, self.settings.drain_backlog_seconds)

    async def close(self, grace: float = 0) -> None:
        if self.server is not None:
            stopping = asyncio.ensure_future(self.server.stop(grace))
            await asyncio.sleep(0)  # gRPC core stops taking calls first, then the held ones get their UNAVAILABLE
            self.service.release_held()
            await stopping
        for task in list(self.draining_models):  # a replaced version still draining: its calls ended with the server
            task.cancel()
        if self.fronts is not None:  # their calls need the engines: they drain first
            await (self._fronts_stopping or self.fronts.stop(ABORT_SECONDS))
        for loaded in [*self.models.values(), *self._retiring]:
            await asyncio.to_thread(loaded.engine.stop)
        if self._http is not None:
            await self._http.close()
            self._http = None
        if self._claim is not None:
            self._claim.close()
