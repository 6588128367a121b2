"""A short headless locust run against a real server: reports, summary, failures by code, and Prometheus agreement."""
from __future__ import annotations

import csv
import json

import pytest
from grpc_harness import Served

from seqserve.cli.main import main
from seqserve.loadtest.summary import METHODS


@pytest.fixture(scope="module")
def headless(tiny_bundle, tmp_path_factory):
    """One 3-user, 3-second run against a fresh server, which stays up for the agreement check."""
    server = Served(tiny_bundle).wait_ready()
    report = tmp_path_factory.mktemp("headless")
    # min = max = 3 new tokens makes every generation exactly 3 tokens long, proving the flags reach the server.
    code = main(["loadtest", "--target", server.address, "--heldout", str(tiny_bundle), "--users", "3",
                 "--duration", "3s", "--report-dir", str(report), "--max-new-tokens", "3", "--min-new-tokens", "3",
                 "--max-failure-rate", "0"])
    yield code, report, json.loads((report / "summary.json").read_text()), server
    server.stop()


def test_headless_run_has_no_failures_and_writes_reports(headless):
    code, report, summary, _ = headless
    assert code == 0
    assert summary["requests"] > 0 and summary["failures"] == 0 and summary["failures_by_code"] == {}
    assert summary["requests_per_s"] > 0 and summary["generated_tokens_per_s"] > 0
    assert all(summary["methods"][m]["requests"] > 0 for m in METHODS)
    assert summary["generated_tokens"] == 3 * summary["requests"]
    assert summary["decoding"] == {"max_new_tokens": 3, "min_new_tokens": 3}
    assert None not in summary["latency_ms"].values() and None not in summary["time_to_first_token_ms"].values()
    assert summary["slo"] == {"--max-failure-rate": {"limit": 0.0, "value": 0.0, "met": True}}
    with (report / "locust_stats.csv").open() as f:
        rows = {(r["Type"], r["Name"]): r for r in csv.DictReader(f)}
    assert {("grpc", "Generate"), ("grpc", "GenerateStream"), ("ttft", "GenerateStream")} <= set(rows)
    streams = int(rows[("grpc", "GenerateStream")]["Request Count"])
    assert int(rows[("ttft", "GenerateStream")]["Request Count"]) == streams == \
        summary["methods"]["GenerateStream"]["requests"]  # the CSV holds the final counts, every stream reports TTFT
    assert "GenerateStream" in (report / "report.html").read_text()


def test_server_counters_agree_with_clients(headless):
    _, _, summary, server = headless
    ok = {m: server.metric("seqserve_requests_total", method=m, code="OK") for m in METHODS}
    assert sum(ok.values()) == summary["requests"] - summary["failures"]
    assert ok == {m: summary["methods"][m]["requests"] for m in METHODS}
    every_code = sum(s.value for metric in server.app.metrics.registry.collect() for s in metric.samples
                     if s.name == "seqserve_requests_total")
    assert every_code == summary["requests"]  # no call the server counted went uncounted by the clients
    assert server.metric("seqserve_generated_tokens_total") == summary["generated_tokens"]


def test_failures_are_grouped_by_status_code(server, loadtest, tmp_path):
    code, out = loadtest(server, "--users", "2", "--duration", "1s", "--report-dir", str(tmp_path), "--top-p", "2")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert code == 1 and "no call succeeded" in out
    assert summary["requests"] > 0 and summary["failures_by_code"] == {"INVALID_ARGUMENT": summary["requests"]}
    with (tmp_path / "locust_failures.csv").open() as f:
        assert {r["Error"] for r in csv.DictReader(f)} == {"INVALID_ARGUMENT"}
    assert sum(server.metric("seqserve_requests_total", method=m, code="INVALID_ARGUMENT") for m in METHODS) == \
        summary["requests"]


def test_a_run_targets_one_model_of_several_by_name(tiny_bundle, tmp_path):
    server = Served((f"en-de={tiny_bundle}", f"de-en={tiny_bundle}")).wait_ready()
    try:
        code = main(["loadtest", "--target", server.address, "--heldout", str(tiny_bundle), "--users", "2",
                     "--duration", "2s", "--report-dir", str(tmp_path), "--max-new-tokens", "3", "--model", "de-en",
                     "--max-failure-rate", "0"])
        summary = json.loads((tmp_path / "summary.json").read_text())
        assert code == 0 and summary["requests"] > 0 and summary["failures"] == 0
        assert sum(server.metric("seqserve_requests_total", model="de-en", method=m, code="OK") for m in METHODS) \
            == summary["requests"]
        assert server.metric("seqserve_requests_total", model="en-de") == 0
    finally:
        server.stop()
