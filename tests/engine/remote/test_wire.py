"""engine/remote/wire.py: every interface type crosses msgpack and comes back equal to what was sent, every field set to
a
value other than its default (so a field the codec dropped or misread would differ)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import msgpack
import pytest

from seqserve.engine.api import EngineInfo, EngineRequest, Output, StepReport, StepStats
from seqserve.engine.build import EngineConfig
from seqserve.engine.remote import wire
from seqserve.engine.request import FinishReason, Result, SamplingParams, Sequence, TokenLogprob
from seqserve.engine.runtime.device import RuntimeConfig
from seqserve.engine.step.scheduler import SchedulerConfig

PARAMS = SamplingParams(max_new_tokens=17, min_new_tokens=3, temperature=0.7, top_k=5, top_p=0.9,
                        repetition_penalty=1.3, stop=("a b", "."), seed=None, num_beams=4, num_return_sequences=2,
                        length_penalty=0.5, early_stopping=True, return_logprobs=True, top_logprobs=3)
REQUEST = EngineRequest(id=2**40 + 7, input_ids=(5, 6, 2), params=PARAMS, stream=True, deadline=12345.25,
                        forced_bos=9, arrival=678.5)
SEQUENCES = (
    Sequence([4, 5], "x y", FinishReason.EOS, cumulative_logprob=-1.5, score=-0.75,
             logprobs=(TokenLogprob(4, -0.5, ((4, -0.5), (7, -2.25))), TokenLogprob(5, -1.0, ()))),
    Sequence([], "", FinishReason.LENGTH))
RESULT = Result(FinishReason.STOP, SEQUENCES, input_tokens=3, generated_tokens=2, seed=99, queue_seconds=0.125,
                first_token_seconds=0.25, total_seconds=1.5, error="boom")
STATS = StepStats(input_tokens=11, generated_tokens=7, encoder_seconds=(0.5, 0.25), decoder_seconds=(0.125,),
                  batch_rows=(3, 4), queue_seconds=(0.01,), first_token_seconds=(0.02, 0.03),
                  inter_token_seconds=(0.004,), finished=("eos", "cancelled"), running=3, waiting=8,
                  kv_cache_bytes=1 << 33)
REPORT = StepReport((Output(3, (4, 5), "x y"), Output(4, (), "", RESULT),
                     Output(5, result=Result(FinishReason.CANCELLED)), Output(6, refused="queue full")), STATS)
INFO = EngineInfo(max_waiting=9, forced_eos=True, languages={"en": 5, "de": {"id": 6, "names": ["Deutsch"]}},
                  model_info={"config": {"d_model": 32, "scale": 0.5}, "variant": "int8", "quality": {"bleu": 12.5}},
                  provider="CPUExecutionProvider", variant="int8")
CONFIG = EngineConfig(Path("/models/tiny"), variant="fp16",
                      runtime=RuntimeConfig(device="cpu", intra_op_threads=3, inter_op_threads=2,
                                            allow_spinning=False, cuda_tf32=True, optimization="basic",
                                            cuda_graphs=True),
                      kv_cache="inplace",
                      scheduler=SchedulerConfig(max_batch_size=7, max_waiting=11, max_kv_tokens=999, encode_batch=5,
                                                max_encoded_bytes=12345, cross_bytes_per_token=64),
                      stream_interval=3)


def _not_defaults(value) -> list[str]:
    """Names of fields (nested) left at their default: the fixtures above must set each one."""
    left = []
    for f in dataclasses.fields(value):
        v = getattr(value, f.name)
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING)
        if f.name != "arrival" and v == default:
            left.append(f"{type(value).__name__}.{f.name}")
        if dataclasses.is_dataclass(v):
            left += _not_defaults(v)
    return left


@pytest.mark.parametrize("value", [REQUEST, RESULT, STATS, INFO, CONFIG, PARAMS, SEQUENCES[0]],
                         ids=lambda v: type(v).__name__)
def test_every_field_is_set_in_the_fixture(value):
    assert _not_defaults(value) == []


@pytest.mark.parametrize("value", [REQUEST, REPORT, INFO, CONFIG, STATS, RESULT], ids=lambda v: type(v).__name__)
def test_round_trip_equals_the_original(value):
    back = wire.loads(type(value), wire.dumps(value))
    assert back == value
    assert type(back) is type(value)


def test_types_survive_not_only_values():
    """Tuples stay tuples, enums stay enums, a Path stays a Path, floats stay floats (1 == 1.0 would hide it)."""
    report = wire.loads(StepReport, wire.dumps(REPORT))
    result = report.outputs[1].result
    assert isinstance(report.outputs[0].token_ids, tuple) and isinstance(report.stats.decoder_seconds, tuple)
    assert result.finish_reason is FinishReason.STOP and result.sequences[0].finish_reason is FinishReason.EOS
    assert isinstance(result.sequences[0].token_ids, list)
    assert result.sequences[0].logprobs[0].top == ((4, -0.5), (7, -2.25))
    assert wire.loads(EngineConfig, wire.dumps(CONFIG)).bundle == Path("/models/tiny")
    whole = dataclasses.replace(PARAMS, temperature=1, length_penalty=2)  # ints given for float fields
    back = wire.loads(SamplingParams, wire.dumps(whole))
    assert type(back.temperature) is float and back.temperature == 1.0 and type(back.max_new_tokens) is int
    assert wire.loads(list[EngineRequest], wire.dumps([REQUEST, REQUEST])) == [REQUEST, REQUEST]


def test_a_message_with_the_wrong_shape_is_refused():
    with pytest.raises(ValueError, match="StepStats"):
        wire.loads(StepStats, wire.dumps([1, 2]))


def _plain_request(**change) -> list:
    """REQUEST as msgpack carries it, with some of its values replaced (by index: id 0, input_ids 1, params 2, ...)."""
    plain = msgpack.unpackb(wire.dumps(REQUEST))
    for index, value in change.items():
        plain[int(index.removeprefix("f"))] = value
    return plain


MALFORMED = {  # what an engine process may read from its socket: each is WireError, never another exception
    "truncated": wire.dumps([REQUEST])[:-3], "trailing bytes": wire.dumps([REQUEST]) + b"\x00",
    "not msgpack": b"\xc1", "deep nesting": b"\x91" * 100_000 + b"\xc0", "a map key that is a list": b"\x81\x90\x00",
    "a string for the list": msgpack.packb("requests"), "a string for an id": msgpack.packb([_plain_request(f0="1")]),
    "a bool for an id": msgpack.packb([_plain_request(f0=True)]),
    "a float for an id": msgpack.packb([_plain_request(f0=1.5)]),
    "a string for the ids": msgpack.packb([_plain_request(f1="abc")]),
    "a string for a float": msgpack.packb([_plain_request(f2=[*_plain_request()[2][:2], "hot",
                                                              *_plain_request()[2][3:]])]),
    "params cut short": msgpack.packb([_plain_request(f2=[1, 2])]),
    "a request cut short": msgpack.packb([_plain_request()[:3]]),
    "a map for the request": msgpack.packb([{"id": 1}]),
}


@pytest.mark.parametrize("data", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_message_raises_wire_error_only(data):
    with pytest.raises(wire.WireError):
        wire.loads(list[EngineRequest], data)


def test_an_unknown_enum_value_or_a_wrong_tuple_is_wire_error():
    with pytest.raises(wire.WireError, match="FinishReason"):
        wire.loads(Result, msgpack.packb(["exploded", [], 0, 0, 0, 0.0, 0.0, 0.0, None]))
    with pytest.raises(wire.WireError, match="tuple of 3 items, expected 2"):
        wire.loads(tuple[int, bool], msgpack.packb([1, True, 3]))
