"""The gRPC edge (grpc.aio): validate -> Request -> engine.submit -> await the engine's events -> protobuf.

Protobuf stays at this edge: no other server module imports generated code (client.py is the client's side). Events
come from the engine thread through the Outbox (one loop hop per engine step) into one asyncio.Queue per request, so
the event loop never waits on inference.
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

from seqserve.contract.languages import Languages
from seqserve.server.handlers import Undecodable, add_generation_service
from seqserve.server.inflight import Call, InFlight
from seqserve.server.languages import LanguageRefused, RequestLanguages, resolve
from seqserve.server.metrics import Metrics
from seqserve.server.model_defaults import request_defaults
from seqserve.server.outbox import Outbox
from seqserve.server.request import Event, FinishReason, Request, SamplingParams, Sequence
from seqserve.server.scheduler import QueueFull
from seqserve.server.settings import Limits
from seqserve.v1 import seqserve_pb2 as pb
from seqserve.v1 import seqserve_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)
Code = grpc.StatusCode

_FINISH = {FinishReason.EOS: pb.FINISH_REASON_EOS, FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
           FinishReason.STOP: pb.FINISH_REASON_STOP, FinishReason.CANCELLED: pb.FINISH_REASON_CANCELLED,
           FinishReason.DEADLINE: pb.FINISH_REASON_DEADLINE}
_ABORTS = (FinishReason.DEADLINE, FinishReason.CANCELLED, FinishReason.ERROR)  # ends the call with a non-OK status
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


def _beam_params(o: pb.DecodingOptions, limits: Limits, repetition_penalty: float,
                 defaults: SamplingParams = SamplingParams()) -> dict:
    """The beam and log-probability options, validated (0 or unset: the model's default, else 1). A request that
    samples, has stop strings or a repetition penalty gets no default beams (those need num_beams 1)."""
    plain = o.temperature == 0 and not o.stop and repetition_penalty == 1
    beams, most = o.num_beams or (defaults.num_beams if plain else 1), limits.max_num_beams
    _check(beams <= most, f"options.num_beams must be in [1, {most}] (max_num_beams), got {beams}")
    n = o.num_return_sequences or min(defaults.num_return_sequences, beams)
    _check(n <= beams, f"options.num_return_sequences must be in [1, num_beams={beams}], got {n}")
    penalty = o.length_penalty if o.HasField("length_penalty") else defaults.length_penalty
    _check(math.isfinite(penalty), f"options.length_penalty must be finite, got {penalty:g}")
    top, most = o.top_logprobs, limits.max_top_logprobs
    _check(top <= most, f"options.top_logprobs must be in [0, {most}] (max_top_logprobs), got {top}")
    _check(o.return_logprobs or not o.top_logprobs, "options.top_logprobs needs options.return_logprobs")
    if beams > 1:  # beam search here is deterministic, and defined as model/beam.py's reference defines it
        _check(o.temperature == 0, f"options.temperature must be 0 with num_beams > 1 (beam search is "
                                   f"deterministic), got {o.temperature:g}")
        _check(not o.stop, "options.stop is not supported with num_beams > 1")
        _check(repetition_penalty == 1, f"options.repetition_penalty must be 1 with num_beams > 1, "
                                        f"got {repetition_penalty:g}")
    return dict(num_beams=beams, num_return_sequences=n, length_penalty=float(penalty),
                early_stopping=o.early_stopping or defaults.early_stopping, return_logprobs=o.return_logprobs,
                top_logprobs=o.top_logprobs)


class GenerationService(pb_grpc.GenerationServicer):
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.engine = self.tokenizer = self.limits = self.info = None
        self.languages: Languages | None = None  # a multilingual model's (the manifest's)
        self.defaults = SamplingParams()
        self._max_chars = 0  # inputs longer than this cannot fit max_input_tokens: refused before tokenising
        self.outbox: Outbox | None = None  # the engine's events for this event loop
        self.draining = False
        self.inflight = InFlight(metrics)

    def open(self, engine, tokenizer, limits: Limits, model: dict) -> None:
        """Starts answering generation calls (the app calls it once the model is loaded and warmed up)."""
        self.tokenizer, self.limits = tokenizer, limits
        self.defaults = request_defaults(engine.runner.manifest.generation, limits.default_max_new_tokens,
                                         limits.max_num_beams)  # the model's decoding defaults
        self._max_chars = limits.max_input_tokens * max(map(len, tokenizer.get_vocab())) * _CHARS_PER_TOKEN_SLACK
        self.languages = Languages.from_dict(engine.runner.manifest.languages)
        self.info = pb.ModelInfo(limits=pb.Limits(**dataclasses.asdict(limits)), **model)
        if self.languages is not None:
            self.info.languages.update(self.languages.codes)
            self.info.source_language_placement = self.languages.source_placement
        self.metrics.model.info({"provider": model["execution_provider"], "variant": model["variant"],
                                 "bundle_format_version": str(model["bundle_format_version"]),
                                 "onnxruntime_version": model["onnxruntime_version"]})
        self.engine = engine

    def add_to(self, server: grpc.aio.Server) -> None:
        add_generation_service(self, server)  # the generated handlers, with decoders that never raise

    def begin_drain(self) -> None:
        """New calls get UNAVAILABLE from now on; calls already in flight carry on."""
        self.draining = True

    @contextlib.asynccontextmanager
    async def _call(self, method: str, context: grpc.aio.ServicerContext, request, timed: bool = True):
        """Every RPC runs inside this: admission, counting, the status code, and releasing its rows. The call
        counts as in flight until its status is sent, so a drain waits for the status, not just the handler."""
        start, call, code, message = time.monotonic(), Call(context), Code.OK, ""
        self.inflight.enter(call)
        try:
            try:
                self._admit(call, method, request)
                yield call
            except Rejected as exc:
                code, message = exc.code, exc.message
                if exc.reason:
                    self.metrics.rejected.labels(exc.reason).inc()
            except (asyncio.CancelledError, GeneratorExit):  # the client went away, or its deadline passed
                late = call.deadline and time.monotonic() >= call.deadline
                code = Code.DEADLINE_EXCEEDED if late else Code.CANCELLED
                raise
            except Exception as exc:
                log.exception("%s failed", method)
                code, message = Code.INTERNAL, f"internal error: {exc}"
            finally:
                call.release()
                self.metrics.requests.labels(method, code.name).inc()
                if timed:
                    self.metrics.request_duration.labels(method).observe(time.monotonic() - start)
            if code is not Code.OK:
                await context.abort(code, message)
        finally:
            self.inflight.leave(call)

    def _admit(self, call: Call, method: str, request) -> None:
        """Refuses a call before any work: the server is not ready or draining, the request could not be decoded,
        or its bytes would take the calls in flight beyond max_inflight_bytes."""
        if self.draining or self.engine is None:
            raise Rejected(Code.UNAVAILABLE, "the server is shutting down" if self.draining else
                           "the model is still loading", "draining" if self.draining else "not_ready")
        if isinstance(request, Undecodable):
            log.warning("%s: refused a request that cannot be decoded (%d bytes): %s", method, request.size,
                        request.reason)
            raise Rejected(Code.INVALID_ARGUMENT, f"the request is not a valid {method} message: {request.reason}",
                           "undecodable")
        size, most = request.ByteSize(), self.limits.max_inflight_bytes
        if not self.inflight.hold(call, size, most):
            raise Rejected(Code.RESOURCE_EXHAUSTED, f"too many request bytes in flight: {self.inflight.bytes} held "
                                                    f"and this call has {size} (max_inflight_bytes={most})",
                           "inflight_bytes")

    async def Generate(self, request: pb.GenerateRequest, context) -> pb.GenerateResponse:
        async with self._call("Generate", context, request) as call:
            params, langs = self._params(request.options), self._languages(request)
            row = self._new_request(call, request.input, "input", params, stream=False, langs=langs)
            self._submit(call, [row])
            return _response(await self._result(*call.rows[0]))

    async def GenerateStream(self, request: pb.GenerateRequest, context):
        async with self._call("GenerateStream", context, request) as call:
            params, langs = self._params(request.options), self._languages(request)
            row = self._new_request(call, request.input, "input", params, stream=True, langs=langs)
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
                aborted = end.error is not None or end.finish_reason in _ABORTS
                if aborted and (piece.text or piece.token_ids):  # what came before an abort still reaches the client
                    yield piece
                    piece = pb.GenerateStreamResponse()
                _raise_for_end(row, end)
                piece.MergeFrom(pb.GenerateStreamResponse(**_summary(row)))
                yield piece
                return

    async def GenerateBatch(self, request: pb.GenerateBatchRequest, context) -> pb.GenerateBatchResponse:
        async with self._call("GenerateBatch", context, request) as call:
            n, most = len(request.inputs), self.limits.max_batch_inputs
            _check(n > 0, "inputs must not be empty")
            _check(n <= most, f"inputs has {n} entries, more than max_batch_inputs={most}")
            params, langs = self._params(request.options), self._batch_languages(request)
            rows = [self._new_request(call, text, f"inputs[{i}]", params, stream=False, langs=langs[i])
                    for i, text in enumerate(request.inputs)]
            self._submit(call, rows)
            results = [await self._result(row, queue) for row, queue in call.rows]  # all run at once in the engine
            return pb.GenerateBatchResponse(results=[_response(r) for r in results])

    async def GetModelInfo(self, request: pb.GetModelInfoRequest, context) -> pb.ModelInfo:
        async with self._call("GetModelInfo", context, request, timed=False):
            return self.info

    def _params(self, o: pb.DecodingOptions) -> dict:
        """Validated decoding options (INVALID_ARGUMENT names the field); the seed is chosen per input."""
        cap = self.limits.max_new_tokens
        max_new = o.max_new_tokens if o.HasField("max_new_tokens") else self.defaults.max_new_tokens
        min_new = o.min_new_tokens or min(self.defaults.min_new_tokens, max_new)
        if self.engine.constraints.forced_eos is not None:  # the forced end token wins over min_length, as in HF
            min_new = min(min_new, max_new - 1)
        _check(1 <= max_new <= cap, f"options.max_new_tokens must be in [1, {cap}], got {max_new}")
        _check(min_new <= max_new,
               f"options.min_new_tokens must be at most max_new_tokens ({max_new}), got {min_new}")
        d = self.defaults  # the model's (a sampling model's temperature and top_k apply while the request's are 0)
        temperature, top_k = o.temperature or d.temperature, o.top_k or d.top_k
        _check(math.isfinite(temperature) and temperature >= 0,
               f"options.temperature must be finite and >= 0, got {temperature:g}")
        _check(top_k >= 0, f"options.top_k must be >= 0 (0 = disabled), got {top_k}")
        top_p = o.top_p if o.HasField("top_p") else d.top_p
        _check(0 < top_p <= 1, f"options.top_p must be in (0, 1], got {top_p:g}")
        penalty = o.repetition_penalty if o.HasField("repetition_penalty") else d.repetition_penalty
        _check(math.isfinite(penalty) and penalty > 0, f"options.repetition_penalty must be finite and > 0, "
                                                       f"got {penalty:g}")
        most = self.limits.max_stop_strings
        _check(len(o.stop) <= most, f"options.stop has {len(o.stop)} strings, more than max_stop_strings={most}")
        each, total = self.limits.max_stop_string_bytes, 0
        for i, stop in enumerate(o.stop):
            _check(stop != "", f"options.stop[{i}] must not be empty")
            size = len(stop.encode())
            _check(size <= each, f"options.stop[{i}] has {size} bytes, more than max_stop_string_bytes={each}")
            total += size
        _check(total <= self.limits.max_stop_bytes, f"options.stop has {total} bytes in all, more than "
                                                    f"max_stop_bytes={self.limits.max_stop_bytes}")
        return dict(max_new_tokens=max_new, min_new_tokens=min_new, temperature=float(temperature),
                    top_k=top_k, top_p=float(top_p), repetition_penalty=float(penalty), stop=tuple(o.stop),
                    seed=o.seed if o.HasField("seed") else None, **_beam_params(o, self.limits, penalty, self.defaults))

    def _languages(self, request) -> RequestLanguages | None:
        """The request's source and target languages, checked against the model's (server/languages.py)."""
        try:
            return resolve(self.languages, request.source_language, request.target_language)
        except LanguageRefused as exc:
            raise Rejected(Code.INVALID_ARGUMENT, str(exc), "invalid_argument") from None

    def _batch_languages(self, request: pb.GenerateBatchRequest) -> list[RequestLanguages | None]:
        """Each input's languages: target_languages[i] when the call names one per input, else target_language."""
        n, targets = len(request.inputs), list(request.target_languages)
        if not targets:
            return [self._languages(request)] * n
        _check(len(targets) == n, f"target_languages has {len(targets)} entries; it must be empty or have one per "
                                  f"input ({n})")
        _check(not request.target_language, "target_language and target_languages cannot both be set")
        try:
            return [resolve(self.languages, request.source_language, target, f"target_languages[{i}]")
                    for i, target in enumerate(targets)]
        except LanguageRefused as exc:
            raise Rejected(Code.INVALID_ARGUMENT, str(exc), "invalid_argument") from None

    def _new_request(self, call: Call, text: str, field: str, params: dict, stream: bool,
                     langs: RequestLanguages | None = None) -> Request:
        _check(text.strip() != "", f"{field} must not be empty or whitespace")
        most = self.limits.max_input_tokens
        _check(len(text) <= self._max_chars, f"{field} has {len(text)} characters, more than "
                                             f"max_input_tokens={most} tokens can hold")
        ids = self.tokenizer.encode(text).ids
        if langs is not None:  # the source language token, where the model's tokenizer puts it
            ids = self.languages.source_ids(ids, langs.source)
        _check(len(ids) <= most, f"{field} has {len(ids)} tokens, more than max_input_tokens={most}")
        seed = params["seed"] if params["seed"] is not None else secrets.randbits(64)  # returned to the client
        return Request(ids, SamplingParams(**{**params, "seed": seed}), sink=self._outbox(), stream=stream,
                       deadline=call.deadline, forced_bos=None if langs is None else langs.target_token)

    def _outbox(self) -> Outbox:
        """The sink for requests of this event loop (made on the loop, once)."""
        if self.outbox is None:
            self.outbox = Outbox(asyncio.get_running_loop())
        return self.outbox

    def _submit(self, call: Call, rows: list[Request]) -> None:
        """Queues every row or none: a call the queue cannot take whole gets RESOURCE_EXHAUSTED at once."""
        scheduler = self.engine.scheduler
        free = scheduler.cfg.max_waiting - scheduler.n_waiting  # only this loop adds, so it can only grow meanwhile
        if len(rows) > free:
            raise Rejected(Code.RESOURCE_EXHAUSTED, f"queue full: {scheduler.n_waiting} requests waiting "
                                                    f"(max_waiting={scheduler.cfg.max_waiting})", "queue_full")
        for row in rows:
            queue = self.outbox.open(row)
            try:
                self.engine.submit(row)
            except QueueFull as exc:  # cannot happen after the check above; kept so a call never half-queues
                raise Rejected(Code.RESOURCE_EXHAUSTED, f"queue full: {exc}", "queue_full") from exc
            call.rows.append((row, queue))

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
                                   total_seconds=since_arrival(row.finished_at)),
                sequences=[_sequence(s) for s in row.sequences])


def _sequence(s: Sequence) -> pb.Sequence:
    return pb.Sequence(text=s.text, token_ids=s.token_ids, finish_reason=_FINISH[s.finish_reason],
                       cumulative_logprob=s.cumulative_logprob, score=s.score,
                       logprobs=[pb.TokenLogprob(token_id=t.token_id, logprob=t.logprob, top_logprobs=[
                           pb.TopLogprob(token_id=i, logprob=lp) for i, lp in t.top]) for t in s.logprobs])


def _response(row: Request) -> pb.GenerateResponse:
    return pb.GenerateResponse(text=row.text, token_ids=row.output_ids, **_summary(row))
