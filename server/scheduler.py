"""Pure scheduling policy (no onnxruntime): which requests leave, which are encoded, which join the next step.

FCFS admission within the batch-size and KV-cache budgets, a bounded waiting queue, encode-ahead within a byte
budget, and the end of cancelled or expired requests (the rules themselves are finish.py's). A row may join or leave
between any two decoder steps.
"""
from __future__ import annotations

import collections
import threading
from dataclasses import dataclass

from seqserve.server import finish
from seqserve.server.request import Request, RequestStatus


@dataclass(frozen=True)
class SchedulerConfig:
    max_batch_size: int = 32  # rows in one decoder step
    max_waiting: int = 256  # queued requests beyond which new ones get RESOURCE_EXHAUSTED
    # Cache budget in token slots (per layer and K/V; bytes = slots x 2 x layers x d_model x 4). The cache is padded,
    # so admission bounds its worst case: rows x (longest source + largest max_new_tokens); a running row can then
    # never be evicted for lack of cache.
    max_kv_tokens: int = 65_536
    # Encode-ahead: when a joining request has no encoder output yet, the encoder also takes up to this many waiting
    # requests behind it, so under load it runs once per batch of arrivals instead of once per step on 1-2 rows.
    encode_batch: int = 64
    max_encoded_bytes: int = 64 << 20  # cross K/V held for waiting requests (encode-ahead stops at this budget)
    cross_bytes_per_token: int = 0  # set from the model by the app: K and V bytes of one source token, all layers


SWEEP_SECONDS = 0.01  # how stale a waiting request's cancel or deadline may be before it is noticed


class QueueFull(Exception):
    """The waiting queue is at max_waiting: the service answers RESOURCE_EXHAUSTED at once."""


@dataclass(frozen=True)
class Plan:
    retired: list[Request]  # rows that left since the last step: free their slots
    encode: list[Request]  # run the encoder on these now (every admitted one without K/V, then some ahead)
    admitted: list[Request]  # join this step
    dropped: list[Request]  # waiting requests that ended without running (cancelled, expired)


class Scheduler:
    def __init__(self, cfg: SchedulerConfig) -> None:
        self.cfg = cfg
        self.waiting: collections.deque[Request] = collections.deque()
        self.running: list[Request] = []
        self.encoded_bytes = 0  # cross K/V held by ENCODED waiting requests
        self._lock = threading.Lock()  # add() comes from the gRPC loop, schedule() from the engine thread
        self._swept = float("-inf")  # when _drop_abandoned last scanned the waiting queue

    def add(self, request: Request) -> None:
        with self._lock:
            if len(self.waiting) >= self.cfg.max_waiting:
                raise QueueFull(f"{len(self.waiting)} requests waiting (max_waiting={self.cfg.max_waiting})")
            self.waiting.append(request)

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    @property
    def n_waiting(self) -> int:
        return len(self.waiting)

    def schedule(self, now: float) -> Plan:
        for r in self.running:
            if not r.done and (reason := finish.abandoned(r, now)):
                r.end(reason, now)
        retired = [r for r in self.running if r.done]
        kept = [r for r in self.running if not r.done]
        with self._lock:
            dropped = self._drop_abandoned(now)
            admitted = self._admit(kept, now)
            encode = self._encode(admitted)
        self.running = kept + admitted
        return Plan(retired, encode, admitted, dropped)

    def _admit(self, kept: list[Request], now: float) -> list[Request]:
        admitted: list[Request] = []
        rows = sum(r.n_rows for r in kept)  # a beam request holds one row per beam
        longest = max((r.n_input_tokens for r in kept), default=0)
        most_new = max((r.params.max_new_tokens for r in kept), default=0)
        while self.waiting and rows < self.cfg.max_batch_size:
            head = self.waiting[0]
            if head.done:  # ended while waiting (its encoder failed): it has been counted already
                self.waiting.popleft()
                continue
            src, new = max(longest, head.n_input_tokens), max(most_new, head.params.max_new_tokens)
            if rows + head.n_rows > self.cfg.max_batch_size and rows:
                break  # a wide beam request waits for room; it is never overtaken (FCFS), and alone it always fits
            if _padded(rows + head.n_rows, src, new) > self.cfg.max_kv_tokens and rows:
                break  # FCFS: the head waits for cache rather than being overtaken (alone, it always runs)
            self.waiting.popleft()
            if head.status is RequestStatus.ENCODED:
                self.encoded_bytes -= self._cross_bytes(head)
            head.status, head.scheduled_at = RequestStatus.RUNNING, now
            admitted.append(head)
            rows, longest, most_new = rows + head.n_rows, src, new
        return admitted

    def _encode(self, admitted: list[Request]) -> list[Request]:
        """Admitted requests still without K/V, plus (only then) waiting ones from the head, within the budgets."""
        encode = [r for r in admitted if r.cross is None]
        if not encode:
            return encode  # the encoded pool covered this step: no encoder call at all
        for r in self.waiting:
            if len(encode) >= self.cfg.encode_batch:
                break
            if r.status is RequestStatus.ENCODED:
                continue
            size = self._cross_bytes(r)
            if self.encoded_bytes + size > self.cfg.max_encoded_bytes:
                break  # FCFS: never encode a later request ahead of an earlier one
            r.status = RequestStatus.ENCODED
            self.encoded_bytes += size
            encode.append(r)
        return encode

    def _cross_bytes(self, r: Request) -> int:
        return r.n_input_tokens * self.cfg.cross_bytes_per_token

    def _drop_abandoned(self, now: float) -> list[Request]:
        """Waiting requests whose client left or whose deadline passed end now, not when they reach the head.

        The queue is swept at most every SWEEP_SECONDS: a scan per decoder step would cost more than the step."""
        if now - self._swept < SWEEP_SECONDS and now >= self._swept:
            return []
        self._swept = now
        if not any(finish.abandoned(r, now) for r in self.waiting):
            return []
        alive, dropped = collections.deque(), []
        for r in self.waiting:
            if not r.done and (reason := finish.abandoned(r, now)):
                if r.status is RequestStatus.ENCODED:
                    self.encoded_bytes -= self._cross_bytes(r)
                r.end(reason, now)
                dropped.append(r)
            else:
                alive.append(r)
        self.waiting = alive
        return dropped

    def unencode(self, requests: list[Request]) -> None:
        """The encoder failed for these: they wait again without K/V (or have ended)."""
        for r in requests:
            if r.status is RequestStatus.ENCODED:
                r.status = RequestStatus.WAITING
                self.encoded_bytes -= self._cross_bytes(r)

    def drain(self, reason, now: float) -> None:
        """Ends every waiting and running request (the engine is stopping without running them)."""
        with self._lock:
            for r in [*self.waiting, *self.running]:
                if not r.done:
                    r.end(reason, now)
            self.waiting.clear()
            self.encoded_bytes = 0


def _padded(rows: int, longest_source: int, most_new_tokens: int) -> int:
    """The most cache token slots these rows can occupy together: every row is padded to the longest source, and the
    self-attention past is as long as the oldest row's age, which never exceeds its max_new_tokens."""
    return rows * (longest_source + most_new_tokens)
