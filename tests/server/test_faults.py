"""Fault isolation: a decoder step or encoder call that fails because of one request fails that request alone.

The fault is injected for real: a Runner whose onnxruntime call raises whenever one chosen source is among the rows it
runs (as a manifest overstating max_positions made GatherND fail for one long row). The batch mates must finish with
exactly the tokens they get when served alone, and later requests must succeed.
"""
from __future__ import annotations

import grpc
import pytest

from seqserve.contract.tokenizer import load_tokenizer
from seqserve.contract.tsv import heldout_pairs
from seqserve.engine.request import FinishReason, Request, SamplingParams
from seqserve.engine.runtime.device import RuntimeConfig
from seqserve.engine.runtime.runner import Runner
from seqserve.engine.step.engine import Engine
from seqserve.engine.step.finish import ERROR_MESSAGE
from seqserve.engine.step.scheduler import Scheduler, SchedulerConfig
from seqserve.v1 import seqserve_pb2 as pb

POISON = "b 5 9 k"


def poison_decoder(runner: Runner, poison: list[int], when=lambda: True) -> None:
    """Wraps the runner's KV cache so that a decoder step (or a probe) raises whenever a row holding the poisoned
    source takes part, as onnxruntime raised for one over-long row (the runner's encoder calls say which request ids
    hold it)."""
    run, encode, poisoned = runner.cache.run, runner.encode, set()

    def encoding(request_ids, sources):
        poisoned.update(i for i, s in zip(request_ids, sources) if s == poison)
        return encode(request_ids, sources)

    def failing(decoder, slots, rows=None, **options):  # options: what the step fetches (need)
        picked = range(slots.hi) if rows is None else rows
        if when() and any(slots.owners[i] in poisoned for i in picked):
            raise RuntimeError("[ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running GatherND")
        return run(decoder, slots, rows, **options)

    runner.cache.run, runner.encode = failing, encoding


class Poisoned(Runner):
    """Raises inside the decoder step (or the encoder) whenever a request with the poisoned source takes part."""

    poison: list[int] = []
    where = "decoder"

    def run_encoder(self, sources):
        if self.where == "encoder" and self.poison in sources:
            raise RuntimeError("[ONNXRuntimeError] : encoder failed (injected)")
        return super().run_encoder(sources)


@pytest.fixture(scope="module")
def setup(tiny_bundle):
    tok = load_tokenizer(tiny_bundle / "tokenizer.json")
    sources = [tok.encode(s).ids for s, _ in heldout_pairs(tiny_bundle, 12)]
    runner = Poisoned(tiny_bundle, RuntimeConfig(device="cpu", intra_op_threads=1), capacity=16)
    runner.poison = tok.encode(POISON).ids
    poison_decoder(runner, runner.poison, when=lambda: runner.where == "decoder")
    engine = Engine(runner, tok, Scheduler(SchedulerConfig(max_batch_size=16, encode_batch=16,
                                                           cross_bytes_per_token=runner.cross_bytes_per_token)))
    alone = [engine.generate([Request(s, SamplingParams(max_new_tokens=24))])[0].output_ids for s in sources]
    return engine, runner, sources, alone


@pytest.mark.parametrize("where", ["decoder", "encoder"])
def test_only_the_poisoned_request_fails_and_its_batch_mates_are_untouched(setup, where):
    engine, runner, sources, alone = setup
    runner.where = where
    try:
        mates = [Request(s, SamplingParams(max_new_tokens=24)) for s in sources]
        poisoned = Request(runner.poison, SamplingParams(max_new_tokens=24))
        engine.generate(mates[:6] + [poisoned] + mates[6:])
    finally:
        runner.where = None
    assert poisoned.finish_reason is FinishReason.ERROR and poisoned.error == ERROR_MESSAGE
    assert [r.output_ids for r in mates] == alone and all(r.finish_reason is not FinishReason.ERROR for r in mates)
    assert engine.generate([Request(sources[0], SamplingParams(max_new_tokens=24))])[0].output_ids == alone[0]
    assert runner.slots.n_live == 0 and engine.scheduler.encoded_bytes == 0


def test_the_client_gets_internal_without_internals_and_the_error_is_counted(served):
    runner = served.runner
    poison_decoder(runner, served.model.tokenizer.encode(POISON).ids)
    try:
        ok = served.stub.Generate.future(pb.GenerateRequest(input="a b c", options=pb.DecodingOptions()), timeout=30)
        with pytest.raises(grpc.RpcError) as err:
            served.stub.Generate(pb.GenerateRequest(input=POISON), timeout=30)
        assert ok.result().text is not None
    finally:
        del runner.cache.run  # the instance attribute goes: the class's method is back
    assert err.value.code() == grpc.StatusCode.INTERNAL
    assert "GatherND" not in err.value.details() and "ONNXRuntime" not in err.value.details()
    assert served.metric("seqserve_finished_requests_total", reason="error") >= 1
