"""Pure scheduling policy (no onnxruntime): which requests leave, which are encoded, which join the next step.

FCFS admission within the batch-size and KV-cache budgets, a bounded waiting queue, encode-ahead within a byte
budget, and the end of cancelled or expired requests. A row may join or leave between any two decoder steps. A
request's status only moves forward (WAITING -> RUNNING -> FINISHED): which waiting requests are already encoded is
this scheduler's own record (their K/V are the engine's, by request id).

Cancels are messages (vLLM's aborts queue): `abort` only appends to a queue, from any thread, and `schedule` drains it
at the start of the next step, with the deadlines that passed (a heap: the earliest is looked at, never every row),
so only the engine thread ever ends a request.
"""
from __future__ import annotations

import collections
import heapq
import threading
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from seqserve.engine.api import QueueFull
from seqserve.engine.request import FinishReason, Request, RequestStatus
from seqserve.engine.step.outputs import end


@dataclass(frozen=True)
class SchedulerConfig:
    """The scheduler's settings; the server's Settings take their defaults from here (from_settings copies them back by
    name), plus one the model gives."""

    max_batch_size: int = 32  # rows in one decoder step
    max_waiting: int = 256  # queued requests beyond which new ones get RESOURCE_EXHAUSTED
    # Cache budget in token slots (per layer and K/V; bytes = slots x 2 x layers x d_model x 4). The cache is padded,
    # so admission bounds its worst case: rows x (longest source + largest max_new_tokens); a running row can then
    # never be evicted for lack of cache.
    max_kv_tokens: int = 65_536
    # Encode-ahead: when a joining request has no encoder output yet, the encoder also takes up to this many waiting
    # requests behind it, so under load it runs once per batch of arrivals instead of once per step on 1-2 rows.
    encode_batch: int = 64
    max_encoded_bytes: int = 64 * 2**20  # cross K/V held for waiting requests (encode-ahead)
    cross_bytes_per_token: int = 0  # set from the model by the app: K and V bytes of one source token, all layers

    @classmethod
    def from_settings(cls, settings: Any, cross_bytes_per_token: int) -> SchedulerConfig:
        """Every field but cross_bytes_per_token taken by name from the server's settings."""
        named = {f.name: getattr(settings, f.name) for f in fields(cls) if f.name != "cross_bytes_per_token"}
        return cls(**named, cross_bytes_per_token=cross_bytes_per_token)


@dataclass(frozen=True)
class Plan:
    abandoned: list[Request]  # running requests this schedule ended (aborted, expired): free their rows
    encode: list[Request]  # run the encoder on these now (every admitted one without K/V, then some ahead)
    admitted: list[Request]  # join this step
    dropped: list[Request]  # waiting requests that ended without running (aborted, expired)


class Scheduler:
    def __init__(self, cfg: SchedulerConfig) -> None:
        self.cfg = cfg
        self.waiting: collections.deque[Request] = collections.deque()
        self._running: dict[int, Request] = {}  # by id, in admission order
        self.rows = 0  # rows the running requests hold (one per beam)
        self._longest = self._most_new = 0  # running rows' longest source and max_new_tokens (may overstate: see _fits)
        self.encoded_bytes = 0  # cross K/V held for encoded waiting requests
        self._encoded: set[int] = set()  # ids of the waiting requests whose source is encoded (or is in this plan)
        self._lock = threading.Lock()  # add() comes from the edge's thread, schedule() from the engine thread
        self._aborts: collections.deque[tuple[int, bool]] = collections.deque()  # (id, by deadline), any thread
        self._deadlines: list[tuple[float, int]] = []  # heap of (deadline, id) of the requests added with one

    def add(self, requests: Sequence[Request]) -> None:
        """Queues every request or none: the one queue-full rule (QueueFull names the limit)."""
        with self._lock:
            if len(self.waiting) + len(requests) > self.cfg.max_waiting:
                raise QueueFull(f"{len(self.waiting)} requests waiting (max_waiting={self.cfg.max_waiting})")
            self.waiting.extend(requests)
            for r in requests:
                if r.deadline is not None:
                    heapq.heappush(self._deadlines, (r.deadline, r.id))

    def abort(self, request_id: int, deadline: bool = False) -> None:
        """From any thread: the request ends at the start of the next schedule, DEADLINE when its call ran out of
        time, else CANCELLED (the first reason stands). An id this scheduler does not hold is ignored."""
        self._aborts.append((request_id, deadline))  # (deque.append is atomic: the edge never waits for a step)

    @property
    def running(self) -> list[Request]:
        return list(self._running.values())

    def has_work(self) -> bool:
        return bool(self._running or self.waiting or self._aborts)

    @property
    def n_waiting(self) -> int:
        return len(self.waiting)

    def schedule(self, now: float) -> Plan:
        """The aborts and passed deadlines first (those requests end here), then admission and encode-ahead."""
        with self._lock:
            abandoned, dropped = self._abandon(now)
            admitted, bare = self._admit(now)
            encode = self._encode(bare)
        return Plan(abandoned, encode, admitted, dropped)

    def retire(self, requests: Sequence[Request]) -> None:
        """Running requests that ended leave the batch's books (the engine frees their rows: Engine._retire)."""
        for r in requests:
            if self._running.pop(r.id, None) is not None:
                self.rows -= r.n_rows

    def _abandon(self, now: float) -> tuple[list[Request], list[Request]]:
        """Drains the aborts and the passed deadlines: (running requests ended, waiting requests ended)."""
        if len(self._deadlines) > 2 * (len(self._running) + len(self.waiting)) + 64:  # amortised: ended requests'
            held = {*self._running, *(r.id for r in self.waiting)}  # entries go once they outnumber the held ones
            self._deadlines = [e for e in self._deadlines if e[1] in held]
            heapq.heapify(self._deadlines)
        reasons: dict[int, FinishReason] = {}
        while self._aborts:
            rid, by_deadline = self._aborts.popleft()
            reasons.setdefault(rid, FinishReason.DEADLINE if by_deadline else FinishReason.CANCELLED)
        while self._deadlines and self._deadlines[0][0] <= now:
            reasons.setdefault(heapq.heappop(self._deadlines)[1], FinishReason.DEADLINE)
        if not reasons:
            return [], []
        abandoned = [r for i in reasons if (r := self._running.get(i)) is not None and not r.done]
        dropped = []
        if len(abandoned) < len(reasons) and any(r.id in reasons for r in self.waiting):
            dropped = [r for r in self.waiting if r.id in reasons and not r.done]
            self.waiting = collections.deque(r for r in self.waiting if r.id not in reasons)
        for r in [*abandoned, *dropped]:
            self._forget_encoded(r)
            end(r, reasons[r.id], now)
        self.retire(abandoned)
        return abandoned, dropped

    def _admit(self, now: float) -> tuple[list[Request], list[Request]]:
        """The requests that join, and those of them without K/V yet."""
        admitted: list[Request] = []
        bare: list[Request] = []
        while self.waiting and self.rows < self.cfg.max_batch_size:
            head = self.waiting[0]
            if head.done:  # ended while waiting (its encoder failed): it has been counted already
                self.waiting.popleft()
                continue
            if self.rows + head.n_rows > self.cfg.max_batch_size and self.rows:
                break  # a wide beam request waits for room; it is never overtaken (FCFS), and alone it always fits
            if not self._fits(head):
                break  # FCFS: the head waits for cache rather than being overtaken (alone, it always runs)
            self.waiting.popleft()
            if head.id in self._encoded:
                self._forget_encoded(head)
            else:
                bare.append(head)
            head.status, head.scheduled_at = RequestStatus.RUNNING, now
            admitted.append(head)
            self._running[head.id] = head
            self.rows += head.n_rows
            self._longest = max(self._longest, head.n_input_tokens)
            self._most_new = max(self._most_new, head.params.max_new_tokens)
        return admitted, bare

    def _fits(self, head: Request) -> bool:
        """The KV budget with head added. The kept maxima only grow (a leaving row may have held them), so a refusal
        is checked again against the exact maxima, recomputed then: rarely, since the budget seldom binds."""
        if not self._running:
            self._longest = self._most_new = 0
            return True
        for exact in (False, True):
            if exact:
                self._longest = max(r.n_input_tokens for r in self._running.values())
                self._most_new = max(r.params.max_new_tokens for r in self._running.values())
            src, new = max(self._longest, head.n_input_tokens), max(self._most_new, head.params.max_new_tokens)
            if _padded(self.rows + head.n_rows, src, new) <= self.cfg.max_kv_tokens:
                return True
        return False

    def _encode(self, bare: list[Request]) -> list[Request]:
        """Admitted requests still without K/V, plus (only then) waiting ones from the head, within the budgets."""
        encode = list(bare)
        if not encode:
            return encode  # the encoded pool covered this step: no encoder call at all
        for r in self.waiting:
            if len(encode) >= self.cfg.encode_batch:
                break
            if r.id in self._encoded:
                continue
            size = self._cross_bytes(r)
            if self.encoded_bytes + size > self.cfg.max_encoded_bytes:
                break  # FCFS: never encode a later request ahead of an earlier one
            self._encoded.add(r.id)
            self.encoded_bytes += size
            encode.append(r)
        return encode

    def _cross_bytes(self, r: Request) -> int:
        return r.n_input_tokens * self.cfg.cross_bytes_per_token

    def _forget_encoded(self, r: Request) -> None:
        if r.id in self._encoded:
            self._encoded.discard(r.id)
            self.encoded_bytes -= self._cross_bytes(r)

    def unencode(self, requests: list[Request]) -> None:
        """The encoder failed for these: the waiting ones are no longer counted as encoded (their status stays)."""
        with self._lock:
            for r in requests:
                self._forget_encoded(r)

    def drain(self, reason: FinishReason, now: float) -> list[Request]:
        """Ends every waiting and running request (the engine is stopping without running them); returns them."""
        with self._lock:
            ended = [r for r in [*self.waiting, *self._running.values()] if end(r, reason, now)]
            self.waiting.clear()
            self._running.clear()
            self._encoded.clear()
            self._aborts.clear()
            self._deadlines.clear()
            self.rows = self.encoded_bytes = 0
        return ended


def _padded(rows: int, longest_source: int, most_new_tokens: int) -> int:
    """The most cache token slots these rows can occupy together: every row is padded to the longest source, and the
    self-attention past is as long as the oldest row's age, which never exceeds its max_new_tokens."""
    return rows * (longest_source + most_new_tokens)
