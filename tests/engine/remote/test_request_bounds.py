"""engine/remote/request_bounds.py: the bounds an engine process checks every request against. Every request the edge
accepts (server/options.py builds its params) keeps them, at the edges of each range; each bound broken alone is
named; and the engine's ranges are the edge's (a limit changed in Limits moves both)."""
from __future__ import annotations

import dataclasses
import math

import pytest

from seqserve.engine.api import EngineRequest
from seqserve.engine.limits import Limits
from seqserve.engine.remote.request_bounds import request_problem
from seqserve.engine.request import SamplingParams
from seqserve.server.options import sampling_params
from seqserve.v1 import seqserve_pb2 as pb

LIMITS = Limits(max_input_tokens=64, max_new_tokens=32, default_max_new_tokens=16, max_stop_strings=8,
                max_batch_inputs=64, max_batch_size=32, max_waiting=256, max_stop_string_bytes=256, max_stop_bytes=1024,
                max_receive_message_bytes=1 << 18, max_inflight_bytes=1 << 25, max_num_beams=8, max_top_logprobs=20)
VOCAB = 100
# Options the edge accepts, each at or near the edge of a range (the oracle: options.py's own validation).
ACCEPTED = [dict(), dict(max_new_tokens=32, min_new_tokens=32), dict(temperature=100.0, top_k=99, top_p=1e-30),
            dict(repetition_penalty=100.0, seed=2**64 - 1), dict(num_beams=8, num_return_sequences=8,
                                                                 length_penalty=-10.0, early_stopping=True),
            dict(return_logprobs=True, top_logprobs=20), dict(stop=["x" * 256, "y" * 256, "z" * 256, "w" * 256]),
            dict(temperature=0.5, stop=[str(i) for i in range(8)])]


def _request(params: SamplingParams, ids=(5, 6, 2), **fields) -> EngineRequest:
    return EngineRequest(7, tuple(ids), params, **fields)


@pytest.mark.parametrize("options", ACCEPTED, ids=lambda o: ",".join(o) or "unset")
def test_every_request_the_edge_accepts_the_engine_accepts(options):
    params = sampling_params(pb.DecodingOptions(**options), LIMITS)
    params = dataclasses.replace(params, seed=options.get("seed", 1))  # the service draws one where unset
    assert request_problem(_request(params, ids=range(64)), LIMITS, VOCAB) is None
    assert request_problem(_request(params, ids=(VOCAB - 1,), forced_bos=VOCAB - 1), LIMITS, VOCAB) is None


OK = SamplingParams(max_new_tokens=16, seed=1)
BROKEN = [  # (what the request breaks, its params or request fields, the words the message must hold)
    ("num_beams", dict(num_beams=10**4), "options.num_beams must be in [1, 8] (max_num_beams), got 10000"),
    ("num_beams 0", dict(num_beams=0), "options.num_beams must be in [1, 8]"),
    ("temperature NaN", dict(temperature=math.nan), "options.temperature must be in [0, 100], got nan"),
    ("temperature inf", dict(temperature=math.inf), "options.temperature must be in [0, 100]"),
    ("top_p 0", dict(top_p=0.0), "options.top_p must be in (0, 1]"),
    ("repetition_penalty", dict(repetition_penalty=-1.0), "options.repetition_penalty must be in (0, 100]"),
    ("top_k", dict(top_k=-1), "options.top_k must be >= 0"),
    ("max_new_tokens", dict(max_new_tokens=10**6), "options.max_new_tokens must be in [1, 32], got 1000000"),
    ("max_new_tokens 0", dict(max_new_tokens=0), "options.max_new_tokens must be in [1, 32]"),
    ("min_new_tokens", dict(max_new_tokens=4, min_new_tokens=5), "options.min_new_tokens must be at most"),
    ("seed", dict(seed=-1), "options.seed must be in [0, 2**64)"),
    ("seed unset", dict(seed=None), "options.seed must be in [0, 2**64)"),
    ("top_logprobs", dict(return_logprobs=True, top_logprobs=21), "options.top_logprobs must be in [0, 20]"),
    ("top_logprobs alone", dict(top_logprobs=2), "options.top_logprobs needs return_logprobs"),
    ("stop count", dict(stop=("a",) * 9), "options.stop has 9 strings, more than max_stop_strings=8"),
    ("stop empty", dict(stop=("",)), "options.stop[0] must not be empty"),
    ("stop bytes", dict(stop=("x" * 257,)), "options.stop[0] has 257 bytes"),
    ("beams sampled", dict(num_beams=2, temperature=1.0), "options.temperature must be 0 with num_beams > 1"),
    ("return sequences", dict(num_return_sequences=2), "options.num_return_sequences must be in [1, num_beams=1]"),
    ("length_penalty", dict(length_penalty=math.nan), "options.length_penalty must be finite"),
]


@pytest.mark.parametrize("what, change, words", BROKEN, ids=[b[0] for b in BROKEN])
def test_each_option_out_of_range_is_named(what, change, words):
    problem = request_problem(_request(dataclasses.replace(OK, **change)), LIMITS, VOCAB)
    assert problem is not None and words in problem


@pytest.mark.parametrize("ids, fields, words", [
    ((), {}, "input has 0 tokens, outside [1, max_input_tokens=64]"),
    (range(65), {}, "input has 65 tokens"),
    ((5, VOCAB), {}, "input ids must be in [0, 100) (the vocabulary), got 5..100"),
    ((-1, 5), {}, "input ids must be in [0, 100)"),
    ((5,), dict(forced_bos=VOCAB), "forced_bos must be in [0, 100)"),
    ((5,), dict(deadline=math.nan), "deadline and arrival must be finite"),
    ((5,), dict(arrival=math.inf), "deadline and arrival must be finite"),
])
def test_each_request_field_out_of_range_is_named(ids, fields, words):
    problem = request_problem(_request(OK, ids=ids, **fields), LIMITS, VOCAB)
    assert problem is not None and words in problem


def test_the_bounds_are_the_limits_the_server_resolved():
    """One definition: the same request passes or not as the model's Limits say, not by constants of its own."""
    params = dataclasses.replace(OK, num_beams=12, max_new_tokens=40)
    assert "max_new_tokens" in request_problem(_request(params), LIMITS, VOCAB)
    assert "num_beams" in request_problem(_request(params), dataclasses.replace(LIMITS, max_new_tokens=40), VOCAB)
    wider = dataclasses.replace(LIMITS, max_num_beams=12, max_new_tokens=40)
    assert request_problem(_request(params), wider, VOCAB) is None
