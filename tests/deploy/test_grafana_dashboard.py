"""The Grafana dashboard: the committed JSON is what deploy/grafana/dashboard.py generates, it has every panel the
deploy promises (each by replica and in total), and its provisioning points at the compose stack's Prometheus.
(Every query returning data from live replicas: test_prometheus_live.py.)"""
from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest
import yaml
from deploy_harness import DEPLOY, ROOT

GRAFANA = DEPLOY / "grafana"
COMMITTED = json.loads((GRAFANA / "dashboards" / "seqserve.json").read_text())
PANELS = {p["title"]: p for p in COMMITTED["panels"] if p["type"] != "row"}
# What each panel must show: the list, metric by metric.
EXPECTED = {
    "Requests/s": "seqserve_requests_total",
    "Generated tokens/s": "seqserve_generated_tokens_total",
    "Time to first token": "seqserve_time_to_first_token_seconds_bucket",
    "Inter-token latency": "seqserve_inter_token_latency_seconds_bucket",
    "End-to-end latency": "seqserve_request_duration_seconds_bucket",
    "Queue depth": "seqserve_waiting_requests",
    "Running rows": "seqserve_running_requests",
    "Rows per decoder step": "seqserve_batch_rows_sum",
    "KV-cache bytes": "seqserve_kv_cache_bytes",
    "Encoder vs decoder-step time": "seqserve_decoder_step_duration_seconds_sum",
    "Errors by code": "seqserve_requests_total",
    "Rejections by reason": "seqserve_rejected_requests_total",
}


def _generator():
    if importlib.util.find_spec("grafana_foundation_sdk") is None:
        message = "grafana-foundation-sdk is not installed (the dev extra pins it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    spec = importlib.util.spec_from_file_location("grafana_dashboard", GRAFANA / "dashboard.py")
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_committed_json_is_the_generated_dashboard():
    generated = _generator().render()
    assert json.loads(generated) == COMMITTED, "run: .venv/bin/python deploy/grafana/dashboard.py"
    assert generated == (GRAFANA / "dashboards" / "seqserve.json").read_text()


def test_every_promised_panel_is_there_by_replica_and_in_total():
    assert set(PANELS) == set(EXPECTED)
    for title, metric in EXPECTED.items():
        exprs = [t["expr"] for t in PANELS[title]["targets"]]
        assert any(metric in e for e in exprs), title
        per_replica = [e for e in exprs if "by (instance" in e or "by (le, instance)" in e]
        total = [e for e in exprs if e not in per_replica]
        assert per_replica and total, title
        assert all('instance=~"$instance"' in e for e in exprs), title  # the replica picker applies to all
    assert "seqserve_encoder_duration_seconds_sum" in str(PANELS["Encoder vs decoder-step time"]["targets"])
    for title in ("Time to first token", "Inter-token latency", "End-to-end latency"):
        exprs = str(PANELS[title]["targets"])
        assert all(f"histogram_quantile({q}," in exprs for q in ("0.5", "0.95", "0.99")), title


def test_provisioning_points_at_the_stack_prometheus_and_the_dashboard_folder():
    (source,) = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text())[
        "datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    used = {json.dumps(t["datasource"], sort_keys=True) for p in PANELS.values() for t in p["targets"]}
    assert used == {json.dumps({"type": "prometheus", "uid": source["uid"]}, sort_keys=True)}
    (provider,) = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "seqserve.yml").read_text())["providers"]
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["grafana"]
    assert f"./deploy/grafana/dashboards:{provider['options']['path']}:ro" in compose["volumes"]
    prometheus = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    interval = source["jsonData"]["timeInterval"]
    assert interval == prometheus["global"]["scrape_interval"]  # so $__rate_interval covers whole scrapes
