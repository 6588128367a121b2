"""docker-compose.yml, the Dockerfile and the Prometheus files, checked offline (no Docker engine here): the
validators users run, every copied path, every command, every SEQSERVE_* name and every port against the code."""
from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from deploy_harness import DEPLOY, ROOT
from external_tools import require

from seqserve.cli.main import build_parser
from seqserve.server.metrics import Metrics
from seqserve.server.settings import Settings

COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
DOCKERFILE = (ROOT / "Dockerfile").read_text()
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
BUNDLE_SCRIPT = (DEPLOY / "bundle.sh").read_text()
SERVERS = ("seqserve", "seqserve-gpu")
TRAINER_VARIABLES = {"SEQSERVE_TRAIN_ARGS", "SEQSERVE_EXPORT_ARGS", "SEQSERVE_ARTIFACTS"}  # deploy/bundle.sh's own
GRPC_PORT = Settings.__dataclass_fields__["port"].default
METRICS_PORT = Settings.__dataclass_fields__["metrics_port"].default
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",), "info": ("_info",)}


def _subcommands() -> dict:
    (sub,) = [a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction"]
    return sub.choices


def serve_variables() -> set[str]:
    """The variables `seqserve serve --help` names: the only SEQSERVE_* a server may be configured with."""
    return set(re.findall(r"\[env\s+(SEQSERVE_\w+)", _subcommands()["serve"].format_help()))


def _stage(name: str) -> str:
    return DOCKERFILE.split(f" AS {name}\n", 1)[1].split("\nFROM ", 1)[0]


def _env(service: dict) -> dict:
    return {k: str(v) for k, v in service.get("environment", {}).items()}


def _metric_names() -> set[str]:
    return {f.name + suffix for f in Metrics().registry.collect() for suffix in SUFFIXES[f.type]}


@pytest.mark.parametrize("profiles", [[], ["loadtest"], ["gpu"], ["loadtest", "gpu"]])
def test_docker_compose_config_is_valid(profiles):
    compose = require("docker-compose")
    args = [arg for p in profiles for arg in ("--profile", p)]
    done = subprocess.run([compose, *args, "config", "-q"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_one_command_stack_trains_once_then_serves_replicas():
    trainer = SERVICES["trainer"]
    assert trainer["build"]["target"] == "train" and trainer["command"] == ["seqserve-bundle", "build"]
    assert "artifacts:/artifacts" in trainer["volumes"] and trainer["restart"] == "no"
    assert set(_env(trainer)) == {"SEQSERVE_TRAIN_ARGS", "SEQSERVE_EXPORT_ARGS"}
    assert "${SEQSERVE_TRAIN_ARGS:-}" == trainer["environment"]["SEQSERVE_TRAIN_ARGS"]  # the user's, passed through
    for name in SERVERS:
        server = SERVICES[name]
        assert server["depends_on"] == {"trainer": {"condition": "service_completed_successfully"}}
        assert "artifacts:/artifacts:ro" in server["volumes"]
        assert _env(server)["SEQSERVE_BUNDLE"] == "/artifacts/bundle"  # where seqserve-bundle writes it
        assert _env(server)["SEQSERVE_BIND"] == _env(server)["SEQSERVE_METRICS_BIND"] == "0.0.0.0"
        assert float(server["stop_grace_period"].rstrip("s")) > float(_env(server)["SEQSERVE_GRACE_SECONDS"])
        assert "ports" not in server  # only through nginx (gRPC) and Prometheus (metrics)
    assert SERVICES["seqserve"]["deploy"]["replicas"] == "${SEQSERVE_REPLICAS:-2}"
    assert 'ARTIFACTS="${SEQSERVE_ARTIFACTS:-/artifacts}"' in BUNDLE_SCRIPT
    assert 'BUNDLE="$ARTIFACTS/bundle"' in BUNDLE_SCRIPT
    assert COMPOSE["volumes"].keys() >= {"artifacts"}


def test_gpu_profile_reserves_a_device_and_matches_onnxruntime_gpu_requirements():
    gpu = SERVICES["seqserve-gpu"]
    assert gpu["profiles"] == ["gpu"] and gpu["build"]["target"] == "serve-gpu"
    assert _env(gpu)["SEQSERVE_DEVICE"] == "cuda"
    (device,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"] and device["count"] == 1
    (pin,) = [d for d in PYPROJECT["project"]["dependencies"] if d.startswith("onnxruntime-gpu==")]
    version = pin.split(";")[0].split("==")[1]
    assert f'pip install "onnxruntime-gpu[cuda,cudnn]=={version}"' in _stage("serve-gpu")
    try:
        requires = importlib.metadata.requires("onnxruntime-gpu") or []
        installed = importlib.metadata.version("onnxruntime-gpu")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("onnxruntime-gpu is not installed here (not Linux x86_64): its extras cannot be read")
    assert installed == version
    # The wheel's own declaration of what it was built for: CUDA 13.x and cuDNN 9.x, which the image installs.
    extras = {re.split(r"[~=<>; ]", r)[0]: r for r in requires if "extra ==" in r}
    assert "~=13.0" in extras["nvidia-cuda-runtime"] and "~=9.0" in extras["nvidia-cudnn-cu13"], extras
    assert "CUDA 13" in DOCKERFILE and "cuDNN 9" in DOCKERFILE


def test_loadtest_profile_runs_locust_master_and_workers_at_the_balancer():
    master, worker = SERVICES["locust-master"], SERVICES["locust-worker"]
    assert master["profiles"] == worker["profiles"] == ["loadtest"]
    assert master["command"][master["command"].index("--host") + 1] == f"nginx:{GRPC_PORT}"
    assert "--master" in master["command"] and "--worker" in worker["command"]
    assert worker["command"][worker["command"].index("--master-host") + 1] == "locust-master"
    assert worker["deploy"]["replicas"] >= 2


def test_server_configuration_uses_only_serve_settings():
    names = serve_variables()
    assert {f"SEQSERVE_{f.upper()}" for f in Settings.__dataclass_fields__} == names
    for name in SERVERS:
        assert set(_env(SERVICES[name])) <= names, set(_env(SERVICES[name])) - names
    assert set(re.findall(r"(SEQSERVE_\w+)=", _stage("runtime"))) <= names
    trainer_side = set(re.findall(r"SEQSERVE_\w+", BUNDLE_SCRIPT)) | set(_env(SERVICES["trainer"]))
    assert trainer_side <= TRAINER_VARIABLES and not trainer_side & names
    docs = (ROOT / "docs" / "deploy.md").read_text()
    assert all(variable in docs for variable in TRAINER_VARIABLES)  # documented


def test_every_path_the_dockerfile_copies_exists_and_reaches_the_build():
    ignored = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines() if line.strip()]
    copies = re.findall(r"^COPY (?:--\S+ )*(.+) \S+$", DOCKERFILE, re.M)
    sources = [src for line in copies for src in line.split()]
    assert "deploy/bundle.sh" in sources and "pyproject.toml" in sources
    for src in sources:
        assert (ROOT / src).exists(), src
        assert not any(Path(src).match(pattern) or src.split("/")[0] == pattern for pattern in ignored), src


def test_the_image_gets_every_folder_the_package_installs():
    """`pip install .` in the image builds from the folders COPY brings: each package-dir source must be among them."""
    copied = {src.rstrip("/") for line in re.findall(r"^COPY (?:--\S+ )*(.+) \S+$", DOCKERFILE, re.M)
              for src in line.split()}
    folders = {path.split("/")[0] for path in PYPROJECT["tool"]["setuptools"]["package-dir"].values()}
    assert "client" in folders and folders <= copied, sorted(folders - copied)


def test_dockerfile_targets_and_what_each_installs():
    stages = re.findall(r"^FROM \S+ AS (\S+)", DOCKERFILE, re.M)
    assert stages[-1] == "serve"  # a plain `docker build .` gives the CPU server
    for service in SERVICES.values():
        if "build" in service:
            assert service["build"]["target"] in stages
    assert "pip install .\n" in _stage("runtime") and "torch" not in _stage("runtime")  # the server never needs torch
    (torch,) = [d for d in PYPROJECT["project"]["optional-dependencies"]["train"] if d.startswith("torch==")]
    assert f"pip install {torch} --index-url https://download.pytorch.org/whl/cpu" in _stage("train")
    assert 'pip install ".[train]"' in _stage("train") and 'pip install ".[loadtest]"' in _stage("loadtest")


def _commands() -> list[tuple[str, list[str]]]:
    """(where, argv) of every command an image or service runs."""
    joined = DOCKERFILE.replace("\\\n", " ")  # continuation lines
    found = [(f"Dockerfile {kind}", json.loads(args))
             for kind, args in re.findall(r"^(?:HEALTHCHECK .*?)?(CMD|ENTRYPOINT) (\[.*\])$", joined, re.M)]
    for name, service in SERVICES.items():
        if "build" not in service:
            continue  # third-party images (nginx, prometheus, grafana) run their own programs
        if "command" in service:
            entry = ["locust"] if service.get("build", {}).get("target") == "loadtest" else []
            found.append((f"compose {name}", entry + service["command"]))
        if "healthcheck" in service:
            found.append((f"compose {name} healthcheck", service["healthcheck"]["test"][1:]))
    for doc in (d for path in sorted((DEPLOY / "k8s").glob("*.yaml")) for d in yaml.safe_load_all(path.read_text())):
        spec = (doc or {}).get("spec", {}).get("template", {}).get("spec", {})
        for container in spec.get("containers", []) + spec.get("initContainers", []):
            found.append((f"k8s {doc['metadata']['name']}/{container['name']}", container["command"]))
    return found


def _check_seqserve(argv: list[str]) -> None:
    assert argv[0] in _subcommands(), argv
    build_parser().parse_args(argv)  # exits (SystemExit) on an unknown flag


@pytest.mark.parametrize("where, argv", _commands(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_command_is_a_real_seqserve_command(where, argv):
    if argv[0] == "seqserve":
        _check_seqserve(argv[1:])
    elif argv[0] == "python":
        assert argv[1] == "-m" and importlib.util.find_spec(argv[2]) is not None, argv
    elif argv[0] == "seqserve-bundle":
        assert argv[1:] in (["build"], ["wait"]) and "/usr/local/bin/seqserve-bundle" in DOCKERFILE
    elif argv[0] == "locust":
        if len(argv) == 1:
            return  # the loadtest image's ENTRYPOINT: compose gives the arguments
        locustfile = argv[argv.index("-f") + 1]
        assert (ROOT / locustfile.removeprefix("/app/")).is_file() and locustfile.startswith("/app/")
        parsed = subprocess.run([sys.executable, "-c", "import sys, seqserve.loadtest.locustfile; "
                                 "from locust.argument_parser import get_parser; get_parser().parse_args(sys.argv[1:])",
                                 *argv[1:]], capture_output=True, text=True, timeout=120)
        assert parsed.returncode == 0, parsed.stderr
    else:
        pytest.fail(f"{where} runs {argv[0]!r}, which is not seqserve's")


def test_bundle_script_runs_real_seqserve_commands():
    variables = {"$CHECKPOINT": "/artifacts/checkpoint", "$BUNDLE": "/artifacts/bundle", "$resume": "--resume",
                 "$TRAIN_ARGS": "--data /data/corpus.tsv", "$EXPORT_ARGS": "--int8"}
    lines = [line.split("||")[-1].split("#")[0] for line in BUNDLE_SCRIPT.splitlines() if "seqserve " in line]
    commands = [line[line.index("seqserve "):] for line in lines if re.search(r"(^|\s)seqserve \w", line)]
    assert [c.split()[1] for c in commands] == ["train", "export", "verify"]
    for command in commands:
        for name, value in variables.items():
            command = command.replace(f'"{name}"', value).replace(name, value)
        _check_seqserve(shlex.split(command)[1:])
    module, function = re.search(r"from (seqserve\.\S+) import (\w+)", BUNDLE_SCRIPT).groups()
    assert callable(getattr(importlib.import_module(module), function))


def test_ports_agree_with_the_server_defaults():
    assert (GRPC_PORT, METRICS_PORT) == (50051, 50052)  # the numbers every file below spells out
    runtime = _stage("runtime")
    assert f"SEQSERVE_PORT={GRPC_PORT}" in runtime and f"SEQSERVE_METRICS_PORT={METRICS_PORT}" in runtime
    assert f"EXPOSE {GRPC_PORT} {METRICS_PORT}" in runtime and f"127.0.0.1:{GRPC_PORT}" in runtime
    for name in SERVERS:
        server = SERVICES[name]
        assert (_env(server)["SEQSERVE_PORT"], _env(server)["SEQSERVE_METRICS_PORT"]) == (str(GRPC_PORT),
                                                                                          str(METRICS_PORT))
        assert server["expose"] == [str(GRPC_PORT), str(METRICS_PORT)]
        assert server["healthcheck"]["test"][-1] == f"127.0.0.1:{GRPC_PORT}"
    nginx = (DEPLOY / "nginx" / "nginx.conf").read_text()
    assert SERVICES["nginx"]["ports"] == [f"{GRPC_PORT}:{GRPC_PORT}"] and f"listen {GRPC_PORT} http2;" in nginx
    assert set(re.findall(r"server (seqserve(?:-gpu)?):(\d+)", nginx)) == {(s, str(GRPC_PORT)) for s in SERVERS}
    prometheus = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    (sd,) = prometheus["scrape_configs"][0]["dns_sd_configs"]
    assert sd["port"] == METRICS_PORT and sd["names"] == list(SERVERS)


def test_prometheus_and_grafana_are_wired_to_the_repository_files():
    prometheus, grafana = SERVICES["prometheus"], SERVICES["grafana"]
    assert "./deploy/prometheus:/etc/prometheus:ro" in prometheus["volumes"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]
    assert "./deploy/grafana/provisioning:/etc/grafana/provisioning:ro" in grafana["volumes"]
    assert "./deploy/grafana/dashboards:/var/lib/grafana/dashboards:ro" in grafana["volumes"]
    for mount in (v.split(":")[0] for s in SERVICES.values() for v in s.get("volumes", [])):
        if mount.startswith("./") and mount != "./data":  # ./data: the user's own corpus, made on first use
            assert (ROOT / mount).exists(), mount


@pytest.mark.parametrize("args", [["check", "config", "prometheus.yml"], ["check", "rules", "alerts.yml"]])
def test_promtool_accepts_the_config_and_rules(args):
    done = subprocess.run([require("promtool"), *args], cwd=DEPLOY / "prometheus", capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_rules_and_dashboard_name_only_real_metrics():
    exported = _metric_names()
    for path in (DEPLOY / "prometheus" / "alerts.yml", DEPLOY / "grafana" / "dashboards" / "seqserve.json",
                 DEPLOY / "k8s" / "hpa.yaml", DEPLOY / "k8s" / "prometheus-adapter" / "values.yaml"):
        used = set(re.findall(r"\bseqserve_[a-z_]+", path.read_text()))
        assert used and used <= exported, (path.name, used - exported)
