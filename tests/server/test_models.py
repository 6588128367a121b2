"""Several models in one server: each picked by name, each answering as a one-model server does, named in
GetModelInfo, health and every metric; unknown names NOT_FOUND; intra-op threads split; a memory budget at load."""
from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys

import grpc
import pytest
from fixture_builds import THREADS
from grpc_harness import engine_of, request
from grpc_health.v1 import health_pb2, health_pb2_grpc

from seqserve.client.client import Client
from seqserve.contract.manifest import MANIFEST, load_manifest, sha256_of
from seqserve.contract.verified import VERIFIED
from seqserve.server import settings as st
from seqserve.v1 import seqserve_pb2 as pb

Code = grpc.StatusCode
MODELS = ("en-de", "de-en")


@pytest.fixture(scope="module")
def two(tiny_bundle):
    """One server serving the tiny bundle twice, under two names, sharing twice the threads the one-model server has
    (so each model runs with as many as it, and their floating-point sums agree)."""
    from grpc_harness import Served

    s = Served(tuple(f"{name}={tiny_bundle}" for name in MODELS), intra_op_threads=2 * THREADS).wait_ready()
    yield s
    s.stop()


def test_each_model_answers_as_a_one_model_server(two, served, heldout):
    sources = [source for source, _ in heldout[:8]]
    alone = [served.stub.Generate(request(text), timeout=30) for text in sources]
    for name in MODELS:
        got = [two.stub.Generate(pb.GenerateRequest(input=text, model=name), timeout=30) for text in sources]
        assert [list(r.token_ids) for r in got] == [list(r.token_ids) for r in alone], name
        stream = list(two.stub.GenerateStream(pb.GenerateRequest(input=sources[0], model=name), timeout=30))
        assert [t for m in stream for t in m.token_ids] == list(alone[0].token_ids)
        batch = two.stub.GenerateBatch(pb.GenerateBatchRequest(inputs=sources[:3], model=name), timeout=30)
        assert [list(r.token_ids) for r in batch.results] == [list(r.token_ids) for r in alone[:3]]
    for options in (pb.DecodingOptions(temperature=0.8, seed=7), pb.DecodingOptions(num_beams=4, num_return_sequences=4)):
        expected = served.stub.Generate(pb.GenerateRequest(input=sources[1], options=options), timeout=30)
        for name in MODELS:
            got = two.stub.Generate(pb.GenerateRequest(input=sources[1], options=options, model=name), timeout=30)
            assert [list(q.token_ids) for q in got.sequences] == [list(q.token_ids) for q in expected.sequences]
            assert [q.score for q in got.sequences] == pytest.approx([q.score for q in expected.sequences], abs=1e-5)


def test_each_model_has_its_own_engine_and_a_share_of_the_threads(two):
    engines = {name: engine_of(two.app.models[name]) for name in MODELS}
    assert engines["en-de"] is not engines["de-en"]
    assert engines["en-de"].scheduler is not engines["de-en"].scheduler
    assert [engines[n].runner.device.cfg.intra_op_threads for n in MODELS] == [THREADS, THREADS]  # 2T / 2
    assert st.Settings(bundle=two.app.settings.bundle).bundles().keys() == set(MODELS)


def test_an_unknown_model_is_not_found_and_the_message_lists_the_models(two):
    for call in (lambda: two.stub.Generate(pb.GenerateRequest(input="<fr> 1", model="fr-en"), timeout=10),
                 lambda: list(two.stub.GenerateStream(pb.GenerateRequest(input="<fr> 1", model="fr-en"), timeout=10)),
                 lambda: two.stub.GenerateBatch(pb.GenerateBatchRequest(inputs=["<fr> 1"], model="fr-en"), timeout=10),
                 lambda: two.stub.GetModelInfo(pb.GetModelInfoRequest(model="fr-en"), timeout=10)):
        with pytest.raises(grpc.RpcError) as info:
            call()
        assert info.value.code() == Code.NOT_FOUND
        assert "'fr-en'" in info.value.details() and all(name in info.value.details() for name in MODELS)
    assert two.metric("seqserve_rejected_requests_total", model="", reason="unknown_model") == 4


def test_with_several_models_a_call_must_name_one(two):
    with pytest.raises(grpc.RpcError) as info:
        two.stub.Generate(request("<fr> 1"), timeout=10)
    assert info.value.code() == Code.INVALID_ARGUMENT
    assert info.value.details().startswith("model must be set") and all(n in info.value.details() for n in MODELS)


def test_model_info_names_the_model_lists_them_all_and_reports_memory(two, tiny_bundle):
    manifest = load_manifest(tiny_bundle)
    files = manifest.variants["fp32"]
    graphs = sum((tiny_bundle / files[g]["file"]).stat().st_size for g in ("encoder", "decoder"))
    for name in MODELS:
        info = two.stub.GetModelInfo(pb.GetModelInfoRequest(model=name), timeout=10)
        assert info.model == name and list(info.models) == sorted(MODELS)
        assert info.memory_bytes > graphs  # the graphs, and the KV cache and encode-ahead budgets on top
        assert two.metric("seqserve_model_memory_bytes", model=name) == info.memory_bytes
        assert two.metric("seqserve_model_ready", model=name) == 1
        assert info.limits.max_new_tokens == manifest.max_new_tokens


def test_health_has_a_service_name_per_model(two):
    health = health_pb2_grpc.HealthStub(two.channel)
    for name in ("", "seqserve.v1.Generation", *(f"seqserve.v1.Generation/{n}" for n in MODELS)):
        assert health.Check(health_pb2.HealthCheckRequest(service=name), timeout=10).status == \
            health_pb2.HealthCheckResponse.SERVING, name
    with pytest.raises(grpc.RpcError) as info:
        health.Check(health_pb2.HealthCheckRequest(service="seqserve.v1.Generation/fr-en"), timeout=10)
    assert info.value.code() == Code.NOT_FOUND


def test_every_metric_carries_the_model_that_served_the_call(two, heldout):
    before = {n: two.metric("seqserve_generated_tokens_total", model=n) for n in MODELS}
    ok_before = {n: two.metric("seqserve_requests_total", model=n, method="Generate", code="OK") for n in MODELS}
    r = two.stub.Generate(pb.GenerateRequest(input=heldout[0][0], model="de-en"), timeout=30)
    from grpc_harness import wait_for

    wait_for(lambda: two.metric("seqserve_generated_tokens_total", model="de-en") ==
             before["de-en"] + r.usage.generated_tokens, what="de-en's tokens counted")
    assert two.metric("seqserve_generated_tokens_total", model="en-de") == before["en-de"]
    assert two.metric("seqserve_requests_total", model="de-en", method="Generate", code="OK") == \
        ok_before["de-en"] + 1
    assert two.metric("seqserve_requests_total", model="en-de", method="Generate", code="OK") == ok_before["en-de"]
    labelled = {family.name: {s.labels.get("model") for s in family.samples}
                for family in two.app.metrics.registry.collect() if family.samples}
    unlabelled = {name for name, models in labelled.items() if None in models}
    assert unlabelled == {"seqserve_inflight_request_bytes"}  # the one server-wide budget


def test_the_client_and_the_cli_take_the_model(two, heldout):
    source = heldout[0][0]
    with Client(two.address, timeout=30, model="en-de") as client:
        expected = client.generate(source).token_ids
        assert client.generate(source, model="de-en").token_ids == expected
        assert client.model_info(model="de-en")["model"] == "de-en"
        assert client.model_info()["models"] == sorted(MODELS)
        with pytest.raises(grpc.RpcError) as info:
            client.generate(source, model="nope")
        assert info.value.code() == Code.NOT_FOUND
    cli = [sys.executable, "-m", "seqserve.cli", "generate", "--server", two.address, source, "--timeout", "30"]
    done = subprocess.run([*cli, "--model", "de-en", "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    refused = subprocess.run([*cli, "--model", "nope"], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1 and "NOT_FOUND" in refused.stderr and "de-en, en-de" in refused.stderr


def test_a_model_beyond_the_memory_budget_is_refused_at_load(make_server, two):
    one = two.stub.GetModelInfo(pb.GetModelInfoRequest(model="en-de"), timeout=10).memory_bytes
    budget = one + one // 2  # room for one model, not two
    bundles = two.app.settings.bundle
    with pytest.raises(st.SettingsError) as info:
        make_server(bundle=bundles, memory_budget_bytes=budget)
    message = str(info.value)
    assert "'de-en'" in message and str(budget) in message and "--memory-budget-bytes" in message
    assert make_server(bundle=bundles[:1], memory_budget_bytes=budget).app.models.keys() == {"en-de"}


def test_a_reload_refuses_a_model_beyond_the_budget_and_the_others_keep_serving(make_server, two, tiny_bundle,
                                                                               tmp_path, caplog, heldout):
    one = two.stub.GetModelInfo(pb.GetModelInfoRequest(model="en-de"), timeout=10).memory_bytes
    repository = tmp_path / "models"
    for name in ("a", "b"):
        shutil.copytree(tiny_bundle, repository / name)
        (repository / name / VERIFIED).write_text(json.dumps({"manifest_sha256": sha256_of(tiny_bundle / MANIFEST)}))
    shutil.move(repository / "b", tmp_path / "b")  # not there yet
    s = make_server(bundle=None, model_repository=repository, memory_budget_bytes=one + one // 2)
    assert s.app.models.keys() == {"a"}
    shutil.move(tmp_path / "b", repository / "b")
    with caplog.at_level(logging.ERROR, logger="seqserve"):
        s.run_async(s.app.reload()).result(60)
    assert s.app.models.keys() == {"a"}
    refused = [r.getMessage() for r in caplog.records if "not loaded" in r.getMessage()]
    assert len(refused) == 1 and "'b'" in refused[0] and str(one + one // 2) in refused[0]
    assert s.stub.Generate(request(heldout[0][0]), timeout=30).token_ids  # the one model still needs no name
    health = health_pb2_grpc.HealthStub(s.channel)
    with pytest.raises(grpc.RpcError) as info:
        health.Check(health_pb2.HealthCheckRequest(service="seqserve.v1.Generation/b"), timeout=10)
    assert info.value.code() == Code.NOT_FOUND


@pytest.mark.parametrize("flags, env, expected", [
    ({"bundle": ["a=one", "b=two"]}, {}, {"a": "one", "b": "two"}),
    ({}, {"SEQSERVE_BUNDLE": "a=one, b=two"}, {"a": "one", "b": "two"}),
    ({"bundle": ["my-bundle"]}, {}, {"my-bundle": "my-bundle"}),  # a plain directory is named after itself
    ({"bundle": ["sub/a=b/bundle"]}, {}, {"bundle": "sub/a=b/bundle"}),  # "=" after a "/" is part of the path
])
def test_bundle_flags_and_variable_name_the_models(tmp_path, monkeypatch, flags, env, expected):
    monkeypatch.chdir(tmp_path)
    for path in expected.values():
        (tmp_path / path).mkdir(parents=True)
        (tmp_path / path / "manifest.json").write_text("{}")
    assert {n: str(p) for n, p in st.load(flags, env).bundles().items()} == expected


@pytest.mark.parametrize("kwargs, message", [
    (dict(bundle=("a=DIR", "a=DIR")), "model 'a' is named twice"),
    (dict(bundle=("bad name=DIR",)), "model name 'bad name'"),
    (dict(bundle=("bad/name=DIR",)), r"model name 'bad/name' .*use letters"),  # NAME=DIR, not a path with "="
    (dict(bundle=("a=DIR",), model_repository="REPO"), "exclude each other"),
    (dict(model_repository="/nonexistent"), "--model-repository / SEQSERVE_MODEL_REPOSITORY: no directory"),
    (dict(bundle=("a=DIR",), memory_budget_bytes=-1), "--memory-budget-bytes / SEQSERVE_MEMORY_BUDGET_BYTES must be"),
])
def test_invalid_model_settings_name_the_flag(tiny_bundle, kwargs, message):
    kwargs = {k: (tuple(s.replace("DIR", str(tiny_bundle)) for s in v) if k == "bundle" else
                  str(tiny_bundle.parent) if v == "REPO" else v) for k, v in kwargs.items()}
    with pytest.raises(st.SettingsError, match=message):
        st.Settings(**kwargs)


def test_a_changed_model_takes_calls_while_its_earlier_version_finishes_one_held_mid_generation(
        make_server, tiny_bundle, tmp_path, heldout):
    from grpc_harness import StepGate, wait_for

    repository = tmp_path / "models"
    shutil.copytree(tiny_bundle, repository / "m")
    (repository / "m" / VERIFIED).write_text(json.dumps({"manifest_sha256": sha256_of(tiny_bundle / MANIFEST)}))
    s = make_server(bundle=None, model_repository=repository)
    old = engine_of(s.app.models["m"])
    gate = StepGate(old, s.settle)
    gate.close()
    long = pb.DecodingOptions(min_new_tokens=20, max_new_tokens=20)
    held = s.stub.Generate.future(pb.GenerateRequest(input=heldout[0][0], model="m", options=long), timeout=60)
    gate.wait_held()  # the call runs on the earlier version, which is held between two steps
    manifest = json.loads((repository / "m" / MANIFEST).read_text())
    manifest["max_new_tokens"] = 30  # a new version
    (repository / "m" / MANIFEST).write_text(json.dumps(manifest))
    (repository / "m" / "bundle.sha256").write_text(f"{sha256_of(repository / 'm' / MANIFEST)}  {MANIFEST}\n")
    (repository / "m" / VERIFIED).write_text(json.dumps({"manifest_sha256": sha256_of(repository / "m" / MANIFEST)}))
    s.run_async(s.app.reload()).result(60)
    assert engine_of(s.app.models["m"]) is not old
    fresh = s.stub.Generate(pb.GenerateRequest(input=heldout[1][0], model="m"), timeout=30)  # the new version answers
    assert fresh.token_ids and s.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10).limits.max_new_tokens == 30
    assert not held.done()
    assert s.metric("seqserve_running_requests", model="m") == 1  # the versions add up: the held row is counted
    gate.open()
    assert len(held.result(60).token_ids) == 20  # the earlier version finished it whole
    assert s.metric("seqserve_running_requests", model="m") == 0
    wait_for(lambda: not s.app.draining_models, what="the earlier version drained and stopped")
    assert old.loop.thread is not None and not old.loop.thread.is_alive()


def test_a_removed_model_refuses_new_calls_and_finishes_one_held_mid_generation(make_server, tiny_bundle, tmp_path,
                                                                                  heldout):
    from grpc_harness import StepGate, wait_for

    repository = tmp_path / "models"
    for name in ("m", "keep"):
        shutil.copytree(tiny_bundle, repository / name)
        (repository / name / VERIFIED).write_text(json.dumps({"manifest_sha256": sha256_of(tiny_bundle / MANIFEST)}))
    s = make_server(bundle=None, model_repository=repository)
    gate = StepGate(engine_of(s.app.models["m"]), s.settle)
    gate.close()
    long = pb.DecodingOptions(min_new_tokens=20, max_new_tokens=20)
    held = s.stub.Generate.future(pb.GenerateRequest(input=heldout[0][0], model="m", options=long), timeout=60)
    gate.wait_held()
    shutil.move(repository / "m", tmp_path / "m")
    s.run_async(s.app.reload()).result(60)
    with pytest.raises(grpc.RpcError) as info:
        s.stub.Generate(pb.GenerateRequest(input=heldout[1][0], model="m"), timeout=10)
    assert info.value.code() == Code.NOT_FOUND and "the models are: keep" in info.value.details()
    health = health_pb2_grpc.HealthStub(s.channel)
    assert health.Check(health_pb2.HealthCheckRequest(service="seqserve.v1.Generation/m"), timeout=10).status == \
        health_pb2.HealthCheckResponse.NOT_SERVING  # draining
    assert s.metric("seqserve_model_ready", model="m") == 0
    gate.open()
    assert len(held.result(60).token_ids) == 20
    wait_for(lambda: not s.app.draining_models, what="m drained and stopped")
    with pytest.raises(grpc.RpcError) as info:
        health.Check(health_pb2.HealthCheckRequest(service="seqserve.v1.Generation/m"), timeout=10)
    assert info.value.code() == Code.NOT_FOUND  # gone
    assert not [s for f in s.app.metrics.registry.collect() for s in f.samples
                if s.labels.get("model") == "m" and f.type in ("gauge", "info")]
