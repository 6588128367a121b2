"""Locust load test for seqserve's gRPC API: closed-loop users calling Generate and GenerateStream.

Headless, with a summary JSON, SLO checks and capacity sweeps (the usual way; it runs this file):

    seqserve loadtest --target 127.0.0.1:50051 --heldout artifacts/bundle --users 8 --duration 60s

Interactive, with locust's web UI on http://localhost:8089 (from the repository root, venv active):

    locust -f loadtest/locustfile.py --host 127.0.0.1:50051 --heldout artifacts/bundle --stop-timeout 30 \\
        --web-host 127.0.0.1

(`--stop-timeout` lets calls in flight finish when you press Stop, so locust's counts match the server's.)

Inputs are drawn at random from the held-out split the bundle was evaluated on (`--heldout`: the bundle
directory or its heldout.tsv). Decoding options are the proto's names as flags (`--max-new-tokens`,
`--temperature`, `--top-k`, `--top-p`, `--repetition-penalty`, `--min-new-tokens`, `--stop`, `--seed`,
`--num-beams`, `--num-return-sequences`, `--length-penalty`, `--early-stopping`, `--return-logprobs`,
`--top-logprobs`); the web UI shows them under "Custom parameters" (booleans as true / false).
`--tags Generate` or `--tags GenerateStream` runs one method only. A multilingual model takes a language mix:
`--source-language en_XX --languages fr_XX,de_DE` (the calls cycle through the target languages). `--model NAME`
targets one model of a server that serves several.

Statistics: request type "grpc" rows are whole calls, with "content size" = generated tokens; "ttft" rows are
streams' time to first token (so locust's own "Aggregated" row counts each stream twice; summary.json does not).
Failures are grouped by gRPC status code. `--summary-json PATH` writes summary.json whenever a test stops.
A server with TLS or bearer tokens (docs/security.md): `--ca-file`, `--cert-file`/`--key-file`, `--token-file` (or
the SEQSERVE_TOKEN environment variable), as `seqserve generate` takes them.
"""
from __future__ import annotations

import csv
import os
import random

from locust import constant, events, tag, task
from locust.stats import PERCENTILES_TO_REPORT, StatsCSV

from seqserve.client.channel import add_connection_arguments
from seqserve.client.client import add_decoding_arguments, decoding_from_args
from seqserve.loadtest.grpc_user import GrpcUser
from seqserve.loadtest.summary import Summary
from seqserve.loadtest.workload import Workload, add_language_arguments, heldout_sources, target_languages


@events.init_command_line_parser.add_listener
def _add_arguments(parser) -> None:
    parser.add_argument("--heldout", default="artifacts/bundle",
                        help="bundle directory (or its heldout.tsv) whose held-out sources are the inputs")
    parser.add_argument("--timeout", type=float, help="deadline of each call in seconds (unset = none)")
    parser.add_argument("--model", default="", help="the model every call names (needed when the server serves "
                                                    "several; empty = its one model)")
    parser.add_argument("--summary-json", include_in_web_ui=False, help="write the run's summary here on stop")
    add_connection_arguments(parser, include_in_web_ui=False)
    add_decoding_arguments(parser)
    add_language_arguments(parser)


class SeqserveUser(GrpcUser):
    wait_time = constant(0)  # closed loop: a user's next call leaves as soon as its last one ended
    workload: Workload  # set at each test start, so values typed into the web UI apply to the next run

    def on_start(self) -> None:
        super().on_start()
        self.rng = random.Random()

    @tag("Generate")
    @task
    def unary(self) -> None:
        self.generate(self.workload.request(self.rng), self.workload.timeout)

    @tag("GenerateStream")
    @task
    def stream(self) -> None:
        self.generate_stream(self.workload.request(self.rng), self.workload.timeout)


@events.test_start.add_listener
def _load_workload(environment, **_) -> None:
    o = environment.parsed_options
    timeout = float(o.timeout) if o.timeout not in (None, "") else None  # the web UI sends strings
    SeqserveUser.workload = Workload(heldout_sources(o.heldout), decoding_from_args(o), timeout,
                                     o.source_language or "", target_languages(o.languages),
                                     model=(o.model or "").strip())


@events.test_stop.add_listener
def _write_summary(environment, **_) -> None:
    o = environment.parsed_options
    if o.summary_json:
        summary = Summary.from_stats(environment.stats, target=environment.host or "", users=int(o.num_users or 0),
                                     decoding=SeqserveUser.workload.decoding)
        summary.write(o.summary_json)


@events.quitting.add_listener
def _write_final_csv(environment, **_) -> None:
    """Locust writes its CSV files once a second, so they miss the last second; rewrite them from the final stats."""
    prefix = environment.parsed_options.csv_prefix
    if not prefix:
        return
    table = StatsCSV(environment, PERCENTILES_TO_REPORT)
    for suffix, write in (("stats", table.requests_csv), ("failures", table.failures_csv),
                          ("exceptions", table.exceptions_csv)):
        path = f"{prefix}_{suffix}.csv"
        with open(path + ".tmp", "w", newline="") as f:
            write(csv.writer(f))
        os.replace(path + ".tmp", path)  # a new file: locust's own handle still flushes into the old one on close
