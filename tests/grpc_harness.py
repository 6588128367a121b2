"""Test harness: real servers on 127.0.0.1 (port 0) in a background event loop, with real channels."""
from __future__ import annotations

import asyncio
import os
import re
import threading
import time
from pathlib import Path

import grpc
from fixture_builds import THREADS

from seqserve.server import settings as st
from seqserve.server.app import App
from seqserve.v1 import seqserve_pb2 as pb
from seqserve.v1 import seqserve_pb2_grpc as pb_grpc

# Where served tests run onnxruntime: cpu here and in CI; SEQSERVE_TEST_DEVICE=cuda runs them on a GPU.
DEVICE = os.environ.get("SEQSERVE_TEST_DEVICE", "cpu")
PROVIDER = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}[DEVICE]


class Served:
    """An App running in its own thread and event loop, as `seqserve serve` runs it, minus the signals."""

    def __init__(self, bundle: Path, app_class=App, **overrides) -> None:
        values = dict(bundle=bundle, bind="127.0.0.1", port=0, metrics_port=0, device=DEVICE,
                      intra_op_threads=THREADS, log_level="WARNING") | overrides  # SEQSERVE_TEST_THREADS
        self.app = app_class(st.Settings(**values))
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="test-server", daemon=True)
        self.thread.start()
        self._listening = threading.Event()
        self._started = self.run_async(self._start())
        if not self._listening.wait(30):
            raise RuntimeError(f"server did not start: {self._started.exception(0)}")
        self.address = f"127.0.0.1:{self.app.port}"
        self.channel = grpc.insecure_channel(self.address)
        self.stub = pb_grpc.GenerationStub(self.channel)

    async def _start(self) -> None:
        start = asyncio.ensure_future(self.app.start())
        while self.app.port is None and not start.done():  # listening comes before loading and warm-up
            await asyncio.sleep(0.005)
        self._listening.set()
        await start

    def wait_ready(self, timeout: float = 60) -> Served:
        self._started.result(timeout)
        return self

    def run_async(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def settle(self) -> None:
        """Returns once the event loop has handled every engine report delivered before this call (each report is one
        hop to the loop: its metrics and outputs land there, a moment after the engine's step)."""
        self.run_async(asyncio.sleep(0)).result(30)

    @property
    def model(self):
        """The one model the app loaded (server/loading.py Loaded: engine, manifest, tokenizer, limits)."""
        (loaded,) = self.app.models.values()
        return loaded

    @property
    def engine(self):
        """The one model's in-process Engine (tests hold and inspect it; the server reaches it only through
        engine/api.py)."""
        return engine_of(self.model)

    @property
    def runner(self):
        return self.engine.runner

    def slow_down(self, seconds_per_step: float) -> None:
        """Makes every decoder step take longer, so generations are long enough to act on mid-way (0 undoes it)."""
        self.step_delay = seconds_per_step
        runner = self.runner
        if "run_step" not in vars(runner):  # wrap the bound method the engine calls, once; the delay can change later
            step = runner.run_step

            def slow_step(*args, **kwargs):
                time.sleep(self.step_delay)
                return step(*args, **kwargs)

            runner.run_step = slow_step

    def gate(self) -> StepGate:
        """The engine's step gate (made once): close() holds the engine after its next step, open() lets it go on."""
        if getattr(self, "_gate", None) is None:
            self._gate = StepGate(self.engine, self.settle)
        return self._gate

    def metric(self, name: str, **labels) -> float:
        """The sum of the samples with these labels (whatever their other labels: every metric has `model`)."""
        return sum(s.value for family in self.app.metrics.registry.collect() for s in family.samples
                   if s.name == name and labels.items() <= s.labels.items())

    def stop(self) -> None:
        self.channel.close()
        if self._started.done() and self._started.exception() is None and not self.app.service.draining:
            self.run_async(self.app.drain()).result(60)
        else:
            self.run_async(self.app.close()).result(60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def engine_of(loaded):
    """The Engine inside a loaded model's in-process EngineCore (engine/step/core.py)."""
    return loaded.engine.engine


class StepGate:
    """Holds the engine thread between two steps (Engine.after_step calls it after every step), so a test acts at an
    exact step, event-driven: "cancel after k tokens" is exact on any machine, with no timing window."""

    def __init__(self, engine, settle=None) -> None:
        self.engine, self.settle = engine, settle  # settle (Served.settle): the held step's report has landed
        self._cond = threading.Condition()
        self._closed = False
        self._allowed = 0  # steps the engine may still take while the gate is closed
        self.held = threading.Event()  # set while the engine waits here
        self.steps = 0  # steps the engine finished since the gate was made
        engine.after_step = self

    def __call__(self) -> None:
        with self._cond:
            self.steps += 1
            while self._closed and not self._allowed:
                self.held.set()
                self._cond.wait()
            self.held.clear()
            if self._closed:
                self._allowed -= 1

    def close(self) -> None:
        """Once the engine is idle (earlier requests retired, and its thread waiting for work, not finishing the step
        that retired them), holds it after its next step: the one that admits the next request and gives it its first
        token."""
        loop = self.engine.loop  # (not started yet: nothing in flight either)
        wait_for(lambda: not self.engine.scheduler.has_work() and (loop.thread is None or loop.idle.is_set()),
                 what="an idle engine")
        with self._cond:
            self._closed, self._allowed = True, 0

    def run(self, steps: int) -> None:
        """The engine, held, takes exactly this many more steps and is held again (returns once it is)."""
        self.wait_held()
        with self._cond:
            self._allowed = steps
            self.held.clear()
            self._cond.notify_all()
        wait_for(lambda: self.held.is_set() and not self._allowed, what=f"{steps} more steps")
        if self.settle is not None:
            self.settle()

    def open(self) -> None:
        """Lets the engine go on (its next schedule drains every abort queued meanwhile, and every passed deadline)."""
        with self._cond:
            self._closed = False
            self._cond.notify_all()

    def wait_aborted(self, request_id: int) -> None:
        """Returns once the edge's abort of this request waits in the scheduler's queue (Scheduler.abort) for the held
        engine's next step to drain it."""
        aborts = self.engine.scheduler._aborts  # (read-only here: the queue the edge's thread appends to)
        wait_for(lambda: any(i == request_id for i, _ in list(aborts)), what="the abort to reach the engine")

    def wait_held(self, timeout: float = 30) -> None:
        assert self.held.wait(timeout), "the engine never reached the gate"
        if self.settle is not None:
            self.settle()


def wait_for(predicate, timeout: float = 20, what: str = "condition") -> None:
    """Polls until predicate() is true (never a bare sleep as synchronisation)."""
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.005)


def request(text: str, **options) -> pb.GenerateRequest:
    return pb.GenerateRequest(input=text, options=pb.DecodingOptions(**options))


def follow_log(proc) -> tuple[list[str], list[int], threading.Event]:
    """Reads a `seqserve serve` process's log (stderr) in a thread: its lines so far, and its gRPC port once it logs
    where it listens (the event is set then)."""
    log, port, listening = [], [], threading.Event()

    def read() -> None:
        for line in proc.stderr:
            log.append(line)
            if m := re.search(r" on 127\.0\.0\.1:(\d+) \(", line):
                port.append(int(m.group(1)))
                listening.set()

    threading.Thread(target=read, daemon=True).start()
    return log, port, listening


def default_limits(bundle, max_batch_size: int | None = None):
    """The request limits `seqserve serve` resolves for this bundle with its default settings (what an engine process
    checks each request against when a test starts one without a server)."""
    from seqserve.contract.manifest import load_manifest
    from seqserve.server.model_defaults import model_limits
    fields = {"max_batch_size": max_batch_size} if max_batch_size else {}
    return model_limits(st.Settings(bundle=str(bundle), **fields), load_manifest(bundle, check_files=False))
