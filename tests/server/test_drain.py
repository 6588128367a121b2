"""Drain with calls still in flight when the grace period ends: each gets UNAVAILABLE (clients retry it), never
CANCELLED (clients do not), and none hangs. Issue 11 saw CANCELLED in 4 runs of 9 (18-202 calls of 400).

The race: with the engine busy, gRPC accepts calls faster than the event loop hands them to the service, and
server.stop ended that backlog CANCELLED. This test reproduces it (without the fix, App._hold_arrivals and
InFlight.abort made no-ops, the first run ends 330 of 440 calls CANCELLED).

The drain is App.drain(), exactly what SIGTERM/SIGINT run in `seqserve serve` (serve._serve; test_lifecycle.py sends
the real signal to a real process); an in-process App restarted 20 times keeps the repetitions fast.
"""
from __future__ import annotations

import asyncio
import collections
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
from grpc_harness import Served, request, wait_for

from seqserve.server.app import App
from seqserve.v1 import seqserve_pb2 as pb
from seqserve.v1 import seqserve_pb2_grpc as pb_grpc

REPEATS, CALLS, STREAMS = 20, 400, 40
LONG = dict(min_new_tokens=40, max_new_tokens=40)
ENDS = {grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE}


def _unary_code(future) -> grpc.StatusCode:
    try:
        future.result(timeout=30)  # a hang fails here
        return grpc.StatusCode.OK
    except grpc.RpcError as err:
        return err.code()


def _stream_code(stream) -> grpc.StatusCode:
    try:
        final = list(stream)[-1]
        assert final.finish_reason == pb.FINISH_REASON_LENGTH
        return grpc.StatusCode.OK
    except grpc.RpcError as err:
        return err.code()


def test_grace_0_with_400_queued_calls_ends_each_ok_or_unavailable_20_times(tiny_bundle, heldout):
    sources = [src for src, _ in heldout[:50]]
    totals = collections.Counter()
    for run in range(REPEATS):
        s = Served(tiny_bundle, max_batch_size=32, max_waiting=CALLS + STREAMS, grace_seconds=0, metrics_port=-1)
        try:
            s.wait_ready()
            unary = [s.stub.Generate.future(request(sources[i % len(sources)], **LONG), timeout=60)
                     for i in range(CALLS)]
            streams = [s.stub.GenerateStream(request(sources[i % len(sources)], **LONG), timeout=60)
                       for i in range(STREAMS)]
            with ThreadPoolExecutor(STREAMS) as pool:
                stream_codes = [pool.submit(_stream_code, stream) for stream in streams]
                # SIGTERM while gRPC still holds a backlog, at a different moment each run
                wait_for(lambda: len(s.app.service.inflight) >= 20 + 5 * run, what="calls in flight")
                assert s.run_async(s.app.drain()).result(60) is False  # grace 0: calls were still in flight
                codes = [_unary_code(f) for f in unary] + [f.result(timeout=30) for f in stream_codes]
        finally:
            s.stop()
        run_totals = collections.Counter(c.name for c in codes)
        assert set(codes) <= ENDS, f"run {run}: {run_totals}"
        assert run_totals["UNAVAILABLE"] > 0, f"run {run}: nothing was still in flight ({run_totals})"
        totals.update(run_totals)
    print(f"{REPEATS} drains of {CALLS} unary + {STREAMS} streaming calls, grace 0: {dict(totals)}")
    assert totals["CANCELLED"] == 0 and sum(totals.values()) == REPEATS * (CALLS + STREAMS)


STALL_SECONDS, DURING_STALL = 2.5, 100  # longer than the backlog window (2 s); calls sent while it lasts


def test_calls_sent_while_a_busy_machine_stalls_the_drain_end_unavailable(tiny_bundle, heldout):
    """Under load the process can stall for seconds (1.9 s seen at load 11): its event loop takes no call meanwhile,
    so a window measured in wall time ran out during the stall, and server.stop ended CANCELLED the calls gRPC had
    accepted and the loop had not taken. time.sleep on the loop stalls it as a descheduled process is stalled."""
    stalled = threading.Event()

    class StalledApp(App):
        async def _hold_arrivals(self) -> None:
            asyncio.get_running_loop().call_soon(lambda: (stalled.set(), time.sleep(STALL_SECONDS)))
            await super()._hold_arrivals()

    sources = [src for src, _ in heldout[:50]]
    s = Served(tiny_bundle, app_class=StalledApp, grace_seconds=0, metrics_port=-1)
    try:
        s.wait_ready()
        first = [s.stub.Generate.future(request(src, **LONG), timeout=60) for src in sources[:20]]
        wait_for(lambda: len(s.app.service.inflight) >= 20, what="calls in flight")
        drained = s.run_async(s.app.drain())
        assert stalled.wait(30)
        during = [s.stub.Generate.future(request(sources[i % len(sources)], **LONG), timeout=60)
                  for i in range(DURING_STALL)]
        assert drained.result(60) is False  # grace 0: the first calls were still in flight
        codes = collections.Counter(_unary_code(f).name for f in first + during)
    finally:
        s.stop()
    assert set(codes) <= {"OK", "UNAVAILABLE"} and codes["UNAVAILABLE"] >= DURING_STALL, codes


DRAINS, CLIENTS = 3, 8


def test_calls_arriving_throughout_drains_never_end_cancelled(tiny_bundle, heldout):
    """Issue 16, item 8: calls that kept arriving during a drain ended CANCELLED (about one per client per drain,
    here 7 of 8 clients retrying at once), and the exit waited 5 s for a pause that never came. Each client sends
    its next call as soon as the last one is answered, from before the drain until after the drain has returned;
    one stream is still generating when the drain begins."""
    totals, counted = collections.Counter(), collections.Counter()
    for _ in range(DRAINS):
        s = Served(tiny_bundle, metrics_port=-1)
        stop = threading.Event()
        try:
            s.wait_ready()
            s.slow_down(0.02)
            in_flight = s.stub.GenerateStream(request(heldout[0][0], **LONG), timeout=60)
            next(in_flight)

            def client() -> collections.Counter:
                codes = collections.Counter()
                with grpc.insecure_channel(s.address) as channel:
                    stub = pb_grpc.GenerationStub(channel)
                    while not stop.is_set():
                        try:
                            stub.Generate(request(heldout[1][0], max_new_tokens=2), timeout=30)
                            codes["OK"] += 1
                        except grpc.RpcError as err:
                            codes[err.code().name] += 1
                return codes

            with ThreadPoolExecutor(CLIENTS) as pool:
                clients = [pool.submit(client) for _ in range(CLIENTS)]
                wait_for(lambda: s.metric("seqserve_requests_total", method="Generate", code="OK") >= CLIENTS,
                         what="the clients' calls")
                assert s.run_async(s.app.drain()).result(60) is True  # the stream finished within the grace
                stop.set()  # only now: calls kept arriving until the server had stopped
                for c in clients:
                    totals.update(c.result(60))
            assert _stream_code(in_flight) == grpc.StatusCode.OK
            counted.update({code.name: s.metric("seqserve_requests_total", method="Generate", code=code.name)
                            for code in grpc.StatusCode})
        finally:
            stop.set()
            s.stop()
    print(f"{DRAINS} drains, {CLIENTS} clients calling throughout: {dict(totals)}; counted {+counted}")
    assert totals["CANCELLED"] == 0 and counted["CANCELLED"] == 0, totals
    assert set(totals) <= {"OK", "UNAVAILABLE"} and totals["UNAVAILABLE"] > 0
    assert counted["UNAVAILABLE"] > 0  # calls reached the draining service and were answered by it


# docs/security.md's figures: SEQSERVE_SIGTERM_DRAINS=5 pytest -s tests/server/test_drain.py -k sigterm
SIGTERM_DRAINS = int(os.environ.get("SEQSERVE_SIGTERM_DRAINS", "1"))
REPO = Path(__file__).resolve().parents[2]


def test_sigterm_under_continuous_calls_exits_0_and_no_call_ends_cancelled(tiny_bundle, heldout):
    """The real signal to a real `seqserve serve`, with 8 clients calling back to back from before the signal until
    after the process has exited (the exit time is printed, not asserted)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEQSERVE_")}
    totals = collections.Counter()
    for run in range(SIGTERM_DRAINS):
        proc = subprocess.Popen([sys.executable, "-m", "seqserve.cli", "serve", "--bundle", str(tiny_bundle), "--port",
                                 "0", "--metrics-port", "-1", "--device", "cpu", "--intra-op-threads", "1"], cwd=REPO,
                                env=env, stderr=subprocess.PIPE, text=True)
        try:
            address = re.search(r" on (127\.0\.0\.1:\d+) \(", _serving_line(proc)).group(1)
            stop, codes, answered = threading.Event(), collections.Counter(), []

            def client() -> collections.Counter:
                mine = collections.Counter()
                with grpc.insecure_channel(address) as channel:
                    stub = pb_grpc.GenerationStub(channel)
                    while not stop.is_set():
                        try:
                            stub.Generate(request(heldout[1][0], max_new_tokens=16), timeout=30)
                            mine["OK"] += 1
                            answered.append(1)
                        except grpc.RpcError as err:
                            mine[err.code().name] += 1
                return mine

            with ThreadPoolExecutor(CLIENTS) as pool:
                clients = [pool.submit(client) for _ in range(CLIENTS)]
                wait_for(lambda: len(answered) >= 4 * CLIENTS, what="the clients' first answers")
                start = time.monotonic()
                proc.send_signal(signal.SIGTERM)
                code = proc.wait(60)
                exit_seconds = time.monotonic() - start
                stop.set()
                for c in clients:
                    codes.update(c.result(60))
        finally:
            if proc.poll() is None:
                proc.kill()
        print(f"SIGTERM drain {run}: exit {code} after {exit_seconds:.2f} s; calls {dict(codes)}")
        assert code == 0
        totals.update(codes)
    print(f"{SIGTERM_DRAINS} SIGTERM drains, {CLIENTS} clients calling throughout: {dict(totals)}")
    assert totals["CANCELLED"] == 0 and set(totals) <= {"OK", "UNAVAILABLE"}, totals


def _serving_line(proc: subprocess.Popen) -> str:
    for line in proc.stderr:
        if " on 127.0.0.1:" in line and "serving" in line:
            threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep the pipe drained
            return line
    raise AssertionError(f"the server exited with {proc.wait()} before serving")
