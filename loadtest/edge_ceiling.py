"""The edge against its own ceiling: server_bench's served rows beside the bare servicer's (loadtest/bare_servicer.py)
and the offline engine's, from the same run.

On one core, a grpc.aio servicer that does nothing but answer is the limit of any Python edge. A served call costs
the edge's time plus the engine's, so the most a Python edge in front of this engine could serve is

    ceiling = 1 / (bare seconds per call + engine offline seconds per call)

and, every call forced to the same number of tokens, in tokens/s: 1 / (1 / bare tokens/s + 1 / engine tokens/s).
served / ceiling is 1.0 where our own edge costs nothing beyond grpc.aio's. Unary (Generate) and streaming
(GenerateStream: the bare servicer sends one message per token) each get their row; both counted by the clients.

On a shared machine other work takes the pinned core too, by different amounts in each phase, so wall-clock figures
from different phases compare poorly. The same ratio in CPU time does not depend on that: each server's CPU
seconds over its window (/proc) and the offline engine's own (process time) per token, and
served / ceiling (CPU) = (bare CPU per token + engine CPU per token) / served CPU per token.
"""
from __future__ import annotations

import sys

from seqserve.loadtest import bench_streams
from seqserve.loadtest.pinned_server import free_port, launched

BARE_MODULE = "seqserve.loadtest.bare_servicer"
KINDS = ("unary", "stream")


def bare_argv(core: int, port: int, tokens: int) -> list[str]:
    """The bare servicer pinned as the server is (taskset -c <server core>)."""
    return ["taskset", "-c", str(core), sys.executable, "-m", BARE_MODULE, "--port", str(port), "--tokens",
            str(tokens)]


def window(cfg, address: str, metrics_url: str | None, texts: list[str], pid: int, unary: bool) -> dict:
    """One timed window of cfg.streams concurrent calls (Generate when unary, else GenerateStream), no
    sequential phase: the merged concurrent figures (loadtest/bench_streams.py)."""
    load = bench_streams.StreamLoad(address, metrics_url, texts, cfg.streams, cfg.warmup_s, cfg.duration_s,
                                    cfg.max_new_tokens, 0, server_pid=pid, unary=unary)
    budget = cfg.startup_timeout_s + cfg.warmup_s + cfg.duration_s + bench_streams.RESULT_SLACK_S
    return bench_streams.run_processes(load, cfg.client_cores, budget)["concurrent"]


def bare(cfg, texts: list[str]) -> tuple[list[str], dict[str, dict]]:
    """The bare servicer on the server's core: its argv and a window of each kind."""
    port = free_port()
    argv = bare_argv(cfg.server_core, port, cfg.max_new_tokens)
    address = f"127.0.0.1:{port}"
    with launched(argv, address, cfg.startup_timeout_s) as pid:
        return argv, {kind: window(cfg, address, None, texts, pid, kind == "unary") for kind in KINDS}


def ceiling_tokens_per_s(bare_tokens_per_s: float, engine_tokens_per_s: float) -> float:
    """1 / (bare seconds per token + engine seconds per token): per call, as every call has the same length."""
    return 1.0 / (1.0 / bare_tokens_per_s + 1.0 / engine_tokens_per_s)


def cpu_us_per_token(window_figures: dict) -> float:
    """A server's CPU microseconds per token over its window (its process tree's CPU / the tokens received)."""
    return 1e6 * window_figures["server_cpu_s"] / max(1, window_figures["client_tokens"])


def row(served: dict, bare_window: dict, engine_tokens_per_s: float, engine_cpu_us_per_token: float) -> dict:
    """One kind's figures: served, bare and engine tokens/s, the ceiling, and served / ceiling (wall and CPU)."""
    top = ceiling_tokens_per_s(bare_window["client_tokens_per_s"], engine_tokens_per_s)
    cpu = {"served": cpu_us_per_token(served), "bare": cpu_us_per_token(bare_window),
           "engine_offline": engine_cpu_us_per_token}
    return {"served_tokens_per_s": served["client_tokens_per_s"], "bare_tokens_per_s":
            bare_window["client_tokens_per_s"], "engine_offline_tokens_per_s": engine_tokens_per_s,
            "ceiling_tokens_per_s": round(top, 1), "served_per_ceiling": round(served["client_tokens_per_s"] / top, 3),
            "served_messages_per_call": served["messages_per_call"],
            "bare_messages_per_call": bare_window["messages_per_call"],
            "served_cpu_cores_busy": served["server_cpu_cores_busy"],
            "bare_cpu_cores_busy": bare_window["server_cpu_cores_busy"],
            "client_cpu_cores_busy": [served["client_cpu_cores_busy"], bare_window["client_cpu_cores_busy"]],
            "cpu_us_per_token": {k: round(v, 2) for k, v in cpu.items()},
            "served_per_ceiling_cpu": round((cpu["bare"] + cpu["engine_offline"]) / cpu["served"], 3),
            "bare": bare_window}


def table(edge: dict, streams: int, tokens: int) -> str:
    head = (f"| {streams} concurrent calls of {tokens} tokens | served tokens/s | bare servicer | engine offline | "
            "ceiling | served / ceiling | CPU us per token (served, bare, engine) | served / ceiling, CPU | "
            "messages per call (served, bare) |")
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for kind in KINDS:
        r = edge[kind]
        cpu = r["cpu_us_per_token"]
        lines.append(f"| {kind} | {r['served_tokens_per_s']:,.0f} | {r['bare_tokens_per_s']:,.0f} | "
                     f"{r['engine_offline_tokens_per_s']:,.0f} | {r['ceiling_tokens_per_s']:,.0f} | "
                     f"{r['served_per_ceiling']:.2f} | {cpu['served']:.1f}, {cpu['bare']:.1f}, "
                     f"{cpu['engine_offline']:.1f} | {r['served_per_ceiling_cpu']:.2f} | "
                     f"{r['served_messages_per_call']:.1f}, "
                     f"{r['bare_messages_per_call']:.1f} |")
    return "\n".join(lines)
