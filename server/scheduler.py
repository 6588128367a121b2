"""Pure scheduling policy (no onnxruntime): who runs in the next decoder step.

FCFS admission within the batch-size and KV-cache budgets, a bounded waiting queue, and retirement
of finished, cancelled and expired rows. A row may join or leave between any two decoder steps.
"""
from __future__ import annotations

import collections
import threading
from dataclasses import dataclass

from seqserve.server.request import FinishReason, Request, RequestStatus


@dataclass(frozen=True)
class SchedulerConfig:
    max_batch_size: int = 32  # rows in one decoder step
    max_waiting: int = 256  # queued requests beyond which new ones get RESOURCE_EXHAUSTED
    # Cache budget in token slots (per layer and K/V; bytes = slots x 2 x layers x d_model x 4). The cache is one
    # padded batch, so admission bounds its worst case: rows x (longest source + largest max_new_tokens). A running
    # row can then never be evicted for lack of cache. Free slots and unused past columns are dropped lazily
    # (kv_cache.py), so the cache can hold up to a third more slots and twice the past columns (or 8 more): leave
    # that headroom.
    max_kv_tokens: int = 65_536


SWEEP_SECONDS = 0.01  # how stale a waiting request's cancel or deadline may be before it is noticed


class QueueFull(Exception):
    """The waiting queue is at max_waiting: the service answers RESOURCE_EXHAUSTED at once."""


@dataclass(frozen=True)
class Plan:
    admitted: list[Request]  # new rows: encode their sources, then they join this step
    running: list[Request]  # this step's rows: kept rows first, then admitted (the runner places them in slots)
    retired: list[Request]  # rows that left since the last step: free their cache


class Scheduler:
    def __init__(self, cfg: SchedulerConfig) -> None:
        self.cfg = cfg
        self.waiting: collections.deque[Request] = collections.deque()
        self.running: list[Request] = []
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
        retired = [r for r in self.running if self._leaves(r, now)]
        kept = [r for r in self.running if r.status is RequestStatus.RUNNING]
        admitted = self._admit(kept, now)
        self.running = kept + admitted
        return Plan(admitted, list(self.running), retired)

    def _leaves(self, r: Request, now: float) -> bool:
        """Finishes a cancelled or expired row; True for every row that must leave the batch."""
        if r.status is RequestStatus.RUNNING and r.cancelled:
            r.finish(FinishReason.CANCELLED, now)
        elif r.status is RequestStatus.RUNNING and r.expired(now):
            r.finish(FinishReason.DEADLINE, now)
        return r.status is RequestStatus.FINISHED

    def _admit(self, kept: list[Request], now: float) -> list[Request]:
        admitted: list[Request] = []
        rows = len(kept)
        longest = max((r.n_input_tokens for r in kept), default=0)
        most_new = max((r.params.max_new_tokens for r in kept), default=0)
        with self._lock:
            self._drop_abandoned(now)
            while self.waiting and rows < self.cfg.max_batch_size:
                head = self.waiting[0]
                src, new = max(longest, head.n_input_tokens), max(most_new, head.params.max_new_tokens)
                if _padded(rows + 1, src, new) > self.cfg.max_kv_tokens and rows:
                    break  # FCFS: the head waits for cache rather than being overtaken (alone, it always runs)
                self.waiting.popleft()
                head.status, head.scheduled_at = RequestStatus.RUNNING, now
                admitted.append(head)
                rows, longest, most_new = rows + 1, src, new
        return admitted

    def _drop_abandoned(self, now: float) -> None:
        """Waiting requests whose client left or whose deadline passed end now, not when they reach the head.

        The queue is swept at most every SWEEP_SECONDS: a scan per decoder step would cost more than the step."""
        if now - self._swept < SWEEP_SECONDS and now >= self._swept:
            return
        self._swept = now
        if not any(r.cancelled or r.expired(now) for r in self.waiting):
            return
        alive = collections.deque()
        for r in self.waiting:
            if r.cancelled or r.expired(now):
                r.finish(FinishReason.CANCELLED if r.cancelled else FinishReason.DEADLINE, now)
            else:
                alive.append(r)
        self.waiting = alive

    def drain_waiting(self, reason: FinishReason, now: float) -> None:
        """Finishes every waiting request (used when the engine stops without running them)."""
        with self._lock:
            while self.waiting:
                self.waiting.popleft().finish(reason, now)


def padded_kv_tokens(rows: list[Request]) -> int:
    """The most cache slots these rows can ever occupy together: the runner pads every row to the longest source,
    and the self-attention past is as long as the oldest row's age, which never exceeds its max_new_tokens."""
    if not rows:
        return 0
    return _padded(len(rows), max(r.n_input_tokens for r in rows), max(r.params.max_new_tokens for r in rows))


def _padded(rows: int, longest_source: int, most_new_tokens: int) -> int:
    return rows * (longest_source + most_new_tokens)
