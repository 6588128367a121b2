"""Beam search and log-probabilities over a real server, against the PyTorch reference (model/beam.py).

The oracle is the reference itself run on the checkpoint the bundle came from: whatever the tiny model learned, the
server's n-best lists, their order, scores and log-probabilities must be the reference's.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from grpc_harness import request, wait_for

from seqserve.v1 import seqserve_pb2 as pb

MAX_NEW = 24
TOL = 1e-4


@pytest.fixture(scope="module")
def model(tiny_checkpoint):
    from seqserve.model.checkpoint import load_checkpoint

    return load_checkpoint(tiny_checkpoint)


def _reference(model, sources: list[str], **opts):
    from seqserve.model.beam import BeamOptions, beam_search

    net, tok = model
    return beam_search(net, [tok.encode(s).ids for s in sources], BeamOptions(max_new_tokens=MAX_NEW, **opts))


def _nbest(result) -> list[tuple[list[int], str, float, float]]:
    return [(list(s.token_ids), pb.FinishReason.Name(s.finish_reason), s.cumulative_logprob, s.score)
            for s in result.sequences]


@pytest.mark.parametrize("width", [1, 2, 4])
def test_beam_search_equals_the_pytorch_reference(served, heldout, model, width):
    sources = [s for s, _ in heldout[:10]]
    options = pb.DecodingOptions(max_new_tokens=MAX_NEW, num_beams=width, num_return_sequences=width,
                                 return_logprobs=True)
    results = served.stub.GenerateBatch(pb.GenerateBatchRequest(inputs=sources, options=options), timeout=120).results
    for result, hyps in zip(results, _reference(model, sources, num_beams=width, num_return_sequences=width)):
        got = _nbest(result)
        assert [g[0] for g in got] == [h.token_ids for h in hyps]  # the same hypotheses, in the same order
        assert [g[1] for g in got] == [f"FINISH_REASON_{h.finish_reason.upper()}" for h in hyps]
        for (_, _, cum, score), h in zip(got, hyps):
            assert cum == pytest.approx(h.cumulative_logprob, abs=TOL) and score == pytest.approx(h.score, abs=TOL)
        assert list(result.token_ids) == got[0][0] and result.text == result.sequences[0].text


def test_one_beam_is_greedy_exactly(served, heldout):
    for source, _ in heldout[:8]:
        greedy = served.stub.Generate(request(source, max_new_tokens=MAX_NEW), timeout=30)
        one = served.stub.Generate(request(source, max_new_tokens=MAX_NEW, num_beams=1), timeout=30)
        assert (list(one.token_ids), one.text, one.finish_reason) == (list(greedy.token_ids), greedy.text,
                                                                      greedy.finish_reason)


def test_greedy_logprobs_equal_the_reference(served, heldout, model):
    from seqserve.model.beam import greedy_logprobs

    net, tok = model
    sources = [s for s, _ in heldout[:6]]
    want = greedy_logprobs(net, [tok.encode(s).ids for s in sources], MAX_NEW, top_logprobs=3)
    for source, ref in zip(sources, want):
        r = served.stub.Generate(request(source, max_new_tokens=MAX_NEW, return_logprobs=True, top_logprobs=3),
                                 timeout=30)
        seq = r.sequences[0]
        assert [t.token_id for t in seq.logprobs] == ref.token_ids + ([] if ref.finish_reason == "length" else
                                                                         [tok.token_to_id("</s>")])
        assert [t.logprob for t in seq.logprobs] == pytest.approx(ref.token_logprobs, abs=TOL)
        assert [[a.token_id for a in t.top_logprobs] for t in seq.logprobs] == [[i for i, _ in top]
                                                                                for top in ref.top_logprobs]
        assert seq.cumulative_logprob == pytest.approx(ref.cumulative_logprob, abs=TOL)
        assert seq.score == pytest.approx(ref.score, abs=TOL)
    plain = served.stub.Generate(request(sources[0], max_new_tokens=MAX_NEW), timeout=30).sequences[0]
    assert not plain.HasField("cumulative_logprob") and not plain.logprobs  # computed only when asked for


def test_a_beam_request_is_the_same_alone_and_inside_a_changing_batch(make_server, heldout):
    s = make_server(max_batch_size=16)
    beam = request(heldout[3][0], max_new_tokens=MAX_NEW, num_beams=4, num_return_sequences=4)
    alone = s.stub.Generate(beam, timeout=60)
    others = [request(src, max_new_tokens=2 + 3 * i) for i, (src, _) in enumerate(heldout[:6])]
    others += [request(src, max_new_tokens=5 + i, temperature=2.0, seed=i) for i, (src, _) in enumerate(heldout[6:10])]
    others += [request(heldout[11][0], max_new_tokens=MAX_NEW, num_beams=2, num_return_sequences=2)]
    gate, scheduler = s.gate(), s.engine.scheduler
    gate.close()  # the engine is held after each step it is let take: who joins when is exact
    with ThreadPoolExecutor(len(others) + 1) as pool:
        together = pool.submit(s.stub.Generate, beam, timeout=120)
        gate.wait_held()  # the beams' first step
        early = [pool.submit(s.stub.Generate, r, timeout=120) for r in others[::2]]
        wait_for(lambda: scheduler.n_waiting == len(early), what="the early requests queued")
        gate.run(3)  # they join the beams, and run beside them
        assert [r.n_rows for r in scheduler.running if not r.done].count(4) == 1, "the beam request runs mid-way"
        late = [pool.submit(s.stub.Generate, r, timeout=120) for r in others[1::2]]
        wait_for(lambda: scheduler.n_waiting == len(late), what="the late requests queued")
        gate.open()  # the rest join mid-way, while the beam request is running
        result = together.result()
        assert all(f.result().sequences for f in early + late)
    assert [g[:2] for g in _nbest(result)] == [g[:2] for g in _nbest(alone)] and len(result.sequences) == 4
    # Scores agree to float32 rounding: onnxruntime's kernels may sum in another order for another batch size.
    assert [g[3] for g in _nbest(result)] == pytest.approx([g[3] for g in _nbest(alone)], abs=1e-5)


def test_streaming_a_beam_request_sends_the_final_n_best_once(served, heldout):
    r = request(heldout[2][0], max_new_tokens=MAX_NEW, num_beams=3, num_return_sequences=2)
    unary = served.stub.Generate(r, timeout=60)
    messages = list(served.stub.GenerateStream(r, timeout=60))
    assert len(messages) == 1  # nothing streams while any live beam may still be overtaken
    final = messages[0]
    assert (final.text, list(final.token_ids)) == (unary.text, list(unary.token_ids))
    assert _nbest(final) == _nbest(unary) and final.finish_reason == unary.finish_reason


def test_rows_and_cache_return_to_idle_after_beams_including_cancelled(make_server, heldout):
    s = make_server()
    gate = s.gate()
    gate.close()  # the beams hold their rows, between two steps, while they are cancelled
    stream = s.stub.GenerateStream(request(heldout[0][0], max_new_tokens=MAX_NEW, num_beams=4), timeout=60)
    gate.wait_held()
    assert s.metric("seqserve_running_requests") == 4, "four beam rows in the batch"
    assert s.metric("seqserve_kv_cache_bytes") > 0, "their cache counted"
    (row,) = s.engine.scheduler.running
    stream.cancel()
    gate.wait_aborted(row.id)
    gate.open()
    wait_for(lambda: s.metric("seqserve_running_requests") == 0, what="the cancelled beams to leave")
    wait_for(lambda: s.metric("seqserve_kv_cache_bytes") == 0, what="their cache freed")
    done = s.stub.Generate(request(heldout[1][0], max_new_tokens=MAX_NEW, num_beams=4), timeout=60)
    assert done.sequences
    wait_for(lambda: s.metric("seqserve_running_requests") == 0, what="the finished beams to leave")
    assert s.metric("seqserve_finished_requests_total", reason="cancelled") == 1


def test_a_beam_request_counts_one_first_token_and_its_best_sequence_as_usage(served, heldout):
    ttft = served.metric("seqserve_time_to_first_token_seconds_count")
    tokens = served.metric("seqserve_generated_tokens_total")
    r = served.stub.Generate(request(heldout[4][0], max_new_tokens=MAX_NEW, num_beams=8), timeout=60)
    assert served.metric("seqserve_time_to_first_token_seconds_count") - ttft == 1
    assert served.metric("seqserve_generated_tokens_total") - tokens == r.usage.generated_tokens == len(r.token_ids)
