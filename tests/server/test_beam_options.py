"""Validation of the beam and log-probability options (issue 13) over a real server: INVALID_ARGUMENT naming it."""
from __future__ import annotations

import grpc
import pytest
from grpc_harness import request

from seqserve.client.client import Client
from seqserve.v1 import seqserve_pb2 as pb

BEAMS = dict(num_beams=2)
INVALID = [  # (options, the start of the message, which names the field)
    (dict(num_beams=9), "options.num_beams must be in [1, 8] (max_num_beams), got 9"),
    (dict(num_beams=2, num_return_sequences=3), "options.num_return_sequences must be in [1, num_beams=2], got 3"),
    (dict(num_return_sequences=2), "options.num_return_sequences must be in [1, num_beams=1], got 2"),
    (dict(length_penalty=float("nan")), "options.length_penalty must be finite"),
    (dict(length_penalty=float("-inf"), **BEAMS), "options.length_penalty must be finite"),
    (dict(return_logprobs=True, top_logprobs=21), "options.top_logprobs must be in [0, 20] (max_top_logprobs), got 21"),
    (dict(top_logprobs=3), "options.top_logprobs needs options.return_logprobs"),
    (dict(temperature=0.7, **BEAMS), "options.temperature must be 0 with num_beams > 1 (beam search is deterministic)"),
    (dict(stop=["x"], **BEAMS), "options.stop is not supported with num_beams > 1"),
    (dict(repetition_penalty=1.3, **BEAMS), "options.repetition_penalty must be 1 with num_beams > 1, got 1.3"),
]


def _error(call, req) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        result = call(req, timeout=30)
        if not hasattr(result, "SerializeToString"):  # a stream fails when read
            list(result)
    return info.value


@pytest.mark.parametrize("options, message", INVALID, ids=[m for _, m in INVALID])
def test_invalid_beam_options_are_invalid_argument_naming_the_field(served, options, message):
    before = served.metric("seqserve_rejected_requests_total", reason="invalid_argument")
    for call in (served.stub.Generate, served.stub.GenerateStream):
        err = _error(call, request("a", **options))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and err.details().startswith(message), err.details()
    batch = pb.GenerateBatchRequest(inputs=["a", "b"], options=pb.DecodingOptions(**options))
    err = _error(served.stub.GenerateBatch, batch)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and err.details().startswith(message), err.details()
    assert served.metric("seqserve_rejected_requests_total", reason="invalid_argument") == before + 3


def test_options_at_their_limits_and_defaults_are_accepted(served, heldout):
    limits = served.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10).limits
    assert (limits.max_num_beams, limits.max_top_logprobs) == (8, 20)  # the settings' defaults
    source = heldout[0][0]
    for options in (dict(num_beams=0, num_return_sequences=0),  # 0 = unset = 1
                    dict(num_beams=1, length_penalty=-2.0, early_stopping=True),  # ignored without beams
                    dict(return_logprobs=True, top_logprobs=20, temperature=0.5, seed=3),
                    dict(num_beams=8, num_return_sequences=8, length_penalty=0.6, early_stopping=True,
                         min_new_tokens=2, max_new_tokens=6, return_logprobs=True, top_logprobs=1)):
        response = served.stub.Generate(request(source, **options), timeout=60)
        assert response.finish_reason in (pb.FINISH_REASON_EOS, pb.FINISH_REASON_LENGTH), options


def test_the_beam_cap_is_a_setting_bounded_by_the_batch(make_server):
    s = make_server(max_num_beams=3, max_top_logprobs=0)
    limits = s.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10).limits
    assert (limits.max_num_beams, limits.max_top_logprobs) == (3, 0)
    err = _error(s.stub.Generate, request("a", num_beams=4))
    assert err.details().startswith("options.num_beams must be in [1, 3] (max_num_beams), got 4")
    err = _error(s.stub.Generate, request("a", return_logprobs=True, top_logprobs=1))
    assert err.details().startswith("options.top_logprobs must be in [0, 0] (max_top_logprobs), got 1")
    with Client(s.address) as client:
        assert client.model_info()["limits"]["max_num_beams"] == 3
        with pytest.raises(grpc.RpcError, match="num_beams"):
            client.generate("a", num_beams=4)
    small = make_server(max_batch_size=2)  # each beam is a row of one decoder step: the cap follows the batch
    assert small.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10).limits.max_num_beams == 2
