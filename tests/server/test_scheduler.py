"""The scheduler as pure policy (no onnxruntime): FCFS admission within batch and KV-cache budgets, a bounded queue,
retirement of finished, cancelled and expired rows."""
from __future__ import annotations

import pytest

from seqserve.server.request import FinishReason, Request, RequestStatus, SamplingParams
from seqserve.server.scheduler import QueueFull, Scheduler, SchedulerConfig, padded_kv_tokens


def req(src_len: int = 4, max_new: int = 8, deadline: float | None = None) -> Request:
    return Request(input_ids=list(range(4, 4 + src_len)), params=SamplingParams(max_new_tokens=max_new),
                   deadline=deadline)


def test_fcfs_up_to_max_batch_size_and_a_finished_row_makes_room_at_the_next_step():
    s = Scheduler(SchedulerConfig(max_batch_size=2))
    a, b, c = req(), req(), req()
    for r in (a, b, c):
        s.add(r)
    plan = s.schedule(now=0.0)
    assert plan.admitted == [a, b] and plan.running == [a, b] and plan.retired == []
    assert c.status is RequestStatus.WAITING and s.n_waiting == 1
    a.finish(FinishReason.EOS, 1.0)
    plan = s.schedule(now=1.0)
    assert plan.retired == [a] and plan.admitted == [c] and plan.running == [b, c]  # kept rows first, then new ones


def test_kv_budget_counts_the_padded_batch_not_the_sum_of_rows():
    long_source, long_output = req(src_len=40, max_new=4), req(src_len=4, max_new=40)
    assert padded_kv_tokens([long_source, long_output]) == 2 * (40 + 40)  # each row alone would need only 44
    s = Scheduler(SchedulerConfig(max_kv_tokens=100))
    s.add(long_source)
    s.add(long_output)
    assert s.schedule(now=0.0).admitted == [long_source]  # 44 + 44 fits a sum, 160 padded slots do not
    long_source.finish(FinishReason.EOS, 1.0)
    assert s.schedule(now=1.0).admitted == [long_output]


def test_the_head_waits_for_cache_and_is_never_overtaken():
    s = Scheduler(SchedulerConfig(max_kv_tokens=50))
    running, big, small = req(src_len=4, max_new=8), req(src_len=4, max_new=40), req(src_len=2, max_new=2)
    for r in (running, big, small):
        s.add(r)
    assert s.schedule(now=0.0).admitted == [running]
    assert s.schedule(now=0.1).admitted == []  # small would fit, but big is first in line
    running.finish(FinishReason.LENGTH, 0.2)
    assert s.schedule(now=0.2).admitted == [big]  # 44 slots alone; with small, 2 x 44 would not fit
    assert s.n_waiting == 1


def test_a_row_over_the_whole_budget_still_runs_alone():
    s = Scheduler(SchedulerConfig(max_kv_tokens=10))
    huge = req(src_len=30, max_new=30)
    s.add(huge)
    assert s.schedule(now=0.0).admitted == [huge]


def test_queue_full_is_refused_at_once():
    s = Scheduler(SchedulerConfig(max_waiting=2))
    s.add(req())
    s.add(req())
    with pytest.raises(QueueFull, match="max_waiting=2"):
        s.add(req())


def test_cancelled_and_expired_rows_leave_running_and_waiting():
    events = []
    s = Scheduler(SchedulerConfig(max_batch_size=2))
    running_cancel, running_late = req(), req(deadline=5.0)
    waiting_cancel, waiting_late = req(), req(deadline=5.0)
    for r in (running_cancel, running_late, waiting_cancel, waiting_late):
        r.deliver = events.append
        s.add(r)
    s.schedule(now=0.0)
    running_cancel.cancel()
    waiting_cancel.cancel()
    plan = s.schedule(now=6.0)
    assert plan.retired == [running_cancel, running_late] and plan.running == [] and s.n_waiting == 0
    assert [r.finish_reason for r in (running_cancel, running_late, waiting_cancel, waiting_late)] == [
        FinishReason.CANCELLED, FinishReason.DEADLINE, FinishReason.CANCELLED, FinishReason.DEADLINE]
    assert sum(e.finish_reason is not None for e in events) == 4  # every request told exactly once
    assert not s.has_work()
