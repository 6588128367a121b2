"""The engine offline (Engine.generate, as warm-up, quality, verify and bench use it) on the tiny bundle."""
from __future__ import annotations

import pytest

from seqserve.contract.tokenizer import load_tokenizer
from seqserve.contract.tsv import heldout_pairs
from seqserve.engine.device import RuntimeConfig
from seqserve.engine.engine import Engine
from seqserve.engine.request import FinishReason, Request, SamplingParams
from seqserve.engine.runner import Runner
from seqserve.engine.scheduler import Scheduler, SchedulerConfig


@pytest.fixture(scope="module")
def parts(tiny_bundle):
    tok = load_tokenizer(tiny_bundle / "tokenizer.json")
    runner = Runner(tiny_bundle, RuntimeConfig(device="cpu", intra_op_threads=1), capacity=8)
    return runner, tok, [tok.encode(s).ids for s, _ in heldout_pairs(tiny_bundle, 64)]


def engine(runner, tok, **cfg) -> Engine:
    return Engine(runner, tok, Scheduler(SchedulerConfig(cross_bytes_per_token=runner.cross_bytes_per_token, **cfg)))


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
    e.generate([Request(s, SamplingParams(max_new_tokens=12)) for s in sources])
    encoder_calls, steps = len(e.stats.encoder_seconds), len(e.stats.decoder_seconds)  # an offline engine keeps them
    assert encoder_calls <= 4 < steps  # 64 sources: 8 admitted + 24 ahead, then 32 more, not one call per step
    assert e.scheduler.encoded_bytes == 0 and runner.slots.n_live == 0


def test_more_requests_than_the_queue_holds_are_fed_as_it_drains(parts):
    runner, tok, sources = parts
    e = engine(runner, tok, max_batch_size=4, max_waiting=3)
    done = e.generate([Request(s, SamplingParams(max_new_tokens=6)) for s in sources[:20]])
    alone = [e.generate([Request(s, SamplingParams(max_new_tokens=6))])[0].output_ids for s in sources[:20]]
    assert [r.output_ids for r in done] == alone and all(r.done for r in done)
