"""One object per request, carried from the service through the scheduler and engine and back.

Status is an ordered enum: a request only moves forward (WAITING < RUNNING < FINISHED).
"""
from __future__ import annotations

import enum
import itertools
import threading
import time
from dataclasses import dataclass, field

_ids = itertools.count(1)


class RequestStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    FINISHED = 2


class FinishReason(enum.Enum):
    EOS = "eos"  # the model produced its end token
    LENGTH = "length"  # max_new_tokens reached
    STOP = "stop"  # a stop string appeared in the text
    CANCELLED = "cancelled"  # the client went away
    DEADLINE = "deadline"  # the gRPC deadline passed inside the loop


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
    seed: int = 0

    @property
    def greedy(self) -> bool:
        """Plain argmax: nothing alters the logits, so a whole batch of such rows is one argmax."""
        return self.temperature == 0.0 and self.repetition_penalty == 1.0 and self.min_new_tokens == 0


@dataclass(frozen=True)
class Event:
    """What the engine hands back to the service: new text and ids, or the end (finish_reason set)."""

    token_ids: tuple[int, ...] = ()
    text: str = ""
    finish_reason: FinishReason | None = None
    error: str | None = None  # set when inference failed: the service answers INTERNAL


@dataclass(eq=False)
class Request:
    input_ids: list[int]  # source ids as the encoder sees them (ending with the end token)
    params: SamplingParams
    deliver: callable = lambda event: None  # thread-safe sink for Events (the service binds it to its event loop)
    deadline: float | None = None  # time.monotonic() by which the request must end
    id: int = field(default_factory=lambda: next(_ids))
    arrival: float = field(default_factory=time.monotonic)
    status: RequestStatus = RequestStatus.WAITING
    output_ids: list[int] = field(default_factory=list)
    text: str = ""  # detokenised output so far (stop strings cut it)
    finish_reason: FinishReason | None = None
    error: str | None = None
    scheduled_at: float | None = None  # admitted into the running batch
    first_token_at: float | None = None
    last_token_at: float | None = None
    finished_at: float | None = None
    rng: object = None  # numpy Generator seeded from params.seed, made at the first sampled step
    _cancelled: threading.Event = field(default_factory=threading.Event, repr=False)

    def cancel(self) -> None:
        """Called from the service's thread; the engine drops the row at its next step."""
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def expired(self, now: float) -> bool:
        return self.deadline is not None and now >= self.deadline

    @property
    def n_input_tokens(self) -> int:
        return len(self.input_ids)

    def finish(self, reason: FinishReason, now: float) -> None:
        self.status = RequestStatus.FINISHED
        self.finish_reason = reason
        self.finished_at = now
        self.deliver(Event(finish_reason=reason))

    def fail(self, message: str, now: float) -> None:
        self.status = RequestStatus.FINISHED
        self.finished_at = now
        self.error = message
        self.deliver(Event(error=message))
