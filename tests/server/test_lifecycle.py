"""Health, reflection, metrics, draining, SIGTERM in a real `seqserve serve` process, and no torch on the server."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import grpc
import pytest
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_harness import PROVIDER, follow_log, request, wait_for
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from seqserve.server.app import App
from seqserve.v1 import seqserve_pb2 as pb
from seqserve.v1 import seqserve_pb2_grpc as pb_grpc

REPO = Path(__file__).resolve().parents[2]
SERVICE = "seqserve.v1.Generation"
LONG = dict(min_new_tokens=30, max_new_tokens=30)
SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


def _health(channel, service: str = "") -> int:
    return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status


def test_health_not_serving_until_warm_then_serving_then_draining(make_server, heldout):
    gate = threading.Event()

    class GatedApp(App):
        def _load(self, *args):  # loading ends with the warm-up: held here, the server is not warm yet
            assert gate.wait(60), "the test never opened the gate"
            return super()._load(*args)

    s = make_server(app_class=GatedApp, ready=False)
    assert _health(s.channel) == NOT_SERVING and _health(s.channel, SERVICE) == NOT_SERVING
    with pytest.raises(grpc.RpcError) as info:
        s.stub.Generate(request(heldout[0][0]), timeout=10)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    gate.set()
    s.wait_ready()
    assert _health(s.channel) == SERVING and _health(s.channel, SERVICE) == SERVING

    gate = s.gate()
    gate.close()  # the in-flight call stays in flight, held between two steps, through the checks below
    in_flight = s.stub.GenerateStream(request(heldout[0][0], **LONG), timeout=60)
    next(in_flight)
    drained = s.run_async(s.app.drain())
    wait_for(lambda: _health(s.channel) == NOT_SERVING, what="NOT_SERVING while draining")
    with pytest.raises(grpc.RpcError) as info:
        s.stub.Generate(request(heldout[1][0]), timeout=10)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE and "shutting down" in info.value.details()
    assert not drained.done()
    gate.open()
    assert list(in_flight)[-1].finish_reason == pb.FINISH_REASON_LENGTH  # the in-flight call finished
    assert drained.result(30) is True
    assert s.metric("seqserve_rejected_requests_total", reason="draining") == 1
    assert s.metric("seqserve_rejected_requests_total", reason="not_ready") == 1


def test_the_event_loop_answers_while_the_engine_thread_is_busy(make_server, heldout):
    """Inference runs in the engine thread: calls on the event loop are answered while that thread is held."""
    s = make_server()
    gate = s.gate()
    gate.close()
    running = s.stub.Generate.future(request(heldout[0][0], max_new_tokens=2, min_new_tokens=2), timeout=30)
    gate.wait_held()
    assert _health(s.channel) == SERVING
    info = s.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
    assert info.limits.max_new_tokens > 0 and not running.done()
    gate.open()
    assert running.result().usage.generated_tokens == 2


def test_reflection_lists_and_describes_the_service(served):
    database = ProtoReflectionDescriptorDatabase(served.channel)
    assert SERVICE in database.get_services() and "grpc.health.v1.Health" in database.get_services()
    service = DescriptorPool(database).FindServiceByName(SERVICE)
    assert {m.name for m in service.methods} == {"Generate", "GenerateStream", "GenerateBatch", "GetModelInfo"}


def test_metric_values_move_as_requests_complete(served, heldout):
    names = ["seqserve_input_tokens_total", "seqserve_generated_tokens_total",
             "seqserve_encoder_duration_seconds_count", "seqserve_decoder_step_duration_seconds_count",
             "seqserve_time_to_first_token_seconds_count", "seqserve_queue_duration_seconds_count",
             "seqserve_inter_token_latency_seconds_count"]
    before = {n: served.metric(n) for n in names}
    requests_before = served.metric("seqserve_requests_total", method="Generate", code="OK")
    duration_before = served.metric("seqserve_request_duration_seconds_count", method="Generate")
    eos_before = served.metric("seqserve_finished_requests_total", reason="eos")
    r = served.stub.Generate(request(heldout[0][0]), timeout=30)
    # The engine counts a step's tokens just after delivering them; the end token is neither returned nor counted.
    assert r.finish_reason == pb.FINISH_REASON_EOS
    generated = before["seqserve_generated_tokens_total"] + r.usage.generated_tokens
    wait_for(lambda: served.metric("seqserve_generated_tokens_total") == generated, what="generated tokens counted")
    after = {n: served.metric(n) for n in names}
    assert after["seqserve_input_tokens_total"] - before["seqserve_input_tokens_total"] == r.usage.input_tokens
    assert all(after[n] > before[n] for n in names)
    assert served.metric("seqserve_requests_total", method="Generate", code="OK") == requests_before + 1
    assert served.metric("seqserve_request_duration_seconds_count", method="Generate") == duration_before + 1
    assert served.metric("seqserve_finished_requests_total", reason="eos") == eos_before + 1
    assert served.metric("seqserve_running_requests") == 0
    text = urllib.request.urlopen(f"http://127.0.0.1:{served.app.metrics_port}/metrics", timeout=10).read().decode()
    assert re.search(rf'seqserve_model_info\{{[^}}]*provider="{PROVIDER}"[^}}]*variant="fp32"', text)
    assert 'seqserve_requests_total{code="OK",method="Generate",model="tiny-bundle"}' in text  # every metric: its model


# Holds the engine of a real `seqserve serve` between two decoder steps while the file argv[1] exists: the step after
# the first one it takes once the file appears waits (polling the file, never a timing window) until the test removes
# it, so the call is exactly mid-generation when the signal lands.
HELD_SERVE = """
import os, sys, time
from seqserve.engine.runtime.runner import Runner
step = Runner.run_step  # the decoder step the engine calls
taken = 0
def held_step(self, *args, **kwargs):
    global taken
    if os.path.exists(sys.argv[1]):
        taken += 1
        while taken > 1 and os.path.exists(sys.argv[1]):
            time.sleep(0.01)
    return step(self, *args, **kwargs)
Runner.run_step = held_step
from seqserve.cli.main import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_drains_in_flight_calls_and_exits_0(tiny_bundle, heldout, sig, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEQSERVE_")}
    env |= {"SEQSERVE_GRACE_SECONDS": "30", "SEQSERVE_DEVICE": "cpu"}  # settings through the environment too
    hold = tmp_path / "hold"
    proc = subprocess.Popen([sys.executable, "-c", HELD_SERVE, str(hold), "serve", "--bundle", str(tiny_bundle),
                             "--bind", "127.0.0.1", "--port", "0", "--metrics-port", "-1"], cwd=REPO, env=env,
                            stderr=subprocess.PIPE, text=True)
    log, port, listening = follow_log(proc)
    try:
        assert listening.wait(60), "".join(log)
        with grpc.insecure_channel(f"127.0.0.1:{port[0]}") as channel:
            stub = pb_grpc.GenerationStub(channel)
            hold.touch()  # the engine is held after the call's first step
            in_flight = stub.GenerateStream(request(heldout[0][0], **LONG), timeout=60)
            next(in_flight)
            proc.send_signal(sig)
            wait_for(lambda: any("draining" in line for line in log), what="the drain to begin")
            with pytest.raises(grpc.RpcError) as info:
                stub.Generate(request(heldout[1][0]), timeout=10)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            hold.unlink()  # the held call goes on, to its end, inside the drain
            rest = list(in_flight)
            assert rest[-1].finish_reason == pb.FINISH_REASON_LENGTH and rest[-1].usage.generated_tokens == 30
        assert proc.wait(60) == 0, "".join(log)
    finally:
        if proc.poll() is None:
            proc.kill()


# Holds `seqserve serve` in its start-up, before the event loop exists (where the slow imports are), until the test
# has sent its signal and touched the file named by argv[1].
EARLY_SIGNAL_SERVE = """
import os, sys, time
import seqserve.server.settings as settings
load = settings.load
def held_load(*args, **kwargs):
    print("starting up", file=sys.stderr, flush=True)
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.01)
    return load(*args, **kwargs)
settings.load = held_load
from seqserve.cli.main import main
sys.exit(main(sys.argv[2:]))
"""


def test_a_signal_during_start_up_exits_0(tiny_bundle, tmp_path):
    """Issue 16, item 11: a SIGTERM 0.3 s after start (while onnxruntime and grpc were still importing) ended the
    process with -15, before the handlers were installed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEQSERVE_")}
    sent = tmp_path / "signal-sent"
    proc = subprocess.Popen([sys.executable, "-c", EARLY_SIGNAL_SERVE, str(sent), "serve", "--bundle", str(tiny_bundle),
                             "--port", "0", "--metrics-port", "-1", "--device", "cpu"], cwd=REPO, env=env,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr.readline() == "starting up\n"
        proc.send_signal(signal.SIGTERM)
        sent.touch()
        assert proc.wait(60) == 0, proc.stderr.read()
        assert "stopped before serving" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_importing_the_server_does_not_import_torch():
    """Nor transformers or sentencepiece (the hf extra is for `seqserve import` and the tests only)."""
    code = ("import sys, seqserve.server.app, seqserve.server.service, seqserve.engine.step.engine, seqserve.cli.main\n"
            "import seqserve.client.client, seqserve.server.settings, seqserve.engine.decoding.token_rules\n"
            "import seqserve.server.model_defaults, seqserve.contract.integrity\n"
            "seqserve.cli.main.build_parser()\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'sentencepiece'))\n"
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=120)


def test_warm_up_is_not_counted_as_traffic(make_server):
    s = make_server()
    assert s.metric("seqserve_input_tokens_total") == s.metric("seqserve_generated_tokens_total") == 0
    assert s.metric("seqserve_decoder_step_duration_seconds_count") == 0
