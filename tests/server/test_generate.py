"""Generation over a real channel: unary, stream, batch, continuous batching and seeded sampling."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from grpc_harness import PROVIDER, request, wait_for

from seqserve.v1 import seqserve_pb2 as pb

SAMPLING = dict(temperature=3.0, seed=1234)  # hot enough that the tiny, confident model really samples


def test_unary_equals_pytorch_reference(served, heldout, reference):
    src = heldout[0][0]
    r = served.stub.Generate(request(src), timeout=30)
    assert (list(r.token_ids), r.text) == reference(src)
    assert r.finish_reason == pb.FINISH_REASON_EOS
    assert r.usage.generated_tokens == len(r.token_ids) > 0
    assert r.usage.input_tokens > 0
    assert 0 <= r.timings.queue_seconds <= r.timings.first_token_seconds <= r.timings.total_seconds


def test_stream_pieces_arrive_before_the_end_and_add_up_to_the_unary_text(make_server, heldout):
    s = make_server()
    src = max((s for s, _ in heldout), key=len)
    unary = s.stub.Generate(request(src), timeout=30)
    gate = s.gate()
    gate.close()  # the first piece is read while the engine holds after the first step
    stream = s.stub.GenerateStream(request(src), timeout=30)
    messages = [next(stream)]
    gate.open()
    messages += list(stream)
    assert len(messages) > 1 and all(m.finish_reason == pb.FINISH_REASON_UNSPECIFIED for m in messages[:-1])
    assert any(m.text for m in messages[:-1]), "no text before the final message"
    assert "".join(m.text for m in messages) == unary.text
    assert [t for m in messages for t in m.token_ids] == list(unary.token_ids)
    final = messages[-1]
    assert final.finish_reason == unary.finish_reason and final.usage == unary.usage


def test_batch_returns_results_in_input_order(served, heldout, reference):
    sources = [s for s, _ in heldout[:6]]
    response = served.stub.GenerateBatch(pb.GenerateBatchRequest(inputs=sources), timeout=30)
    assert [(list(r.token_ids), r.text) for r in response.results] == [reference(s) for s in sources]
    assert len({r.text for r in response.results}) == len(sources)  # distinct inputs, distinct outputs: no mix-up


def test_length_and_stop_finish_reasons(served, heldout):
    src = max((s for s, _ in heldout), key=len)
    r = served.stub.Generate(request(src, max_new_tokens=3), timeout=30)
    assert r.finish_reason == pb.FINISH_REASON_LENGTH and len(r.token_ids) == 3
    stop = src.split()[2]
    r = served.stub.Generate(request(src, stop=[stop]), timeout=30)
    assert r.finish_reason == pb.FINISH_REASON_STOP and r.text == src[: src.index(stop)]


def test_32_concurrent_requests_equal_each_served_alone(served, heldout, reference):
    sources = sorted({s for s, _ in heldout}, key=len)[:: max(1, len(heldout) // 32)][:32]  # spread of lengths
    alone = [served.stub.Generate(request(s), timeout=30) for s in sources]
    rows_before = served.metric("seqserve_batch_rows_bucket", le="1.0")
    steps_before = served.metric("seqserve_batch_rows_count")
    with ThreadPoolExecutor(32) as pool:
        together = list(pool.map(lambda s: served.stub.Generate(request(s), timeout=60), sources))
    assert [r.token_ids for r in together] == [r.token_ids for r in alone]
    assert [(list(r.token_ids), r.text) for r in together] == [reference(s) for s in sources]
    single_row_steps = served.metric("seqserve_batch_rows_bucket", le="1.0") - rows_before
    assert single_row_steps < served.metric("seqserve_batch_rows_count") - steps_before, "never batched"


def test_a_request_joining_mid_generation_changes_nobody(make_server, heldout):
    s = make_server()
    first, second = heldout[0][0], heldout[1][0]
    long_first = dict(min_new_tokens=30, max_new_tokens=30)  # runs well past the copy, on forced tokens
    alone_first = s.stub.Generate(request(first, **long_first), timeout=30)
    alone_second = s.stub.Generate(request(second), timeout=30)
    gate = s.gate()
    gate.close()  # the engine holds after the first request's first step: the second one joins it there
    stream = s.stub.GenerateStream(request(first, **long_first), timeout=60)
    pieces = [next(stream)]  # the first request is mid-generation now
    joined = s.stub.Generate.future(request(second), timeout=60)
    wait_for(lambda: s.engine.scheduler.n_waiting == 1, what="the joining request queued")
    gate.open()
    wait_for(joined.done, what="the joining request")
    pieces += list(stream)
    assert pieces[-1].finish_reason == pb.FINISH_REASON_LENGTH
    assert [t for p in pieces for t in p.token_ids] == list(alone_first.token_ids)
    assert joined.result().token_ids == alone_second.token_ids
    assert s.metric("seqserve_batch_rows_count") > s.metric("seqserve_batch_rows_bucket", le="1.0"), "never joined"


def test_seeded_sampling_is_identical_alone_and_in_a_batch(served, heldout):
    sources = [s for s, _ in heldout[:8]]
    alone = [served.stub.Generate(request(s, **SAMPLING), timeout=30) for s in sources]
    batch = served.stub.GenerateBatch(pb.GenerateBatchRequest(inputs=sources, options=pb.DecodingOptions(**SAMPLING)),
                                      timeout=30)
    assert [r.token_ids for r in batch.results] == [r.token_ids for r in alone]
    assert all(r.seed == SAMPLING["seed"] for r in batch.results)
    greedy = [served.stub.Generate(request(s), timeout=30).token_ids for s in sources]
    assert [r.token_ids for r in alone] != greedy, "the sampling options did not change anything: test is vacuous"
    other = [served.stub.Generate(request(s, temperature=3.0, seed=99), timeout=30).token_ids for s in sources]
    assert other != [r.token_ids for r in alone], "a different seed gave the same samples"


def test_unset_seed_is_chosen_by_the_server_and_reproduces(served, heldout):
    src = heldout[2][0]
    first = served.stub.Generate(request(src, temperature=3.0), timeout=30)
    again = served.stub.Generate(request(src, temperature=3.0, seed=first.seed), timeout=30)
    assert again.token_ids == first.token_ids


def test_model_info(served):
    info = served.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
    assert info.execution_provider == PROVIDER and info.variant == "fp32"
    assert info.bundle_format_version == 1 and info.onnxruntime_version
    assert info.config["d_model"].int_value > 0
    assert info.limits.max_new_tokens > 0 and info.limits.max_input_tokens == info.config["max_positions"].int_value
    assert 0 < info.limits.default_max_new_tokens <= info.limits.max_new_tokens


def test_stream_interval_groups_tokens_and_still_adds_up_to_the_unary_text(make_server, heldout):
    s = make_server(stream_interval=4)
    src = max((src for src, _ in heldout), key=len)
    unary = s.stub.Generate(request(src, max_new_tokens=14, min_new_tokens=14), timeout=30)
    gate = s.gate()
    gate.close()
    stream = s.stub.GenerateStream(request(src, max_new_tokens=14, min_new_tokens=14), timeout=30)
    gate.run(3)  # four steps: the first message is read before the engine goes on
    messages = [next(stream)]
    gate.open()
    messages += list(stream)
    sizes = [len(m.token_ids) for m in messages]  # groups of 4 (a slow reader may get several in one message)
    assert sum(sizes) == 14 and all(n % 4 == 0 for n in sizes[:-1]) and sizes[-1] % 4 == 2 and len(sizes) > 1
    assert "".join(m.text for m in messages) == unary.text
    assert [t for m in messages for t in m.token_ids] == list(unary.token_ids)
