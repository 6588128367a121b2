"""Results and model facts as protobuf messages: the other half of the gRPC edge (service.py builds the calls)."""
from __future__ import annotations

import json

from seqserve.contract.decoding import FLOAT_RANGES
from seqserve.engine.request import FinishReason, Result, Sequence
from seqserve.v1 import seqserve_pb2 as pb

_FINISH = {FinishReason.EOS: pb.FINISH_REASON_EOS, FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
           FinishReason.STOP: pb.FINISH_REASON_STOP, FinishReason.CANCELLED: pb.FINISH_REASON_CANCELLED,
           FinishReason.DEADLINE: pb.FINISH_REASON_DEADLINE}

def summary(result: Result) -> dict:
    """The result's fields of a response, nested messages as dicts (the message's constructor builds them in place:
    cheaper than building each message and copying it in)."""
    return dict(finish_reason=_FINISH[result.finish_reason], seed=result.seed,
                usage={"input_tokens": result.input_tokens, "generated_tokens": result.generated_tokens},
                timings={"queue_seconds": result.queue_seconds, "first_token_seconds": result.first_token_seconds,
                         "total_seconds": result.total_seconds},
                sequences=[_sequence(s) for s in result.sequences])


def _sequence(s: Sequence) -> dict:
    fields = {"text": s.text, "token_ids": s.token_ids, "finish_reason": _FINISH[s.finish_reason],
              "cumulative_logprob": s.cumulative_logprob, "score": s.score}
    if s.logprobs:  # only with return_logprobs
        fields["logprobs"] = [{"token_id": t.token_id, "logprob": t.logprob, "top_logprobs": [
            {"token_id": i, "logprob": lp} for i, lp in t.top]} for t in s.logprobs]
    return fields


def response(result: Result) -> pb.GenerateResponse:
    return pb.GenerateResponse(text=result.text, token_ids=result.token_ids, **summary(result))


def option_ranges() -> dict[str, pb.FloatRange]:
    """Every float option's accepted range (contract/decoding.py), as GetModelInfo reports them."""
    return {name: pb.FloatRange(min=r.lo, max=r.hi, min_exclusive=r.lo_open) for name, r in FLOAT_RANGES.items()}


def config_value(value) -> pb.ConfigValue:
    """A model config value with its type (bool before int: a bool is an int in Python)."""
    if isinstance(value, bool):
        return pb.ConfigValue(bool_value=value)
    if isinstance(value, int):
        return pb.ConfigValue(int_value=value)
    if isinstance(value, float):
        return pb.ConfigValue(double_value=value)
    return pb.ConfigValue(string_value=value if isinstance(value, str) else json.dumps(value))
