"""On a core the edge shares with the engine, a gRPC event does not interrupt an engine step: the edge's threads run
Linux's SCHED_BATCH policy, the engine's thread the default one.

Under the default policy every thread that wakes may preempt the one running. A streamed call's every message ends
in a completion that wakes grpc's poller thread and then the event loop, so on one core the engine thread was
preempted in the middle of its steps over a thousand times a second, each time paying the switch and refilling its
caches. SCHED_BATCH marks the event loop and grpc's threads as throughput work whose wakeups do not preempt the
running thread: they run when the engine's step waits (for the GIL) or its time slice ends, and then find more events
ready at once. The engine thread keeps the default policy, so it still preempts them when it wakes. Measured and
recorded in docs/benchmarks.md ("The edge against its own ceiling"); with free cores a woken thread takes an idle
one and neither policy waits.

A thread takes its creator's policy: the process's first thread takes SCHED_BATCH before it starts any other (grpc's,
asyncio's executor, onnxruntime's), and the engine is loaded and started from a thread that runs the default policy
meanwhile (`with_default_policy`). Only a server whose engine runs in its own thread does it (`serve.run`): a front
end of an engine process shares its cores with other work, not with an engine step, and keeps the default policy.
Where the policy cannot be set (not Linux, or refused), nothing changes.
"""
from __future__ import annotations

import os

_BATCH = getattr(os, "SCHED_BATCH", None)
_DEFAULT = getattr(os, "SCHED_OTHER", None)


def batch() -> bool:
    """The calling thread, and every thread it starts from now on, runs SCHED_BATCH; False where that is refused."""
    return _set(_BATCH)


def with_default_policy(fn, *args):
    """fn(*args) with the calling thread at the default policy, so the threads fn starts (the engine's) take it; the
    calling thread's policy is put back after."""
    before = _get()
    _set(_DEFAULT)
    try:
        return fn(*args)
    finally:
        if before is not None:
            _set(before)


def _get() -> int | None:
    try:
        return os.sched_getscheduler(0)
    except (AttributeError, OSError):
        return None


def _set(policy: int | None) -> bool:
    """Sets the calling thread's policy (pid 0 is the calling thread on Linux)."""
    if policy is None:
        return False
    try:
        os.sched_setscheduler(0, policy, os.sched_param(0))
    except (AttributeError, OSError):
        return False
    return True
