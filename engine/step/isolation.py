"""Failure isolation: the encoder and decoder calls, and each request's bookkeeping, so that a failure ends the
requests that cause it and no other.

What each failure ends (the client sees INTERNAL with finish.ERROR_MESSAGE, which names no internals):
  * an encoder call that fails: each source is encoded alone, and only those that still fail end;
  * a decoder step that fails: the rows that fail alone (found by halving) end, the step is retried without them;
    if it fails again, no one row is the cause (out of memory, a broken session) and every running row ends;
  * an exception in one request's bookkeeping (`each`): that request alone;
  * an exception anywhere else in a step (a bug): every request still running (engine/step/loop.py); finished ones keep
    their result.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

import numpy as np

from seqserve.engine.request import Request
from seqserve.engine.runtime.runner import Runner
from seqserve.engine.step.stats import Stats
from seqserve.engine.step_output import Need, StepOutput

log = logging.getLogger("seqserve.engine.step.engine")


class Isolation:
    def __init__(self, runner: Runner, stats: Stats, end_error: Callable[[Request], None],
                 retire: Callable[[list[Request]], None], request_at: Callable[[int], Request]) -> None:
        """end_error ends a request with ERROR and retire frees what it held (the engine's ways); request_at: the
        request holding a slot."""
        self.runner, self.stats, self._request_at = runner, stats, request_at
        self._end_error, self._retire = end_error, retire

    def each(self, items: Iterable, work: Callable) -> None:
        """work(item) for each item (a record, a request or a BeamResult) whose request still runs; an exception
        ends that request alone with ERROR and the others go on."""
        for item in items:
            r = getattr(item, "request", item)
            if r.done:
                continue
            try:
                work(item)
            except Exception:
                log.exception("request %d failed in the engine's bookkeeping; ending it alone", r.id)
                self._end_error(r)

    def encode(self, requests: list[Request]) -> tuple[dict[int, object], list[Request]]:
        """The sources' cross K/V by request id, and the requests whose source fails the encoder on its own."""
        try:
            cross, seconds = self.runner.encode([r.id for r in requests], [r.input_ids for r in requests])
            self.stats.encoder_seconds.append(seconds)
            return cross, []
        except Exception:
            log.exception("encoder failed for %d sources; isolating the cause", len(requests))
        cross, failed = {}, []
        for r in requests:
            try:
                cross.update(self.runner.encode([r.id], [r.input_ids])[0])
            except Exception:
                failed.append(r)
        return cross, failed

    def run(self, need: Need = Need.LOGITS) -> StepOutput | None:
        """One decoder step for every live row; None when every row failed."""
        start = time.perf_counter()
        try:
            out = self.runner.run_step(need)
        except Exception:
            log.exception("decoder step failed for %d rows; isolating the cause", self.runner.slots.n_live)
            self.fail(self._culprits(self.live()))
            if not self.runner.slots.n_live:
                return None
            try:
                out = self.runner.run_step(need)
            except Exception:  # not caused by any one row (out of memory, a broken session): fail everyone
                log.exception("decoder step failed again without the failing rows")
                self.fail(self.live())
                return None
        self.stats.decoder_seconds.append(time.perf_counter() - start)
        self.stats.batch_rows.append(self.runner.slots.n_live)
        return out

    def _culprits(self, rows: list[int]) -> list[int]:
        """The rows whose step fails on their own, found by halving (a handful of probes for one bad row)."""
        try:
            self.runner.probe(rows)
            return []
        except Exception:
            if len(rows) == 1:
                return rows
            return self._culprits(rows[: len(rows) // 2]) + self._culprits(rows[len(rows) // 2 :])

    def live(self) -> list[int]:
        return np.flatnonzero(self.runner.slots.live).tolist()

    def fail(self, rows: list[int]) -> None:
        """These rows' requests end with ERROR and leave now (a retried step runs without them), unless they had
        finished (their result stands)."""
        failed = list(dict.fromkeys(self._request_at(i) for i in rows))  # a beam request holds several rows
        for r in failed:
            self._end_error(r)
        self._retire(failed)
