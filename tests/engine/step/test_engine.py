"""The engine offline (Engine.generate, as warm-up, quality, verify and bench use it, and Engine.step with the report
it returns) on the tiny bundle."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from seqserve.contract.tokenizer import load_tokenizer
from seqserve.contract.tsv import heldout_pairs
from seqserve.engine.build import offline
from seqserve.engine.request import FinishReason, Request, SamplingParams
from seqserve.engine.runtime.device import RuntimeConfig
from seqserve.engine.runtime.runner import Runner
from seqserve.engine.step.engine import Engine
from seqserve.engine.step.scheduler import SchedulerConfig


@pytest.fixture(scope="module")
def parts(tiny_bundle):
    tok = load_tokenizer(tiny_bundle / "tokenizer.json")
    runner = Runner(tiny_bundle, RuntimeConfig(device="cpu", intra_op_threads=1), capacity=8)
    return runner, tok, [tok.encode(s).ids for s, _ in heldout_pairs(tiny_bundle, 64)]


def engine(runner, tok, **cfg) -> Engine:
    return offline(runner, tok, SchedulerConfig(), **cfg)


def run(e: Engine, requests: list[Request]) -> list:
    """Every step's report until the engine has nothing left."""
    e.submit(requests)
    reports = []
    while e.scheduler.has_work():
        reports.append(e.step())
    return reports


def test_min_new_tokens_forces_the_length_without_changing_the_greedy_prefix(parts):
    runner, tok, sources = parts
    e = engine(runner, tok, max_batch_size=8)
    free = e.generate([Request(s, SamplingParams(max_new_tokens=20)) for s in sources[:16]])
    forced = e.generate([Request(s, SamplingParams(max_new_tokens=20, min_new_tokens=20)) for s in sources[:16]])
    assert all(r.finish_reason is FinishReason.LENGTH and len(r.output_ids) == 20 for r in forced)
    eos = runner.manifest.special_tokens["eos_id"]
    assert all(eos not in r.output_ids for r in forced)
    # Up to where the free run stopped, masking the end token changes nothing: argmax was not the end token there.
    assert all(f.output_ids[: len(r.output_ids)] == r.output_ids for f, r in zip(forced, free))
    assert any(r.finish_reason is FinishReason.EOS for r in free)  # the tiny model does end early by itself


def test_encode_ahead_runs_the_encoder_once_per_batch_of_arrivals_not_per_step(parts):
    runner, tok, sources = parts
    e = engine(runner, tok, max_batch_size=8, encode_batch=32)
    reports = run(e, [Request(s, SamplingParams(max_new_tokens=12)) for s in sources])
    encoder_calls = sum(len(r.stats.encoder_seconds) for r in reports)
    steps = sum(len(r.stats.decoder_seconds) for r in reports)
    assert encoder_calls <= 4 < steps  # 64 sources: 8 admitted + 24 ahead, then 32 more, not one call per step
    assert e.scheduler.encoded_bytes == 0 and runner.slots.n_live == 0


def test_more_requests_than_the_queue_holds_are_fed_as_it_drains(parts):
    runner, tok, sources = parts
    e = engine(runner, tok, max_batch_size=4, max_waiting=3)
    done = e.generate([Request(s, SamplingParams(max_new_tokens=6)) for s in sources[:20]])
    alone = [e.generate([Request(s, SamplingParams(max_new_tokens=6))])[0].output_ids for s in sources[:20]]
    assert [r.output_ids for r in done] == alone and all(r.done for r in done)


def test_an_offline_engine_counts_encode_ahead_in_the_models_bytes(parts):
    runner, tok, _ = parts
    e = offline(runner, tok, max_batch_size=2)
    assert e.scheduler.cfg.cross_bytes_per_token == runner.cross_bytes_per_token > 0
    assert e.scheduler.cfg.max_batch_size == 2 and offline(runner, tok).scheduler.cfg.max_batch_size == 8  # capacity


def test_a_step_returns_its_report_every_output_it_made_and_its_figures(parts):
    runner, tok, sources = parts
    e = engine(runner, tok, max_batch_size=4)
    streamed, unary = Request(sources[0], SamplingParams(max_new_tokens=5), stream=True), Request(sources[1])
    reports = run(e, [streamed, unary])
    outs = [o for r in reports for o in r.outputs]
    pieces = [o for o in outs if o.request_id == streamed.id and o.result is None]
    assert [t for o in pieces for t in o.token_ids] == streamed.output_ids
    assert all(len(o.token_ids) == 1 for o in pieces)  # stream_interval 1: each step's token in that step's report
    assert "".join(o.text for o in pieces) == streamed.text
    assert [o.result for o in outs if o.request_id == unary.id] == [unary.result]  # unary: its one last output
    assert [o.result for o in outs if o.result is not None and o.request_id == streamed.id] == [streamed.result]
    assert sum(r.stats.generated_tokens for r in reports) == len(streamed.output_ids) + len(unary.output_ids)
    assert sorted(f for r in reports for f in r.stats.finished) == sorted(
        x.finish_reason.value for x in (streamed, unary))
    assert reports[-1].stats.running == 0 and runner.slots.n_live == 0


def test_an_abort_is_a_message_the_next_step_drains(parts):
    runner, tok, sources = parts
    e = engine(runner, tok, max_batch_size=4)
    running, waiting = Request(sources[0], SamplingParams(max_new_tokens=30, min_new_tokens=30)), Request(sources[1])
    e.submit([running])
    e.step()
    e.submit([waiting])
    e.abort(running.id)
    e.abort(waiting.id, deadline=True)
    assert not running.done and runner.slots.n_live == 1  # nothing ends outside a step
    report = e.step()
    assert {o.request_id: o.result.finish_reason for o in report.outputs if o.result} == {
        running.id: FinishReason.CANCELLED, waiting.id: FinishReason.DEADLINE}
    assert sorted(report.stats.finished) == ["cancelled", "deadline"] and len(running.output_ids) == 0
    assert runner.slots.n_live == 0 and not e.scheduler.has_work() and report.stats.running == 0


def test_a_greedy_step_runs_no_beam_or_nbest_code(parts):
    """One decider per kind of row: steps whose rows are greedy, sampled, scored or streamed call no function of
    engine/decoding/beam.py or engine/decoding/nbest.py (sys.setprofile sees every Python call), while a beam request's
    steps do."""
    runner, tok, sources = parts
    e = engine(runner, tok, max_batch_size=8)
    options = [{}, dict(temperature=0.8, seed=1), dict(return_logprobs=True, top_logprobs=2), dict(stop=("zz",))]
    e.generate([Request(sources[0], SamplingParams(max_new_tokens=4, num_beams=2))])  # beams ran here before

    def beam_calls(requests: list[Request]) -> set[str]:
        called: set[str] = set()

        def profile(frame, event, arg) -> None:
            if event == "call" and Path(frame.f_code.co_filename).name in ("beam.py", "nbest.py"):
                called.add(f"{Path(frame.f_code.co_filename).name}:{frame.f_code.co_name}")

        sys.setprofile(profile)
        try:
            run(e, requests)
        finally:
            sys.setprofile(None)
        assert all(r.done and r.error is None for r in requests)
        return called

    assert beam_calls([Request(s, SamplingParams(max_new_tokens=8, **o), stream=True)
                       for s, o in zip(sources, options)]) == set()
    assert "beam.py:advance" in beam_calls([Request(sources[1], SamplingParams(max_new_tokens=4, num_beams=2))])
