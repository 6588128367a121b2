"""The requests a front end has handed its engine process and not yet seen end (engine/remote/remote_engine.py): the
bound on
them, and ending them in the front end when the engine cannot (it died, it is silent, the server stops).

The bound is what the engine itself can hold (max_batch_size running + max_waiting queued): an engine that ends
nothing, stopped or wedged, cannot make the front end take more, so the queue limit answers RESOURCE_EXHAUSTED at
once as it does in-process. Requests aborted while the engine is silent (a deadline, a client gone, a drain past its
grace) end here; if the engine speaks again, their late outputs go nowhere and their finish is counted once.
"""
from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence

from seqserve.engine.api import Output, QueueFull, StepReport, StepStats
from seqserve.engine.request import FinishReason, Result


def cancelled(ids: Sequence[int], error: str | None = None, reason: FinishReason = FinishReason.CANCELLED
              ) -> StepReport:
    """The report that ends requests an engine can no longer finish (error: why, for the call's status)."""
    outputs = tuple(Output(i, result=Result(reason, error=error)) for i in ids)
    return StepReport(outputs, StepStats(finished=(reason.value,) * len(ids)))


class Held:
    """ids and lock: any thread (add takes the lock); aborted and abandoned: the socket thread only."""

    def __init__(self, most: int, hand: Callable[[StepReport], None]) -> None:
        self.most, self.hand = most, hand  # hand: delivers a report to the edge
        self.lock = threading.Lock()
        self.ids: set[int] = set()  # added and not yet ended
        self.aborted: dict[int, bool] = {}  # held ids whose ABORT went out: whether for their deadline
        self.abandoned: set[int] = set()  # aborted ids ended here while the engine was silent

    def take(self, ids: Sequence[int]) -> None:
        """Holds every id or none (QueueFull past the bound); the caller holds the lock."""
        if len(self.ids) + len(ids) > self.most:
            raise QueueFull(f"{len(self.ids)} requests are with the model's engine, which holds at most {self.most} "
                            "(max_batch_size + max_waiting)")
        self.ids.update(ids)

    def holds(self, request_id: int) -> bool:
        return request_id in self.ids

    def only_held(self, ids: Sequence[int]) -> list[int]:
        with self.lock:
            return [i for i in ids if i in self.ids]

    def ended(self, report: StepReport) -> StepReport:
        """An engine's report: the requests it ended leave; an abandoned request's outputs are dropped."""
        report = self._drop_abandoned(report)
        with self.lock:
            for out in report.outputs:
                if out.result is not None or out.refused is not None:
                    self.ids.discard(out.request_id)
                    self.aborted.pop(out.request_id, None)
        return report

    def end(self, ids: Sequence[int], error: str | None = None, reason: FinishReason = FinishReason.CANCELLED
            ) -> None:
        with self.lock:
            self.ids.difference_update(ids)
        for i in ids:
            self.aborted.pop(i, None)
        self.hand(cancelled(ids, error, reason))

    def end_all(self, error: str | None = None) -> int:
        """Ends every held request; how many there were."""
        with self.lock:
            ids = sorted(self.ids)
            self.ids.clear()
        self.aborted.clear()
        self.abandoned.clear()  # a new engine never reports them
        if ids:
            self.hand(cancelled(ids, error))
        return len(ids)

    def abandon(self) -> None:
        """The engine is silent: requests aborted so far end here, so none waits on an engine that may never answer."""
        with self.lock:
            ids = sorted(i for i in self.aborted if i in self.ids)
        aborted, self.aborted = self.aborted, {}
        self.abandoned.update(ids)
        for reason in (FinishReason.CANCELLED, FinishReason.DEADLINE):  # as the engine would have ended each
            if chosen := [i for i in ids if aborted[i] == (reason is FinishReason.DEADLINE)]:
                self.end(chosen, reason=reason)

    def _drop_abandoned(self, report: StepReport) -> StepReport:
        late = {o.request_id for o in report.outputs if o.request_id in self.abandoned}
        if not late:
            return report
        finished = list(report.stats.finished)
        for out in report.outputs:
            if out.request_id in late and out.result is not None:
                self.abandoned.discard(out.request_id)
                if out.result.finish_reason.value in finished:  # counted when it was ended here
                    finished.remove(out.result.finish_reason.value)
        outputs = tuple(o for o in report.outputs if o.request_id not in late)
        return StepReport(outputs, dataclasses.replace(report.stats, finished=tuple(finished)))
