"""A small synchronous Python client for seqserve.v1.Generation.

    with Client("127.0.0.1:50051") as client:
        print(client.generate("<fr> 1 234", max_new_tokens=20).text)
        for piece in client.stream("<fr> 1 234", temperature=0.8, seed=1):
            print(piece.text, end="", flush=True)
        print()

Decoding options are keywords named exactly as the proto's DecodingOptions fields (an unknown name raises
ValueError); None leaves an option unset (it is not sent), so the model's default applies, else the
server's. Errors are grpc.RpcError.
TLS, a client certificate and a bearer token: `Client(address, connection=Connection(ca_file=..., token=...))`.
A server with several models: `Client(address, model="en-de")`, or `model=` per call (it wins).
"""
from __future__ import annotations

import argparse
from collections.abc import Iterator
from dataclasses import dataclass

from google.protobuf.descriptor import FieldDescriptor

from seqserve.client.channel import Connection
from seqserve.client.flags import DEFAULT_ADDRESS, flag, parse_bool
from seqserve.v1 import seqserve_pb2 as pb
from seqserve.v1 import seqserve_pb2_grpc as pb_grpc

OPTION_NAMES = tuple(f.name for f in pb.DecodingOptions.DESCRIPTOR.fields)

# Help of each decoding flag; the flags themselves are derived from the proto so their names cannot drift. "Unset =
# the model's default" is the proto's wording: a flag left out is not sent, so the model's generation default applies.
MODEL_DEFAULT = "unset = the model's default, else"
OPTION_HELP = {
    "max_new_tokens": f"most tokens to generate ({MODEL_DEFAULT} the server's)",
    "min_new_tokens": "the end token is suppressed until this many tokens were generated; 0 = none "
                      f"({MODEL_DEFAULT} 0)",
    "temperature": f"0 = greedy ({MODEL_DEFAULT} 0)",
    "top_k": f"0 = disabled ({MODEL_DEFAULT} 0)",
    "top_p": f"in (0, 1]; 1 = disabled ({MODEL_DEFAULT} 1)",
    "repetition_penalty": f"1 = disabled ({MODEL_DEFAULT} 1)",
    "stop": "stop string (repeatable)",
    "seed": "sampling seed (unset = chosen by the server and returned)",
    "num_beams": f"beam search width; 1 = off; > 1 needs temperature 0 ({MODEL_DEFAULT} 1)",
    "num_return_sequences": f"sequences returned, best first; at most num_beams ({MODEL_DEFAULT} 1)",
    "length_penalty": "score = cumulative logprob / generated tokens ** length_penalty; > 0 favours longer "
                      f"({MODEL_DEFAULT} 1)",
    "early_stopping": "beams end as soon as num_beams hypotheses are finished; --no-early-stopping: when no live beam "
                      f"can beat the worst finished one (HF's heuristic) ({MODEL_DEFAULT} the heuristic)",
    "return_logprobs": "return each generated token's log-probability",
    "top_logprobs": "with --return-logprobs, also this many most likely tokens per step; 0 = none",
}


_FLAG_TYPES = {FieldDescriptor.TYPE_UINT32: int, FieldDescriptor.TYPE_INT32: int, FieldDescriptor.TYPE_UINT64: int,
               FieldDescriptor.TYPE_FLOAT: float, FieldDescriptor.TYPE_STRING: str,
               FieldDescriptor.TYPE_BOOL: parse_bool}


def add_decoding_arguments(parser) -> None:
    """One flag per DecodingOptions field, named after it (`--max-new-tokens`); every command that decodes uses this."""
    for f in pb.DecodingOptions.DESCRIPTOR.fields:
        name = flag(f.name)
        if f.type == FieldDescriptor.TYPE_BOOL:  # --return-logprobs / --no-return-logprobs; absent = unset
            parser.add_argument(name, action=argparse.BooleanOptionalAction, default=None, help=OPTION_HELP[f.name])
        else:
            parser.add_argument(name, type=_FLAG_TYPES[f.type], help=OPTION_HELP[f.name],
                                action="append" if f.is_repeated else "store")


def option_flags(decoding: dict) -> list[str]:
    """The flags that give these decoding keywords back through add_decoding_arguments (None = left out)."""
    flags = []
    for name, value in decoding.items():
        if isinstance(value, bool):
            flags.append(flag(name) if value else flag("no_" + name))
            continue
        for v in value if isinstance(value, list) else [] if value is None else [value]:
            flags.append(f"{flag(name)}={v}")  # `=` keeps a stop string like "-" a value
    return flags


def decoding_from_args(args) -> dict:
    """The decoding keywords for options()/Client from parsed flags (None = unset).

    Also accepts the plain strings locust's web UI puts in place of flags it shows ("" = unset).
    """
    decoding = {}
    for f in pb.DecodingOptions.DESCRIPTOR.fields:
        value = getattr(args, f.name, None)
        if isinstance(value, str):
            value = None if not value.strip() else [value] if f.is_repeated else _FLAG_TYPES[f.type](value)
        decoding[f.name] = value
    return decoding


@dataclass(frozen=True)
class Result:
    """One finished generation."""

    text: str
    token_ids: list[int]
    finish_reason: str  # eos | length | stop | cancelled | deadline
    input_tokens: int
    generated_tokens: int
    queue_seconds: float
    first_token_seconds: float
    total_seconds: float
    seed: int
    sequences: tuple[Sequence, ...] = ()  # best first; sequences[0] is text / token_ids / finish_reason above


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token's log-probability, with the most likely (token_id, logprob) at its step when asked."""

    token_id: int
    logprob: float
    top_logprobs: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class Sequence:
    """One returned sequence (a beam hypothesis, or the greedy / sampled output). On eos, logprobs has one entry more
    than token_ids: the last is the end token's (token_ids and text leave it out)."""

    text: str
    token_ids: list[int]
    finish_reason: str  # eos | length | stop
    cumulative_logprob: float | None  # the end token's included on eos; None: not computed (no return_logprobs)
    score: float | None  # cumulative_logprob / (len(token_ids) + end token) ** length_penalty; None as above
    logprobs: tuple[TokenLogprob, ...] = ()  # with return_logprobs: one per token cumulative_logprob sums


@dataclass(frozen=True)
class Piece:
    """One streamed message: new text and ids; the last one also carries the whole Result."""

    text: str
    token_ids: list[int]
    result: Result | None = None


def options(**kwargs) -> pb.DecodingOptions:
    unknown = sorted(set(kwargs) - set(OPTION_NAMES))
    if unknown:
        raise ValueError(f"unknown decoding option(s) {unknown}; the options are {list(OPTION_NAMES)}")
    return pb.DecodingOptions(**{k: v for k, v in kwargs.items() if v is not None})


def _finish_name(value: int) -> str:
    return pb.FinishReason.Name(value).removeprefix("FINISH_REASON_").lower()


def _sequence(s: pb.Sequence) -> Sequence:
    logprobs = tuple(TokenLogprob(t.token_id, t.logprob, tuple((a.token_id, a.logprob) for a in t.top_logprobs))
                     for t in s.logprobs)
    return Sequence(text=s.text, token_ids=list(s.token_ids), finish_reason=_finish_name(s.finish_reason),
                    cumulative_logprob=s.cumulative_logprob if s.HasField("cumulative_logprob") else None,
                    score=s.score if s.HasField("score") else None, logprobs=logprobs)


def _result(m, text: str, token_ids: list[int]) -> Result:
    return Result(text=text, token_ids=token_ids, finish_reason=_finish_name(m.finish_reason),
                  input_tokens=m.usage.input_tokens, generated_tokens=m.usage.generated_tokens,
                  queue_seconds=m.timings.queue_seconds, first_token_seconds=m.timings.first_token_seconds,
                  total_seconds=m.timings.total_seconds, seed=m.seed,
                  sequences=tuple(_sequence(s) for s in m.sequences))


class Client:
    def __init__(self, address: str = DEFAULT_ADDRESS, timeout: float | None = None,
                 connection: Connection = Connection(), model: str | None = None) -> None:
        """timeout: the default deadline of every call in seconds (None = no deadline); connection: plaintext by
        default, or TLS / mutual TLS / a bearer token; model: the model every call names unless it names its own
        (None: the server's one model)."""
        self.address, self.timeout, self.model = address, timeout, model
        self.channel = connection.channel(address)
        self.stub = pb_grpc.GenerationStub(self.channel)

    def _model(self, model: str | None) -> str:
        return model or self.model or ""

    def generate(self, input: str, *, timeout: float | None = None, model: str | None = None, source_language: str = "",
                 target_language: str = "", **decoding) -> Result:
        """source_language / target_language: a multilingual model's codes (model_info()["languages"])."""
        m = self.generate_response(input, timeout=timeout, model=model, source_language=source_language,
                                   target_language=target_language, **decoding)
        return _result(m, m.text, list(m.token_ids))

    def generate_response(self, input: str, *, timeout: float | None = None, model: str | None = None,
                          source_language: str = "", target_language: str = "", **decoding) -> pb.GenerateResponse:
        """The server's GenerateResponse itself (`seqserve generate --json` prints it)."""
        return self.stub.Generate(pb.GenerateRequest(input=input, options=options(**decoding), model=self._model(model),
                                                     source_language=source_language, target_language=target_language),
                                  timeout=timeout or self.timeout)

    def stream(self, input: str, *, timeout: float | None = None, model: str | None = None, source_language: str = "",
               target_language: str = "", **decoding) -> Iterator[Piece]:
        """Yields pieces as the server produces them; breaking out of the loop cancels the call."""
        text, ids = [], []
        for m in self.stream_responses(input, timeout=timeout, model=model, source_language=source_language,
                                       target_language=target_language, **decoding):
            text.append(m.text)
            ids += m.token_ids
            final = _result(m, "".join(text), ids) if m.finish_reason else None
            yield Piece(m.text, list(m.token_ids), final)

    def stream_responses(self, input: str, *, timeout: float | None = None, model: str | None = None,
                         source_language: str = "", target_language: str = "",
                         **decoding) -> Iterator[pb.GenerateStreamResponse]:
        """The server's GenerateStreamResponse messages themselves; breaking out of the loop cancels the call."""
        call = self.stub.GenerateStream(pb.GenerateRequest(input=input, options=options(**decoding),
                                                           model=self._model(model), source_language=source_language,
                                                           target_language=target_language),
                                        timeout=timeout or self.timeout)
        try:
            yield from call
        finally:
            call.cancel()  # no-op once the stream ended; frees the server's row if the caller stopped early

    def generate_batch(self, inputs: list[str], *, timeout: float | None = None, model: str | None = None,
                       source_language: str = "", target_language: str = "", target_languages: list[str] | None = None,
                       **decoding) -> list[Result]:
        """target_languages: one target language per input (instead of target_language for all)."""
        m = self.stub.GenerateBatch(pb.GenerateBatchRequest(inputs=inputs, options=options(**decoding),
                                                            model=self._model(model), source_language=source_language,
                                                            target_language=target_language,
                                                            target_languages=target_languages or []),
                                    timeout=timeout or self.timeout)
        return [_result(r, r.text, list(r.token_ids)) for r in m.results]

    def model_info(self, timeout: float | None = None, model: str | None = None) -> dict:
        m = self.stub.GetModelInfo(pb.GetModelInfoRequest(model=self._model(model)), timeout=timeout or self.timeout)
        return {"model": m.model, "models": list(m.models), "memory_bytes": m.memory_bytes,
                "config": {k: getattr(v, v.WhichOneof("kind")) for k, v in m.config.items()},  # typed values
                "bundle_format_version": m.bundle_format_version, "variant": m.variant,
                "execution_provider": m.execution_provider, "onnxruntime_version": m.onnxruntime_version,
                "quality": dict(m.quality), "limits": {f.name: getattr(m.limits, f.name)
                                                       for f in pb.Limits.DESCRIPTOR.fields},
                "option_ranges": {k: {"min": r.min, "max": r.max, "min_exclusive": r.min_exclusive}
                                  for k, r in m.option_ranges.items()},
                "languages": dict(m.languages), "source_language_placement": m.source_language_placement}

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
