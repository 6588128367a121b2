"""The engine in its own process (engine/remote/remote_engine.py, engine/remote/engine_process.py), real processes on
the tiny
bundle: an in-process EngineCore on the same requests is the oracle for every output.

Where a test needs the engine to hold a request, it stops the engine process (SIGSTOP) before adding one that must
run 38 steps; what the test sends next (abort, stop) is handed to the socket behind the add before the engine goes on
(RemoteEngine.sent), so the engine reads both before it steps.
"""
from __future__ import annotations

import itertools
import os
import signal
import threading
import time

import pytest
from grpc_harness import default_limits

from seqserve.contract.integrity import open_bundle
from seqserve.engine.api import EngineRequest, StepReport
from seqserve.engine.build import EngineConfig, build
from seqserve.engine.remote.engine_watch import RESTART_DELAYS, Silence, restart_delay
from seqserve.engine.remote.remote_engine import RemoteEngine
from seqserve.engine.request import FinishReason, SamplingParams
from seqserve.engine.runtime.device import RuntimeConfig
from seqserve.engine.step.scheduler import SchedulerConfig
from seqserve.server.engine_client import start_engine

WAIT = 30.0  # every wait is bounded: a hang fails the test instead of blocking the suite
MAX_WAITING = 4
HELD = Silence(not_ready=600, restart=1200, abandon=600)  # SIGSTOP holds the engine here: its silence is no hang
SOURCES = ["b 5 9 k o 9 9 5 d", "f b 8 f d f j o d", "e c i 8 d", "a a 3 k"]
LONG = SamplingParams(max_new_tokens=38, min_new_tokens=38)  # 38 steps (the bundle allows 40)
_ids = itertools.count(1)


class Reports:
    """deliver: every report kept, each request's outputs gathered, its end awaited."""

    def __init__(self) -> None:
        self.reports: list[StepReport] = []
        self.outputs: dict[int, list] = {}
        self.cond = threading.Condition()

    def __call__(self, report: StepReport) -> None:
        with self.cond:
            self.reports.append(report)
            for out in report.outputs:
                self.outputs.setdefault(out.request_id, []).append(out)
            self.cond.notify_all()

    def wait(self, test, what: str):
        with self.cond:
            assert self.cond.wait_for(test, WAIT), f"no {what} within {WAIT} s"

    def first(self, request_id: int) -> None:
        self.wait(lambda: self.outputs.get(request_id), f"output of request {request_id}")

    def result(self, request_id: int):
        self.wait(lambda: any(o.result for o in self.outputs.get(request_id, ())), f"end of request {request_id}")
        return self.outputs[request_id][-1].result

    def ended(self, request_id: int) -> bool:
        with self.cond:
            return any(o.result for o in self.outputs.get(request_id, ()))


def _config(bundle) -> EngineConfig:
    return EngineConfig(bundle, runtime=RuntimeConfig(device="cpu", intra_op_threads=1),
                        scheduler=SchedulerConfig(max_waiting=MAX_WAITING))


def _requests(tokenizer, params: SamplingParams, stream: bool = False, sources=SOURCES) -> list[EngineRequest]:
    return [EngineRequest(next(_ids), tuple(tokenizer.encode(s).ids), params, stream=stream) for s in sources]


@pytest.fixture(scope="module")
def tokenizer(tiny_bundle):
    return open_bundle(tiny_bundle)[1]


@pytest.fixture(scope="module")
def oracle(tiny_bundle):
    core, reports = build(_config(tiny_bundle)), Reports()
    core.start(reports)
    yield core, reports
    core.stop()


@pytest.fixture(scope="module")
def remote(tiny_bundle):
    engine, reports = start_engine(_config(tiny_bundle), in_process=False, silence=HELD,
                                   limits=default_limits(tiny_bundle)), Reports()
    engine.start(reports)
    yield engine, reports
    engine.stop()


def _run(engine, reports, requests):
    engine.add(requests)
    return [(reports.result(r.id), [o for o in reports.outputs[r.id] if o.result is None]) for r in requests]


def _same(oracle, remote, requests_for):
    """The remote engine's results (and stream pieces) equal the in-process core's on the same requests."""
    expected, got = _run(*oracle, requests_for()), _run(*remote, requests_for())
    for (want, want_pieces), (have, have_pieces) in zip(expected, got, strict=True):
        assert have.finish_reason == want.finish_reason and have.error is None
        assert [(s.token_ids, s.text, s.finish_reason) for s in have.sequences] == [
            (s.token_ids, s.text, s.finish_reason) for s in want.sequences]
        assert [s.score for s in have.sequences] == pytest.approx([s.score for s in want.sequences])
        assert [(p.token_ids, p.text) for p in have_pieces] == [(p.token_ids, p.text) for p in want_pieces]
        assert have.generated_tokens == want.generated_tokens and have.input_tokens == want.input_tokens
    return got


def test_the_engine_process_answers_what_the_in_process_core_answers(oracle, remote, tokenizer):
    assert isinstance(remote[0], RemoteEngine) and remote[0].info == oracle[0].info
    got = _same(oracle, remote, lambda: _requests(tokenizer, SamplingParams(max_new_tokens=20)))
    assert any(r.token_ids for r, _ in got)  # the comparison compared tokens
    streamed = _same(oracle, remote, lambda: _requests(tokenizer, SamplingParams(max_new_tokens=20), stream=True))
    assert all(len(pieces) >= 1 for r, pieces in streamed if r.token_ids)
    beams = SamplingParams(max_new_tokens=12, num_beams=3, num_return_sequences=2, return_logprobs=True)
    assert all(len(r.sequences) == 2 for r, _ in _same(oracle, remote, lambda: _requests(tokenizer, beams)))


def test_step_figures_arrive_and_count_the_returned_tokens(remote, tokenizer):
    engine, reports = remote
    start = len(reports.reports)
    requests = _requests(tokenizer, SamplingParams(max_new_tokens=15))
    results = [r for r, _ in _run(engine, reports, requests)]
    with reports.cond:
        figures = [r.stats for r in reports.reports[start:]]
    assert sum(s.generated_tokens for s in figures) == sum(len(r.token_ids) for r in results) > 0
    assert sorted(f for s in figures for f in s.finished) == sorted(r.finish_reason.value for r in results)
    assert any(s.decoder_seconds for s in figures)


def test_a_full_queue_refuses_the_whole_add(remote, tokenizer):
    """add returns at once; the engine refuses every request of an add it cannot take whole, each with an Output
    that says so (the edge answers RESOURCE_EXHAUSTED), and nothing of it runs."""
    engine, reports = remote
    too_many = _requests(tokenizer, SamplingParams(max_new_tokens=3), sources=SOURCES + SOURCES[:1])
    engine.add(too_many)
    for r in too_many:
        reports.wait(lambda r=r: reports.outputs.get(r.id), f"the refusal of request {r.id}")
        [out] = reports.outputs[r.id]
        assert out.result is None and f"max_waiting={MAX_WAITING}" in out.refused
    assert not _holds(engine) & {r.id for r in too_many}  # the front end holds none of them any more
    fits = _requests(tokenizer, SamplingParams(max_new_tokens=3), sources=SOURCES[:2])
    assert all(r.finish_reason is not FinishReason.CANCELLED for r, _ in _run(engine, reports, fits))


def _held(engine, reports, requests: list[EngineRequest]) -> int:
    """Stops the engine process (SIGSTOP), then adds 38-step requests: what the test sends next reaches the engine
    after them (the test waits until the front end handed it to the socket: _sent), before the engine steps. Its
    pid."""
    pid = engine.process.pid
    os.kill(pid, signal.SIGSTOP)
    sent = engine.sent
    engine.add(requests)
    _until(lambda: engine.sent > sent)
    return pid


def _sent(engine, before: int) -> None:
    """Waits until the front end handed its commands after the first `before` to the engine's socket."""
    _until(lambda: engine.sent > before)


def _until(condition) -> None:
    """Waits for a state another thread reaches (no one notifies: looked at every millisecond, WAIT s at most)."""
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, "not reached within WAIT s"
        time.sleep(0.001)


def _holds(engine) -> set[int]:
    with engine.held.lock:  # add() registers and queues its requests under this lock
        return set(engine.held.ids)


@pytest.mark.parametrize("deadline, reason", [(False, FinishReason.CANCELLED), (True, FinishReason.DEADLINE)])
def test_abort_ends_a_request_the_engine_holds(remote, tokenizer, deadline, reason):
    engine, reports = remote
    [request] = _requests(tokenizer, LONG, stream=True, sources=SOURCES[:1])
    pid = _held(engine, reports, [request])
    sent = engine.sent
    engine.abort(request.id, deadline=deadline)
    _sent(engine, sent)
    os.kill(pid, signal.SIGCONT)
    result = reports.result(request.id)
    assert result.finish_reason is reason and result.error is None


def test_a_killed_engine_ends_its_requests_and_is_restarted(remote, tokenizer, caplog):
    engine, reports = remote
    requests = _requests(tokenizer, LONG, stream=True, sources=SOURCES[:2])
    pid = _held(engine, reports, requests)
    os.kill(pid, signal.SIGKILL)
    for r in requests:  # at once: reports.result waits at most WAIT seconds
        result = reports.result(r.id)
        assert result.finish_reason is FinishReason.CANCELLED and "engine" in result.error and "restart" in result.error
    assert engine.wait_up(WAIT) and engine.process.pid != pid
    assert "was killed by SIGKILL: its 2 requests end UNAVAILABLE; restarting" in caplog.text
    [after] = _requests(tokenizer, SamplingParams(max_new_tokens=20), sources=SOURCES[:1])
    result = _run(engine, reports, [after])[0][0]
    assert result.finish_reason in (FinishReason.EOS, FinishReason.LENGTH) and result.token_ids


def test_stop_drains_the_engine_and_its_process_exits_0(tiny_bundle, tokenizer):
    engine, reports = RemoteEngine(_config(tiny_bundle), silence=HELD, limits=default_limits(tiny_bundle)), Reports()
    engine.start(reports)
    requests = _requests(tokenizer, LONG, stream=True, sources=SOURCES[:2])
    process = engine.process
    pid = _held(engine, reports, requests)
    sent, stopped = engine.sent, []
    stopping = threading.Thread(target=lambda: stopped.append(engine.stop(timeout=WAIT)), daemon=True)
    stopping.start()
    _sent(engine, sent)  # the front end sent STOP behind the adds: the engine gets both when it goes on
    os.kill(pid, signal.SIGCONT)
    stopping.join(WAIT + 20)
    assert stopped == [True]
    assert [reports.result(r.id).finish_reason for r in requests] == [FinishReason.CANCELLED] * 2
    assert process.returncode == 0


def test_a_crash_loop_waits_longer_each_time():
    assert restart_delay(0) == 0.0
    assert [restart_delay(n) for n in range(1, len(RESTART_DELAYS))] == sorted(RESTART_DELAYS[1:])
    assert restart_delay(1000) == RESTART_DELAYS[-1] > 0
