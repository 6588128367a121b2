"""The gRPC edge (grpc.aio): validate -> Request -> engine.submit -> await the engine's events -> protobuf.

The only server module that imports generated code. Events come from the engine thread through
loop.call_soon_threadsafe into one asyncio.Queue per request, so the event loop never waits on inference.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import secrets
import time

import grpc

from seqserve.server.metrics import Metrics
from seqserve.server.request import Event, FinishReason, Request, SamplingParams
from seqserve.server.scheduler import QueueFull
from seqserve.server.settings import Limits
from seqserve.v1 import seqserve_pb2 as pb
from seqserve.v1 import seqserve_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)
Code = grpc.StatusCode

_FINISH = {FinishReason.EOS: pb.FINISH_REASON_EOS, FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
           FinishReason.STOP: pb.FINISH_REASON_STOP, FinishReason.CANCELLED: pb.FINISH_REASON_CANCELLED,
           FinishReason.DEADLINE: pb.FINISH_REASON_DEADLINE}
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Generation"].full_name  # seqserve.v1.Generation
_CHARS_PER_TOKEN_SLACK = 4  # NFC may compose up to 3 characters into one, so this bound never rejects a valid input


class Rejected(Exception):
    """Ends a call with a status code; reason (if any) is the rejected-requests metric label."""

    def __init__(self, code: grpc.StatusCode, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.reason = code, message, reason


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise Rejected(Code.INVALID_ARGUMENT, message, "invalid_argument")


class _Call:
    """One RPC: its deadline and the Requests it submitted, each with the queue its events arrive on."""

    def __init__(self, context: grpc.aio.ServicerContext) -> None:
        remaining = context.time_remaining()
        self.deadline = None if remaining is None else time.monotonic() + remaining
        self.rows: list[tuple[Request, asyncio.Queue]] = []

    def release(self) -> None:
        """The call ended: rows still in flight leave the batch (expired ones the engine ends as DEADLINE)."""
        now = time.monotonic()
        for request, _ in self.rows:
            if not request.expired(now):
                request.cancel()


class GenerationService(pb_grpc.GenerationServicer):
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.engine = self.tokenizer = self.limits = self.info = None
        self._max_chars = 0  # inputs longer than this cannot fit max_input_tokens: refused before tokenising
        self.draining = False
        self._inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def open(self, engine, tokenizer, limits: Limits, model: dict) -> None:
        """Starts answering generation calls (the app calls it once the model is loaded and warmed up)."""
        self.tokenizer, self.limits = tokenizer, limits
        self._max_chars = limits.max_input_tokens * max(map(len, tokenizer.get_vocab())) * _CHARS_PER_TOKEN_SLACK
        self.info = pb.ModelInfo(limits=pb.Limits(**dataclasses.asdict(limits)), **model)
        self.metrics.model.info({"provider": model["execution_provider"], "variant": model["variant"],
                                 "bundle_format_version": str(model["bundle_format_version"]),
                                 "onnxruntime_version": model["onnxruntime_version"]})
        self.engine = engine

    def add_to(self, server: grpc.aio.Server) -> None:
        pb_grpc.add_GenerationServicer_to_server(self, server)

    def begin_drain(self) -> None:
        """New calls get UNAVAILABLE from now on; calls already in flight carry on."""
        self.draining = True

    async def wait_idle(self, timeout: float) -> bool:
        """True once no call is in flight, False if the timeout came first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except TimeoutError:
            return False

    @contextlib.asynccontextmanager
    async def _call(self, method: str, context: grpc.aio.ServicerContext, timed: bool = True):
        """Every RPC runs inside this: admission, counting, the status code, and releasing its rows."""
        start, call, code, message = time.monotonic(), _Call(context), Code.OK, ""
        self._inflight += 1
        self._idle.clear()
        try:
            if self.draining or self.engine is None:
                raise Rejected(Code.UNAVAILABLE, "the server is shutting down" if self.draining else
                               "the model is still loading", "draining" if self.draining else "not_ready")
            yield call
        except Rejected as exc:
            code, message = exc.code, exc.message
            if exc.reason:
                self.metrics.rejected.labels(exc.reason).inc()
        except (asyncio.CancelledError, GeneratorExit):  # the client went away, or its deadline passed
            code = Code.DEADLINE_EXCEEDED if call.deadline and time.monotonic() >= call.deadline else Code.CANCELLED
            raise
        except Exception as exc:
            log.exception("%s failed", method)
            code, message = Code.INTERNAL, f"internal error: {exc}"
        finally:
            call.release()
            self._inflight -= 1
            if self._inflight == 0:
                self._idle.set()
            self.metrics.requests.labels(method, code.name).inc()
            if timed:
                self.metrics.request_duration.labels(method).observe(time.monotonic() - start)
        if code is not Code.OK:
            await context.abort(code, message)

    async def Generate(self, request: pb.GenerateRequest, context) -> pb.GenerateResponse:
        async with self._call("Generate", context) as call:
            params = self._params(request.options)
            row = self._new_request(call, request.input, "input", params)
            self._submit(call, [row])
            return _response(await self._result(*call.rows[0]))

    async def GenerateStream(self, request: pb.GenerateRequest, context):
        async with self._call("GenerateStream", context) as call:
            params = self._params(request.options)
            row = self._new_request(call, request.input, "input", params)
            self._submit(call, [row])
            queue = call.rows[0][1]
            while True:
                events = [await queue.get()]
                while not queue.empty():  # a slow reader gets the backlog in one message
                    events.append(queue.get_nowait())
                piece = pb.GenerateStreamResponse(text="".join(e.text for e in events),
                                                  token_ids=[t for e in events for t in e.token_ids])
                end = events[-1]
                if end.finish_reason is None and end.error is None:
                    yield piece
                    continue
                if piece.text or piece.token_ids:  # what was produced before an abort still reaches the client
                    yield piece
                    piece = pb.GenerateStreamResponse()
                _raise_for_end(row, end)
                piece.MergeFrom(pb.GenerateStreamResponse(**_summary(row)))
                yield piece
                return

    async def GenerateBatch(self, request: pb.GenerateBatchRequest, context) -> pb.GenerateBatchResponse:
        async with self._call("GenerateBatch", context) as call:
            n, most = len(request.inputs), self.limits.max_batch_inputs
            _check(n > 0, "inputs must not be empty")
            _check(n <= most, f"inputs has {n} entries, more than max_batch_inputs={most}")
            params = self._params(request.options)
            rows = [self._new_request(call, text, f"inputs[{i}]", params) for i, text in enumerate(request.inputs)]
            self._submit(call, rows)
            results = [await self._result(row, queue) for row, queue in call.rows]  # all run at once in the engine
            return pb.GenerateBatchResponse(results=[_response(r) for r in results])

    async def GetModelInfo(self, request: pb.GetModelInfoRequest, context) -> pb.ModelInfo:
        async with self._call("GetModelInfo", context, timed=False):
            return self.info

    def _params(self, o: pb.DecodingOptions) -> dict:
        """Validated decoding options (INVALID_ARGUMENT names the field); the seed is chosen per input."""
        cap = self.limits.max_new_tokens
        max_new = o.max_new_tokens if o.HasField("max_new_tokens") else self.limits.default_max_new_tokens
        _check(1 <= max_new <= cap, f"options.max_new_tokens must be in [1, {cap}], got {max_new}")
        _check(o.min_new_tokens <= max_new,
               f"options.min_new_tokens must be at most max_new_tokens ({max_new}), got {o.min_new_tokens}")
        _check(math.isfinite(o.temperature) and o.temperature >= 0,
               f"options.temperature must be finite and >= 0, got {o.temperature:g}")
        _check(o.top_k >= 0, f"options.top_k must be >= 0 (0 = disabled), got {o.top_k}")
        top_p = o.top_p if o.HasField("top_p") else 1.0
        _check(0 < top_p <= 1, f"options.top_p must be in (0, 1], got {top_p:g}")
        penalty = o.repetition_penalty if o.HasField("repetition_penalty") else 1.0
        _check(math.isfinite(penalty) and penalty > 0, f"options.repetition_penalty must be finite and > 0, "
                                                       f"got {penalty:g}")
        most = self.limits.max_stop_strings
        _check(len(o.stop) <= most, f"options.stop has {len(o.stop)} strings, more than max_stop_strings={most}")
        for i, stop in enumerate(o.stop):
            _check(stop != "", f"options.stop[{i}] must not be empty")
        return dict(max_new_tokens=max_new, min_new_tokens=o.min_new_tokens, temperature=float(o.temperature),
                    top_k=o.top_k, top_p=float(top_p), repetition_penalty=float(penalty), stop=tuple(o.stop),
                    seed=o.seed if o.HasField("seed") else None)

    def _new_request(self, call: _Call, text: str, field: str, params: dict) -> Request:
        _check(text.strip() != "", f"{field} must not be empty or whitespace")
        most = self.limits.max_input_tokens
        _check(len(text) <= self._max_chars, f"{field} has {len(text)} characters, more than "
                                             f"max_input_tokens={most} tokens can hold")
        ids = self.tokenizer.encode(text).ids
        _check(len(ids) <= most, f"{field} has {len(ids)} tokens, more than max_input_tokens={most}")
        seed = params["seed"] if params["seed"] is not None else secrets.randbits(64)  # returned to the client
        return Request(ids, SamplingParams(**{**params, "seed": seed}), deadline=call.deadline)

    def _submit(self, call: _Call, rows: list[Request]) -> None:
        """Queues every row or none: a call the queue cannot take whole gets RESOURCE_EXHAUSTED at once."""
        scheduler = self.engine.scheduler
        free = scheduler.cfg.max_waiting - scheduler.n_waiting  # only this loop adds, so it can only grow meanwhile
        if len(rows) > free:
            raise Rejected(Code.RESOURCE_EXHAUSTED, f"queue full: {scheduler.n_waiting} requests waiting "
                                                    f"(max_waiting={scheduler.cfg.max_waiting})", "queue_full")
        loop = asyncio.get_running_loop()
        for row in rows:
            queue = asyncio.Queue()
            row.deliver = self._sink(loop, queue)
            try:
                self.engine.submit(row)
            except QueueFull as exc:  # cannot happen after the check above; kept so a call never half-queues
                raise Rejected(Code.RESOURCE_EXHAUSTED, f"queue full: {exc}", "queue_full") from exc
            call.rows.append((row, queue))

    def _sink(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue):
        """The deliver callback, run in the engine thread: counts finishes, hands events to this loop."""
        finished = self.metrics.finished

        def deliver(event: Event) -> None:
            if event.finish_reason is not None:
                finished.labels(event.finish_reason.value).inc()
            try:
                loop.call_soon_threadsafe(queue.put_nowait, event)
            except RuntimeError:  # the event loop is closed (shutdown): nobody is waiting any more
                pass

        return deliver

    @staticmethod
    async def _result(row: Request, queue: asyncio.Queue) -> Request:
        while True:
            event = await queue.get()
            if event.finish_reason is not None or event.error is not None:
                _raise_for_end(row, event)
                return row


def _raise_for_end(row: Request, end: Event) -> None:
    """Turns a final event that is not a normal finish into the call's status."""
    if end.error is not None:
        raise Rejected(Code.INTERNAL, end.error)
    if end.finish_reason is FinishReason.DEADLINE:
        raise Rejected(Code.DEADLINE_EXCEEDED, f"deadline passed after {len(row.output_ids)} generated tokens")
    if end.finish_reason is FinishReason.CANCELLED:  # only the engine stopping cancels a row whose call is alive
        raise Rejected(Code.UNAVAILABLE, "the server stopped before this generation finished")


def _summary(row: Request) -> dict:
    def since_arrival(t: float | None) -> float:
        return 0.0 if t is None else max(0.0, t - row.arrival)

    return dict(finish_reason=_FINISH[row.finish_reason], seed=row.params.seed,
                usage=pb.Usage(input_tokens=row.n_input_tokens, generated_tokens=len(row.output_ids)),
                timings=pb.Timings(queue_seconds=since_arrival(row.scheduled_at),
                                   first_token_seconds=since_arrival(row.first_token_at),
                                   total_seconds=since_arrival(row.finished_at)))


def _response(row: Request) -> pb.GenerateResponse:
    return pb.GenerateResponse(text=row.text, token_ids=row.output_ids, **_summary(row))
