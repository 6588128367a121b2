"""A model repository's reload bookkeeping: a model whose bundle is rewritten in place (its verified.json stale or
gone) keeps serving its loaded version until a verified one appears; an unloaded model's every metric series leaves
/metrics once its last call is counted (scraped over real HTTP)."""
from __future__ import annotations

import json
import shutil
import urllib.request

import grpc
import pytest
from grpc_harness import StepGate, engine_of, wait_for
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from seqserve.contract.manifest import DIGEST, MANIFEST, sha256_of
from seqserve.contract.verified import VERIFIED
from seqserve.v1 import seqserve_pb2 as pb


def _repository(tiny_bundle, tmp_path, *names: str):
    repository = tmp_path / "models"
    for name in names:
        shutil.copytree(tiny_bundle, repository / name)
        _verify(repository / name)
    return repository


def _verify(bundle) -> None:
    """What a passing `seqserve verify` leaves: verified.json naming the manifest's sha256 (contract/verified.py)."""
    (bundle / VERIFIED).write_text(json.dumps({"manifest_sha256": sha256_of(bundle / MANIFEST)}))


def _rewrite(bundle, max_new_tokens: int) -> None:
    """A new manifest written in place, its bundle.sha256 with it: verified.json now names the earlier manifest."""
    manifest = json.loads((bundle / MANIFEST).read_text())
    manifest["max_new_tokens"] = max_new_tokens
    (bundle / MANIFEST).write_text(json.dumps(manifest, indent=2))
    (bundle / DIGEST).write_text(f"{sha256_of(bundle / MANIFEST)}  {MANIFEST}\n")


def _limit(s, model: str) -> int:
    return s.stub.GetModelInfo(pb.GetModelInfoRequest(model=model), timeout=10).limits.max_new_tokens


def test_a_model_rewritten_in_place_keeps_its_loaded_version_until_a_verified_one_appears(make_server, tiny_bundle,
                                                                                           tmp_path, heldout):
    repository = _repository(tiny_bundle, tmp_path, "m")
    s = make_server(bundle=None, model_repository=repository)
    engine, served_limit = s.app.models["m"].engine, _limit(s, "m")
    health = health_pb2_grpc.HealthStub(s.channel)
    request = pb.GenerateRequest(input=heldout[0][0], model="m")
    expected = list(s.stub.Generate(request, timeout=30).token_ids)

    _rewrite(repository / "m", served_limit + 7)  # verified.json is stale now
    s.run_async(s.app.reload()).result(60)
    (repository / "m" / VERIFIED).unlink()  # and then gone, as a copy in progress may leave it
    s.run_async(s.app.reload()).result(60)
    assert list(s.stub.Generate(request, timeout=30).token_ids) == expected  # OK, from the loaded version
    assert s.app.models["m"].engine is engine
    assert _limit(s, "m") == served_limit
    assert health.Check(health_pb2.HealthCheckRequest(service="seqserve.v1.Generation/m"), timeout=10).status == \
        health_pb2.HealthCheckResponse.SERVING

    _verify(repository / "m")  # the rewrite is verified: the next reload loads it
    s.run_async(s.app.reload()).result(60)
    assert s.app.models["m"].engine is not engine and _limit(s, "m") == served_limit + 7
    assert list(s.stub.Generate(request, timeout=30).token_ids) == expected
    wait_for(lambda: not s.app.draining_models, what="the earlier version drained")
    assert s.metric("seqserve_model_ready", model="m") == 1  # a replaced version's drain keeps the name's series


def _series(port: int) -> list[tuple[str, dict]]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return [(sample.name, sample.labels) for family in text_string_to_metric_families(body) for sample in family.samples]


def test_an_unloaded_models_series_leave_metrics_after_its_last_call_is_counted(make_server, tiny_bundle, tmp_path,
                                                                                 heldout):
    repository = _repository(tiny_bundle, tmp_path, "a", "keep")
    s = make_server(bundle=None, model_repository=repository)
    for model in ("a", "keep"):
        s.stub.Generate(pb.GenerateRequest(input=heldout[0][0], model=model), timeout=30)
        list(s.stub.GenerateStream(pb.GenerateRequest(input=heldout[1][0], model=model), timeout=30))
        with pytest.raises(grpc.RpcError):  # a refusal: its rejected series carries the model too
            s.stub.Generate(pb.GenerateRequest(input=" ", model=model), timeout=30)
    names_of_a = {name for name, labels in _series(s.app.metrics_port) if labels.get("model") == "a"}
    assert {"seqserve_requests_total", "seqserve_rejected_requests_total", "seqserve_generated_tokens_total",
            "seqserve_request_duration_seconds_count", "seqserve_model_info"} <= names_of_a

    gate = StepGate(engine_of(s.app.models["a"]), s.settle)
    gate.close()
    long = pb.DecodingOptions(min_new_tokens=12, max_new_tokens=12)
    held = s.stub.Generate.future(pb.GenerateRequest(input=heldout[2][0], model="a", options=long), timeout=60)
    gate.wait_held()  # a's last call runs while a is removed
    shutil.move(repository / "a", tmp_path / "a")
    s.run_async(s.app.reload()).result(60)
    ok_before = s.metric("seqserve_requests_total", model="a", method="Generate", code="OK")
    gate.open()
    assert len(held.result(60).token_ids) == 12
    wait_for(lambda: not s.app.draining_models, what="a drained and stopped")
    assert ok_before == 1  # the held call was not counted yet when a left the service

    series = _series(s.app.metrics_port)
    assert [(name, labels) for name, labels in series if labels.get("model") == "a"] == []
    names_of_keep = {name for name, labels in series if labels.get("model") == "keep"}
    assert names_of_a <= names_of_keep  # the model still served keeps every one of its series
