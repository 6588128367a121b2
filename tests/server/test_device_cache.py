"""The device-resident in-place cache (engine/runtime/device_cache.py) on 'cpu' OrtValues: the very code CUDA runs (copy
graphs bound by pointer, outputs fetched from device buffers) gives today's numpy InPlaceCache's tokens exactly."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from seqserve.contract import names
from seqserve.contract.tokenizer import load_tokenizer
from seqserve.contract.tsv import heldout_pairs
from seqserve.engine.request import Request, SamplingParams
from seqserve.engine.runtime import onnx_proto
from seqserve.engine.runtime.device import RuntimeConfig
from seqserve.engine.runtime.device_cache import DeviceInPlaceCache, buckets
from seqserve.engine.runtime.inplace_cache import InPlaceCache
from seqserve.engine.runtime.runner import Runner, choose_cache
from seqserve.engine.step.engine import Engine
from seqserve.engine.step.scheduler import Scheduler, SchedulerConfig
from seqserve.server.metrics import Metrics

CPU = RuntimeConfig(device="cpu", intra_op_threads=1)


@pytest.fixture(scope="module")
def sources(tiny_bundle):
    tok = load_tokenizer(tiny_bundle / "tokenizer.json")
    return tok, [tok.encode(s).ids for s, _ in heldout_pairs(tiny_bundle, 40)]


def _serve(bundle, tok, requests, device_cache, capacity=8, variant="fp32"):
    runner = Runner(bundle, CPU, variant=variant, capacity=capacity, device_cache=device_cache)
    e = Engine(runner, tok, Scheduler(SchedulerConfig(cross_bytes_per_token=runner.cross_bytes_per_token,
                                                      max_batch_size=capacity)), Metrics())
    done = e.generate(requests)
    return [[(list(s.token_ids), s.finish_reason.value, s.cumulative_logprob) for s in r.result.sequences]
            for r in done], runner


def _scores(runs) -> list[float]:
    return [seq[2] for r in runs for seq in r if seq[2] is not None]


def _mix(ids):
    """Greedy, beams (reordered rows), sampling and log-probabilities, more requests than slots (rows join late and
    reuse freed slots, sources of every length widen the cross buffers)."""
    out = []
    for i, s in enumerate(ids):
        kind = i % 4
        params = [dict(), dict(num_beams=3, num_return_sequences=2), dict(temperature=0.7, seed=i),
                  dict(return_logprobs=True, min_new_tokens=2)][kind]
        out.append(Request(s, SamplingParams(max_new_tokens=10 + i % 5, **params)))
    return out


@pytest.mark.parametrize("bundle", ["tiny_bundle", "choice_bundle"])
def test_device_cache_serves_the_numpy_caches_tokens(request, sources, bundle):
    tok, ids = sources
    path = request.getfixturevalue(bundle)
    today, old = _serve(path, tok, _mix(ids), device_cache=False)
    got, new = _serve(path, tok, _mix(ids), device_cache=True)
    assert isinstance(old.cache, InPlaceCache) and isinstance(new.cache, DeviceInPlaceCache)
    assert got == today


def test_the_cpu_default_stays_the_numpy_cache_and_fp16_buffers_choose_inplace_anywhere(tiny_bundle):
    assert isinstance(Runner(tiny_bundle, CPU, capacity=2).cache, InPlaceCache)
    half = {names.DECODER_INPLACE: {"kv_dtype": "float16"}}
    assert choose_cache("auto", half, "cuda") == "inplace"
    assert choose_cache("auto", {names.DECODER_INPLACE: {"kv_dtype": "float32"}}, "cuda") == "concat"


class Captured(Runner):
    """The device cache in its CUDA-graph mode on the CPU: steps padded to buckets, total_sequence_length pinned to
    the buffer length, every output bound, warm-up runs per bucket (only the capture itself is CUDA's)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.cache.captured = True
        self.warmed = self.cache.capture(self.decoder, self.slots)


def test_the_cuda_graph_mode_serves_the_same_tokens(choice_bundle, sources):
    tok, ids = sources
    today, _ = _serve(choice_bundle, tok, _mix(ids), device_cache=False, capacity=6)
    runner = Captured(choice_bundle, CPU, capacity=6, device_cache=True)
    e = Engine(runner, tok, Scheduler(SchedulerConfig(cross_bytes_per_token=runner.cross_bytes_per_token,
                                                      max_batch_size=6)), Metrics())
    got = [[(list(s.token_ids), s.finish_reason.value, s.cumulative_logprob) for s in r.result.sequences]
           for r in e.generate(_mix(ids))]
    assert got == today
    assert runner.warmed == 4 and int(runner.cache._total) == runner.cache.max_len
    assert {key[0] for key in runner.cache._bindings} <= {1, 2, 4, 6}  # every step ran at a bucket's size


def test_the_cpu_never_takes_the_cuda_graph_path(tiny_bundle):
    runner = Runner(tiny_bundle, RuntimeConfig(device="cpu", intra_op_threads=1, cuda_graphs=True), capacity=4,
                    device_cache=True)
    assert not runner.device.cuda_graphs and not runner.cache.captured and runner.device.run_options(4) is None
    assert runner.decoder.get_providers() == ["CPUExecutionProvider"]


def test_buckets_cover_every_batch():
    assert buckets(8) == [1, 2, 4, 8] and buckets(6) == [1, 2, 4, 6] and buckets(1) == [1]


def test_wire_format_graph_equals_onnx_own_serialisation():
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    got = onnx_proto.model("g", [onnx_proto.node("Pad", ["x", "p"], ["y"]),
                           onnx_proto.node("Cast", ["y"], ["z"], to=10)],
                          [onnx_proto.value("x", np.float32, ["b", 3])], [onnx_proto.value("z", np.float16, ["b", 5])],
                          [onnx_proto.initializer("p", np.array([0, 1, 0, 1], np.int64))])
    parsed = onnx.load_from_string(got)
    onnx.checker.check_model(parsed)
    assert [n.op_type for n in parsed.graph.node] == ["Pad", "Cast"]
    assert helper.get_attribute_value(parsed.graph.node[1].attribute[0]) == TensorProto.FLOAT16
    assert numpy_helper.to_array(parsed.graph.initializer[0]).tolist() == [0, 1, 0, 1]
    session = ort.InferenceSession(got, providers=["CPUExecutionProvider"])
    out = session.run(None, {"x": np.ones((2, 3), np.float32)})[0]
    assert out.dtype == np.float16 and out.tolist() == [[0, 1, 1, 1, 0]] * 2


def test_a_probe_on_the_device_cache_changes_nothing_and_sees_the_step(tiny_bundle, sources):
    tok, ids = sources
    runner = Runner(tiny_bundle, CPU, capacity=4, device_cache=True)
    e = Engine(runner, tok, Scheduler(SchedulerConfig(cross_bytes_per_token=runner.cross_bytes_per_token,
                                                      max_batch_size=4)), Metrics())
    for s in ids[:3]:
        e.submit([Request(s, SamplingParams(max_new_tokens=12))])
    e.step()
    e.step()
    before = [b.numpy().copy() for b in runner.cache.self_kv]
    alone = runner.cache.run(runner.decoder, runner.slots, np.array([1, 2])).logits
    assert all((b.numpy() == saved).all() for b, saved in zip(runner.cache.self_kv, before))
    step = runner.step()
    np.testing.assert_allclose(alone, step[[1, 2]], atol=1e-5)


@pytest.fixture(scope="module")
def fp16_bundle(tiny_bundle, tmp_path_factory):
    """The tiny bundle with its fp16 variant: decoder_inplace.fp16.onnx, float16 buffers and the token-choice outputs
    (the graph the device path is for)."""
    import shutil

    from seqserve.contract.manifest import load_manifest
    from seqserve.export.variants import add_variant

    out = tmp_path_factory.mktemp("fp16") / "bundle"
    shutil.copytree(tiny_bundle, out)
    manifest = load_manifest(out)
    add_variant(out, manifest, "fp16")
    manifest.save(out)
    return out


def test_on_the_test_device_the_fp16_graph_serves_the_same_tokens_with_and_without_cuda_graphs(fp16_bundle, sources):
    """SEQSERVE_TEST_DEVICE=cuda: the real CUDA path, captured graphs against uncaptured ones (same kernels, so the
    same tokens); on the CPU the captured mode is set by hand (padding, pinned length, every output bound)."""
    from grpc_harness import DEVICE

    tok, ids = sources
    reference, _ = _serve(fp16_bundle, tok, _mix(ids), device_cache=False, capacity=6, variant="fp16")  # numpy, CPU
    runs = []
    for graphs in (False, True):
        cfg = RuntimeConfig(device=DEVICE, intra_op_threads=1, cuda_graphs=graphs)
        runner = Runner(fp16_bundle, cfg, variant="fp16", capacity=6, device_cache=True)
        assert runner.token_choice and runner.kv_cache == "inplace"
        if graphs and DEVICE == "cpu":
            runner.cache.captured = True
        assert runner.cache.captured == graphs
        e = Engine(runner, tok, Scheduler(SchedulerConfig(cross_bytes_per_token=runner.cross_bytes_per_token,
                                                          max_batch_size=6)), Metrics())
        runs.append([[(list(s.token_ids), s.finish_reason.value, s.cumulative_logprob) for s in r.result.sequences]
                     for r in e.generate(_mix(ids))])
    assert any(len(r) == 2 for r in runs[0])  # the beam requests ran
    # The CPU's numpy cache on the same graph is the reference: exact on the CPU; on CUDA other kernels (and the
    # buckets' batch sizes) round differently, so tokens must agree and scores within float16's error.
    for run in runs:
        assert [[seq[:2] for seq in r] for r in run] == [[seq[:2] for seq in r] for r in reference]
        if DEVICE == "cpu":
            assert run == reference
        else:
            assert _scores(run) == pytest.approx(_scores(reference), abs=1e-2)


def test_serving_with_cuda_graphs_on_the_cpu_ignores_them_and_serves_todays_text(make_server, served, heldout):
    from grpc_harness import DEVICE

    from seqserve.v1 import seqserve_pb2 as pb

    server = make_server(cuda_graphs=True)
    runner = server.runner
    if DEVICE == "cpu":  # --cuda-graphs is a CUDA setting: the CPU keeps its numpy cache and plain runs
        assert not runner.device.cuda_graphs and isinstance(runner.cache, InPlaceCache)
    for source, _ in heldout[:4]:
        want = served.stub.Generate(pb.GenerateRequest(input=source), timeout=30)
        got = server.stub.Generate(pb.GenerateRequest(input=source), timeout=30)
        assert list(got.token_ids) == list(want.token_ids)
