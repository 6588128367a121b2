"""What a front end holds of its engine process (engine/remote/engine_held.py) and how it judges the engine's silence
(engine/remote/engine_watch.py): plain objects, no process; the fault suite (test_engine_faults.py) runs the real
thing."""
from __future__ import annotations

import pytest

from seqserve.engine.api import Output, QueueFull, StepReport, StepStats
from seqserve.engine.remote.engine_held import Held
from seqserve.engine.remote.engine_watch import HEARTBEAT_SECONDS, Silence, Watch
from seqserve.engine.request import FinishReason, Result


def _held(most: int = 3) -> tuple[Held, list[StepReport]]:
    handed: list[StepReport] = []
    return Held(most, handed.append), handed


def test_the_front_end_holds_no_more_than_the_engine_can():
    held, _ = _held(most=3)
    with held.lock:
        held.take([1, 2])
        with pytest.raises(QueueFull, match="at most 3"):
            held.take([3, 4])  # all or none
        held.take([3])
    assert held.ids == {1, 2, 3}
    held.ended(StepReport((Output(2, result=Result(FinishReason.EOS)),)))
    with held.lock:
        held.take([4])  # the engine ended one: room for one more
    assert held.ids == {1, 3, 4}


def test_requests_aborted_while_the_engine_is_silent_end_here_with_their_own_reason():
    held, handed = _held()
    with held.lock:
        held.take([1, 2, 3])
    held.aborted.update({1: True, 2: False})  # 1 for its deadline, 2 cancelled; 3 was never aborted
    held.abandon()
    ended = {o.request_id: o.result.finish_reason for r in handed for o in r.outputs}
    assert ended == {1: FinishReason.DEADLINE, 2: FinishReason.CANCELLED}
    assert sorted(f for r in handed for f in r.stats.finished) == ["cancelled", "deadline"]
    assert held.ids == {3}


def test_an_abandoned_request_s_late_output_is_dropped_and_its_finish_counted_once():
    held, handed = _held()
    with held.lock:
        held.take([1, 2])
    held.aborted[1] = False
    held.abandon()
    late = StepReport((Output(1, result=Result(FinishReason.CANCELLED)), Output(2, token_ids=(7,), text="x")),
                      StepStats(generated_tokens=1, finished=("cancelled",)))
    got = held.ended(late)
    assert [o.request_id for o in got.outputs] == [2]
    assert got.stats.finished == () and got.stats.generated_tokens == 1
    assert not held.abandoned


def test_end_all_says_why():
    held, handed = _held()
    with held.lock:
        held.take([5, 6])
    assert held.end_all("the engine went away") == 2
    assert {o.result.error for o in handed[0].outputs} == {"the engine went away"}
    assert held.end_all() == 0 and len(handed) == 1


def test_silence_counts_from_the_unanswered_ping():
    watch = Watch(Silence(not_ready=3, restart=6, abandon=1))
    now = watch.heard
    assert not watch.ping_due(now) and watch.silent(now) == 0
    assert watch.wake(now) == now + HEARTBEAT_SECONDS
    pinged = now + HEARTBEAT_SECONDS
    assert watch.ping_due(pinged) and not watch.ping_due(pinged + 0.1)  # one ping out at a time
    assert watch.silent(pinged + 2) == 2
    assert watch.wake(pinged + 0.5) == pinged + 1  # abandon, then not ready, then restart
    assert watch.wake(pinged + 2) == pinged + 3
    assert watch.wake(pinged + 4) == pinged + 6
    watch.hear(pinged + 5)
    assert watch.silent(pinged + 5) == 0


def test_a_crash_loop_backs_off_and_a_lasting_engine_restarts_at_once():
    watch = Watch(Silence())
    assert [watch.restart_delay(lasted=False) for _ in range(3)] == [0.0, 1.0, 2.0]
    assert watch.restart_delay(lasted=True) == 0.0
