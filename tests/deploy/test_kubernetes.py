"""deploy/k8s: built with kustomize (kubectl's, when installed), validated against the Kubernetes schemas
(kubernetes-validate, offline, strict), and checked for what the issue asks of each object."""
from __future__ import annotations

import shutil
import subprocess

import kubernetes_validate
import pytest
import yaml
from deploy_harness import DEPLOY

from seqserve.server.settings import Settings

K8S = DEPLOY / "k8s"
KUBERNETES = "1.30.0"  # the oldest release the manifests target: grpc probes (GA 1.27), preStop sleep (1.30)
KUSTOMIZATION = yaml.safe_load((K8S / "kustomization.yaml").read_text())


def _built() -> list[dict]:
    """`kustomize build`; without a kustomize binary, the listed resources plus the generated ConfigMaps."""
    kustomize = shutil.which("kustomize")
    kubectl = shutil.which("kubectl")
    if kustomize or kubectl:
        command = [kustomize, "build"] if kustomize else [kubectl, "kustomize"]
        done = subprocess.run([*command, str(K8S)], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return list(yaml.safe_load_all(done.stdout))
    docs = [d for name in KUSTOMIZATION["resources"] for d in yaml.safe_load_all((K8S / name).read_text())]
    for generator in KUSTOMIZATION["configMapGenerator"]:
        data = dict(literal.split("=", 1) for literal in generator["literals"])
        docs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": generator["name"]}, "data": data})
    return docs


BUILT = _built()


def _one(kind: str, name: str | None = None) -> dict:
    """The one object of that kind (and name; a ConfigMap's name has kustomize's hash appended)."""
    def named(doc: dict) -> bool:
        actual = doc["metadata"]["name"]
        return name is None or actual == name or (kind == "ConfigMap" and actual.startswith(name + "-"))

    (doc,) = [d for d in BUILT if d["kind"] == kind and named(d)]
    return doc


def _settings() -> dict:
    return _one("ConfigMap", "seqserve-settings")["data"]


@pytest.mark.parametrize("doc", BUILT, ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_every_manifest_validates_against_the_kubernetes_schema(doc):
    for version in (KUBERNETES, kubernetes_validate.latest_version()):
        kubernetes_validate.validate(doc, version, strict=True)  # raises ValidationError naming the field


def test_the_base_holds_every_object_the_deploy_needs():
    kinds = sorted(f"{d['kind']}/{d['metadata']['name']}" for d in BUILT if d["kind"] != "ConfigMap")
    assert kinds == ["Deployment/seqserve", "HorizontalPodAutoscaler/seqserve", "Job/seqserve-trainer",
                     "PersistentVolumeClaim/seqserve-artifacts", "Service/seqserve", "Service/seqserve-headless"]


def test_server_pods_probe_grpc_health_and_drain_before_they_are_killed():
    pod = _one("Deployment")["spec"]["template"]["spec"]
    (server,) = pod["containers"]
    grpc_port = Settings.__dataclass_fields__["port"].default
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert server[probe]["grpc"] == {"port": grpc_port}, probe  # native grpc.health.v1, no exec
    assert {p["name"]: p["containerPort"] for p in server["ports"]} == {
        "grpc": grpc_port, "metrics": Settings.__dataclass_fields__["metrics_port"].default}
    pre_stop = server["lifecycle"]["preStop"]["sleep"]["seconds"]
    drain = float(_settings()["SEQSERVE_GRACE_SECONDS"])
    assert pod["terminationGracePeriodSeconds"] > pre_stop + drain
    liveness = server["livenessProbe"]
    assert liveness["periodSeconds"] * liveness["failureThreshold"] > pre_stop + drain  # a drain is never restarted
    assert server["resources"]["requests"].keys() >= {"cpu", "memory"}
    assert int(_settings()["SEQSERVE_INTRA_OP_THREADS"]) == int(server["resources"]["requests"]["cpu"])
    assert _settings()["SEQSERVE_BIND"] == _settings()["SEQSERVE_METRICS_BIND"] == "0.0.0.0"
    (wait,) = pod["initContainers"]
    assert wait["command"] == ["seqserve-bundle", "wait"]  # until the trainer Job verified a bundle
    annotations = _one("Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(Settings.__dataclass_fields__["metrics_port"].default)


def test_settings_are_serve_variables():
    names = {f"SEQSERVE_{f.upper()}" for f in Settings.__dataclass_fields__}
    assert set(_settings()) <= names, set(_settings()) - names
    assert _settings()["SEQSERVE_BUNDLE"] == "/artifacts/bundle"


def test_services_select_the_server_pods():
    labels = _one("Deployment")["spec"]["template"]["metadata"]["labels"]
    service, headless = _one("Service", "seqserve"), _one("Service", "seqserve-headless")
    assert headless["spec"]["clusterIP"] == "None" and not headless["spec"]["publishNotReadyAddresses"]
    for svc in (service, headless):
        assert svc["spec"]["selector"].items() <= labels.items()
        assert {"name": "grpc", "port": 50051, "targetPort": "grpc", "appProtocol": "kubernetes.io/h2c"} in \
            svc["spec"]["ports"]


def test_trainer_job_writes_the_volume_the_servers_read():
    job = _one("Job")["spec"]["template"]["spec"]
    (trainer,) = job["containers"]
    assert trainer["command"] == ["seqserve-bundle", "build"]
    claim = _one("PersistentVolumeClaim")["metadata"]["name"]
    deployment = _one("Deployment")["spec"]["template"]["spec"]
    for spec in (job, deployment):
        (volume,) = [v for v in spec["volumes"] if "persistentVolumeClaim" in v]
        assert volume["persistentVolumeClaim"]["claimName"] == claim
    assert _one("PersistentVolumeClaim")["spec"]["accessModes"] == ["ReadWriteMany"]  # every node's pods mount it


def test_autoscaler_scales_the_deployment_on_a_prometheus_metric():
    hpa = _one("HorizontalPodAutoscaler")["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "seqserve"}
    (metric,) = hpa["metrics"]
    assert metric["type"] == "Pods" and metric["pods"]["target"]["type"] == "AverageValue"
    # The adapter rule that serves it runs against a live Prometheus in test_prometheus_live.py.
    (rule,) = yaml.safe_load((K8S / "prometheus-adapter" / "values.yaml").read_text())["rules"]["custom"]
    assert rule["name"]["as"] == metric["pods"]["metric"]["name"]
