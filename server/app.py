"""`seqserve serve`: builds runner + engine + service, serves gRPC (with health and reflection) and /metrics.

Lifecycle: bind with health NOT_SERVING -> load the bundle and warm up (off the event loop) -> SERVING.
SIGTERM/SIGINT: NOT_SERVING -> new calls UNAVAILABLE -> in-flight calls finish within the grace period -> calls
still in flight get UNAVAILABLE, and so do calls gRPC accepted but had not handed over yet (never CANCELLED: clients
retry UNAVAILABLE, not CANCELLED) -> server.stop -> engine.stop -> exit 0.
Security (docs/security.md): TLS / mutual TLS, bearer tokens, the bind addresses, reflection on or off.
"""
from __future__ import annotations

import asyncio
import logging
import time

import grpc
import onnxruntime as ort
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc

from seqserve.contract.integrity import check_graphs, open_bundle
from seqserve.server import signals
from seqserve.server.auth import TokenAuth
from seqserve.server.device import RuntimeConfig
from seqserve.server.engine import Engine
from seqserve.server.handlers import add_refusing
from seqserve.server.health import Health
from seqserve.server.metrics import Metrics
from seqserve.server.metrics_http import MetricsEndpoint
from seqserve.server.request import Request, SamplingParams
from seqserve.server.runner import Runner
from seqserve.server.scheduler import Scheduler, SchedulerConfig
from seqserve.server.service import SERVICE_NAME, GenerationService
from seqserve.server.settings import Settings, SettingsError, env_name
from seqserve.server.tls import server_credentials

log = logging.getLogger("seqserve")
WARMUP_TEXT = "warm up"
ABORT_SECONDS = 5.0  # after the grace period: how long calls get to send their UNAVAILABLE before server.stop
BACKLOG_SECONDS = 5.0  # at most this long answering calls gRPC accepted but had not yet handed to the service
QUIET_SECONDS = 0.1  # no new call for this long: gRPC's backlog of accepted calls is empty
FLUSH_SECONDS = 1.0  # server.stop's own grace: lets the last statuses and responses reach their clients
LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


class App:
    def __init__(self, settings: Settings, metrics: Metrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.service = GenerationService(self.metrics)
        self.health = Health(settings.max_health_watches, self.metrics)
        self.server: grpc.aio.Server | None = None
        self.runner: Runner | None = None
        self.engine: Engine | None = None
        self.port = self.metrics_port = None
        self._http = None

    async def start(self) -> None:
        """Listens at once (health NOT_SERVING), then loads and warms up in a thread, then SERVING."""
        await self._listen()
        try:
            await self._serve_metrics()
            runner, tokenizer, limits, engine = await asyncio.to_thread(self._load)
            self.runner, self.engine = runner, engine
            self.service.open(engine, tokenizer, limits, self._model_info(runner))
            await self._set_health(health_pb2.HealthCheckResponse.SERVING)
            log.info("serving %s on %s:%d (%s, %s); %s", self.settings.bundle, self.settings.bind, self.port,
                     runner.provider, runner.variant, "metrics disabled" if self.metrics_port is None else
                     f"metrics on {self.settings.metrics_bind}:{self.metrics_port}/metrics")
        except BaseException:
            await self.close(grace=0)
            raise

    async def _listen(self) -> None:
        s = self.settings
        tokens = s.tokens()
        interceptors = [TokenAuth(tokens, self.metrics, SERVICE_NAME, s.auth_exempt_health)] if tokens else []
        # so_reuseport off: a second server on a taken port must fail, not silently share it. gRPC core keeps calls
        # the event loop has not taken yet; past its soft limit (default 1,000) it drops some at random and past
        # its hard limit (3,000) all, CANCELLED and unseen by the service: one limit for both, max_pending_calls.
        self.server = grpc.aio.server(interceptors=interceptors, options=[
            ("grpc.so_reuseport", 0), ("grpc.max_receive_message_length", s.max_receive_message_bytes),
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
            if s.tls_cert_file is None:
                self.port = self.server.add_insecure_port(address)
            else:
                self.port = self.server.add_secure_port(address, server_credentials(
                    s.tls_cert_file, s.tls_key_file, s.tls_client_ca_file))
        except RuntimeError as exc:
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

    def _load(self):
        """Runs in a worker thread: onnxruntime sessions, tokenizer, engine, one warm-up generation."""
        s = self.settings
        manifest, tokenizer = open_bundle(s.bundle)
        if s.variant in manifest.variants:  # probed on CPU too: an out-of-range gather may pass silently on a GPU
            check_graphs(s.bundle, manifest, s.variant)
        limits = s.limits(int(manifest.model["max_positions"]), int(manifest.max_new_tokens))
        runtime = RuntimeConfig(device=s.device, intra_op_threads=s.intra_op_threads,
                                inter_op_threads=s.inter_op_threads, allow_spinning=s.allow_spinning,
                                cuda_tf32=s.cuda_tf32)
        runner = Runner(s.bundle, runtime, s.variant, capacity=s.max_batch_size, kv_cache=s.kv_cache)
        scheduler = Scheduler(SchedulerConfig.from_settings(s, runner.cross_bytes_per_token))
        engine = Engine(runner, tokenizer, scheduler, self.metrics, stream_interval=s.stream_interval)
        self._warm_up(engine, tokenizer)
        engine.start()
        return runner, tokenizer, limits, engine

    def _warm_up(self, engine: Engine, tokenizer) -> None:
        """One short generation before SERVING, so the first client does not pay for onnxruntime's first run."""
        request = Request(tokenizer.encode(WARMUP_TEXT).ids, SamplingParams(max_new_tokens=2))
        exported, engine.metrics = engine.metrics, Metrics()  # warm-up is not traffic: keep it off /metrics
        try:
            engine.generate([request])
        finally:
            engine.metrics = exported
        if request.error is not None:
            raise RuntimeError(f"warm-up generation failed: {request.error}")

    def _model_info(self, runner: Runner) -> dict:
        manifest = runner.manifest
        quality = manifest.variants[runner.variant].get("quality", {})
        return dict(config=dict(manifest.model),
                    bundle_format_version=manifest.format_version, variant=runner.variant,
                    execution_provider=runner.provider, onnxruntime_version=ort.__version__,
                    quality={k: float(v) for k, v in quality.items() if isinstance(v, (int, float))})

    async def _set_health(self, status) -> None:
        for service in ("", SERVICE_NAME):  # "" is the whole server, as load balancers ask
            await self.health.set(service, status)

    async def drain(self) -> bool:
        """Graceful stop; True when every in-flight call finished within the grace period."""
        grace = self.settings.grace_seconds
        log.info("draining: health NOT_SERVING, refusing new calls, waiting up to %.1fs for in-flight ones", grace)
        await self.health.enter_graceful_shutdown()
        self.service.begin_drain()
        inflight = self.service.inflight
        finished = await inflight.wait_idle(grace)
        if not finished:
            aborted = inflight.abort()
            log.warning("grace period of %.1fs over: %d calls still in flight get UNAVAILABLE", grace, aborted)
            if not await inflight.wait_idle(ABORT_SECONDS):
                log.error("calls still in flight %.1fs after their abort: server.stop cancels them", ABORT_SECONDS)
        await self._refuse_backlog()
        await self.close(grace=FLUSH_SECONDS)
        return finished

    async def _refuse_backlog(self) -> None:
        """gRPC may hold calls it accepted but has not handed to the service yet (a busy event loop takes them one
        at a time), and server.stop would end those CANCELLED. So the server keeps answering, each such call gets
        UNAVAILABLE at once, until none arrived for QUIET_SECONDS (at most BACKLOG_SECONDS)."""
        inflight, end = self.service.inflight, time.monotonic() + BACKLOG_SECONDS
        while time.monotonic() < end:
            await inflight.wait_idle(max(0.0, end - time.monotonic()))
            quiet_since = time.monotonic()  # a loop busy with aborts hands over no call: only count from idle
            await asyncio.sleep(QUIET_SECONDS)
            if inflight.last_arrival < quiet_since and not inflight:  # nothing came, nothing is left
                return

    async def close(self, grace: float = 0) -> None:
        if self.server is not None:
            await self.server.stop(grace)
        if self.engine is not None:
            await asyncio.to_thread(self.engine.stop)
        if self._http is not None:
            await self._http.close()
            self._http = None


async def _serve(settings: Settings) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in signals.SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    if signals.received():  # during start-up, before these handlers (signals.hold): nothing to drain yet
        log.info("stopped before serving: a signal arrived while starting")
        return 0
    app = App(settings)
    await app.start()
    await stop.wait()
    await app.drain()
    log.info("stopped")
    return 0


def run(settings: Settings) -> int:
    """The `seqserve serve` entry point: serves until SIGTERM/SIGINT, then drains and returns 0."""
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return asyncio.run(_serve(settings))
