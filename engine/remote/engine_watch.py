"""Whether a front end's engine process is alive: when it last heard from it, the ping it is waiting on, and the bounds
on silence (--engine-not-ready-seconds, --engine-restart-seconds) and on restarts.

The engine process answers a PING between two steps, on the one thread that steps its engine
(engine/remote/engine_process.py), and each step's report goes to the first front end. Silence therefore means that no
step
ended and no ping was read, whatever the engine holds, busy or idle. A heartbeat sent by a thread of its own would
go on while a step itself is wedged (Python switches threads every 5 ms), hiding the very hang the bounds are for;
the price is that one step longer than the not-ready bound reads as a hang. A step is bounded by the batch and token
budgets (tens of milliseconds on a CPU at batch 64, docs/architecture.md); a deployment whose steps are slower raises
the bounds. Loading and warm-up come before the engine's HELLO and are bounded by START_SECONDS instead.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

NOT_READY_SECONDS = 10.0  # --engine-not-ready-seconds' default: as a readiness probe's few failed periods
RESTART_SECONDS = 60.0  # --engine-restart-seconds' default: a minute of silence is a hang, not a slow step
HEARTBEAT_SECONDS = 0.5  # no news from the engine for this long: the front end pings it
ABANDON_SECONDS = 1.0  # silent this long: requests already aborted end in the front end; a stopping one is killed
RESTART_DELAYS = (0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0)  # after 0, 1, 2, ... starts in a row that did not last
STABLE_SECONDS = 60.0  # an engine up this long before it died restarts at once again
HUNG, EXITED, KILLED = "hung", "exited", "killed"  # why an engine process was started again (the metric's cause)
WHAT = {HUNG: "answered nothing for too long and was killed", EXITED: "exited", KILLED: "was killed by a signal",
         None: "went away"}


def restart_delay(failures: int) -> float:
    """Seconds before the next start after `failures` starts in a row that did not last."""
    return RESTART_DELAYS[min(failures, len(RESTART_DELAYS) - 1)]


def ended_message(model: str, cause: str | None) -> str:
    """What a call whose request the engine held hears when that engine went away."""
    return (f"this generation did not finish: the engine of model {model!r} {WHAT[cause]} and is being restarted; "
            "the call may be retried")


def restarting_message(model: str, cause: str | None) -> str:
    """What a call that arrives while its model's engine is down hears."""
    return f"the engine of model {model!r} is restarting (it {WHAT[cause]}); the call may be retried"


def silent_message(model: str, seconds: float) -> str:
    """What a call that arrives while its model's engine is silent (not ready) hears."""
    return (f"the engine of model {model!r} has answered nothing for {seconds:.0f} s (not ready); the call may be "
            "retried")


@dataclass(frozen=True)
class Silence:
    """The bounds on an engine's silence: past not_ready its model is not ready, past restart it is restarted; past
    abandon, requests already aborted end in the front end, and an engine being stopped is killed (a test that holds
    the engine with SIGSTOP raises them all)."""

    not_ready: float = NOT_READY_SECONDS
    restart: float = RESTART_SECONDS
    abandon: float = ABANDON_SECONDS


class Watch:
    """One engine's liveness, as its front end's socket thread sees it (only that thread uses it)."""

    def __init__(self, silence: Silence) -> None:
        self.silence = silence
        self.heard = time.monotonic()
        self.pinged: float | None = None  # when the ping still unanswered went out
        self.failures = 0  # starts in a row that did not last

    def hear(self, now: float) -> None:
        """Anything came from the engine: it is alive now."""
        self.heard, self.pinged = now, None

    def ping_due(self, now: float) -> bool:
        """True (once) when nothing came for HEARTBEAT_SECONDS and no ping is out: the caller sends one."""
        if self.pinged is None and now - self.heard >= HEARTBEAT_SECONDS:
            self.pinged = now
            return True
        return False

    def silent(self, now: float) -> float:
        """Seconds the engine has left a ping unanswered (0 while none is out)."""
        return 0.0 if self.pinged is None else now - self.pinged

    def wake(self, now: float) -> float:
        """When the next ping or bound is due (time.monotonic())."""
        if self.pinged is None:
            return self.heard + HEARTBEAT_SECONDS
        bounds = (self.silence.abandon, self.silence.not_ready, self.silence.restart)
        later = [b for b in bounds if self.pinged + b > now]
        return self.pinged + min(later) if later else now + HEARTBEAT_SECONDS

    def restart_delay(self, lasted: bool) -> float:
        """Seconds before the next start of an engine that went away (lasted: up STABLE_SECONDS before)."""
        self.failures = 0 if lasted else self.failures
        self.failures += 1
        return restart_delay(self.failures - 1)

    def refusal(self, model: str, up: bool, cause: str | None) -> str:
        """What a call that arrives while the engine is down (up: silent) hears."""
        return silent_message(model, self.silent(time.monotonic())) if up else restarting_message(model, cause)
