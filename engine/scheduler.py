"""Pure scheduling policy (no onnxruntime): which requests leave, which are encoded, which join the next step.

FCFS admission within the batch-size and KV-cache budgets, a bounded waiting queue, encode-ahead within a byte
budget, and the end of cancelled or expired requests (the rules themselves are finish.py's). A row may join or leave
between any two decoder steps. A request's status only moves forward (WAITING -> RUNNING -> FINISHED): which waiting
requests are already encoded is this scheduler's own record (their K/V are the engine's, by request id).
"""
from __future__ import annotations

import collections
import threading
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from seqserve.engine import finish
from seqserve.engine.api import QueueFull
from seqserve.engine.outputs import end
from seqserve.engine.request import Request, RequestStatus


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


# How stale a cancel or deadline may be before it is noticed: a running row costs a step, so it is looked at often;
# the waiting queue (up to max_waiting requests) costs nothing while it waits, and a scan of it costs more.
SWEEP_SECONDS = 0.01
WAITING_SWEEP_SECONDS = 0.1


@dataclass(frozen=True)
class Plan:
    retired: list[Request]  # rows that left since the last step: free their slots
    encode: list[Request]  # run the encoder on these now (every admitted one without K/V, then some ahead)
    admitted: list[Request]  # join this step
    dropped: list[Request]  # waiting requests that ended without running (cancelled, expired)
    abandoned: list[Request] = ()  # running requests this schedule ended (cancelled, expired): part of retired


class Scheduler:
    def __init__(self, cfg: SchedulerConfig) -> None:
        self.cfg = cfg
        self.waiting: collections.deque[Request] = collections.deque()
        self._running: dict[int, Request] = {}  # by id, in admission order
        self.rows = 0  # rows the running requests hold (one per beam)
        self._longest = self._most_new = 0  # running rows' longest source and max_new_tokens (may overstate: see _fits)
        self.encoded_bytes = 0  # cross K/V held for encoded waiting requests
        self._encoded: set[int] = set()  # ids of the waiting requests whose source is encoded (or is in this plan)
        self._lock = threading.Lock()  # add() comes from the gRPC loop, schedule() from the engine thread
        self._swept = self._swept_waiting = float("-inf")  # when running / waiting were last scanned

    def add(self, requests: Sequence[Request]) -> None:
        """Queues every request or none: the one queue-full rule (QueueFull names the limit)."""
        with self._lock:
            if len(self.waiting) + len(requests) > self.cfg.max_waiting:
                raise QueueFull(f"{len(self.waiting)} requests waiting (max_waiting={self.cfg.max_waiting})")
            self.waiting.extend(requests)

    @property
    def running(self) -> list[Request]:
        return list(self._running.values())

    def has_work(self) -> bool:
        return bool(self._running or self.waiting)

    @property
    def n_waiting(self) -> int:
        return len(self.waiting)

    def schedule(self, now: float, ended: list[Request] = ()) -> Plan:
        """ended: running requests the engine ended since the last call. Others that ended (cancelled, expired, or
        ended from outside) are found by a sweep at most every SWEEP_SECONDS: no per-row scan at every step."""
        retired = [r for r in ended if self._running.pop(r.id, None) is not None]
        with self._lock:
            dropped, abandoned = [], []
            if not (0 <= now - self._swept < SWEEP_SECONDS):
                self._swept = now
                swept = self._sweep_running(now)
                abandoned = [r for r, ended_here in swept if ended_here]
                retired += [r for r, _ in swept]
            if not (0 <= now - self._swept_waiting < WAITING_SWEEP_SECONDS):
                self._swept_waiting = now
                dropped = self._drop_abandoned(now)
            for r in retired:
                self.rows -= r.n_rows
            admitted, bare = self._admit(now)
            encode = self._encode(bare)
        return Plan(retired, encode, admitted, dropped, abandoned)

    def sweep_next(self) -> None:
        """The next schedule looks at every running and waiting request, however recent the last sweep (a test that
        held the engine between steps wants its cancel seen at the very next step)."""
        self._swept = self._swept_waiting = float("-inf")

    def _sweep_running(self, now: float) -> list[tuple[Request, bool]]:
        """(request, whether this sweep ended it) for every running request that has ended."""
        left = []
        for r in list(self._running.values()):
            ended_here = not r.done and (reason := finish.abandoned(r, now)) is not None
            if ended_here:
                end(r, reason, now)
            if r.done:
                left.append((self._running.pop(r.id), ended_here))
        return left

    def encoded(self, request: Request) -> bool:
        """Whether a waiting request's source is encoded already (encode-ahead)."""
        return request.id in self._encoded

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

    def _drop_abandoned(self, now: float) -> list[Request]:
        """Waiting requests whose client left or whose deadline passed end now, not when they reach the head."""
        if not any(finish.abandoned(r, now) for r in self.waiting):
            return []
        alive, dropped = collections.deque(), []
        for r in self.waiting:
            if not r.done and (reason := finish.abandoned(r, now)):
                self._forget_encoded(r)
                end(r, reason, now)
                dropped.append(r)
            else:
                alive.append(r)
        self.waiting = alive
        return dropped

    def unencode(self, requests: list[Request]) -> None:
        """The encoder failed for these: the waiting ones are no longer counted as encoded (their status stays)."""
        with self._lock:
            for r in requests:
                self._forget_encoded(r)

    def drain(self, reason, now: float) -> None:
        """Ends every waiting and running request (the engine is stopping without running them)."""
        with self._lock:
            for r in [*self.waiting, *self._running.values()]:
                if not r.done:
                    end(r, reason, now)
            self.waiting.clear()
            self._running.clear()
            self._encoded.clear()
            self.rows = self.encoded_bytes = 0


def _padded(rows: int, longest_source: int, most_new_tokens: int) -> int:
    """The most cache token slots these rows can occupy together: every row is padded to the longest source, and the
    self-attention past is as long as the oldest row's age, which never exceeds its max_new_tokens."""
    return rows * (longest_source + most_new_tokens)
