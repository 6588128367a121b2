"""The scheduler as pure policy (no onnxruntime): FCFS admission within batch and KV-cache budgets, a bounded queue,
retirement of finished rows, aborts drained at the next schedule and expired deadlines."""
from __future__ import annotations

import pytest

from seqserve.engine.request import FinishReason, Request, RequestStatus, SamplingParams
from seqserve.engine.step.outputs import end
from seqserve.engine.step.scheduler import QueueFull, Scheduler, SchedulerConfig


def req(src_len: int = 4, max_new: int = 8, deadline: float | None = None) -> Request:
    return Request(input_ids=list(range(4, 4 + src_len)), params=SamplingParams(max_new_tokens=max_new),
                   deadline=deadline)


def test_fcfs_up_to_max_batch_size_and_a_finished_row_makes_room_at_the_next_step():
    s = Scheduler(SchedulerConfig(max_batch_size=2))
    a, b, c = req(), req(), req()
    for r in (a, b, c):
        s.add([r])
    plan = s.schedule(now=0.0)
    assert plan.admitted == [a, b] and s.running == [a, b] and plan.abandoned == []
    assert c.status is RequestStatus.WAITING and plan.encode == [a, b, c] and s.n_waiting == 1  # encoded ahead
    end(a, FinishReason.EOS, 1.0)
    s.retire([a])
    plan = s.schedule(now=1.0)
    assert plan.admitted == [c] and plan.encode == [] and s.running == [b, c]  # kept rows first, then new ones


def test_kv_budget_counts_the_padded_batch_not_the_sum_of_rows():
    """Each row alone needs 44 slots (88 together fit 100), but padded to the longest source and output it is
    2 x (40 + 40) = 160: only one row is admitted."""
    long_source, long_output = req(src_len=40, max_new=4), req(src_len=4, max_new=40)
    s = Scheduler(SchedulerConfig(max_kv_tokens=100))
    s.add([long_source])
    s.add([long_output])
    assert s.schedule(now=0.0).admitted == [long_source]  # 44 + 44 fits a sum, 160 padded slots do not
    end(long_source, FinishReason.EOS, 1.0)
    s.retire([long_source])
    assert s.schedule(now=1.0).admitted == [long_output]


def test_the_head_waits_for_cache_and_is_never_overtaken():
    s = Scheduler(SchedulerConfig(max_kv_tokens=50))
    running, big, small = req(src_len=4, max_new=8), req(src_len=4, max_new=40), req(src_len=2, max_new=2)
    for r in (running, big, small):
        s.add([r])
    assert s.schedule(now=0.0).admitted == [running]
    assert s.schedule(now=0.1).admitted == []  # small would fit, but big is first in line
    end(running, FinishReason.LENGTH, 0.2)
    s.retire([running])
    assert s.schedule(now=0.2).admitted == [big]  # 44 slots alone; with small, 2 x 44 would not fit
    assert s.n_waiting == 1


def test_a_row_over_the_whole_budget_still_runs_alone():
    s = Scheduler(SchedulerConfig(max_kv_tokens=10))
    huge = req(src_len=30, max_new=30)
    s.add([huge])
    assert s.schedule(now=0.0).admitted == [huge]


def test_queue_full_is_refused_at_once():
    s = Scheduler(SchedulerConfig(max_waiting=2))
    s.add([req()])
    s.add([req()])
    with pytest.raises(QueueFull, match="max_waiting=2"):
        s.add([req()])


def test_a_batch_the_queue_cannot_take_whole_is_refused_whole():
    s = Scheduler(SchedulerConfig(max_waiting=2))
    s.add([req()])
    with pytest.raises(QueueFull, match="max_waiting=2"):
        s.add([req(), req()])  # one place is free: neither is queued
    assert s.n_waiting == 1
    s.add([req()])
    assert s.n_waiting == 2


def test_aborts_and_passed_deadlines_end_running_and_waiting_requests_at_the_next_schedule():
    s = Scheduler(SchedulerConfig(max_batch_size=2))
    running_cancel, running_late = req(), req(deadline=5.0)
    waiting_cancel, waiting_late = req(), req(deadline=5.0)
    for r in (running_cancel, running_late, waiting_cancel, waiting_late):
        s.add([r])
    s.schedule(now=0.0)
    s.abort(running_cancel.id)
    s.abort(running_cancel.id, deadline=True)  # the first reason stands
    s.abort(waiting_cancel.id)
    s.abort(10**9)  # an id it does not hold: ignored
    assert not any(r.done for r in (running_cancel, waiting_cancel))  # a message: nothing ends before the schedule
    plan = s.schedule(now=6.0)
    assert plan.abandoned == [running_cancel, running_late] and s.running == [] and s.n_waiting == 0
    assert plan.dropped == [waiting_cancel, waiting_late] and s.rows == 0
    assert [r.finish_reason for r in (running_cancel, running_late, waiting_cancel, waiting_late)] == [
        FinishReason.CANCELLED, FinishReason.DEADLINE, FinishReason.CANCELLED, FinishReason.DEADLINE]
    assert not s.has_work()


def test_a_deadline_ends_its_request_at_the_first_schedule_after_it_and_not_before():
    s = Scheduler(SchedulerConfig())
    late = req(deadline=5.0)
    s.add([late])
    assert s.schedule(now=4.999).admitted == [late] and not late.done
    plan = s.schedule(now=5.0)
    assert plan.abandoned == [late] and late.finish_reason is FinishReason.DEADLINE
    s.abort(late.id, deadline=True)  # the edge's abort of an ended request changes nothing
    assert s.schedule(now=6.0).abandoned == [] and late.finish_reason is FinishReason.DEADLINE


def test_the_deadline_heap_forgets_requests_that_ended_long_before_their_deadline():
    """A generous deadline (an hour) on every call must not keep every ended call in the heap for that hour."""
    s = Scheduler(SchedulerConfig(max_batch_size=1))
    for i in range(1000):
        r = req(deadline=3600.0)
        s.add([r])
        assert s.schedule(now=float(i)).admitted == [r]
        end(r, FinishReason.EOS, float(i))
        s.retire([r])
    assert len(s._deadlines) <= 2 * 1 + 64 + 1  # (the heap itself: nothing outside reads it)


def test_encode_ahead_takes_waiting_requests_in_order_within_the_byte_budget():
    """The encoder runs only when a joining row has no K/V; then it also takes the queue's head, in FCFS order, until
    encode_batch or the byte budget stops it, and never skips a request to fit a later one."""
    s = Scheduler(SchedulerConfig(max_batch_size=1, encode_batch=4, cross_bytes_per_token=10, max_encoded_bytes=100))
    first, a, b, big, c = req(src_len=4), req(src_len=4), req(src_len=4), req(src_len=5), req(src_len=1)
    for r in (first, a, b, big, c):
        s.add([r])
    plan = s.schedule(now=0.0)
    assert plan.admitted == [first] and plan.encode == [first, a, b]  # 40 + 40 bytes; big's 50 would exceed 100
    assert s.encoded_bytes == 80
    assert {r.status for r in (a, b, big, c)} == {RequestStatus.WAITING}  # a status only moves forward
    end(first, FinishReason.EOS, 1.0)
    s.retire([first])
    plan = s.schedule(now=1.0)
    assert plan.admitted == [a] and plan.encode == [] and s.encoded_bytes == 40  # a joins without an encoder call
    end(a, FinishReason.EOS, 2.0)
    s.retire([a])
    s.abort(b.id)
    plan = s.schedule(now=2.0)
    assert plan.dropped == [b] and plan.admitted == [big] and plan.encode == [big, c]
    assert s.encoded_bytes == 10  # b's K/V were released when it was cancelled; c (10 bytes) is held now
