"""`seqserve loadtest`: its flags, and the choice between one headless run (driver.py) and a sweep (sweep.py)."""
from __future__ import annotations

import sys
import time
from pathlib import Path

from seqserve.client.channel import add_connection_arguments
from seqserve.client.client import add_decoding_arguments
from seqserve.client.flags import DEFAULT_ADDRESS
from seqserve.loadtest.driver import LoadTest, LoadTestError, judge, run
from seqserve.loadtest.slo import Slo
from seqserve.loadtest.summary import METHODS
from seqserve.loadtest.sweep import Sweep
from seqserve.loadtest.workload import add_language_arguments


def add_arguments(parser) -> None:
    parser.add_argument("--target", default=DEFAULT_ADDRESS,
                        help="host:port of the gRPC server (default %(default)s)")
    add_connection_arguments(parser)  # TLS, mutual TLS and a bearer token, as every seqserve client
    parser.add_argument("--heldout", default="artifacts/bundle",
                        help="bundle directory (or its heldout.tsv) whose held-out sources are the inputs "
                             "(default %(default)s)")
    parser.add_argument("--users", type=int, default=8, help="concurrent closed-loop users (default %(default)s)")
    parser.add_argument("--spawn-rate", type=float, help="users started per second (default: all at once)")
    parser.add_argument("--duration", default="60s", help="run time: 90, 60s, 5m, 1h30m (default %(default)s)")
    parser.add_argument("--methods", default=",".join(METHODS), help="RPCs the users call, in equal shares")
    parser.add_argument("--timeout", type=float, help="deadline of each call in seconds (unset = none)")
    parser.add_argument("--model", help="the model every call names (needed when the server serves several)")
    parser.add_argument("--stop-timeout", default="30s",
                        help="how long calls in flight at the end may finish (default %(default)s)")
    parser.add_argument("--report-dir", help="output folder (default: reports/loadtest-<timestamp>)")
    parser.add_argument("--sweep", help="capacity sweep: comma-separated user counts, one step each, e.g. 1,2,4,8")
    parser.add_argument("--step-duration", default="20s", help="run time of each sweep step (default %(default)s)")
    Slo.add_arguments(parser)
    add_decoding_arguments(parser.add_argument_group("decoding options (unset = the server's defaults)"))
    add_language_arguments(parser.add_argument_group("languages (a multilingual model)"))


def main(args) -> int:
    test, slo = LoadTest.from_args(args), Slo.from_args(args)
    report_dir = Path(args.report_dir or f"reports/loadtest-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        if args.sweep:
            return Sweep.from_args(args, test, slo).run(report_dir)
        summary = run(test, report_dir)
    except LoadTestError as exc:
        print(f"seqserve loadtest: error: {exc}", file=sys.stderr)
        return 2
    code, problems = judge(summary, slo, report_dir / "summary.json")
    print(summary.describe())
    print(f"-> {report_dir}/ (summary.json, report.html, locust_*.csv, locust.log)")
    for line in problems:
        print(line)
    return code
