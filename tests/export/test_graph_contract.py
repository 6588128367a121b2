"""The graphs' contract: checker-valid, names / dtypes / ranks / dimension names as export/names.py declares them,
no control flow, loadable on the CPU provider, and dynamic axes that really take 0 and 1."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from seqserve.contract import names
from seqserve.export.ort_io import CPU, cpu_session, random_decoder_feeds

CONTROL_FLOW = {"If", "Loop", "Scan", "SequenceMap"}
ONNX_TYPES = {names.INT64: onnx.TensorProto.INT64, names.FLOAT32: onnx.TensorProto.FLOAT}
ORT_TYPES = {names.INT64: "tensor(int64)", names.FLOAT32: "tensor(float)"}


@pytest.fixture(params=["small fp32", "tiny fp32", "tiny int8", "tiny fp16"])
def graphs(request) -> tuple[dict, dict]:
    """({graph: path}, model config) for the small random export or one variant of the tiny bundle."""
    source, variant = request.param.split()
    if source == "small":
        directory, cfg = request.getfixturevalue("small_graphs"), request.getfixturevalue("small_model").cfg.to_dict()
    else:
        directory = request.getfixturevalue("full_bundle")
        cfg = json.loads((directory / "manifest.json").read_text())["model"]
    return {g: directory / names.graph_files(variant)[g] for g in names.GRAPHS}, cfg


def _resolve(dims: list, cfg: dict) -> list:
    static = {names.HEADS: cfg["n_heads"], names.HEAD_DIM: cfg["d_model"] // cfg["n_heads"],
              names.VOCAB: cfg["vocab_size"]}
    return [static.get(d, d) for d in dims]


def test_checker_names_dtypes_and_dimension_names(graphs):
    paths, cfg = graphs
    declared = names.signature(cfg["n_decoder_layers"])
    for graph, path in paths.items():
        onnx.checker.check_model(str(path), full_check=True)
        model = onnx.load(str(path))
        values = list(model.graph.input) + list(model.graph.output)
        assert [v.name for v in values] == list(declared[graph]), path.name
        for v in values:
            dtype, dims = declared[graph][v.name]
            tensor = v.type.tensor_type
            assert tensor.elem_type == ONNX_TYPES[dtype], (path.name, v.name)
            assert [d.dim_param or d.dim_value for d in tensor.shape.dim] == _resolve(dims, cfg), (path.name, v.name)


def test_no_control_flow_and_opset(graphs):
    paths, _ = graphs
    for path in paths.values():
        model = onnx.load(str(path))
        ops = {n.op_type for n in model.graph.node} | {n.op_type for f in model.functions for n in f.node}
        assert not ops & CONTROL_FLOW, (path.name, ops & CONTROL_FLOW)
        assert not any(a.type == onnx.AttributeProto.GRAPH for n in model.graph.node for a in n.attribute)
        assert {o.domain: o.version for o in model.opset_import}[""] == 18


def test_loads_on_cpu_provider_with_declared_io(graphs):
    paths, cfg = graphs
    declared = names.signature(cfg["n_decoder_layers"])
    for graph, path in paths.items():
        session = cpu_session(path)
        assert session.get_providers() == [CPU]
        io = session.get_inputs() + session.get_outputs()
        assert [(v.name, v.type) for v in io] == [(n, ORT_TYPES[t]) for n, (t, _) in declared[graph].items()]


@pytest.mark.parametrize("batch, past_len, src_len", [(0, 0, 1), (1, 0, 1), (1, 1, 7), (3, 1, 1)])
def test_dynamic_axes_take_zero_and_one(graphs, batch, past_len, src_len):
    """Exported with sizes 3 / 7 / 5; batch 0, past_len 0 and 1, src_len 1 run and give the declared shapes."""
    paths, cfg = graphs
    encoder, decoder = cpu_session(paths["encoder"]), cpu_session(paths["decoder"])
    ids = np.full((batch, src_len), 5, np.int64)
    heads, head_dim = cfg["n_heads"], cfg["d_model"] // cfg["n_heads"]
    for out in encoder.run(None, {names.INPUT_IDS: ids, names.ATTENTION_MASK: np.ones_like(ids)}):
        assert out.shape == (batch, heads, src_len, head_dim)
    feeds = random_decoder_feeds(cfg, max(batch, 1), past_len, src_len)
    outputs = decoder.run(None, {k: v[:batch] for k, v in feeds.items()})
    assert outputs[0].shape == (batch, cfg["vocab_size"]) and outputs[0].dtype == np.float32
    assert all(o.shape == (batch, heads, past_len + 1, head_dim) for o in outputs[1:])
    assert all(np.isfinite(o).all() for o in outputs)
