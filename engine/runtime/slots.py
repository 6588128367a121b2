"""The running batch as slots: which request (by id) holds each row, and every row's decoder state as preallocated
arrays.

A decoder step runs on rows [0, hi): every live row sits below hi, and a new row takes the lowest free slot, so the
batch stays dense without moving anyone. Per-row state lives in arrays updated by vector operations (one numpy call
per step for the whole batch, not a Python loop over rows): the tokens so far, the length, the limit.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Joining:
    """Rows that join the batch, one entry per row (a beam request's beams are its rows), by value: no Request."""

    request_ids: list[int]
    max_new: list[int]  # max_new_tokens
    min_new: list[int]  # min_new_tokens
    first: list[int]  # the row's own forced first token, -1: the model's rule
    penalty: list[float]  # repetition_penalty
    sampled: list[bool]  # the token is drawn, not an argmax

    @classmethod
    def of(cls, requests) -> Joining:
        """The rows of these requests (each holds n_rows rows)."""
        rows = [r for r in requests for _ in range(r.n_rows)]
        return cls([r.id for r in rows], [r.params.max_new_tokens for r in rows],
                   [r.params.min_new_tokens for r in rows],
                   [-1 if r.forced_bos is None else r.forced_bos for r in rows],
                   [r.params.repetition_penalty for r in rows], [not r.params.greedy for r in rows])

    def __len__(self) -> int:
        return len(self.request_ids)


class Slots:
    def __init__(self, capacity: int, max_new_tokens: int, decoder_start_id: int) -> None:
        self.capacity, self.decoder_start_id = capacity, decoder_start_id
        self.owners: list[int | None] = [None] * capacity  # the id of the request holding each row
        # (C, 1+T) the decoder start token, then the generated ids
        self.ids = np.full((capacity, max_new_tokens + 1), decoder_start_id, np.int64)
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

    def place(self, rows: Joining, into: list[int]) -> None:
        """rows take the slots into (one each)."""
        for i, slot in enumerate(into):
            self.owners[slot] = rows.request_ids[i]
            self.index.setdefault(rows.request_ids[i], []).append(slot)
        self.ids[into, 0] = self.decoder_start_id
        self.length[into] = 0
        self.max_new[into], self.min_new[into], self.first[into] = rows.max_new, rows.min_new, rows.first
        self.penalty[into], self.sampled[into] = rows.penalty, rows.sampled
        self.live[into] = True
        self.n_live += len(into)
        self.hi = max(self.hi, max(into) + 1)

    def release(self, slot: int) -> None:
        rows = self.index.get(self.owners[slot], [])
        rows.remove(slot)
        if not rows:
            del self.index[self.owners[slot]]
        self.owners[slot] = None
        self.live[slot] = False
        self.n_live -= 1
        self.length[slot] = 0
        for a in self._tracked:
            a[slot] = _BLANK.get(a.dtype, 0)
        while self.hi and not self.live[self.hi - 1]:
            self.hi -= 1

    def slot_of(self, request_id: int) -> int | None:
        """The request's (first) slot, None if it holds none."""
        rows = self.index.get(request_id)
        return rows[0] if rows else None

    def slots_of(self, request_id: int) -> list[int]:
        return self.index.get(request_id, [])

    def append(self, chosen: np.ndarray, rows: np.ndarray) -> None:
        """chosen (hi,) ids; rows (hi,) bool: the rows whose id is written after their tokens."""
        rows = np.flatnonzero(rows)
        self.length[rows] += 1
        self.ids[rows, self.length[rows]] = chosen[rows]

    def output(self, slot: int) -> list[int]:
        """The ids a row generated so far (the decoder start token excluded)."""
        return self.ids[slot, 1 : 1 + self.length[slot]].tolist()

    def move(self, src: int, dst: int) -> None:
        """Moves a live row to a free lower slot (compaction); the caller moves its cache rows too."""
        self.owners[dst], self.owners[src] = self.owners[src], None
        rows = self.index[self.owners[dst]]
        rows[rows.index(src)] = dst
        for a in (self.ids, self.length, self.max_new, self.min_new, self.first, self.penalty, self.sampled, self.live):
            a[dst] = a[src]
        self.live[src], self.length[src] = False, 0
        for a in self._tracked:
            a[dst] = a[src]
            a[src] = _BLANK.get(a.dtype, 0)
        while self.hi and not self.live[self.hi - 1]:
            self.hi -= 1

    def shared_prefix(self, a: np.ndarray, b: np.ndarray, n: int) -> np.ndarray:
        """(N,) how many of their first n tokens rows a and b have in common, pair by pair (beams of one request: in
        an int8 graph the K/V columns of a common prefix are equal, computed from the same tokens in the same steps)."""
        differ = self.ids[a, :n] != self.ids[b, :n]  # (N, n)
        return np.where(differ.any(axis=1), differ.argmax(axis=1), n)

    def copy_rows(self, dst: list[int], src: list[int]) -> None:
        """Beam search: rows dst continue from rows src's tokens (all read before any is written)."""
        self.ids[dst] = self.ids[src]
        self.length[dst] = self.length[src]


_BLANK = {np.dtype(object): None}  # what a freed row holds in a tracked array (0 / False otherwise)
