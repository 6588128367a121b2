"""TLS, mutual TLS and bearer tokens on real servers, with certificates the test makes (trustme)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
import trustme
from grpc_harness import Served, request, wait_for
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from seqserve.cli.main import main
from seqserve.client.channel import Connection
from seqserve.client.client import Client
from seqserve.client.healthcheck import check
from seqserve.client.healthcheck import main as healthcheck_main
from seqserve.v1 import seqserve_pb2 as pb

REPO = Path(__file__).resolve().parents[2]
TOKEN, OTHER_TOKEN, WRONG = "t0ken-" + "a" * 26, "t0ken-" + "b" * 26, "t0ken-" + "c" * 26
Code = grpc.StatusCode


class PKI:
    """A server CA with a certificate for 127.0.0.1, a client CA with one client certificate, and a stranger CA."""

    def __init__(self, root) -> None:
        self.root = root
        server_ca, client_ca, stranger = trustme.CA(), trustme.CA(), trustme.CA()
        self.ca = self._write("ca.pem", server_ca.cert_pem)
        self.stranger_ca = self._write("stranger-ca.pem", stranger.cert_pem)
        self.cert, self.key = self._issue(server_ca, "server", "127.0.0.1", "localhost")
        self.client_ca = self._write("client-ca.pem", client_ca.cert_pem)
        self.client_cert, self.client_key = self._issue(client_ca, "client", "client.example")
        self.stranger_cert, self.stranger_key = self._issue(stranger, "stranger", "client.example")

    def _write(self, name: str, blob) -> str:
        path = self.root / name
        blob.write_to_path(str(path))
        return str(path)

    def _issue(self, ca: trustme.CA, name: str, *identities: str) -> tuple[str, str]:
        issued = ca.issue_cert(*identities)
        chain = self.root / f"{name}.pem"
        chain.write_bytes(b"".join(blob.bytes() for blob in issued.cert_chain_pems))
        return str(chain), self._write(f"{name}.key", issued.private_key_pem)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> PKI:
    return PKI(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_server(tiny_bundle, pki):
    s = Served(tiny_bundle, tls_cert_file=pki.cert, tls_key_file=pki.key, metrics_port=-1).wait_ready()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def auth_server(tiny_bundle, tmp_path_factory):
    token_file = tmp_path_factory.mktemp("tokens") / "tokens"
    token_file.write_text(f"# one token per line\n{TOKEN}\n\n")
    s = Served(tiny_bundle, auth_token_file=token_file, auth_tokens=OTHER_TOKEN, metrics_port=-1).wait_ready()
    yield s
    s.stop()


def _code(call, *args, **kwargs) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        result = call(*args, **kwargs)
        if not hasattr(result, "SerializeToString"):
            list(result)
    return info.value.code()


def test_tls_right_ca_connects_plaintext_and_wrong_ca_fail(tls_server, pki, heldout, capsys):
    src, tgt = heldout[0]
    with Client(tls_server.address, timeout=30, connection=Connection(ca_file=pki.ca)) as client:
        assert client.generate(src).text == tgt
        assert "".join(p.text for p in client.stream(src)) == tgt
    assert check(tls_server.address, connection=Connection(ca_file=pki.ca)) == "SERVING"
    assert healthcheck_main([tls_server.address, "--ca-file", pki.ca]) == 0
    assert main(["generate", src, "--server", tls_server.address, "--ca-file", pki.ca]) == 0
    assert capsys.readouterr().out == f"SERVING\n{tgt}\n"
    for connection in (Connection(), Connection(ca_file=pki.stranger_ca)):  # plaintext; a CA that never signed it
        with Client(tls_server.address, timeout=10, connection=connection) as client:
            with pytest.raises(grpc.RpcError) as info:
                client.generate(src)
            assert info.value.code() == Code.UNAVAILABLE
    assert check(tls_server.address, timeout=5) == "UNAVAILABLE"


def test_mutual_tls_refuses_clients_without_a_certificate_it_trusts(tiny_bundle, pki, heldout):
    s = Served(tiny_bundle, tls_cert_file=pki.cert, tls_key_file=pki.key, tls_client_ca_file=pki.client_ca,
               metrics_port=-1).wait_ready()
    try:
        src, tgt = heldout[0]
        ok = Connection(ca_file=pki.ca, cert_file=pki.client_cert, key_file=pki.client_key)
        with Client(s.address, timeout=30, connection=ok) as client:
            assert client.generate(src).text == tgt
        for refused in (Connection(ca_file=pki.ca),  # no client certificate
                        Connection(ca_file=pki.ca, cert_file=pki.stranger_cert, key_file=pki.stranger_key)):
            with Client(s.address, timeout=10, connection=refused) as client:
                with pytest.raises(grpc.RpcError) as info:
                    client.generate(src)
                assert info.value.code() == Code.UNAVAILABLE
    finally:
        s.stop()


@pytest.mark.parametrize("token", [None, WRONG, TOKEN[:-1], "Bearer", ""], ids=["missing", "wrong", "prefix",
                                                                                  "word", "empty"])
def test_a_missing_or_wrong_token_is_unauthenticated_on_every_method(auth_server, heldout, token):
    metadata = () if token is None else (("authorization", f"Bearer {token}"),)
    stub, src = auth_server.stub, heldout[0][0]
    assert _code(stub.Generate, request(src), metadata=metadata, timeout=10) == Code.UNAUTHENTICATED
    assert _code(stub.GenerateStream, request(src), metadata=metadata, timeout=10) == Code.UNAUTHENTICATED
    assert _code(stub.GenerateBatch, pb.GenerateBatchRequest(inputs=[src]), metadata=metadata,
                 timeout=10) == Code.UNAUTHENTICATED
    assert _code(stub.GetModelInfo, pb.GetModelInfoRequest(), metadata=metadata, timeout=10) == Code.UNAUTHENTICATED
    junk = auth_server.channel.unary_unary("/seqserve.v1.Generation/Generate")  # raw bytes: refused before decoding
    assert _code(junk, b"\xff\xff\xff", metadata=metadata, timeout=10) == Code.UNAUTHENTICATED


def test_right_tokens_from_the_file_and_the_variable_pass(auth_server, heldout, tmp_path, capsys, monkeypatch):
    src, tgt = heldout[0]
    before = auth_server.metric("seqserve_requests_total", method="Generate", code="UNAUTHENTICATED")
    for token in (TOKEN, OTHER_TOKEN):
        with Client(auth_server.address, timeout=30, connection=Connection(token=token)) as client:
            assert client.generate(src).text == tgt
            assert "".join(p.text for p in client.stream(src)) == tgt
            assert [r.text for r in client.generate_batch([src])] == [tgt]
            assert client.model_info()["limits"]["max_inflight_bytes"] > 0
    assert _code(auth_server.stub.Generate, request(src), timeout=10) == Code.UNAUTHENTICATED
    assert auth_server.metric("seqserve_requests_total", method="Generate", code="UNAUTHENTICATED") == before + 1
    for header in (f"bearer {TOKEN}", f"BEARER  {TOKEN} ", f"  Bearer {OTHER_TOKEN}"):  # RFC 7235: any case
        assert auth_server.stub.Generate(request(src), metadata=(("authorization", header),), timeout=30).text == tgt
    for header in (f"Basic {TOKEN}", f"Bearer{TOKEN}", TOKEN):
        assert _code(auth_server.stub.Generate, request(src), metadata=(("authorization", header),),
                     timeout=10) == Code.UNAUTHENTICATED
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    assert main(["generate", src, "--server", auth_server.address, "--token-file", str(token_file)]) == 0
    monkeypatch.setenv("SEQSERVE_TOKEN", OTHER_TOKEN)
    assert main(["generate", src, "--server", auth_server.address, "--stream"]) == 0
    monkeypatch.delenv("SEQSERVE_TOKEN")
    assert main(["generate", src, "--server", auth_server.address]) == 1
    out, err = capsys.readouterr()
    assert out == f"{tgt}\n{tgt}\n" and "error: UNAUTHENTICATED" in err


def test_health_is_open_by_setting_and_reflection_needs_the_token(auth_server, tiny_bundle):
    assert check(auth_server.address) == "SERVING"  # probes and load balancers carry no token
    with pytest.raises(grpc.RpcError) as info:
        ProtoReflectionDescriptorDatabase(auth_server.channel).get_services()
    assert info.value.code() == Code.UNAUTHENTICATED
    with Connection(token=TOKEN).channel(auth_server.address) as channel:
        assert "seqserve.v1.Generation" in ProtoReflectionDescriptorDatabase(channel).get_services()
    closed = Served(tiny_bundle, auth_tokens=TOKEN, auth_exempt_health=False, metrics_port=-1).wait_ready()
    try:
        assert check(closed.address) == "UNAUTHENTICATED"
        assert check(closed.address, connection=Connection(token=TOKEN)) == "SERVING"
    finally:
        closed.stop()


def test_reflection_off_and_metrics_only_at_their_path(make_server):
    s = make_server(reflection=False, metrics_bind="127.0.0.1")
    with pytest.raises(grpc.RpcError) as info:
        ProtoReflectionDescriptorDatabase(s.channel).get_services()
    assert info.value.code() == Code.UNIMPLEMENTED
    health = health_pb2_grpc.HealthStub(s.channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert health.status == health_pb2.HealthCheckResponse.SERVING  # the rest of the server is there
    base = f"http://127.0.0.1:{s.app.metrics_port}"
    assert "seqserve_requests_total" in urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
    assert urllib.request.urlopen(base + "/metrics?name[]=seqserve_waiting_requests", timeout=10).status == 200
    for path in ("/", "/metric", "/metrics/x", "/favicon.ico"):
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(base + path, timeout=10)
        assert err.value.code == 404, path
    assert s.app._http.address[0] == "127.0.0.1"


def test_health_watch_streams_are_bounded(make_server):
    """Issue 16, item 11: Watch needs no token and stays open; 2,000 of them held 43 MiB. Beyond
    max_health_watches a new one is RESOURCE_EXHAUSTED, and a closed one frees its place."""
    s = make_server(max_health_watches=3, metrics_port=-1)
    stub = health_pb2_grpc.HealthStub(s.channel)
    watches = [stub.Watch(health_pb2.HealthCheckRequest(), timeout=60) for _ in range(3)]
    assert [next(w).status for w in watches] == [health_pb2.HealthCheckResponse.SERVING] * 3  # all three open
    extra = stub.Watch(health_pb2.HealthCheckRequest(), timeout=10)
    with pytest.raises(grpc.RpcError) as info:
        next(extra)
    assert info.value.code() == Code.RESOURCE_EXHAUSTED and "max_health_watches=3" in info.value.details()
    assert s.metric("seqserve_rejected_requests_total", reason="health_watches") == 1
    assert stub.Check(health_pb2.HealthCheckRequest(), timeout=10).status == health_pb2.HealthCheckResponse.SERVING
    watches.pop().cancel()
    wait_for(lambda: s.app.health.watches == 2, what="the cancelled Watch to close")
    again = stub.Watch(health_pb2.HealthCheckRequest(), timeout=60)
    assert next(again).status == health_pb2.HealthCheckResponse.SERVING
    for w in (*watches, again):
        w.cancel()


def test_metrics_endpoint_holds_no_thread_per_connection_and_answers_only_its_path(make_server, capfd, caplog):
    """Issue 16, item 7: 1,000 half-sent requests held 1,000 threads and 26 MiB with no timeout, and logged 972
    tracebacks when they closed; `//metrics` answered too."""
    s = make_server(metrics_bind="127.0.0.1")
    base, port = f"http://127.0.0.1:{s.app.metrics_port}", s.app.metrics_port
    threads = threading.active_count()
    half_sent = []
    for _ in range(1000):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x")  # never finished
        half_sent.append(sock)
    # accepted in order: once this scrape is answered, every half-sent connection before it was accepted
    assert "seqserve_requests_total" in urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
    assert threading.active_count() <= threads + 1, threading.active_count() - threads
    assert len(s.app._http.connections) <= 64  # the oldest ones were closed to make room
    for sock in half_sent:
        sock.close()
    wait_for(lambda: not s.app._http.connections, what="the half-sent connections to close")
    for path in ("//metrics", "/metrics/", "/./metrics", "/Metrics", "/metrics#x"):
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(base + path if "#" not in path else base + "/metrics%23x", timeout=10)
        assert err.value.code == 404, path
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    raw.sendall(b"\x16\x03\x01junk\r\n\r\n")  # not HTTP (a TLS hello, say)
    assert raw.recv(100).startswith(b"HTTP/1.1 400")
    raw.close()
    request = urllib.request.Request(base + "/metrics", method="POST", data=b"x")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request, timeout=10)
    assert err.value.code == 405
    assert "Traceback" not in capfd.readouterr().err
    assert not [r for r in caplog.records if r.levelno >= 30 or r.exc_info]


def test_a_message_over_the_receive_limit_is_resource_exhausted(make_server):
    s = make_server(max_receive_message_bytes=4096, max_inflight_bytes=8192)
    assert s.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10).limits.max_receive_message_bytes == 4096
    assert _code(s.stub.Generate, request("a " * 3000), timeout=10) == Code.RESOURCE_EXHAUSTED
    assert s.stub.Generate(request("b 5 9", max_new_tokens=2), timeout=30).usage.generated_tokens > 0


def test_generate_offers_every_connection_flag():
    from seqserve.cli.main import build_parser
    from seqserve.client.channel import CONNECTION_HELP

    generate = build_parser()._subparsers._group_actions[0].choices["generate"]
    assert set(CONNECTION_HELP) <= {a.dest for a in generate._actions}


def test_locust_users_connect_with_tls_and_a_token(tiny_bundle, pki, tmp_path):
    """The locustfile's connection flags reach every user's channel: all calls succeed, none without the token."""
    s = Served(tiny_bundle, tls_cert_file=pki.cert, tls_key_file=pki.key, auth_tokens=TOKEN,
               metrics_port=-1).wait_ready()
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    try:
        summaries = {}
        for name, flags in (("token", ["--token-file", str(token_file)]), ("none", [])):
            out = tmp_path / f"{name}.json"
            env = {k: v for k, v in os.environ.items() if k != "SEQSERVE_TOKEN"}
            subprocess.run([sys.executable, "-m", "locust", "-f", str(REPO / "loadtest" / "locustfile.py"),
                            "--headless", "--only-summary", "--host", s.address, "--users", "2", "--spawn-rate", "2",
                            "--run-time", "2s", "--stop-timeout", "10s", "--exit-code-on-error", "0",
                            "--heldout", str(tiny_bundle), "--summary-json", str(out), "--max-new-tokens", "3",
                            "--ca-file", pki.ca, *flags], cwd=REPO, env=env, capture_output=True, timeout=120,
                           check=True)
            summaries[name] = json.loads(out.read_text())
        assert summaries["token"]["requests"] > 0 and summaries["token"]["failures"] == 0
        assert set(summaries["none"]["failures_by_code"]) == {"UNAUTHENTICATED"}
        assert summaries["none"]["failures"] == summaries["none"]["requests"] > 0
    finally:
        s.stop()
