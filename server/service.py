"""The gRPC edge (grpc.aio): validate -> EngineRequest -> engine.add -> await the engine's outputs -> protobuf.

Protobuf stays at this edge: only this module and responses.py (the result -> message builders) import generated
code (client.py is the client's side). The engine is an api.EngineClient, whatever runs it: its reports reach the
event loop through the model's Outbox (one hop per engine step) and each Output lands on its request's Pipe
(server/pipe.py), so the event loop never waits on inference.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import secrets
import time

import grpc

from seqserve.engine.api import ERROR_MESSAGE, EngineClient, EngineRequest, Output, QueueFull
from seqserve.engine.limits import Limits
from seqserve.engine.request import FinishReason, Result, SamplingParams
from seqserve.server import options
from seqserve.server.echo import listed, quoted
from seqserve.server.handlers import Undecodable, add_generation_service
from seqserve.server.inflight import Call, InFlight
from seqserve.server.languages import LanguageRefused, RequestLanguages, resolve
from seqserve.server.metrics import Metrics
from seqserve.server.outbox import Outbox
from seqserve.server.pipe import Pipe
from seqserve.server.responses import config_value, option_ranges, response, summary
from seqserve.server.served_model import ServedModel
from seqserve.v1 import seqserve_pb2 as pb
from seqserve.v1 import seqserve_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)
Code = grpc.StatusCode

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
        _refuse(message)


def _refuse(message: str) -> None:
    raise Rejected(Code.INVALID_ARGUMENT, message, "invalid_argument")


class GenerationService(pb_grpc.GenerationServicer):
    def __init__(self, metrics: Metrics, max_inflight_bytes: int) -> None:
        self.metrics = metrics
        self.models: dict[str, ServedModel] = {}  # the models taking calls, by name
        self.opened = False  # the first model was opened: from then on an empty table means none is served
        self.max_inflight_bytes = max_inflight_bytes  # server-wide: every model's calls together
        self.draining = False
        self.held: asyncio.Event | None = None  # the drain's last moment: new calls wait for it before their answer
        self.inflight = InFlight(metrics)
        self._ids = itertools.count(1)  # every EngineRequest's id: unique server-wide, so within any one engine

    def open(self, engine: EngineClient, outbox: Outbox, tokenizer, limits: Limits, model: dict,
             defaults: SamplingParams = options.NO_DEFAULTS, name: str = "", memory_bytes: int = 0
             ) -> ServedModel | None:
        """Starts answering generation calls for a model (the app calls it once its engine is started, its reports
        going to outbox). defaults: the model's generation defaults, which options a request leaves unset take.
        Returns the model's earlier version it replaces (to drain), if any."""
        max_chars = limits.max_input_tokens * max(map(len, tokenizer.get_vocab())) * _CHARS_PER_TOKEN_SLACK
        # an option left unset (null: d_kv = d_model / n_heads) has no value to send, so it is left out
        config = {k: config_value(v) for k, v in model.pop("config").items() if v is not None}
        info = pb.ModelInfo(limits=pb.Limits(**dataclasses.asdict(limits)), config=config,
                            option_ranges=option_ranges(), model=name, memory_bytes=memory_bytes, **model)
        metrics = self.metrics.for_model(name)
        metrics.model.info({"provider": model["execution_provider"], "variant": model["variant"],
                            "bundle_format_version": str(model["bundle_format_version"]),
                            "onnxruntime_version": model["onnxruntime_version"]})
        metrics.model_memory.set(memory_bytes)
        metrics.model_state.set(1)
        served = ServedModel(name, engine, outbox, tokenizer, limits, info, defaults, max_chars, metrics,
                             memory_bytes)
        if served.languages is not None:
            info.languages.update(served.languages.codes)
            info.source_language_placement = served.languages.source_placement
        earlier, self.models[name] = self.models.get(name), served
        self.opened = True
        return earlier

    def remove(self, name: str) -> ServedModel | None:
        """The model takes no new call from now on (NOT_FOUND); its calls in flight carry on. Returns it to drain."""
        served = self.models.pop(name, None)
        if served is not None:
            served.metrics.model_state.set(0)
        return served

    def add_to(self, server: grpc.aio.Server) -> None:
        add_generation_service(self, server)  # the generated handlers, with decoders that never raise

    def begin_drain(self) -> None:
        """New calls get UNAVAILABLE from now on; calls already in flight carry on."""
        self.draining = True

    def hold_new_calls(self) -> None:
        """New calls wait, unanswered, until release_held (server/arrivals.py says why)."""
        self.held = asyncio.Event()

    def release_held(self) -> None:
        if self.held is not None:
            self.held.set()

    @contextlib.asynccontextmanager
    async def _call(self, method: str, context: grpc.aio.ServicerContext, request, timed: bool = True):
        """Every RPC runs inside this: admission, counting, the status code, and releasing its rows. The call
        counts as in flight until its status is sent, so a drain waits for the status, not just the handler."""
        start, call, code, message = time.monotonic(), Call(context), Code.OK, ""
        self.inflight.enter(call)
        try:
            try:
                if self.held is not None:
                    await self.held.wait()
                self._admit(call, method, request)
                yield call
            except Rejected as exc:
                code, message = exc.code, exc.message
                if exc.reason:
                    self.metrics.rejected.labels(_label(call), exc.reason).inc()
            except (asyncio.CancelledError, GeneratorExit):  # the client went away, or its deadline passed
                code = Code.DEADLINE_EXCEEDED if call.expired(time.monotonic()) else Code.CANCELLED
                raise
            except Exception:
                log.exception("%s failed", method)
                code, message = Code.INTERNAL, ERROR_MESSAGE  # the log has the exception: the client sees no repr
            finally:
                call.release()
                self._count(call, method, code, time.monotonic() - start if timed else None)
            if code is not Code.OK:
                await context.abort(code, message)
        finally:
            if call.model is not None:
                call.model.leave(call)
            self.inflight.leave(call)

    def _count(self, call: Call, method: str, code: grpc.StatusCode, seconds: float | None) -> None:
        """Counts the call (and times it): through its model's metrics, whose children are kept, or model ""."""
        metrics, model = (self.metrics, ("",)) if call.model is None else (call.model.metrics, ())
        metrics.requests.labels(*model, method, code.name).inc()
        if seconds is not None:
            metrics.request_duration.labels(*model, method).observe(seconds)

    def _admit(self, call: Call, method: str, request) -> None:
        """Refuses a call before any work: the server is not ready or draining, the request could not be decoded,
        it names no served model, or its bytes would take the calls in flight beyond max_inflight_bytes."""
        if self.draining or not self.opened:
            raise Rejected(Code.UNAVAILABLE, "the server is shutting down" if self.draining else
                           "the model is still loading", "draining" if self.draining else "not_ready")
        if isinstance(request, Undecodable):
            log.warning("%s: refused a request that cannot be decoded (%d bytes): %s", method, request.size,
                        request.reason)
            raise Rejected(Code.INVALID_ARGUMENT, f"the request is not a valid {method} message: {request.reason}",
                           "undecodable")
        call.model = self._model(request.model)
        call.model.enter(call)
        size, most = request.ByteSize(), self.max_inflight_bytes
        if not self.inflight.hold(call, size, most):
            raise Rejected(Code.RESOURCE_EXHAUSTED, f"too many request bytes in flight: {self.inflight.bytes} held "
                                                    f"and this call has {size} (max_inflight_bytes={most})",
                           "inflight_bytes")

    def _model(self, name: str) -> ServedModel:
        """The model a request names; empty names the one model (with several it is required)."""
        served = listed(self.models) or "none (every model was unloaded)"
        if not name:
            if len(self.models) == 1:
                return next(iter(self.models.values()))
            if not self.models:
                raise Rejected(Code.NOT_FOUND, f"no model is served now; the models are: {served}", "unknown_model")
            raise Rejected(Code.INVALID_ARGUMENT, f"model must be set: this server serves several models ({served})",
                           "invalid_argument")
        model = self.models.get(name)
        if model is None:
            raise Rejected(Code.NOT_FOUND, f"model {quoted(name)} is not served here; the models are: {served}",
                           "unknown_model")
        return model

    async def Generate(self, request: pb.GenerateRequest, context) -> pb.GenerateResponse:
        async with self._call("Generate", context, request) as call:
            params, langs = self._params(call, request.options, secrets.randbits(64)), self._languages(call, request)
            row = self._new_request(call, request.input, "input", params, stream=False, langs=langs)
            self._submit(call, [row])
            return response(await self._result(call.rows[0][1]))

    async def GenerateStream(self, request: pb.GenerateRequest, context):
        async with self._call("GenerateStream", context, request) as call:
            params, langs = self._params(call, request.options, secrets.randbits(64)), self._languages(call, request)
            row = self._new_request(call, request.input, "input", params, stream=True, langs=langs)
            self._submit(call, [row])
            pipe = call.rows[0][1]
            while True:
                outputs = await pipe.take()  # a slow reader gets the backlog in one message
                end = outputs[-1]
                piece = (pb.GenerateStreamResponse(text=end.text, token_ids=end.token_ids) if len(outputs) == 1 else
                         pb.GenerateStreamResponse(text="".join(o.text for o in outputs),
                                                   token_ids=[t for o in outputs for t in o.token_ids]))
                _raise_for_refusal(end)
                if end.result is None:
                    yield piece
                    continue
                aborted = end.result.finish_reason in _ABORTS
                if aborted and (piece.text or piece.token_ids):  # what came before an abort still reaches the client
                    yield piece
                    piece = pb.GenerateStreamResponse()
                _raise_for_end(end.result)
                piece.MergeFrom(pb.GenerateStreamResponse(**summary(end.result)))
                yield piece
                return

    async def GenerateBatch(self, request: pb.GenerateBatchRequest, context) -> pb.GenerateBatchResponse:
        async with self._call("GenerateBatch", context, request) as call:
            n, most = len(request.inputs), call.model.limits.max_batch_inputs
            _check(n > 0, "inputs must not be empty")
            _check(n <= most, f"inputs has {n} entries, more than max_batch_inputs={most}")
            params, langs = self._params(call, request.options), self._batch_languages(call, request)
            rows = [self._new_request(call, text, f"inputs[{i}]", params, stream=False, langs=langs[i])
                    for i, text in enumerate(request.inputs)]
            self._submit(call, rows)
            results = [await self._result(pipe) for _, pipe in call.rows]  # all run at once in the engine
            return pb.GenerateBatchResponse(results=[response(r) for r in results])

    async def GetModelInfo(self, request: pb.GetModelInfoRequest, context) -> pb.ModelInfo:
        async with self._call("GetModelInfo", context, request, timed=False) as call:
            info = pb.ModelInfo()
            info.CopyFrom(call.model.info)
            info.models[:] = sorted(self.models)
            return info

    def _params(self, call: Call, o: pb.DecodingOptions, seed: int | None = None) -> SamplingParams:
        """Validated decoding options (INVALID_ARGUMENT names the field); a seed left unset becomes `seed`, or with
        None is drawn per input (_new_request)."""
        try:
            return options.sampling_params(o, call.model.limits, call.model.defaults,
                                           forced_eos=call.model.engine.info.forced_eos, seed=seed)
        except options.InvalidOption as exc:
            raise Rejected(Code.INVALID_ARGUMENT, str(exc), "invalid_argument") from None

    def _languages(self, call: Call, request) -> RequestLanguages | None:
        """The request's source and target languages, checked against the model's (server/languages.py)."""
        try:
            return resolve(call.model.languages, request.source_language, request.target_language)
        except LanguageRefused as exc:
            raise Rejected(Code.INVALID_ARGUMENT, str(exc), "invalid_argument") from None

    def _batch_languages(self, call: Call, request: pb.GenerateBatchRequest) -> list[RequestLanguages | None]:
        """Each input's languages: target_languages[i] when the call names one per input, else target_language."""
        n, targets = len(request.inputs), list(request.target_languages)
        if not targets:
            return [self._languages(call, request)] * n
        _check(len(targets) == n, f"target_languages has {len(targets)} entries; it must be empty or have one per "
                                  f"input ({n})")
        _check(not request.target_language, "target_language and target_languages cannot both be set")
        try:
            return [resolve(call.model.languages, request.source_language, target, f"target_languages[{i}]")
                    for i, target in enumerate(targets)]
        except LanguageRefused as exc:
            raise Rejected(Code.INVALID_ARGUMENT, str(exc), "invalid_argument") from None

    def _new_request(self, call: Call, text: str, field: str, params: SamplingParams, stream: bool,
                     langs: RequestLanguages | None = None) -> EngineRequest:
        model, most = call.model, call.model.limits.max_input_tokens
        if not text.strip():  # each message is formatted only when its check fails
            _refuse(f"{field} must not be empty or whitespace")
        if len(text) > model.max_chars:
            _refuse(f"{field} has {len(text)} characters, more than max_input_tokens={most} tokens can hold")
        ids = model.tokenizer.encode(text).ids
        if langs is not None:  # the source language token, where the model's tokenizer puts it
            ids = model.languages.source_ids(ids, langs.source)
        if len(ids) > most:
            _refuse(f"{field} has {len(ids)} tokens, more than max_input_tokens={most}")
        if params.seed is None:
            params = dataclasses.replace(params, seed=secrets.randbits(64))  # returned to the client
        return EngineRequest(next(self._ids), tuple(ids), params, stream=stream, deadline=call.deadline,
                             forced_bos=None if langs is None else langs.target_token)

    def _submit(self, call: Call, rows: list[EngineRequest]) -> None:
        """Queues every row or none: a call the engine cannot take whole gets RESOURCE_EXHAUSTED at once."""
        model = call.model
        pipes = [model.outbox.open(row.id) for row in rows]  # open first: the engine may answer at once
        try:
            model.engine.add(rows)
        except QueueFull as exc:
            for row in rows:
                model.outbox.close(row.id)
            raise Rejected(Code.RESOURCE_EXHAUSTED, f"queue full: {exc}", "queue_full") from None
        except BaseException:
            for row in rows:
                model.outbox.close(row.id)
            raise
        call.rows.extend(zip((row.id for row in rows), pipes))

    @staticmethod
    async def _result(pipe: Pipe) -> Result:
        while True:
            for output in await pipe.take():
                _raise_for_refusal(output)
                if output.result is not None:
                    _raise_for_end(output.result)
                    return output.result


def _label(call: Call) -> str:
    """The call's model label: its model's name, or "" when it was refused before naming a served one."""
    return "" if call.model is None else call.model.name


def _raise_for_refusal(output: Output) -> None:
    """An engine in another process refuses a request after add returned, when its queue is full: nothing ran."""
    if output.refused is not None:
        raise Rejected(Code.RESOURCE_EXHAUSTED, f"queue full: {output.refused}", "queue_full")


def _raise_for_end(result: Result) -> None:
    """Turns a result that is not a normal finish into the call's status."""
    if result.finish_reason is FinishReason.CANCELLED:  # a live call's row ends so only when its engine cannot go on
        raise Rejected(Code.UNAVAILABLE, result.error or "the server stopped before this generation finished")
    if result.error is not None or result.finish_reason is FinishReason.ERROR:
        raise Rejected(Code.INTERNAL, result.error or ERROR_MESSAGE)
    if result.finish_reason is FinishReason.DEADLINE:
        raise Rejected(Code.DEADLINE_EXCEEDED, "the deadline passed before the generation finished")
