"""Property fuzzing of the gRPC edge with hypothesis: over 2,000 generated calls, structured over every field
(huge, empty, unicode, control characters, extreme numbers) or byte-mutated protobuf. Every call ends OK or with a
documented status, every one the service decodes is counted, health stays SERVING and the gauges return to 0.

One server serves every case (max_new_tokens capped at 4 so valid generations are short); derandomized, so CI runs
the same cases every time.
"""
from __future__ import annotations

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor
from grpc_harness import Served, wait_for
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seqserve.v1 import seqserve_pb2 as pb

CASES = 2100
Code = grpc.StatusCode
# The statuses seqserve.proto documents for a healthy server: anything else (UNKNOWN, INTERNAL, a deadline on a
# 4-token generation) is a bug.
DOCUMENTED = {Code.OK, Code.INVALID_ARGUMENT, Code.RESOURCE_EXHAUSTED}
SERVICE = "/seqserve.v1.Generation/"
METHODS = {"Generate": pb.GenerateRequest, "GenerateStream": pb.GenerateRequest,
           "GenerateBatch": pb.GenerateBatchRequest, "GetModelInfo": pb.GetModelInfoRequest}
MAX_RECEIVE = 1 << 20
GAUGES = ("seqserve_running_requests", "seqserve_waiting_requests", "seqserve_inflight_request_bytes")


@pytest.fixture(scope="module")
def fuzz_server(tiny_bundle):
    s = Served(tiny_bundle, max_new_tokens=4, max_batch_inputs=8, max_waiting=64, metrics_port=-1,
               max_receive_message_bytes=MAX_RECEIVE).wait_ready()
    yield s
    s.stop()


def texts(sources: list[str]) -> st.SearchStrategy[str]:
    huge = st.builds(lambda piece, n: piece * n, st.text(min_size=1, max_size=3), st.integers(1_000, 20_000))
    return st.one_of(st.sampled_from(sources), st.just(""), st.text(max_size=40),
                     st.text(st.characters(codec="utf-8", categories=["Cc", "Cf", "Zs", "Co", "So"]), max_size=20),
                     huge)


def _number(f: FieldDescriptor) -> st.SearchStrategy:
    ranges = {FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1), FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
              FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1)}
    if f.type == FieldDescriptor.TYPE_FLOAT:
        extremes = [0.0, 0.5, 1.0, 2.0, float("nan"), float("inf"), -10.0, 10.0, 100.0, 1e-30, 3.4e38, -3.4e38]
        return st.one_of(st.floats(width=32), st.sampled_from(extremes))  # every float option's range ends, too
    if f.type == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    lo, hi = ranges[f.type]
    return st.one_of(st.integers(max(lo, -2), 6), st.integers(lo, hi))  # small values reach the engine


def options(sources: list[str]) -> st.SearchStrategy[pb.DecodingOptions]:
    """Every DecodingOptions field the proto has (new ones join automatically), each set or left unset."""
    fields = {}
    for f in pb.DecodingOptions.DESCRIPTOR.fields:
        value = st.lists(texts(sources), max_size=10) if f.type == FieldDescriptor.TYPE_STRING else _number(f)
        fields[f.name] = st.none() | value
    return st.fixed_dictionaries(fields).map(
        lambda kw: pb.DecodingOptions(**{k: v for k, v in kw.items() if v is not None}))


def valid_options() -> st.SearchStrategy[pb.DecodingOptions]:
    """Options the server accepts, so a good share of the cases runs in the engine (sampling, stop strings)."""
    return st.builds(pb.DecodingOptions, max_new_tokens=st.integers(1, 4), min_new_tokens=st.integers(0, 1),
                     temperature=st.sampled_from([0.0, 0.7, 2.0]), top_k=st.integers(0, 5),
                     top_p=st.sampled_from([0.1, 0.9, 1.0]), repetition_penalty=st.sampled_from([1.0, 1.3]),
                     stop=st.lists(st.text(min_size=1, max_size=3), max_size=2), seed=st.integers(0, 2**64 - 1))


def structured(sources: list[str]) -> st.SearchStrategy[tuple[str, bytes]]:
    some_options = st.one_of(valid_options(), options(sources))
    single = st.one_of(st.builds(lambda t, o: pb.GenerateRequest(input=t, options=o), st.sampled_from(sources),
                                 valid_options()),
                       st.builds(lambda t, o: pb.GenerateRequest(input=t, options=o), texts(sources), some_options))
    batch = st.builds(lambda ts, o: pb.GenerateBatchRequest(inputs=ts, options=o),
                      st.lists(texts(sources), max_size=10), some_options)
    return st.one_of(st.tuples(st.sampled_from(["Generate", "GenerateStream"]), single.map(_bytes)),
                     st.tuples(st.just("GenerateBatch"), batch.map(_bytes)),
                     st.tuples(st.just("GetModelInfo"), st.just(b"")))


def _bytes(message) -> bytes:
    return message.SerializeToString()


def _mutate(blob: bytes, edits: list[tuple[str, int, bytes]]) -> bytes:
    data = bytearray(blob)
    for op, at, payload in edits:
        at = at % (len(data) + 1)
        if op == "flip" and at < len(data):
            data[at] ^= payload[0] | 1
        elif op == "insert":
            data[at:at] = payload
        elif op == "delete":
            del data[at:at + len(payload)]
        elif op == "cut":
            del data[at:]
    return bytes(data)


def mutated(sources: list[str]) -> st.SearchStrategy[tuple[str, bytes]]:
    """A valid message with bytes flipped, inserted, deleted or cut; or junk; or invalid UTF-8 in the input."""
    edit = st.tuples(st.sampled_from(["flip", "insert", "delete", "cut"]), st.integers(0, 1 << 16),
                     st.binary(min_size=1, max_size=4))
    edited = st.builds(lambda case, edits: (case[0], _mutate(case[1], edits)), structured(sources),
                       st.lists(edit, min_size=1, max_size=6))
    junk = st.tuples(st.sampled_from(sorted(METHODS)), st.binary(max_size=64))
    bad_utf8 = st.binary(max_size=7).map(lambda b: b + b"\xff")  # 0xff never occurs in UTF-8
    in_input = st.tuples(st.sampled_from(["Generate", "GenerateStream"]),
                         bad_utf8.map(lambda b: b"\x0a" + bytes([len(b)]) + b))
    return st.one_of(edited, junk, in_input)


def _call(channel: grpc.Channel, method: str, blob: bytes) -> grpc.StatusCode:
    """The final status of one raw call (bytes in, bytes out: no client-side validation in the way)."""
    try:
        if method == "GenerateStream":
            for _ in channel.unary_stream(SERVICE + method)(blob, timeout=30):
                pass
        else:
            channel.unary_unary(SERVICE + method)(blob, timeout=30)
    except grpc.RpcError as err:
        return err.code()
    return Code.OK


def _counted(s: Served) -> float:
    return sum(s.metric("seqserve_requests_total", method=m, code=c.name) for m in METHODS for c in Code)


def test_fuzzed_calls_end_in_documented_statuses_and_leave_the_server_idle(fuzz_server, heldout):
    sources = [src for src, _ in heldout[:20]]
    seen: dict[str, int] = {}
    reaching = []  # calls within the receive limit: the service decodes (or refuses) and counts each
    before = _counted(fuzz_server)

    @settings(max_examples=CASES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=st.one_of(structured(sources), mutated(sources)))
    def one_call(case: tuple[str, bytes]) -> None:
        method, blob = case
        code = _call(fuzz_server.channel, method, blob)
        seen[code.name] = seen.get(code.name, 0) + 1
        assert code in DOCUMENTED, (method, blob[:200], code)
        if len(blob) <= MAX_RECEIVE:
            reaching.append(code)

    one_call()
    print(f"fuzzed calls by status: {seen}")
    assert sum(seen.values()) >= 2000
    assert seen.get("OK", 0) >= 100 and seen.get("INVALID_ARGUMENT", 0) >= 100  # both paths were exercised
    assert _counted(fuzz_server) - before == len(reaching)  # undecodable ones included
    health = health_pb2_grpc.HealthStub(fuzz_server.channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    for gauge in GAUGES:
        wait_for(lambda: fuzz_server.metric(gauge) == 0, what=f"{gauge} back to 0")
    assert len(fuzz_server.app.service.inflight) == 0


def test_undecodable_requests_are_invalid_argument_counted_and_logged_once(fuzz_server, caplog):
    before = fuzz_server.metric("seqserve_requests_total", method="Generate", code="INVALID_ARGUMENT")
    undecodable = fuzz_server.metric("seqserve_rejected_requests_total", reason="undecodable")
    caplog.clear()
    for blob in (b"\x0a\x02\xff\xfe", b"\xff\xff\xff\xff", b"\x12\x04\x3a\x02\xc3\x28"):  # input; junk; options.stop
        with pytest.raises(grpc.RpcError) as info:
            fuzz_server.channel.unary_unary(SERVICE + "Generate")(blob, timeout=10)
        assert info.value.code() == Code.INVALID_ARGUMENT
        assert info.value.details().startswith("the request is not a valid Generate message")
    assert fuzz_server.metric("seqserve_requests_total", method="Generate", code="INVALID_ARGUMENT") == before + 3
    assert fuzz_server.metric("seqserve_rejected_requests_total", reason="undecodable") == undecodable + 3
    lines = [r for r in caplog.records if "cannot be decoded" in r.getMessage()]
    assert len(lines) == 3 and not any(r.exc_info for r in caplog.records)  # one line each, no traceback


HEALTH, REFLECTION = "/grpc.health.v1.Health/", "/grpc.reflection.v1alpha.ServerReflection/"


def test_undecodable_health_and_reflection_requests_are_invalid_argument_and_logged_once(fuzz_server, caplog):
    """Issue 16, item 6: health (open without a token) and reflection answered junk UNKNOWN, with a traceback in the
    log on every call; now as the Generation service answers it."""
    channel, junk = fuzz_server.channel, b"\xff\xff\xff\xff"
    caplog.clear()
    calls = {"Check": lambda: channel.unary_unary(HEALTH + "Check")(junk, timeout=10),
             "Watch": lambda: list(channel.unary_stream(HEALTH + "Watch")(junk, timeout=10)),
             "List": lambda: channel.unary_unary(HEALTH + "List")(junk, timeout=10),
             "ServerReflectionInfo": lambda: list(channel.stream_stream(REFLECTION + "ServerReflectionInfo")(
                 iter([junk]), timeout=10))}
    for method, call in calls.items():
        with pytest.raises(grpc.RpcError) as info:
            call()
        assert info.value.code() == Code.INVALID_ARGUMENT, method
        assert info.value.details().startswith(f"the request is not a valid {method} message: "), method
        assert "Error" not in info.value.details() and "<" not in info.value.details()  # no class names
    lines = [r for r in caplog.records if "cannot be decoded" in r.getMessage()]
    assert len(lines) == len(calls) and all(r.levelname == "WARNING" for r in lines)
    assert not any(r.exc_info for r in caplog.records) and not any(r.levelno >= 40 for r in caplog.records)
    stub = health_pb2_grpc.HealthStub(channel)
    assert stub.Check(health_pb2.HealthCheckRequest(), timeout=10).status == health_pb2.HealthCheckResponse.SERVING
    listed = stub.List(health_pb2.HealthListRequest(), timeout=10).statuses  # implemented, not UNKNOWN
    serving = health_pb2.HealthCheckResponse.SERVING  # the server, its service, and its one model by name
    assert {name: r.status for name, r in listed.items()} == {"": serving, "seqserve.v1.Generation": serving,
                                                             "seqserve.v1.Generation/tiny-bundle": serving}
