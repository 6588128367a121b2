"""Engine.stop: the engine thread alone ends its requests, even when a step outlasts stop's patience."""
from __future__ import annotations

import threading
from collections import Counter

from grpc_harness import StepGate, wait_for

from seqserve.contract.tokenizer import load_tokenizer
from seqserve.contract.tsv import heldout_pairs
from seqserve.engine.build import offline
from seqserve.engine.request import FinishReason, Request, SamplingParams
from seqserve.engine.runtime.device import RuntimeConfig
from seqserve.engine.runtime.runner import Runner


class Recorder:
    """The engine's deliver callback: records which thread ended each request, how often, and the ends counted."""

    def __init__(self) -> None:
        self.ends: Counter = Counter()
        self.enders: dict[int, str] = {}
        self.reasons: dict[int, FinishReason] = {}
        self.counted: Counter = Counter()

    def __call__(self, report) -> None:
        self.counted.update(report.stats.finished)
        for out in report.outputs:
            if out.result is not None:
                self.ends[out.request_id] += 1
                self.enders[out.request_id] = threading.current_thread().name
                self.reasons[out.request_id] = out.result.finish_reason


def test_a_stop_that_outwaits_its_patience_leaves_the_requests_to_the_engine_thread(tiny_bundle):
    tok = load_tokenizer(tiny_bundle / "tokenizer.json")
    runner = Runner(tiny_bundle, RuntimeConfig(device="cpu", intra_op_threads=1), capacity=4)
    engine = offline(runner, tok, max_batch_size=2)
    gate = StepGate(engine)
    gate.close()
    sink = Recorder()
    engine.loop.deliver = sink
    engine.start()
    sources = [tok.encode(s).ids for s, _ in heldout_pairs(tiny_bundle, 4)]
    requests = [Request(s, SamplingParams(max_new_tokens=50, min_new_tokens=50)) for s in sources]
    for r in requests:  # two run, two wait: stop must end both kinds
        engine.submit([r])
    gate.wait_held()  # the engine thread is inside its loop, between two steps, and stays there

    drained = engine.stop(timeout=0.1)
    assert not sink.ends and not any(r.done for r in requests)  # nothing was ended behind the engine's back
    assert drained is False  # the step outlasted stop's patience, and stop says so

    gate.open()
    wait_for(lambda: len(sink.ends) == len(requests), what="every request ended")
    engine.loop.thread.join(10)
    assert not engine.loop.thread.is_alive()
    assert engine.stop(timeout=0.1) is True  # drained: a second stop returns at once
    assert set(sink.ends.values()) == {1}  # each request ended exactly once
    assert set(sink.enders.values()) == {"seqserve-engine"}  # and by the engine thread
    assert set(sink.reasons.values()) == {FinishReason.CANCELLED}
    assert sink.counted["cancelled"] == len(requests)  # counted once each
