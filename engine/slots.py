"""The running batch as slots: which request holds each row, and every row's decoder state as preallocated arrays.

A decoder step runs on rows [0, hi): every live row sits below hi, and a new row takes the lowest free slot, so the
batch stays dense without moving anyone. Per-row state lives in arrays updated by vector operations (one numpy call
per step for the whole batch, not a Python loop over rows): the tokens so far, the length, the limit.
"""
from __future__ import annotations

import numpy as np

from seqserve.engine.request import Request


class Slots:
    def __init__(self, capacity: int, max_new_tokens: int, bos_id: int) -> None:
        self.capacity, self.bos_id = capacity, bos_id
        self.requests: list[Request | None] = [None] * capacity
        self.ids = np.full((capacity, max_new_tokens + 1), bos_id, np.int64)  # (C, 1+T) BOS, then generated ids
        self.length = np.zeros(capacity, np.int64)  # (C,) tokens generated = the position of the next input
        self.max_new = np.zeros(capacity, np.int64)  # (C,) each row's max_new_tokens
        self.min_new = np.zeros(capacity, np.int64)  # (C,) each row's min_new_tokens (the end token masked before)
        self.live = np.zeros(capacity, bool)  # (C,)
        self.hi = 0  # rows [0, hi) are stepped: every live row is below hi
        self.n_live = 0
        self.index: dict[int, list[int]] = {}  # request id -> its slots (one per beam)
        self._tracked: tuple[np.ndarray, ...] = ()  # per-row state kept elsewhere (beam.py), moved and cleared here
        self.first = np.full(capacity, -1, np.int64)  # (C,) each row's forced first token (-1: the model's rule)
        self.penalty = np.ones(capacity, np.float64)  # (C,) each row's repetition_penalty (1: off)
        self.sampled = np.zeros(capacity, bool)  # (C,) the row's token is drawn, not an argmax

    def track(self, *arrays: np.ndarray) -> None:
        """Per-row arrays (C, ...) that another component keeps: moved with their row, cleared when it is freed."""
        self._tracked += arrays

    def free(self, n: int) -> list[int]:
        """The n lowest free slots (placing rows low keeps hi, the stepped batch, small)."""
        found = np.flatnonzero(~self.live)[:n].tolist()
        if len(found) < n:
            raise RuntimeError(f"no free slot: {self.n_live} of {self.capacity} rows live")
        return found

    def place(self, request: Request, slot: int) -> None:
        self.requests[slot] = request
        self.index.setdefault(request.id, []).append(slot)
        self.ids[slot, 0] = self.bos_id
        self.length[slot] = 0
        self.max_new[slot] = request.params.max_new_tokens
        self.min_new[slot] = request.params.min_new_tokens
        self.first[slot] = -1 if request.forced_bos is None else request.forced_bos
        self.penalty[slot] = request.params.repetition_penalty
        self.sampled[slot] = not request.params.greedy
        self.live[slot] = True
        self.n_live += 1
        self.hi = max(self.hi, slot + 1)

    def release(self, slot: int) -> None:
        rows = self.index.get(self.requests[slot].id, [])
        rows.remove(slot)
        if not rows:
            del self.index[self.requests[slot].id]
        self.requests[slot] = None
        self.live[slot] = False
        self.n_live -= 1
        self.length[slot] = 0
        for a in self._tracked:
            a[slot] = _BLANK.get(a.dtype, 0)
        while self.hi and not self.live[self.hi - 1]:
            self.hi -= 1

    def slot_of(self, request: Request) -> int | None:
        """The request's (first) slot, None if it holds none."""
        rows = self.index.get(request.id)
        return rows[0] if rows else None

    def slots_of(self, request: Request) -> list[int]:
        return self.index.get(request.id, [])

    def append(self, chosen: np.ndarray, rows: np.ndarray) -> None:
        """chosen (hi,) ids; rows (hi,) bool: the rows whose id is written after their tokens."""
        rows = np.flatnonzero(rows)
        self.length[rows] += 1
        self.ids[rows, self.length[rows]] = chosen[rows]

    def output(self, slot: int) -> list[int]:
        """The ids a row generated so far (BOS excluded)."""
        return self.ids[slot, 1 : 1 + self.length[slot]].tolist()

    def move(self, src: int, dst: int) -> None:
        """Moves a live row to a free lower slot (compaction); the caller moves its cache rows too."""
        self.requests[dst], self.requests[src] = self.requests[src], None
        rows = self.index[self.requests[dst].id]
        rows[rows.index(src)] = dst
        for a in (self.ids, self.length, self.max_new, self.min_new, self.first, self.penalty, self.sampled, self.live):
            a[dst] = a[src]
        self.live[src], self.length[src] = False, 0
        for a in self._tracked:
            a[dst] = a[src]
            a[src] = _BLANK.get(a.dtype, 0)
        while self.hi and not self.live[self.hi - 1]:
            self.hi -= 1

    def copy_rows(self, dst: list[int], src: list[int]) -> None:
        """Beam search: rows dst continue from rows src's tokens (all read before any is written)."""
        self.ids[dst] = self.ids[src]
        self.length[dst] = self.length[src]


_BLANK = {np.dtype(object): None}  # what a freed row holds in a tracked array (0 / False otherwise)
