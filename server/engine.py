"""The engine: one background thread runs step() = schedule -> execute -> update, forever.

Requests join and leave the running batch between any two steps. onnxruntime runs in this thread
(it releases the GIL), so the gRPC event loop is never blocked by inference.
"""
from __future__ import annotations

import logging
import threading
import time

import numpy as np
from tokenizers import Tokenizer

from seqserve.server.detokenizer import next_piece
from seqserve.server.metrics import Metrics
from seqserve.server.request import Event, FinishReason, Request, RequestStatus
from seqserve.server.runner import Runner
from seqserve.server.sampling import next_tokens
from seqserve.server.scheduler import Plan, Scheduler

log = logging.getLogger(__name__)


class Engine:
    def __init__(self, runner: Runner, tokenizer: Tokenizer, scheduler: Scheduler, metrics: Metrics | None = None):
        self.runner, self.tokenizer, self.scheduler = runner, tokenizer, scheduler
        self.metrics = metrics or Metrics()
        special = runner.manifest.special_tokens
        self.bos_id, self.eos_id = special["bos_id"], special["eos_id"]
        self._wake = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None

    def submit(self, request: Request) -> None:
        """Queues a request (raises QueueFull when the waiting queue is at its limit) and wakes the loop."""
        self.scheduler.add(request)
        self.metrics.input_tokens.inc(request.n_input_tokens)
        with self._wake:
            self._wake.notify()

    def step(self) -> None:
        plan = self.scheduler.schedule(time.monotonic())
        self._execute_and_update(plan)
        self._observe_gauges()

    def _execute_and_update(self, plan: Plan) -> None:
        encode_s = self.runner.update(plan.retired, plan.admitted)
        if encode_s is not None:
            self.metrics.encoder_duration.observe(encode_s)
        if not plan.running:
            return
        slots = self.runner.slots  # the running rows, in the cache's order, and None for free slots
        last = np.array([r.output_ids[-1] if r is not None and r.output_ids else self.bos_id
                         for r in slots], np.int64)  # (B,)
        positions = np.array([len(r.output_ids) if r is not None else 0 for r in slots], np.int64)  # (B,) per row
        start = time.perf_counter()
        logits = self.runner.step(last, positions)  # (B, V)
        self.metrics.decoder_step_duration.observe(time.perf_counter() - start)
        live = [i for i, r in enumerate(slots) if r is not None]
        rows = [slots[i] for i in live]
        if len(live) < len(slots):
            logits = logits[live]  # (B_live, V)
        self.metrics.batch_rows.observe(len(rows))
        self._update(rows, next_tokens(logits, rows, self.eos_id))

    def _update(self, rows: list[Request], chosen: np.ndarray) -> None:
        now, delivered = time.monotonic(), 0
        for request, token in zip(rows, chosen.tolist()):
            self._observe_token(request, now)
            if token == self.eos_id:
                request.finish(FinishReason.EOS, now)
                continue
            request.output_ids.append(token)
            delivered += 1
            full = len(request.output_ids) >= request.params.max_new_tokens
            piece, stopped = next_piece(self.tokenizer, request, final=full)
            request.deliver(Event(token_ids=(token,), text=piece))
            if stopped or full:
                request.finish(FinishReason.STOP if stopped else FinishReason.LENGTH, now)
        self.metrics.generated_tokens.inc(delivered)  # EOS is not returned, so not counted: equals usage

    def _observe_token(self, request: Request, now: float) -> None:
        if request.first_token_at is None:
            request.first_token_at = now
            self.metrics.queue_duration.observe(request.scheduled_at - request.arrival)
            self.metrics.time_to_first_token.observe(now - request.arrival)
        else:
            self.metrics.inter_token_latency.observe(now - request.last_token_at)
        request.last_token_at = now

    def _observe_gauges(self) -> None:
        self.metrics.running.set(len(self.scheduler.running))
        self.metrics.waiting.set(self.scheduler.n_waiting)
        self.metrics.kv_cache_bytes.set(self.runner.cache.nbytes)

    def run_until_idle(self) -> None:
        """Steps in the calling thread until nothing is waiting or running (verify, bench, tests)."""
        while self.scheduler.has_work():
            self.step()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="seqserve-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Ends the loop; anything still queued or running finishes as CANCELLED (the service drained first)."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout)
        now = time.monotonic()
        self.scheduler.drain_waiting(FinishReason.CANCELLED, now)
        for r in self.scheduler.running:
            if r.status is RequestStatus.RUNNING:
                r.finish(FinishReason.CANCELLED, now)

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._stopping and not self.scheduler.has_work():
                    self._wake.wait()
                if self._stopping:
                    return
            try:
                self.step()
            except Exception as exc:  # never lose a request: every row in flight gets the error
                log.exception("engine step failed")
                self._fail_all(f"inference failed: {exc}")

    def _fail_all(self, message: str) -> None:
        now = time.monotonic()
        failed = [r for r in self.scheduler.running if r.status is RequestStatus.RUNNING]
        for r in failed:
            r.fail(message, now)
        self.scheduler.running = []
        self.runner.update(list(self.runner.rows), [])
        self._observe_gauges()
