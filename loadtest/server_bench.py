"""The pinned server benchmark: does the gRPC path keep up with the engine?

    python -m seqserve.loadtest.server_bench --bundle artifacts/bundle --markdown reports/server-bench.md

On one machine, in one run:
  1. the engine offline (Engine.generate, no gRPC) pinned to the server's core, 1 intra-op thread: tokens/s at batch
     --max-batch-size and the time per input at batch 1, on the bundle's held-out inputs;
  2. `seqserve serve --device DEVICE` pinned with `taskset -c <server core>` (1 intra-op thread, spinning off, max
     batch --max-batch-size), and --client-processes grpc.aio client processes (loadtest/bench_streams.py), each
     pinned to one of the other cores (from --client-core on, in turn): --streams concurrent streams shared among
     them for a timed window, then --sequential-requests calls one at a time. The clients' CPU time over the window
     is reported next to the server's, so a client limit is never read as a server one; then a window of unary
     Generate calls on the same server;
  3. the bare servicer (loadtest/bare_servicer.py: a grpc.aio servicer on our proto that does nothing but answer)
     pinned the same way, a window of each kind: served / ceiling, unary and streaming (loadtest/edge_ceiling.py).
Every generation is forced to --max-new-tokens tokens (min_new_tokens = max_new_tokens), offline and served. The
ratios: served tokens/s (the server's own /metrics count over the window) / offline tokens/s at the same batch, and
offline ms per input at batch 1 / served ms per call at concurrency 1 (1.0 = the gRPC path costs nothing).
`uptime` is recorded before and after: on a shared machine the load says how much the figures can be trusted.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import multiprocessing
import os
import shlex
import shutil
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from seqserve.contract.devices import DEVICES
from seqserve.contract.manifest import load_manifest
from seqserve.contract.tokenizer import load_tokenizer
from seqserve.contract.tsv import heldout_pairs
from seqserve.loadtest import bench_report, bench_streams, edge_ceiling
from seqserve.loadtest.bench_rows import ENGINE, RowSpec, Workload, run_row
from seqserve.loadtest.pinned_server import free_port, launched

PROG = "python -m seqserve.loadtest.server_bench"
MAX_CLIENT_PROCESSES = 64
DEFAULT_CLIENT_PROCESSES = 4  # and at most one per usable core: enough processes that one client core is no limit


@dataclass(frozen=True)
class ServerBenchConfig:
    bundle: Path
    variant: str = "fp32"
    streams: int = 64  # concurrent streams of the first phase
    max_batch_size: int = 64  # the server's, and the offline engine's batch
    max_new_tokens: int = 32  # forced: every generation is exactly this long
    warmup_s: float = 3.0
    duration_s: float = 20.0  # the timed window of the concurrent phase
    sequential_requests: int = 200  # concurrency 1
    num_inputs: int = 256  # held-out inputs: the offline rows decode each once; the client uses them in turn
    server_core: int = 0
    client_core: int = 1
    threads: int = 1  # intra-op threads, server and offline engine
    startup_timeout_s: float = 300.0
    device: str = "cpu"  # the served engine's and the offline engine's (cuda: onnxruntime's CUDA provider)
    client_processes: int | None = None  # None = DEFAULT_CLIENT_PROCESSES, at most one per usable core
    # The engine in its own process (`serve --engine-process`) pinned to --server-core, the gRPC front end to
    # --front-end-core (default: --client-core: with 2 cores it shares the clients' core); else both in one process.
    engine_process: bool = False
    front_end_core: int | None = None
    inputs: Path | None = None  # one source text per line, instead of the bundle's held-out split (an imported model)
    out: Path | None = None
    markdown: Path | None = None

    def __post_init__(self) -> None:
        if min(self.streams, self.max_batch_size, self.max_new_tokens, self.sequential_requests, self.num_inputs,
               self.threads) <= 0 or self.duration_s <= 0 or self.warmup_s < 0:
            raise ValueError("counts, sizes and --duration must be positive")
        usable = os.sched_getaffinity(0)
        if self.server_core not in usable or self.client_core not in usable or self.server_core == self.client_core:
            raise ValueError(f"--server-core and --client-core must be two different cores of {sorted(usable)}")
        if self.device not in DEVICES:
            raise ValueError(f"--device must be one of {DEVICES}, got {self.device!r}")
        if self.front_end_core is None:
            object.__setattr__(self, "front_end_core", self.client_core)
        if self.front_end_core not in usable or (self.engine_process and self.front_end_core == self.server_core):
            raise ValueError(f"--front-end-core must be a core of {sorted(usable)} other than --server-core")
        if self.client_processes is None:
            object.__setattr__(self, "client_processes", min(DEFAULT_CLIENT_PROCESSES, len(usable)))
        if not 1 <= self.client_processes <= min(MAX_CLIENT_PROCESSES, self.streams):
            raise ValueError(f"--client-processes must be between 1 and {MAX_CLIENT_PROCESSES} and at most --streams "
                             f"({self.streams}), got {self.client_processes}")

    @property
    def client_cores(self) -> list[int]:
        """Each client process's core: the usable cores but the server's (the engine's), from --client-core on, in
        turn."""
        others = sorted(os.sched_getaffinity(0) - {self.server_core})
        first = others.index(self.client_core)
        return [others[(first + i) % len(others)] for i in range(self.client_processes)]

    def command(self) -> str:
        parts = [*shlex.split(PROG), "--bundle", str(self.bundle), "--variant", self.variant, "--streams",
                 str(self.streams), "--max-batch-size", str(self.max_batch_size), "--max-new-tokens",
                 str(self.max_new_tokens), "--warmup", str(self.warmup_s), "--duration", str(self.duration_s),
                 "--sequential-requests", str(self.sequential_requests), "-n", str(self.num_inputs),
                 "--server-core", str(self.server_core), "--client-core", str(self.client_core),
                 "--client-processes", str(self.client_processes), "--threads", str(self.threads), "--device",
                 self.device]
        if self.engine_process:
            parts += ["--engine-process", "--front-end-core", str(self.front_end_core)]
        if self.inputs is not None:
            parts += ["--inputs", str(self.inputs)]
        return shlex.join(parts)


def _pinned(core: int, fn, *args):
    """fn(*args) in a fresh spawned process that runs on `core` alone."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=context, initializer=os.sched_setaffinity, initargs=(0, {core})) as pool:
        return pool.submit(fn, *args).result()


def offline(cfg: ServerBenchConfig, sources: list[list[int]]) -> dict:
    """The engine without gRPC on the server's core: batch max_batch_size and batch 1, forced length."""
    work = Workload(sources, cfg.max_new_tokens, cfg.threads, cfg.device, None, cfg.bundle,
                    min_new_tokens=cfg.max_new_tokens)
    out = {}
    for batch in (cfg.max_batch_size, 1):
        run = _pinned(cfg.server_core, run_row, RowSpec(ENGINE, cfg.variant, batch), work)
        tokens = sum(map(len, run.outputs))
        out[f"b{batch}"] = {"batch_size": batch, "tokens_per_s": round(tokens / run.wall_s, 1),
                            "ms_per_input": round(1e3 * run.wall_s / len(sources), 3), "device": run.device,
                            "cpu_us_per_token": round(1e6 * run.cpu_s / tokens, 2),
                            "graph": run.graph,
                            "lengths": sorted({len(o) for o in run.outputs})}
    return out


def server_argv(cfg: ServerBenchConfig, port: int, metrics_port: int) -> list[str]:
    if shutil.which("taskset") is None:
        raise ValueError("taskset (util-linux) is needed to pin the server")
    core = cfg.front_end_core if cfg.engine_process else cfg.server_core
    split = ["--engine-process", "--engine-cpus", str(cfg.server_core)] if cfg.engine_process else []
    return ["taskset", "-c", str(core), sys.executable, "-m", "seqserve.cli.main", "serve", "--bundle",
            str(cfg.bundle), "--variant", cfg.variant, "--device", cfg.device, "--port", str(port), "--metrics-port",
            str(metrics_port), "--intra-op-threads", str(cfg.threads), "--no-allow-spinning", "--max-batch-size",
            str(cfg.max_batch_size), "--max-waiting", str(max(256, 2 * cfg.streams)), "--log-level", "WARNING",
            *split]


@contextlib.contextmanager
def served(cfg: ServerBenchConfig):
    """`seqserve serve` pinned to the server core, until it answers SERVING; yields (argv, address, metrics URL,
    its process id)."""
    port, metrics_port = free_port(), free_port()
    argv = server_argv(cfg, port, metrics_port)
    address = f"127.0.0.1:{port}"
    with launched(argv, address, cfg.startup_timeout_s) as pid:
        yield argv, address, f"http://127.0.0.1:{metrics_port}/metrics", pid


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def input_texts(cfg: ServerBenchConfig) -> list[str]:
    """The first --num-inputs sources: --inputs' non-blank lines, else the bundle's held-out split."""
    if cfg.inputs is not None:
        texts = [line.strip() for line in cfg.inputs.read_text(encoding="utf-8").splitlines() if line.strip()]
        if not texts:
            raise ValueError(f"--inputs {cfg.inputs} has no non-blank line")
        return texts[: cfg.num_inputs]
    texts = [text for text, _ in heldout_pairs(cfg.bundle, cfg.num_inputs)]
    if not texts:
        raise ValueError(f"{cfg.bundle} has no held-out inputs (heldout.tsv; an imported model has none): "
                         "give --inputs FILE, one source per line")
    return texts


def bench(cfg: ServerBenchConfig) -> dict:
    manifest = load_manifest(cfg.bundle)
    if cfg.max_new_tokens > int(manifest.max_new_tokens):
        raise ValueError(f"--max-new-tokens {cfg.max_new_tokens} exceeds the bundle's cap {manifest.max_new_tokens}")
    texts = input_texts(cfg)
    tokenizer = load_tokenizer(cfg.bundle / manifest.tokenizer["file"])
    sources = [tokenizer.encode(text).ids for text in texts]
    before, machine = uptime(), bench_report.machine()
    engine = offline(cfg, sources)
    with served(cfg) as (argv, address, metrics_url, pid):
        load = bench_streams.StreamLoad(address, metrics_url, texts, cfg.streams, cfg.warmup_s,
                                        cfg.duration_s, cfg.max_new_tokens, cfg.sequential_requests, server_pid=pid)
        budget = cfg.startup_timeout_s + cfg.warmup_s + cfg.duration_s + bench_streams.RESULT_SLACK_S
        client = bench_streams.run_processes(load, cfg.client_cores, budget + cfg.sequential_requests)
        unary = edge_ceiling.window(cfg, address, metrics_url, texts, pid, unary=True)
    bare_command, bare = edge_ceiling.bare(cfg, texts)
    batched, one = engine[f"b{cfg.max_batch_size}"], engine["b1"]
    machine["onnxruntime_providers_used"] = [one["device"]]  # the server runs the same (--device is passed on)
    concurrent, sequential = client["concurrent"], client["sequential"]
    concurrent["engine_offline_tokens_per_s"] = batched["tokens_per_s"]
    concurrent["server_per_engine"] = round(concurrent["server_tokens_per_s"] / batched["tokens_per_s"], 3)
    sequential["engine_offline_ms_per_input"] = one["ms_per_input"]
    sequential["engine_per_server"] = round(one["ms_per_input"] / sequential["mean_ms"], 3)
    edge = {kind: edge_ceiling.row(served_window, bare[kind], batched["tokens_per_s"], batched["cpu_us_per_token"])
            for kind, served_window in (("unary", unary), ("stream", concurrent))}
    edge["unary"]["served"] = unary
    return {"command": cfg.command(), "server_command": shlex.join(argv),
            "created": datetime.datetime.now().astimezone().isoformat(), "machine": machine,
            "uptime_before": before, "uptime_after": uptime(),
            "settings": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()},
            "client_cores": client["cores"], "concurrent": concurrent, "sequential": sequential,
            "engine_offline": engine, "bare_command": shlex.join(bare_command), "edge": edge}


def table(report: dict) -> str:
    """The issue's table: server, engine offline on the same core, and their ratio."""
    c, s = report["concurrent"], report["sequential"]
    return "\n".join([
        "| | server | engine offline, same core | ratio |", "|---|---:|---:|---:|",
        f"| {c['streams']} concurrent streams, tokens/s | {c['server_tokens_per_s']:,.0f} (client: "
        f"{c['client_tokens_per_s']:,.0f}) | {c['engine_offline_tokens_per_s']:,.0f} (batch "
        f"{report['settings']['max_batch_size']}) | {c['server_per_engine']:.2f}x |",
        f"| concurrency 1, ms per request | {s['mean_ms']:.2f} (p50 {s['p50_ms']:.2f}, p99 {s['p99_ms']:.2f}) | "
        f"{s['engine_offline_ms_per_input']:.2f} (batch 1) | {s['engine_per_server']:.2f}x |"])


def edge_table(report: dict) -> str:
    return edge_ceiling.table(report["edge"], report["concurrent"]["streams"], report["settings"]["max_new_tokens"])


def cpu_line(report: dict) -> str:
    """Who was busy in the timed window: the server's process and every client process, in cores."""
    c = report["concurrent"]
    server = (f"server {c['server_cpu_cores_busy']:.2f} cores ({c['server_cpu_s']:.1f} s)"
              if c["server_cpu_s"] is not None else "server not measured")
    each = ", ".join(f"{p['cpu_cores_busy']:.2f} on core {p['core']}" for p in c["client_cpu_per_process"])
    return (f"CPU over the {c['window_s']:.1f} s window: {server}; {c['client_processes']} client process(es) "
            f"{c['client_cpu_cores_busy']:.2f} cores ({c['client_cpu_s']:.1f} s: {each}). A client process near "
            "1.00 is the limit of the figures, not the server.")


def markdown_section(report: dict) -> str:
    return "\n".join(["## Pinned server benchmark", "", "```", report["command"], "```", "",
                      f"Server: `{report['server_command']}`.", "",
                      f"Machine: {bench_report.describe(report['machine'])}.",
                      f"`uptime` before: `{report['uptime_before']}`; after: `{report['uptime_after']}`.", "",
                      table(report), "", cpu_line(report), "",
                      f"The edge against its ceiling (bare servicer: `{report['bare_command']}`):", "",
                      edge_table(report), ""])


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = argparse.Namespace(**{f.name: f.default for f in fields(ServerBenchConfig)})  # the defaults, unvalidated
    p.add_argument("--bundle", required=True, help="bundle directory (its heldout.tsv gives the inputs unless --inputs)")
    p.add_argument("--variant", default=d.variant, help="precision variant, served and offline")
    p.add_argument("--streams", type=int, default=d.streams, help="concurrent streams of the timed phase")
    p.add_argument("--max-batch-size", type=int, default=d.max_batch_size, help="the server's and the offline batch")
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens,
                   help="every generation is forced to exactly this many tokens (min_new_tokens too)")
    p.add_argument("--warmup", type=float, default=d.warmup_s, help="seconds of load before the timed window")
    p.add_argument("--duration", type=float, default=d.duration_s, help="seconds of the timed window")
    p.add_argument("--sequential-requests", type=int, default=d.sequential_requests, help="concurrency-1 calls")
    p.add_argument("-n", "--num-inputs", type=int, default=d.num_inputs, help="inputs (first N)")
    p.add_argument("--inputs", help="source texts, one per line (default: the bundle's heldout.tsv)")
    p.add_argument("--server-core", type=int, default=d.server_core, help="core of the server and offline engine")
    p.add_argument("--client-core", type=int, default=d.client_core,
                   help="core of the first client process; the others take the next usable cores but the server's")
    p.add_argument("--client-processes", type=int,
                   help=f"gRPC client processes sharing the streams (1-{MAX_CLIENT_PROCESSES}, at most --streams; "
                        f"default: {DEFAULT_CLIENT_PROCESSES}, at most one per usable core)")
    p.add_argument("--device", choices=DEVICES, default=d.device,
                   help="the served engine's and the offline engine's onnxruntime device")
    p.add_argument("--threads", type=int, default=d.threads, help="intra-op threads (server and offline engine)")
    p.add_argument("--engine-process", action="store_true",
                   help="serve with the engine in its own process on --server-core (serve --engine-process)")
    p.add_argument("--front-end-core", type=int, help="with --engine-process: the gRPC front end's core (default: "
                                                      "--client-core)")
    p.add_argument("--out", help="JSON report (default: reports/server-bench-<timestamp>.json)")
    p.add_argument("--markdown", help="also write the markdown section here")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_arguments(parser)
    a = parser.parse_args(argv)
    path = lambda value: Path(value) if value else None  # noqa: E731
    try:
        cfg = ServerBenchConfig(Path(a.bundle), a.variant, a.streams, a.max_batch_size, a.max_new_tokens, a.warmup,
                                a.duration, a.sequential_requests, a.num_inputs, a.server_core, a.client_core,
                                a.threads, inputs=path(a.inputs), out=path(a.out),
                                markdown=path(a.markdown), device=a.device, client_processes=a.client_processes,
                                engine_process=a.engine_process, front_end_core=a.front_end_core)
        report = bench(cfg)
    except (ValueError, FileNotFoundError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    out = cfg.out or Path("reports") / f"server-bench-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(table(report))
    print(cpu_line(report))
    print(edge_table(report))
    print(f"uptime before: {report['uptime_before']}\nuptime after: {report['uptime_after']}\n-> {out}")
    if cfg.markdown is not None:
        cfg.markdown.parent.mkdir(parents=True, exist_ok=True)
        cfg.markdown.write_text(markdown_section(report) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
