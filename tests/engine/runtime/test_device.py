"""Execution providers and runtime settings: what `--device` and the thread flags do to the real sessions."""
from __future__ import annotations

import logging

import onnxruntime as ort
import pytest

from seqserve.engine.runtime.device import CPU, CUDA, RuntimeConfig
from seqserve.engine.runtime.runner import Runner


def test_auto_runs_on_the_provider_it_reports(tiny_bundle):
    runner = Runner(tiny_bundle, RuntimeConfig(device="auto"))
    assert runner.provider in (CPU, CUDA)  # CUDA on a GPU machine, the CPU fallback elsewhere
    assert runner.encoder.get_providers()[0] == runner.decoder.get_providers()[0] == runner.provider
    assert runner.device.ort_device == ("cuda" if runner.provider == CUDA else "cpu")


def test_auto_without_a_gpu_falls_back_at_info_and_names_the_provider_in_use(tiny_bundle, caplog):
    """Issue 16, item 18: onnxruntime-gpu lists CUDA on every machine; under auto its absence is expected, not a
    WARNING on every CPU start."""
    with caplog.at_level(logging.DEBUG, logger="seqserve"):
        runner = Runner(tiny_bundle, RuntimeConfig(device="auto"))
    records = [r for r in caplog.records if r.name.startswith("seqserve")]
    assert not [r.getMessage() for r in records if r.levelno >= logging.WARNING]
    if runner.provider == CPU and CUDA in ort.get_available_providers():  # the fallback happened
        assert any(r.levelno == logging.INFO and f"using {CPU}" in r.getMessage() for r in records), records


def test_device_cuda_runs_on_cuda_or_refuses_naming_the_flag(tiny_bundle):
    try:
        runner = Runner(tiny_bundle, RuntimeConfig(device="cuda"))
    except RuntimeError as exc:  # no GPU or no CUDA libraries: a clear refusal, never a silent CPU fallback
        assert "--device cuda" in str(exc)
    else:
        assert runner.provider == CUDA and runner.decoder.get_providers()[0] == CUDA


def test_thread_and_optimisation_settings_reach_the_sessions(tiny_bundle):
    cfg = RuntimeConfig(device="cpu", intra_op_threads=1, inter_op_threads=2, allow_spinning=False,
                        optimization="basic")
    runner = Runner(tiny_bundle, cfg)
    for session in (runner.encoder, runner.decoder):
        opts = session.get_session_options()
        assert (opts.intra_op_num_threads, opts.inter_op_num_threads) == (1, 2)
        assert opts.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        assert opts.get_session_config_entry("session.intra_op.allow_spinning") == "0"


@pytest.mark.parametrize("bad", [dict(device="tpu"), dict(intra_op_threads=-1)])
def test_bad_runtime_settings_are_refused(bad):
    with pytest.raises(ValueError):
        RuntimeConfig(**bad)


@pytest.mark.parametrize("device", ["cpu", "auto"])
def test_cpu_sessions_keep_add_and_layer_normalization_apart(tmp_path, monkeypatch, device):
    """onnxruntime fuses Add + LayerNormalization into SkipLayerNormalization at load, 5x slower on its CPU provider:
    a CPU session (also one that auto fell back to) keeps the two nodes, where a default session fuses them."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from seqserve.engine.runtime.device import Device

    x, s = (helper.make_tensor_value_info(n, TensorProto.FLOAT, [4, 1, 8]) for n in ("x", "s"))
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "s"], ["a"]), helper.make_node("LayerNormalization", ["a", "g", "b"], ["y"])],
        "norm", [x, s], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 1, 8])],
        [numpy_helper.from_array(np.ones(8, np.float32), "g"), numpy_helper.from_array(np.zeros(8, np.float32), "b")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), tmp_path / "n.onnx")
    saved = tmp_path / "optimised.onnx"

    class Saving(ort.SessionOptions):  # writes the graph onnxruntime runs
        def __init__(self):
            super().__init__()
            self.optimized_model_filepath = str(saved)

    monkeypatch.setattr(ort, "SessionOptions", Saving)
    ort.InferenceSession(str(tmp_path / "n.onnx"), Saving(), providers=[CPU])
    assert [n.op_type for n in onnx.load(saved).graph.node] == ["SkipLayerNormalization"]  # the default fuses
    session = Device(RuntimeConfig(device=device)).session(tmp_path / "n.onnx")
    if session.get_providers()[0] == CPU:
        assert [n.op_type for n in onnx.load(saved).graph.node] == ["Add", "LayerNormalization"]
