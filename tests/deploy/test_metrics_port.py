"""The default metrics port stays clear of the ports the monitoring tools a server runs beside take (Prometheus,
its Pushgateway and Alertmanager, the exporters' 9100-9999, Triton's 8000-8002), and every file that spells it
spells the server's constant; 9090 appears only where it is Prometheus's own port."""
from __future__ import annotations

import re

import yaml
from deploy_harness import DEPLOY, ROOT

from seqserve.server.settings import DEFAULT_METRICS_PORT, Settings

TAKEN = [*range(8000, 8003), *range(9090, 10000)]  # Triton; Prometheus's default port allocations
PROMETHEUS_OWN = {"docker-compose.yml": ['"9091:9090"'],  # the stack's Prometheus, published on 9091
                  "deploy/grafana/provisioning/datasources/prometheus.yml": ["http://prometheus:9090"]}


def test_the_default_is_outside_the_ports_monitoring_tools_take():
    assert Settings.__dataclass_fields__["metrics_port"].default == DEFAULT_METRICS_PORT
    assert DEFAULT_METRICS_PORT not in TAKEN and 1024 < DEFAULT_METRICS_PORT < 65536


def test_every_file_spells_the_default():
    port = str(DEFAULT_METRICS_PORT)
    assert re.search(r"^METRICS_PORT \?= (\d+)$", (ROOT / "Makefile").read_text(), re.M)[1] == port
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert f"SEQSERVE_METRICS_PORT={port}" in dockerfile and f"EXPOSE 50051 {port}" in dockerfile
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["seqserve"]
    assert compose["environment"]["SEQSERVE_METRICS_PORT"] == port and port in compose["expose"]
    prometheus = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    (sd,) = prometheus["scrape_configs"][0]["dns_sd_configs"]
    assert sd["port"] == DEFAULT_METRICS_PORT
    k8s = {name: (DEPLOY / "k8s" / name).read_text() for name in ("deployment.yaml", "service.yaml",
                                                                   "kustomization.yaml")}
    assert f'prometheus.io/port: "{port}"' in k8s["deployment.yaml"] and f"containerPort: {port}" in k8s[
        "deployment.yaml"]
    assert f"port: {port}, targetPort: metrics" in k8s["service.yaml"]
    assert f"SEQSERVE_METRICS_PORT={port}" in k8s["kustomization.yaml"]
    for doc, phrase in (("README.md", f"metrics\nport {port}"), ("README.md", f"curl localhost:{port}/metrics"),
                        ("docs/deploy.md", f"/metrics {port}"), ("docs/security.md", f"port {port}")):
        assert phrase in (ROOT / doc).read_text().replace("**", ""), (doc, phrase)


def test_9090_is_only_prometheuss_own_port():
    files = [ROOT / "Makefile", ROOT / "Dockerfile", ROOT / "docker-compose.yml", ROOT / "README.md",
             *(ROOT / "docs").glob("*.md"), *(p for p in DEPLOY.rglob("*") if p.is_file()),
             ROOT / "server" / "settings.py"]
    stray = []
    for path in files:
        text = path.read_text()
        for allowed in PROMETHEUS_OWN.get(path.relative_to(ROOT).as_posix(), []):
            text = text.replace(allowed, "")
        text = re.sub(r"9090-9\d{3}|9090 is Prometheus|9091 → 9090|Prometheus's 9090|holds 9090", "", text)
        stray += [f"{path.relative_to(ROOT)}: {line.strip()}" for line in text.splitlines() if "9090" in line]
    assert not stray, stray
