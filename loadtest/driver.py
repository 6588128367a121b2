"""`seqserve loadtest`: runs loadtest/locustfile.py headless in a child process and judges the run against SLOs.

Locust runs as a child because it monkey-patches its process with gevent; this process never imports locust.
A run writes to its report folder: summary.json, report.html, locust_stats.csv, locust_stats_history.csv,
locust_failures.csv, locust_exceptions.csv and locust.log (locust's own output).
"""
from __future__ import annotations

import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from seqserve.client.channel import CONNECTION_HELP
from seqserve.client.client import decoding_from_args, option_flags, options
from seqserve.client.flags import flag
from seqserve.loadtest.slo import Slo, missed
from seqserve.loadtest.summary import METHODS, Summary
from seqserve.loadtest.workload import heldout_file, target_languages

LOCUSTFILE = Path(__file__).with_name("locustfile.py")
_DURATION = re.compile(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")


class LoadTestError(RuntimeError):
    """Locust did not produce a summary (it crashed, or could not start)."""


def parse_duration(text: str) -> int:
    """Whole seconds from locust's time-span format: 90, 20s, 3m, 1h30m."""
    text = str(text).strip()
    if text.isdigit():
        return int(text)
    match = _DURATION.fullmatch(text)
    if not text or not match:
        raise ValueError(f"invalid duration {text!r}: use e.g. 90, 20s, 3m or 1h30m")
    h, m, s = (int(g or 0) for g in match.groups())
    return h * 3600 + m * 60 + s


@dataclass(frozen=True)
class LoadTest:
    target: str  # host:port of the gRPC server
    heldout: Path  # heldout.tsv whose sources are the inputs
    users: int = 8
    spawn_rate: float | None = None  # users started per second; None = all of them within the first second
    duration_s: int = 60
    methods: tuple[str, ...] = METHODS
    decoding: dict = field(default_factory=dict)  # DecodingOptions keywords; None = the server's default
    timeout_s: float | None = None  # deadline of each call
    stop_timeout_s: int = 30  # calls in flight at the end may finish, so client and server counts agree
    reset_stats: bool = False  # leave the ramp-up out of the statistics (sweep steps)
    connection: dict = field(default_factory=dict)  # client/channel.py's flags (TLS, client certificate, token file)
    source_language: str = ""  # a multilingual model's source language code
    target_languages: tuple[str, ...] = ()  # cycled call by call (--languages)
    model: str | None = None  # the model every call names (None = the server's one model)

    def __post_init__(self) -> None:
        if self.users < 1 or self.duration_s < 1:
            raise ValueError("--users and --duration must be at least 1 (user, second)")
        if not self.methods or set(self.methods) - set(METHODS):
            raise ValueError(f"--methods must be a subset of {','.join(METHODS)}")
        options(**self.decoding)  # an option of the wrong type fails here, before locust starts

    @classmethod
    def from_args(cls, args) -> LoadTest:
        return cls(target=args.target, heldout=heldout_file(args.heldout).resolve(), users=args.users,
                   spawn_rate=args.spawn_rate, duration_s=parse_duration(args.duration),
                   methods=tuple(m.strip() for m in args.methods.split(",") if m.strip()),
                   decoding=decoding_from_args(args), timeout_s=args.timeout,
                   stop_timeout_s=parse_duration(args.stop_timeout), model=getattr(args, "model", None),
                   connection={k: v for k in CONNECTION_HELP if (v := getattr(args, k, None)) not in (None, False)},
                   source_language=getattr(args, "source_language", "") or "",
                   target_languages=target_languages(getattr(args, "languages", "")))

    def locust_argv(self, out: Path) -> list[str]:
        argv = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--only-summary",
                "--host", self.target, "--users", str(self.users), "--spawn-rate", str(self.spawn_rate or self.users),
                "--run-time", f"{self.duration_s}s", "--stop-timeout", f"{self.stop_timeout_s}s",
                "--csv", str(out / "locust"), "--html", str(out / "report.html"),
                "--exit-code-on-error", "0",  # failed calls are results, judged by the SLOs; a crash still exits 1
                "--summary-json", str(out / "summary.json"), "--heldout", str(self.heldout), "--tags", *self.methods]
        argv += ["--reset-stats"] if self.reset_stats else []
        argv += ["--timeout", str(self.timeout_s)] if self.timeout_s else []
        argv += ["--source-language", self.source_language] if self.source_language else []
        argv += ["--languages", ",".join(self.target_languages)] if self.target_languages else []
        argv += ["--model", self.model] if self.model else []
        for name, value in self.connection.items():  # locust's users open their channels with the same flags
            argv += [flag(name)] + ([] if value is True else [str(value)])
        return argv + option_flags(self.decoding)


def run(test: LoadTest, out: Path, progress: bool = True) -> Summary:
    """Runs locust for test.duration_s (plus in-flight calls) and returns its summary; files go to out."""
    out.mkdir(parents=True, exist_ok=True)
    log = out / "locust.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(test.locust_argv(out), stdout=sink, stderr=subprocess.STDOUT)
        try:
            _wait(proc, test, progress)
        except BaseException:
            proc.terminate()  # locust's SIGTERM handler still writes its reports
            proc.wait(30)
            raise
    if proc.returncode != 0 or not (out / "summary.json").exists():
        tail = "\n".join(log.read_text().splitlines()[-20:])
        raise LoadTestError(f"locust exited with {proc.returncode} and no summary; the end of {log}:\n{tail}")
    return Summary.load(out / "summary.json")


def _wait(proc: subprocess.Popen, test: LoadTest, progress: bool) -> None:
    limit = time.monotonic() + test.duration_s + test.stop_timeout_s + 120  # start-up and shutdown slack
    with tqdm(total=test.duration_s, desc=f"{test.users} users", bar_format="{desc} {bar} {n}/{total} s",
              disable=not progress, leave=False) as bar:
        start = time.monotonic()
        while proc.poll() is None:
            if time.monotonic() > limit:
                raise LoadTestError(f"locust did not finish within {limit - start:.0f} s")
            time.sleep(0.2)
            bar.update(min(int(time.monotonic() - start), test.duration_s) - bar.n)


def judge(summary: Summary, slo: Slo, path: Path) -> tuple[int, list[str]]:
    """Records the SLO verdicts in summary.json; returns the exit code and one line per problem."""
    summary.slo = slo.check(summary) or None
    summary.write(path)
    problems = missed(summary.slo or {})
    if summary.successes == 0:
        problems.append(f"no call succeeded ({summary.requests} calls; failures by code: {summary.failures_by_code})")
    return (1 if problems else 0), problems
