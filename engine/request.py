"""One object per request, carried from the service through the scheduler, engine and runner and back.

Status is an ordered enum: a request only moves forward (WAITING < RUNNING < FINISHED; whether a waiting request's
source is already encoded is the scheduler's and the engine's business, not a status). Only the engine thread reads
or writes a Request: what goes back leaves as Outputs in the step's report (engine/step/outputs.py is their one writer),
the last one carrying the request's Result by value; an offline caller reads the finished Request's result. A cancel
is a message to the scheduler (Scheduler.abort), never a write to the Request.
"""
from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, field

_ids = itertools.count(1)


class RequestStatus(enum.IntEnum):
    WAITING = 0  # queued for admission (its source may already be encoded: encode-ahead)
    RUNNING = 1  # holds rows of the running batch
    FINISHED = 2  # ended: finish_reason says why


class FinishReason(enum.Enum):
    EOS = "eos"  # the model produced its end token
    LENGTH = "length"  # max_new_tokens reached
    STOP = "stop"  # a stop string appeared in the text
    CANCELLED = "cancelled"  # the client went away, or the server stopped before it finished
    DEADLINE = "deadline"  # the gRPC deadline passed inside the loop
    ERROR = "error"  # inference failed for this request (the service answers INTERNAL)


@dataclass(frozen=True)
class SamplingParams:
    """Decoding options, one name and default from the proto to the client to the load test.

    0 disables: temperature 0 = greedy, top_k 0 = no top-k; top_p 1.0 and repetition_penalty 1.0 = off.
    """

    max_new_tokens: int = 64
    min_new_tokens: int = 0
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = 0  # None only between validation and the service, which draws one per input
    num_beams: int = 1  # 1 = no beam search (model/beam.py is the reference for > 1)
    num_return_sequences: int = 1  # <= num_beams; the best first
    length_penalty: float = 1.0  # score = cumulative logprob / generated tokens (end token counted) ** this
    early_stopping: bool = False  # beams end at num_beams finished hypotheses (True) or by HF's heuristic (False)
    return_logprobs: bool = False  # report each generated token's log-probability
    top_logprobs: int = 0  # and this many most likely alternatives at each step

    @property
    def greedy(self) -> bool:
        """Argmax of the logits (min_new_tokens only masks the end token, for all such rows in one operation)."""
        return self.temperature == 0.0 and self.repetition_penalty == 1.0


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float  # the model's log-probability of this token (log_softmax of its logits)
    top: tuple[tuple[int, float], ...] = ()  # the top_logprobs most likely (id, logprob) at this step


@dataclass(frozen=True)
class Sequence:
    """One returned sequence: the greedy or sampled output, or one hypothesis of a beam search."""

    token_ids: list[int]  # end token excluded
    text: str
    finish_reason: FinishReason
    # Sum of the tokens' log-probabilities (the end token's included on EOS), and that / n ** length_penalty. Always
    # set for beams; for greedy and sampling only with return_logprobs, because it costs a log-softmax over the
    # vocabulary per token (measured: ~1 ms per step at batch 64 and 2,000 tokens on these CPUs, a third of a step).
    cumulative_logprob: float | None = None
    score: float | None = None
    logprobs: tuple[TokenLogprob, ...] = ()  # with return_logprobs: one per token that cumulative_logprob sums


@dataclass(frozen=True)
class Result:
    """A finished request, by value: built by the engine thread at the end and never changed, so the service can
    read it on the event loop while the engine goes on. sequences is empty when nothing was returned (CANCELLED,
    DEADLINE, ERROR)."""

    finish_reason: FinishReason
    sequences: tuple[Sequence, ...] = ()  # the best first
    input_tokens: int = 0
    generated_tokens: int = 0  # usage: the best sequence's tokens (the end token excluded)
    seed: int = 0
    queue_seconds: float = 0.0  # arrival to joining the running batch (0 if it never joined)
    first_token_seconds: float = 0.0  # arrival to the first generated token (0 if none)
    total_seconds: float = 0.0  # arrival to the end
    error: str | None = None  # set with FinishReason.ERROR: a message that names no internals

    @property
    def token_ids(self) -> list[int]:
        return self.sequences[0].token_ids if self.sequences else []

    @property
    def text(self) -> str:
        return self.sequences[0].text if self.sequences else ""


@dataclass(frozen=True)
class Output:
    """One request's news from one step, by value: new ids and text (streams), and on its last output its Result."""

    request_id: int
    token_ids: tuple[int, ...] = ()
    text: str = ""
    result: Result | None = None  # set on the last output only
    refused: str | None = None  # the engine refused the request (its queue was full): nothing ran, no result follows


@dataclass(eq=False)
class Request:
    input_ids: list[int]  # source ids as the encoder sees them (ending with the end token)
    params: SamplingParams = field(default_factory=SamplingParams)
    stream: bool = False  # True: an Output per step with the new text; False: only the final Output
    deadline: float | None = None  # time.monotonic() by which the request must end (the scheduler's deadline heap)
    forced_bos: int | None = None  # this row's forced first token (the target language's), over the model's own
    id: int = field(default_factory=lambda: next(_ids))
    arrival: float = field(default_factory=time.monotonic)
    status: RequestStatus = RequestStatus.WAITING
    result: Result | None = None  # once FINISHED: what the final Output carried (engine/step/outputs.py sets it)
    scheduled_at: float | None = None  # admitted into the running batch
    first_token_at: float | None = None

    @property
    def n_input_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def n_rows(self) -> int:
        """Rows of the running batch this request holds: one per beam."""
        return self.params.num_beams

    @property
    def done(self) -> bool:
        return self.status is RequestStatus.FINISHED

    # Offline callers' views of the result (derived, never stored twice).
    @property
    def output_ids(self) -> list[int]:
        """Generated ids (the end token excluded); [] until finished."""
        return self.result.token_ids if self.result is not None else []

    @property
    def sequences(self) -> tuple[Sequence, ...]:
        return self.result.sequences if self.result is not None else ()

    @property
    def text(self) -> str:
        return self.result.text if self.result is not None else ""

    @property
    def finish_reason(self) -> FinishReason | None:
        return None if self.result is None else self.result.finish_reason

    @property
    def error(self) -> str | None:
        return None if self.result is None else self.result.error
