"""The summary of one load-test run: what a capacity plan or a CI gate reads (summary.json).

Built inside the locust process from its request statistics; read anywhere else without importing locust
(importing locust monkey-patches the process with gevent).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

# Locust request types: a whole call (Generate, GenerateStream) and a stream's time to first token.
CALL = "grpc"
FIRST_TOKEN = "ttft"
METHODS = ("Generate", "GenerateStream")


@dataclass
class Summary:
    target: str
    users: int
    duration_s: float  # first request to last, as locust measures it
    requests: int  # completed calls, failed ones included
    failures: int
    failure_rate: float
    requests_per_s: float
    generated_tokens: int  # sum of the responses' usage.generated_tokens (end token excluded)
    generated_tokens_per_s: float
    latency_ms: dict[str, float | None]  # p50, p95, p99 of whole calls
    time_to_first_token_ms: dict[str, float | None]  # p50, p99 of streams (None without streams)
    failures_by_code: dict[str, int]  # gRPC status code name -> calls
    methods: dict[str, dict[str, int]]  # per method: requests, failures, generated_tokens
    decoding: dict = field(default_factory=dict)  # the options every call carried (unset ones omitted)
    slo: dict | None = None  # filled by the driver: each SLO flag's limit, measured value and verdict

    @property
    def successes(self) -> int:
        return self.requests - self.failures

    @classmethod
    def from_stats(cls, stats, target: str, users: int, decoding: dict) -> Summary:
        """stats: the locust process's RequestStats (locust is imported here, never at module level)."""
        from locust.stats import StatsEntry, StatsError

        calls = StatsEntry(stats, "calls", CALL)
        methods = {}
        for (name, kind), entry in stats.entries.items():
            if kind == CALL:
                calls.extend(entry)
                methods[name] = {"requests": entry.num_requests, "failures": entry.num_failures,
                                 "generated_tokens": entry.total_content_length}
        ttft = stats.entries.get(("GenerateStream", FIRST_TOKEN))
        duration = max((stats.last_request_timestamp or stats.start_time) - stats.start_time, 1e-9)
        by_code: dict[str, int] = {}
        for error in stats.errors.values():
            if error.method == CALL:  # the error's text is the status code name (see grpc_user.RpcFailure)
                code = StatsError.parse_error(error.error)
                by_code[code] = by_code.get(code, 0) + error.occurrences
        return cls(target=target, users=users, duration_s=round(duration, 3), requests=calls.num_requests,
                   failures=calls.num_failures, failure_rate=calls.num_failures / max(calls.num_requests, 1),
                   requests_per_s=calls.num_requests / duration, generated_tokens=calls.total_content_length,
                   generated_tokens_per_s=calls.total_content_length / duration,
                   latency_ms=_percentiles(calls, 0.5, 0.95, 0.99),
                   time_to_first_token_ms=_percentiles(ttft, 0.5, 0.99),
                   failures_by_code=by_code, methods=methods,
                   decoding={k: v for k, v in decoding.items() if v is not None})

    def write(self, path: Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> Summary:
        return cls(**json.loads(Path(path).read_text()))

    def describe(self) -> str:
        """Two lines for a terminal."""
        lat, ttft = self.latency_ms, self.time_to_first_token_ms
        codes = ", ".join(f"{code} {n}" for code, n in sorted(self.failures_by_code.items()))
        return (f"{self.target}, {self.users} users, {self.duration_s:.1f} s: {self.requests} calls "
                f"({self.failures} failed{': ' + codes if codes else ''}), {self.requests_per_s:.1f} requests/s, "
                f"{self.generated_tokens_per_s:.1f} generated tokens/s\n"
                f"latency p50 {_ms(lat['p50'])}, p95 {_ms(lat['p95'])}, p99 {_ms(lat['p99'])}; "
                f"time to first token p50 {_ms(ttft['p50'])}, p99 {_ms(ttft['p99'])}")


def _percentiles(entry, *quantiles: float) -> dict[str, float | None]:
    # Locust keeps response times in rounded buckets (1 ms below 100 ms), so these are milliseconds at that grain.
    has = entry is not None and entry.num_requests > 0
    return {f"p{round(q * 100)}": entry.get_response_time_percentile(q) if has else None for q in quantiles}


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:g} ms"
