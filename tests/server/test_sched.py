"""server/sched.py: the edge's threads run SCHED_BATCH and the engine's thread the default policy, so on a shared
core a gRPC event does not preempt an engine step. Each thread's policy is read back from the kernel."""
from __future__ import annotations

import os
import sys
import threading

import pytest
from grpc_harness import Served

from seqserve.server import sched

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SCHED_BATCH is Linux's")


def _in_thread(fn):
    """fn() in a fresh thread (whose policy the test may change freely); returns what it returned."""
    out = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join()
    return out[0]


def _policy_of_a_thread_started_here() -> int:
    return _in_thread(lambda: os.sched_getscheduler(0))


def test_batch_is_inherited_and_the_default_policy_is_lent_to_the_threads_started_under_it():
    def run():
        assert sched.batch()
        inherited = _policy_of_a_thread_started_here()
        lent = sched.with_default_policy(_policy_of_a_thread_started_here)
        return os.sched_getscheduler(0), inherited, lent

    mine, inherited, lent = _in_thread(run)
    assert (mine, inherited, lent) == (os.SCHED_BATCH, os.SCHED_BATCH, os.SCHED_OTHER)


def test_a_served_engine_thread_runs_the_default_policy_under_an_edge_that_runs_batch(tiny_bundle):
    """The app's threads inherit SCHED_BATCH from the thread that starts the server; the engine's thread does not."""
    def start() -> Served:
        assert sched.batch()  # this helper thread's: the server's threads start from it
        return Served(tiny_bundle).wait_ready()

    s = _in_thread(start)
    try:
        assert os.sched_getscheduler(s.thread.native_id) == os.SCHED_BATCH  # the event loop's
        assert os.sched_getscheduler(s.engine.loop.thread.native_id) == os.SCHED_OTHER
    finally:
        s.stop()
