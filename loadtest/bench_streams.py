"""The pinned server benchmark's load (loadtest/server_bench.py): a grpc.aio client in its own process and core.

Two phases against one running server:
  * concurrent: `streams` GenerateStream calls in flight at all times (each stream starts the next input as soon as
    its call ends). After a warm-up, one timed window: the tokens the client received in it, and the server's own
    count (the /metrics counter seqserve_generated_tokens_total, read at both ends of the window);
  * sequential: one call at a time (concurrency 1), each call's latency from sending to its last message.
Every call asks for min_new_tokens = max_new_tokens, so each generates exactly that many tokens; the counts of
calls by generated length are reported, so a call that was cut short shows. Every call is greedy, as the offline
engine row it is compared with, even where the model's defaults say beam search (an imported opus-mt: num_beams 4).
"""
from __future__ import annotations

import asyncio
import collections
import os
import time
import urllib.request
from dataclasses import dataclass

import grpc

from seqserve.v1 import seqserve_pb2 as pb
from seqserve.v1 import seqserve_pb2_grpc as pb_grpc

GENERATED_TOKENS = "seqserve_generated_tokens_total"  # server/metrics.py's generated_tokens counter, as exposed


@dataclass(frozen=True)
class StreamLoad:
    address: str  # host:port of the gRPC server
    metrics_url: str  # its /metrics
    inputs: list[str]  # source texts, used in turn
    streams: int
    warmup_s: float
    duration_s: float
    max_new_tokens: int
    sequential_requests: int
    core: int | None = None  # the client process runs on this core alone (None: wherever it is)


def run(load: StreamLoad) -> dict:
    """The child process's whole life: pin, then both phases."""
    if load.core is not None:
        os.sched_setaffinity(0, {load.core})
    return asyncio.run(_run(load))


def decoding_options(max_new_tokens: int) -> pb.DecodingOptions:
    """Greedy, exactly max_new_tokens: num_beams 0 would take the model's default, so 1 is sent."""
    return pb.DecodingOptions(max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, num_beams=1)


async def _run(load: StreamLoad) -> dict:
    options = decoding_options(load.max_new_tokens)
    async with grpc.aio.insecure_channel(load.address) as channel:
        stub = pb_grpc.GenerationStub(channel)
        concurrent = await _concurrent(stub, load, options)
        sequential = await _sequential(stub, load, options)
    return {"concurrent": concurrent, "sequential": sequential, "cores": sorted(os.sched_getaffinity(0))}


class _Tally:
    def __init__(self) -> None:
        self.tokens = 0  # received so far, over every stream
        self.lengths: collections.Counter[int] = collections.Counter()  # finished calls by tokens generated


async def _call(stub, text: str, options: pb.DecodingOptions, tally: _Tally) -> int:
    """One GenerateStream call to its end; returns the tokens it generated."""
    n = 0
    async for message in stub.GenerateStream(pb.GenerateRequest(input=text, options=options)):
        n += len(message.token_ids)
        tally.tokens += len(message.token_ids)
    tally.lengths[n] += 1
    return n


async def _concurrent(stub, load: StreamLoad, options: pb.DecodingOptions) -> dict:
    tally, stop = _Tally(), asyncio.Event()

    async def stream(i: int) -> None:
        while not stop.is_set():
            await _call(stub, load.inputs[i % len(load.inputs)], options, tally)
            i += load.streams

    tasks = [asyncio.create_task(stream(i)) for i in range(load.streams)]
    await asyncio.sleep(load.warmup_s)
    start, client0, server0 = time.perf_counter(), tally.tokens, await _scrape(load.metrics_url)
    await asyncio.sleep(load.duration_s)
    end, client1, server1 = time.perf_counter(), tally.tokens, await _scrape(load.metrics_url)
    stop.set()
    await asyncio.gather(*tasks)  # in-flight calls finish normally (nothing is cancelled mid-way)
    window = end - start
    return {"streams": load.streams, "window_s": round(window, 3), "client_tokens": client1 - client0,
            "server_tokens": int(server1 - server0), "client_tokens_per_s": round((client1 - client0) / window, 1),
            "server_tokens_per_s": round((server1 - server0) / window, 1), "calls": sum(tally.lengths.values()),
            "calls_by_generated_tokens": {str(k): v for k, v in sorted(tally.lengths.items())}}


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
