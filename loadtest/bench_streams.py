"""The pinned server benchmark's load (loadtest/server_bench.py): grpc.aio clients in processes of their own, each on
one core.

Two phases against one running server:
  * concurrent: `streams` calls in flight at all times (GenerateStream; Generate when unary), spread over
    `processes` client processes (each stream starts the next input as soon as its call ends). Every process
    connects, then all start together (a barrier), warm up, and count over one timed window: the tokens they
    received in it, and the server's own count (the /metrics counter seqserve_generated_tokens_total, read by
    process 0 at both ends of the window);
  * sequential: one call at a time (concurrency 1) from process 0, once every concurrent call has ended, each
    call's latency from sending to its last message.
Over the window every process measures its own CPU time (user + system, all its threads), and process 0 the
server's (/proc/PID/stat): a client process near one busy core is the limit, not the server.
Streams count the messages each call received (messages_per_call). Without a metrics URL (the bare servicer has none)
the server's count is not read.
Every call asks for min_new_tokens = max_new_tokens, so each generates exactly that many tokens; the counts of
calls by generated length are reported, so a call that was cut short shows. Every call is greedy, as the offline
engine row it is compared with, even where the model's defaults say beam search (an imported opus-mt: num_beams 4).
"""
from __future__ import annotations

import asyncio
import collections
import multiprocessing
import os
import queue
import time
import traceback
import urllib.request
from dataclasses import dataclass, replace

import grpc

from seqserve.v1 import seqserve_pb2 as pb
from seqserve.v1 import seqserve_pb2_grpc as pb_grpc

GENERATED_TOKENS = "seqserve_generated_tokens_total"  # server/metrics.py's generated_tokens counter, as exposed
RESULT_SLACK_S = 120.0  # beyond warm-up, window and the sequential calls' own time: a process this late is stuck


@dataclass(frozen=True)
class StreamLoad:
    address: str  # host:port of the gRPC server
    metrics_url: str | None  # its /metrics (None: the server's count is not read)
    inputs: list[str]  # source texts, used in turn
    streams: int  # over every process
    warmup_s: float
    duration_s: float
    max_new_tokens: int
    sequential_requests: int
    core: int | None = None  # this process runs on this core alone (None: wherever it is)
    process: int = 0  # this process's index: it runs streams process, process + processes, ...
    processes: int = 1
    server_pid: int | None = None  # process 0 reads its CPU time over the window (None: not measured)
    unary: bool = False  # Generate calls instead of GenerateStream


def run(load: StreamLoad, barrier=None) -> dict:
    """One client process's whole life: pin, then both phases (see the module docstring)."""
    if load.core is not None:
        os.sched_setaffinity(0, {load.core})
    return asyncio.run(_run(load, barrier))


def run_processes(load: StreamLoad, cores: list[int], timeout_s: float) -> dict:
    """len(cores) spawned client processes, process i pinned to cores[i]; their results merged (see merge())."""
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(len(cores)), context.Queue()
    children = [context.Process(target=_child, args=(replace(load, core=core, process=i, processes=len(cores)),
                                                     barrier, results), daemon=True)
                for i, core in enumerate(cores)]
    for child in children:
        child.start()
    try:
        parts = [_result(results, children, timeout_s) for _ in children]
    finally:
        for child in children:
            child.join(5)
            if child.is_alive():
                child.kill()
    return merge(sorted(parts, key=lambda part: part["process"]))


def _child(load: StreamLoad, barrier, results) -> None:
    try:
        results.put(run(load, barrier))
    except BaseException:  # the parent reports it; the barrier is broken so no sibling waits for this one
        barrier.abort()
        results.put({"error": f"client process {load.process}: {traceback.format_exc()}"})


def _result(results, children, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            part = results.get(timeout=1.0)
        except queue.Empty:
            dead = [c for c in children if c.exitcode not in (None, 0)]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"client processes failed or hung (exit codes {[c.exitcode for c in children]})")
            continue
        if "error" in part:
            raise RuntimeError(part["error"])
        return part


def merge(parts: list[dict]) -> dict:
    """The processes' windows as one: tokens and calls summed over processes, process 0's window and server counts,
    and the CPU each process and the server spent in it (cores busy = CPU seconds / window seconds)."""
    first = parts[0]["concurrent"]
    window = first["window_s"]
    client_tokens = sum(p["concurrent"]["client_tokens"] for p in parts)
    messages = sum(p["concurrent"]["messages"] for p in parts)
    lengths: collections.Counter[int] = collections.Counter()
    for p in parts:
        lengths.update({int(k): v for k, v in p["concurrent"]["calls_by_generated_tokens"].items()})
    per_process = [{"process": p["process"], "core": p["core"], "streams": p["concurrent"]["streams"],
                    "cpu_s": p["concurrent"]["cpu_s"],
                    "cpu_cores_busy": round(p["concurrent"]["cpu_s"] / p["concurrent"]["window_s"], 3)}
                   for p in parts]
    client_cpu = sum(p["cpu_s"] for p in per_process)
    concurrent = {"streams": sum(p["streams"] for p in per_process), "window_s": window,
                  "client_tokens": client_tokens, "server_tokens": first["server_tokens"],
                  "client_tokens_per_s": round(client_tokens / window, 1),
                  "server_tokens_per_s": first["server_tokens_per_s"], "calls": sum(lengths.values()),
                  "messages_per_call": round(messages / max(1, sum(lengths.values())), 2),
                  "calls_by_generated_tokens": {str(k): v for k, v in sorted(lengths.items())},
                  "client_processes": len(parts), "client_cpu_s": round(client_cpu, 3),
                  "client_cpu_cores_busy": round(sum(p["cpu_cores_busy"] for p in per_process), 3),
                  "client_cpu_per_process": per_process, "server_cpu_s": first["server_cpu_s"],
                  "server_cpu_cores_busy": (round(first["server_cpu_s"] / window, 3)
                                            if first["server_cpu_s"] is not None else None)}
    return {"concurrent": concurrent, "sequential": parts[0]["sequential"],
            "cores": sorted({p["core"] for p in per_process})}


def decoding_options(max_new_tokens: int) -> pb.DecodingOptions:
    """Greedy, exactly max_new_tokens: num_beams 0 would take the model's default, so 1 is sent."""
    return pb.DecodingOptions(max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, num_beams=1)


async def _run(load: StreamLoad, barrier) -> dict:
    options = decoding_options(load.max_new_tokens)
    async with grpc.aio.insecure_channel(load.address) as channel:
        await channel.channel_ready()
        stub = pb_grpc.GenerationStub(channel)
        await _wait(barrier)  # every process connected: the streams start together
        concurrent = await _concurrent(stub, load, options)
        await _wait(barrier)  # every concurrent call has ended before the sequential phase
        sequential = await _sequential(stub, load, options) if load.process == 0 and load.sequential_requests \
            else None
    return {"process": load.process, "core": load.core, "concurrent": concurrent, "sequential": sequential,
            "cores": sorted(os.sched_getaffinity(0))}


async def _wait(barrier) -> None:
    if barrier is not None:
        await asyncio.to_thread(barrier.wait)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds so far of a process and all its threads, and of its child processes still running
    (an engine process under its front end) (Linux /proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # after "pid (comm)": field 3 (state) is fields[0]
    own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)
    return own + sum(_child_cpu(child) for child in children(pid))


def _child_cpu(pid: int) -> float:
    try:
        return cpu_seconds(pid)
    except OSError:  # it ended meanwhile
        return 0.0


def children(pid: int) -> list[int]:
    """The process's running child processes (every thread's /proc/PID/task/TID/children)."""
    found = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(c) for c in f.read().split()]
    except OSError:  # it ended meanwhile
        pass
    return found


class _Tally:
    def __init__(self, unary: bool = False) -> None:
        self.unary = unary  # Generate calls (one answer each) instead of streams
        self.tokens = 0  # received so far, over every stream
        self.messages = 0  # messages received by the calls that ended
        self.lengths: collections.Counter[int] = collections.Counter()  # finished calls by tokens generated


async def _call(stub, text: str, options: pb.DecodingOptions, tally: _Tally) -> int:
    """One call (GenerateStream, or Generate when the tally is unary) to its end; returns the tokens it generated."""
    request = pb.GenerateRequest(input=text, options=options)
    if tally.unary:
        n, messages = len((await stub.Generate(request)).token_ids), 1
        tally.tokens += n
    else:
        n = messages = 0
        async for message in stub.GenerateStream(request):
            n, messages = n + len(message.token_ids), messages + 1
            tally.tokens += len(message.token_ids)
    tally.lengths[n] += 1
    tally.messages += messages
    return n


async def _concurrent(stub, load: StreamLoad, options: pb.DecodingOptions) -> dict:
    tally, stop = _Tally(load.unary), asyncio.Event()
    lead = load.process == 0  # reads the server's counter and CPU time
    counted = lead and load.metrics_url is not None

    async def stream(i: int) -> None:
        while not stop.is_set():
            await _call(stub, load.inputs[i % len(load.inputs)], options, tally)
            i += load.streams

    ids = range(load.process, load.streams, load.processes)  # this process's share of the streams
    tasks = [asyncio.create_task(stream(i)) for i in ids]
    await asyncio.sleep(load.warmup_s)
    server_cpu0 = cpu_seconds(load.server_pid) if lead and load.server_pid else None
    start, client0, cpu0 = time.perf_counter(), tally.tokens, time.process_time()
    server0 = await _scrape(load.metrics_url) if counted else 0.0
    await asyncio.sleep(load.duration_s)
    end, client1, cpu1 = time.perf_counter(), tally.tokens, time.process_time()
    server1 = await _scrape(load.metrics_url) if counted else 0.0
    server_cpu = cpu_seconds(load.server_pid) - server_cpu0 if server_cpu0 is not None else None
    stop.set()
    await asyncio.gather(*tasks)  # in-flight calls finish normally (nothing is cancelled mid-way)
    window = end - start
    return {"streams": len(ids), "window_s": round(window, 3), "client_tokens": client1 - client0,
            "server_tokens": int(server1 - server0), "client_tokens_per_s": round((client1 - client0) / window, 1),
            "server_tokens_per_s": round((server1 - server0) / window, 1), "calls": sum(tally.lengths.values()),
            "calls_by_generated_tokens": {str(k): v for k, v in sorted(tally.lengths.items())},
            "messages": tally.messages, "cpu_s": round(cpu1 - cpu0, 3),
            "server_cpu_s": round(server_cpu, 3) if server_cpu is not None else None}


async def _sequential(stub, load: StreamLoad, options: pb.DecodingOptions) -> dict:
    tally, latencies = _Tally(), []
    for i in range(load.sequential_requests):
        start = time.perf_counter()
        await _call(stub, load.inputs[i % len(load.inputs)], options, tally)
        latencies.append(time.perf_counter() - start)
    ms = sorted(1e3 * x for x in latencies)
    return {"calls": len(ms), "mean_ms": round(sum(ms) / len(ms), 3), "p50_ms": round(ms[len(ms) // 2], 3),
            "p99_ms": round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 3),
            "tokens_per_s": round(tally.tokens / sum(latencies), 1),
            "calls_by_generated_tokens": {str(k): v for k, v in sorted(tally.lengths.items())}}


async def _scrape(url: str) -> float:
    """The server's generated-token counter now, summed over its models (read off the event loop: urllib blocks)."""
    text = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read().decode())
    counts = [float(line.rsplit(maxsplit=1)[1]) for line in text.splitlines()
              if line.startswith((GENERATED_TOKENS + " ", GENERATED_TOKENS + "{"))]  # {model="..."}
    if not counts:
        raise RuntimeError(f"{url} has no {GENERATED_TOKENS}")
    return sum(counts)
