"""SLO flags: a missed one makes `seqserve loadtest` exit non-zero and name it."""
from __future__ import annotations

import json

from seqserve.loadtest.slo import Slo, missed
from seqserve.loadtest.summary import Summary


def test_unmeetable_slo_fails_the_command_and_names_it(server, loadtest, tmp_path):
    code, out = loadtest(server, "--users", "2", "--duration", "2s", "--report-dir", str(tmp_path),
                         "--max-p99-ms", "0.001", "--max-failure-rate", "0")
    assert code == 1
    assert "SLO missed: --max-p99-ms 0.001" in out and "SLO missed: --max-failure-rate" not in out
    verdicts = json.loads((tmp_path / "summary.json").read_text())["slo"]
    assert verdicts["--max-p99-ms"]["met"] is False and verdicts["--max-failure-rate"]["met"] is True


def _summary(**overrides) -> Summary:
    values = dict(target="t", users=1, duration_s=1.0, requests=10, failures=1, failure_rate=0.1, requests_per_s=10.0,
                  generated_tokens=50, generated_tokens_per_s=50.0, latency_ms={"p50": 5, "p95": 9, "p99": 12},
                  time_to_first_token_ms={"p50": None, "p99": None}, failures_by_code={"UNAVAILABLE": 1},
                  methods={}) | overrides
    return Summary(**values)


def test_slo_bounds_and_missing_measurements():
    verdicts = Slo(max_p99_ms=12, min_rps=10, max_failure_rate=0.05, min_tokens_per_s=51,
                   max_ttft_p99_ms=100).check(_summary())
    assert {flag: v["met"] for flag, v in verdicts.items()} == {
        "--max-p99-ms": True, "--min-rps": True,  # limits are inclusive
        "--max-failure-rate": False, "--min-tokens-per-s": False,
        "--max-ttft-p99-ms": False}  # no streams ran: nothing to measure counts as missed
    assert missed(verdicts) == ["SLO missed: --max-ttft-p99-ms 100 (measured nothing)",
                                "SLO missed: --max-failure-rate 0.05 (measured 0.1)",
                                "SLO missed: --min-tokens-per-s 51 (measured 50)"]
    assert Slo().check(_summary()) == {} and not Slo().any
