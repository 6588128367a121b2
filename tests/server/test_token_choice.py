"""Token choice in the graph: a step whose rows are all greedy copies ids, a beam step the top-k, and only a step
that needs them (sampling, token rules, log-probabilities) the logits; served tokens are today's exactly."""
from __future__ import annotations

import numpy as np
import pytest
from token_choice_bundle import Recording

from seqserve.contract import names
from seqserve.contract.tokenizer import load_tokenizer
from seqserve.contract.tsv import heldout_pairs
from seqserve.engine.request import Request, SamplingParams
from seqserve.engine.runtime.device import RuntimeConfig
from seqserve.engine.step.engine import Engine
from seqserve.engine.step.scheduler import Scheduler, SchedulerConfig
from seqserve.engine.step_output import Need

CPU = RuntimeConfig(device="cpu", intra_op_threads=1)


@pytest.fixture(scope="module")
def sources(tiny_bundle):
    tok = load_tokenizer(tiny_bundle / "tokenizer.json")
    return tok, [tok.encode(s).ids for s, _ in heldout_pairs(tiny_bundle, 24)]


def _engine(bundle, tok, capacity=16) -> Engine:
    runner = Recording(bundle, CPU, capacity=capacity)
    return Engine(runner, tok, Scheduler(SchedulerConfig(cross_bytes_per_token=runner.cross_bytes_per_token,
                                                         max_batch_size=capacity)))


def _run(bundle, tok, requests):
    e = _engine(bundle, tok)
    done = e.generate(requests)
    return [[(list(s.token_ids), s.finish_reason.value, s.cumulative_logprob) for s in r.result.sequences]
            for r in done], e.runner


def _tokens(runs) -> list:
    return [[seq[:2] for seq in r] for r in runs]  # each sequence's ids and finish reason


def _scores(runs) -> list[float]:
    return [seq[2] for r in runs for seq in r if seq[2] is not None]  # beams' cumulative log-probabilities


def test_the_graph_outputs_agree_with_the_host_choice_ties_included(choice_bundle):
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from seqserve.export.token_choice import add_token_choice

    vocab = 40
    graph = helper.make_graph([helper.make_node("Identity", ["x"], [names.LOGITS])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", vocab])],
                              [helper.make_tensor_value_info(names.LOGITS, TensorProto.FLOAT, ["batch", vocab])])
    model = add_token_choice(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    model.ir_version = 10
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    x = rng.integers(-3, 3, (64, vocab)).astype(np.float32)  # many exact ties
    ids, top, lp = session.run(list(names.TOKEN_CHOICE_OUTPUTS), {"x": x})
    assert (ids == x.argmax(-1)).all()
    order = np.lexsort((np.broadcast_to(np.arange(vocab), x.shape), -x), axis=-1)[:, : names.TOP_K]  # ties: lower id
    assert (top == order).all()
    ref = x.astype(np.float64) - np.log(np.exp(x.astype(np.float64)).sum(-1, keepdims=True))
    np.testing.assert_allclose(lp, np.take_along_axis(ref, order, 1), atol=1e-6)


def test_greedy_steps_fetch_only_ids_and_serve_todays_tokens(tiny_bundle, choice_bundle, sources):
    tok, ids = sources
    requests = lambda: [Request(s, SamplingParams(max_new_tokens=16)) for s in ids]  # noqa: E731
    today, old = _run(tiny_bundle, tok, requests())
    got, new = _run(choice_bundle, tok, requests())
    assert got == today
    assert not old.token_choice and set(old.fetched) == {(names.LOGITS,)}  # an old bundle: today's path
    assert new.token_choice and set(new.fetched) == {(names.NEXT_TOKEN_IDS,)}  # no step copied the logits


def test_beam_steps_fetch_the_top_k_and_serve_todays_beams(tiny_bundle, choice_bundle, sources):
    tok, ids = sources
    requests = lambda: [Request(s, SamplingParams(max_new_tokens=12, num_beams=4, num_return_sequences=2))  # noqa: E731
                        for s in ids[:8]] + [Request(s, SamplingParams(max_new_tokens=12)) for s in ids[8:12]]
    today, _ = _run(tiny_bundle, tok, requests())
    got, new = _run(choice_bundle, tok, requests())
    assert _tokens(got) == _tokens(today)
    assert _scores(got) == pytest.approx(_scores(today), abs=1e-5) and len(_scores(got)) == 16
    top = (names.NEXT_TOKEN_IDS, names.TOP_TOKEN_IDS, names.TOP_LOGPROBS)
    assert top in new.fetched and (names.LOGITS,) not in new.fetched


@pytest.mark.parametrize("params", [dict(temperature=0.8, seed=3), dict(min_new_tokens=4), dict(return_logprobs=True),
                                    dict(num_beams=2, min_new_tokens=3), dict(num_beams=9)])
def test_a_row_whose_choice_reads_the_logits_takes_the_host_path(tiny_bundle, choice_bundle, sources, params):
    tok, ids = sources
    requests = lambda: [Request(ids[0], SamplingParams(max_new_tokens=8, **params)),  # noqa: E731
                        Request(ids[1], SamplingParams(max_new_tokens=8))]
    today, _ = _run(tiny_bundle, tok, requests())
    got, new = _run(choice_bundle, tok, requests())
    assert _tokens(got) == _tokens(today)
    assert _scores(got) == pytest.approx(_scores(today), abs=1e-5)  # a beam's later steps: the float32 top-k
    assert (names.LOGITS,) in new.fetched


def test_the_engine_asks_for_ids_only_when_no_row_reads_the_logits(choice_bundle, sources):
    tok, ids = sources
    e = _engine(choice_bundle, tok)
    e.submit([Request(ids[0], SamplingParams(max_new_tokens=8))])
    e.step()
    assert e._need() is Need.IDS
    e.submit([Request(ids[1], SamplingParams(max_new_tokens=8, temperature=0.5, seed=1))])
    e.step()
    assert e._need() is Need.LOGITS
