"""deploy/prometheus + the Grafana dashboard + the autoscaler's adapter rule, live: Debian's prometheus runs the
repository's config (targets rendered for 127.0.0.1, intervals shortened) and scrapes two real replicas under
load; every recording rule, every alert's quantity and every dashboard query must return data."""
from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
import yaml
from deploy_harness import DEPLOY, LOOPBACK, heldout_inputs, start_replicas, wait_until
from external_tools import require
from ports import free_port

from seqserve.server.settings import DEFAULT_METRICS_PORT as METRICS_PORT
from seqserve.v1 import seqserve_pb2 as pb

JOB = "seqserve"
# The labels the Kubernetes pod scrape job gives (prometheus-adapter/values.yaml), so the adapter rule runs as is.
POD_LABELS = [{"namespace": "default", "pod": f"seqserve-{i}"} for i in range(2)]
LOAD_SECONDS = 5.0
DASHBOARD = json.loads((DEPLOY / "grafana" / "dashboards" / "seqserve.json").read_text())
RULES = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
ADAPTER = yaml.safe_load((DEPLOY / "k8s" / "prometheus-adapter" / "values.yaml").read_text())["rules"]["custom"]
COMPARISON = re.compile(r"\s*(==|!=|>=|<=|>|<)\s*[-+0-9.e]+\s*$")  # an alert's threshold


def render(metrics_ports: list[int], rules: Path) -> dict:
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    assert config["rule_files"] == ["alerts.yml"]
    config["rule_files"] = [str(rules)]
    config["global"] |= {"scrape_interval": "1s", "evaluation_interval": "1s"}
    (job,) = config["scrape_configs"]
    assert job["job_name"] == JOB and [c["port"] for c in job.pop("dns_sd_configs")] == [METRICS_PORT]
    job["static_configs"] = [{"targets": [f"{LOOPBACK}:{port}"], "labels": labels}
                             for port, labels in zip(metrics_ports, POD_LABELS, strict=True)]
    return config


class Prometheus:
    def __init__(self, metrics_ports: list[int], workdir: Path) -> None:
        binary = require("prometheus")
        config = workdir / "prometheus.yml"
        config.write_text(yaml.safe_dump(render(metrics_ports, DEPLOY / "prometheus" / "alerts.yml")))
        self.url = f"http://{LOOPBACK}:{free_port()}"
        self.log = (workdir / "prometheus.log").open("w")
        self.process = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={workdir}/data",
                                         f"--web.listen-address={self.url.removeprefix('http://')}"],
                                        stdout=self.log, stderr=subprocess.STDOUT)
        wait_until(lambda: self._ready(), 60, "prometheus to start", poll=0.2)

    def _ready(self) -> bool:
        assert self.process.poll() is None, "prometheus exited"
        try:
            return urllib.request.urlopen(self.url + "/-/ready", timeout=2).status == 200
        except OSError:
            return False

    def api(self, path: str, **params) -> dict | list:
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params, doseq=True)}"
        with urllib.request.urlopen(url, timeout=10) as reply:
            body = json.load(reply)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list:
        return self.api("query", query=expr)["result"]

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(30)
        self.log.close()


def _load(replicas, inputs: list[str], seconds: float) -> None:
    """Traffic that touches every series: unary and streaming calls on both replicas, invalid ones, expired
    deadlines, and a burst that fills the tight replica's one-request queue (RESOURCE_EXHAUSTED)."""
    end = time.monotonic() + seconds

    def calls(stub, kind):
        i = 0
        while time.monotonic() < end:
            text = inputs[i % len(inputs)]
            i += 1
            try:
                if kind == "unary":
                    stub.Generate(pb.GenerateRequest(input=text), timeout=30)
                elif kind == "stream":
                    list(stub.GenerateStream(pb.GenerateRequest(input=text), timeout=30))
                elif kind == "invalid":
                    stub.Generate(pb.GenerateRequest(input=text, options=pb.DecodingOptions(temperature=-1)))
                    time.sleep(0.2)
                else:  # an expired deadline
                    stub.Generate(pb.GenerateRequest(input=text, options=pb.DecodingOptions(min_new_tokens=30)),
                                  timeout=0.003)
            except grpc.RpcError:
                pass  # the errors are the point: the replicas count them by code and reason

    kinds = ["unary", "unary", "stream", "invalid", "deadline"]
    with ThreadPoolExecutor(len(kinds) * len(replicas) + 6) as pool:
        for replica in replicas:
            for kind in kinds:
                pool.submit(calls, replica.stub, kind)
        for _ in range(6):  # the tight replica runs one row and queues one: six callers overflow it
            pool.submit(calls, replicas[1].stub, "stream")


@pytest.fixture(scope="module")
def live(tiny_bundle, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("prometheus")
    tight = {"max_batch_size": 1, "max_waiting": 1, "max_batch_inputs": 1}
    replicas = start_replicas(tiny_bundle, workdir, [{}, tight])
    prometheus = None
    try:
        prometheus = Prometheus([r.metrics_port for r in replicas], workdir)
        wait_until(lambda: len(prometheus.query(f'up{{job="{JOB}"}} == 1')) == 2, 30, "both targets up", poll=0.5)
        loader = threading.Thread(target=_load, args=(replicas, heldout_inputs(tiny_bundle, 20), LOAD_SECONDS))
        loader.start()
        loader.join(LOAD_SECONDS + 60)
        yield prometheus
    finally:
        if prometheus is not None:
            prometheus.close()
        for replica in replicas:
            replica.close()


def _panel_queries() -> dict[str, str]:
    """Every dashboard query as Grafana sends it with all replicas picked: {"panel / refId": PromQL}."""
    return {f"{p['title']} / {t['refId']}": t["expr"].replace("$__rate_interval", "1m").replace("$instance", ".*")
            .replace("$model", ".*") for p in DASHBOARD["panels"] for t in p.get("targets", [])}


def _rule_queries() -> dict[str, str]:
    queries = {}
    for group in RULES["groups"]:
        for rule in group["rules"]:
            if "record" in rule:
                queries[rule["record"]] = rule["record"]  # the recorded series itself
            else:
                assert COMPARISON.search(rule["expr"]), rule
                queries[rule["alert"]] = COMPARISON.sub("", rule["expr"])  # its quantity, without the threshold
    return queries


def _returning_data(prometheus: Prometheus, queries: dict[str, str], timeout: float = 30) -> dict[str, str]:
    """Polls until every query returns at least one series; returns those that never did."""
    missing = dict(queries)
    end = time.monotonic() + timeout
    while missing and time.monotonic() < end:
        missing = {name: q for name, q in missing.items() if not prometheus.query(q)}
        if missing:
            time.sleep(0.5)
    return missing


def test_every_dashboard_panel_query_returns_data(live, tiny_bundle):
    queries = _panel_queries()
    panels = {name.split(" / ")[0] for name in queries}
    assert _returning_data(live, queries) == {}
    print(f"\n{len(panels)} of {len(panels)} panels ({len(queries)} queries) return data from two live replicas")
    for name, expr in queries.items():
        if "by (instance" in expr and "code" not in expr and "reason" not in expr:  # per replica: both of them
            assert {s["metric"]["instance"] for s in live.query(expr)} == \
                   {t["labels"]["instance"] for t in live.api("targets")["activeTargets"]}, name
    variable = DASHBOARD["templating"]["list"][0]
    match = re.fullmatch(r"label_values\((.+), (\w+)\)", variable["query"])
    assert len(live.api(f"label/{match.group(2)}/values", **{"match[]": match.group(1)})) == 2
    model = DASHBOARD["templating"]["list"][1]  # the model picker: the served model's name
    match = re.fullmatch(r"label_values\((.+), (\w+)\)", model["query"])
    named = live.api(f"label/{match.group(2)}/values", **{"match[]": match.group(1)})
    assert named == [tiny_bundle.name]  # --bundle DIR: the model is named after DIR


def test_every_recording_rule_and_alert_returns_data(live):
    queries = _rule_queries()
    assert _returning_data(live, queries) == {}
    unhealthy = [(r["name"], r.get("lastError")) for g in live.api("rules")["groups"] for r in g["rules"]
                 if r["health"] != "ok"]
    assert unhealthy == []
    print(f"\n{len(queries)} recording rules and alert quantities return data; every rule evaluates healthy")


def test_label_values_named_by_queries_exist(live):
    """A matcher like reason="queue_full" must name a value the replicas really export (the load made each one)."""
    exprs = [*_panel_queries().values(), *_rule_queries().values(), *(r["seriesQuery"] for r in ADAPTER)]
    for label, value in {m for e in exprs for m in re.findall(r'(\w+)="([^"]+)"', e)}:
        assert value in live.api(f"label/{label}/values"), (label, value)


def test_the_autoscaler_metric_is_served_by_the_adapter_rule(live):
    hpa = yaml.safe_load((DEPLOY / "k8s" / "hpa.yaml").read_text())
    (metric,) = hpa["spec"]["metrics"]
    (rule,) = ADAPTER
    assert metric["pods"]["metric"]["name"] == rule["name"]["as"]
    assert live.api("series", **{"match[]": rule["seriesQuery"]})  # the series the adapter discovers
    # The query the adapter sends for `kubectl get --raw .../pods/*/<metric>` in namespace default.
    series = re.fullmatch(r"(\w+)\{.*\}", rule["seriesQuery"]).group(1)
    pods = "|".join(labels["pod"] for labels in POD_LABELS)
    query = (rule["metricsQuery"].replace("<<.Series>>", series)
             .replace("<<.LabelMatchers>>", f'namespace="default",pod=~"{pods}"').replace("<<.GroupBy>>", "pod"))
    assert {s["metric"]["pod"] for s in live.query(query)} == {labels["pod"] for labels in POD_LABELS}
