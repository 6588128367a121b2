"""A status detail quotes at most ECHO_CHARS characters of what the client sent (server/echo.py), over a real channel.

A 40 KB model name or language code echoed whole made the `grpc-message` trailer exceed the client's 8 KiB metadata
limit: the client saw RESOURCE_EXHAUSTED ("received metadata size exceeds limit") while the server counted NOT_FOUND,
and a client with a larger limit got the 40,000 characters back.
"""
from __future__ import annotations

import grpc
import pytest

from seqserve.contract.languages import PREFIX, Languages
from seqserve.server.echo import ECHO_CHARS, LISTED_NAMES, listed, quoted
from seqserve.server.languages import LanguageRefused, resolve
from seqserve.v1 import seqserve_pb2 as pb
from seqserve.v1 import seqserve_pb2_grpc as pb_grpc

HUGE = 40_000  # characters: far beyond gRPC's default 8 KiB metadata limit, well within max_receive_message_bytes
MOST_DETAIL = 512  # characters: the longest detail these refusals may have (the field, the quote, the explanation)
LARGE_METADATA = [("grpc.max_metadata_size", 1 << 20)]  # a client that would accept a whole echo


def _value(char: str) -> str:
    return char * HUGE


def _calls(model: str = "", **languages):
    """The calls that name a model and languages: (method, request)."""
    return [("Generate", pb.GenerateRequest(input="b 5 9 k", model=model, **languages)),
            ("GenerateStream", pb.GenerateRequest(input="b 5 9 k", model=model, **languages)),
            ("GenerateBatch", pb.GenerateBatchRequest(inputs=["b 5 9 k"], model=model, **languages))]


def _refusal(stub, method: str, req) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        answer = getattr(stub, method)(req, timeout=10)
        if method == "GenerateStream":
            list(answer)
    return err.value


def _assert_bounded(err: grpc.RpcError, code: grpc.StatusCode, start: str, char: str) -> None:
    details = err.details()
    assert err.code() == code, (err.code(), details[:200])
    assert details.startswith(start), details[:200]
    assert char * ECHO_CHARS in details and char * (ECHO_CHARS + 1) not in details
    assert f"({HUGE} characters)" in details and len(details) <= MOST_DETAIL, len(details)


def test_quoted_cuts_a_long_value_and_keeps_a_short_one():
    assert quoted("x" * ECHO_CHARS) == repr("x" * ECHO_CHARS)
    assert quoted("x" * (ECHO_CHARS + 1)) == f"{'x' * ECHO_CHARS!r}... ({ECHO_CHARS + 1} characters)"
    assert quoted("\x00" * HUGE).startswith("'\\x00") and len(quoted("\x00" * HUGE)) < 4 * ECHO_CHARS + 32


def test_a_refusal_lists_at_most_a_few_served_names_then_how_many_more():
    names = [f"model-{i:03d}-" + "x" * 116 for i in range(300)]  # 300 names of 128 characters: 38 KB in all
    text = listed(names)
    assert text.startswith("model-000-") and text.count("model-") == LISTED_NAMES
    assert text.endswith(f"and {300 - LISTED_NAMES} more (GetModelInfo lists every one)") and len(text) < 4096
    assert listed(["b", "a"]) == "a, b"


@pytest.mark.parametrize("channel_options", [[], LARGE_METADATA], ids=["default-metadata-limit", "large-limit"])
def test_a_40kb_model_name_gets_not_found_with_a_bounded_detail(served, channel_options):
    with grpc.insecure_channel(served.address, options=channel_options) as channel:
        stub = pb_grpc.GenerationStub(channel)
        before = served.metric("seqserve_requests_total", code="NOT_FOUND")
        calls = [*_calls(model=_value("m")), ("GetModelInfo", pb.GetModelInfoRequest(model=_value("m")))]
        for method, req in calls:
            _assert_bounded(_refusal(stub, method, req), grpc.StatusCode.NOT_FOUND, "model 'mmm", "m")
        assert served.metric("seqserve_requests_total", code="NOT_FOUND") == before + len(calls)


@pytest.mark.parametrize("field", ["source_language", "target_language"])
@pytest.mark.parametrize("channel_options", [[], LARGE_METADATA], ids=["default-metadata-limit", "large-limit"])
def test_a_40kb_language_on_a_model_without_languages_gets_a_bounded_detail(served, field, channel_options):
    with grpc.insecure_channel(served.address, options=channel_options) as channel:
        stub = pb_grpc.GenerationStub(channel)
        for method, req in _calls(**{field: _value("l")}):
            _assert_bounded(_refusal(stub, method, req), grpc.StatusCode.INVALID_ARGUMENT,
                            f"{field} is not accepted: this model has no languages", "l")


@pytest.mark.parametrize("channel_options", [[], LARGE_METADATA], ids=["default-metadata-limit", "large-limit"])
def test_a_40kb_per_input_target_language_gets_a_bounded_detail(served, channel_options):
    with grpc.insecure_channel(served.address, options=channel_options) as channel:
        req = pb.GenerateBatchRequest(inputs=["b 5 9 k", "b 5"], target_languages=["", _value("t")])
        _assert_bounded(_refusal(pb_grpc.GenerationStub(channel), "GenerateBatch", req),
                        grpc.StatusCode.INVALID_ARGUMENT, "target_languages[1] is not accepted", "t")


@pytest.mark.parametrize("source, target", [(_value("s"), "fra_Latn"), ("eng_Latn", _value("s"))])
def test_an_unknown_40kb_language_of_a_multilingual_model_is_quoted_cut(source, target):
    with pytest.raises(LanguageRefused) as err:
        resolve(Languages({"eng_Latn": 7, "fra_Latn": 8}, PREFIX), source, target)
    message = str(err.value)
    assert "s" * ECHO_CHARS in message and "s" * (ECHO_CHARS + 1) not in message
    assert f"({HUGE} characters)" in message and len(message) <= MOST_DETAIL
