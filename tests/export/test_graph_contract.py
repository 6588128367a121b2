"""The graphs' contract: checker-valid, names / dtypes / ranks / dimension names as contract/names.py declares them,
no control flow, loadable on the CPU provider, and dynamic axes that really take 0 and 1 (decoder_inplace too)."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from seqserve.contract import names
from seqserve.export.inplace_decoder import CONTRIB_OPS, export_inplace_decoder
from seqserve.export.ort_io import CPU, cpu_session, inplace_step, random_decoder_feeds

CONTROL_FLOW = {"If", "Loop", "Scan", "SequenceMap"}
FLOAT16 = "float16"
ONNX_TYPES = {names.INT32: onnx.TensorProto.INT32, names.INT64: onnx.TensorProto.INT64,
              names.FLOAT32: onnx.TensorProto.FLOAT, FLOAT16: onnx.TensorProto.FLOAT16}
ORT_TYPES = {names.INT32: "tensor(int32)", names.INT64: "tensor(int64)", names.FLOAT32: "tensor(float)",
             FLOAT16: "tensor(float16)"}


@pytest.fixture(params=["small fp32", "tiny fp32", "tiny int8", "tiny fp16"])
def graphs(request, tmp_path_factory) -> tuple[dict, dict, str]:
    """({graph: path}, model config, variant) for the small random export or one variant of the tiny bundle;
    every graph of the contract, decoder_inplace included."""
    source, variant = request.param.split()
    if source == "small":
        directory, model = request.getfixturevalue("small_graphs"), request.getfixturevalue("small_model")
        cfg, inplace = model.cfg.to_dict(), tmp_path_factory.mktemp("small_inplace") / names.DECODER_INPLACE_FILE
        export_inplace_decoder(model, inplace)
        return {g: directory / names.graph_files(variant)[g] for g in names.GRAPHS} | {
            names.DECODER_INPLACE: inplace}, cfg, variant
    directory = request.getfixturevalue("full_bundle")
    cfg = json.loads((directory / "manifest.json").read_text())["model"]
    return {g: directory / names.graph_files(variant)[g] for g in names.ALL_GRAPHS}, cfg, variant


def _resolve(dims: list, cfg: dict) -> list:
    static = {names.HEADS: cfg["n_heads"], names.HEAD_DIM: cfg["d_model"] // cfg["n_heads"],
              names.VOCAB: cfg["vocab_size"], names.TOP: names.TOP_K}
    return [static.get(d, d) for d in dims]


def _declared(cfg: dict, variant: str) -> dict:
    """names.signature, with decoder_inplace's K/V buffers in float16 in the fp16 variant (past and present are one
    tensor, so no Cast may sit between them), which ends with the token-choice outputs (it is the CUDA graph)."""
    n = cfg["n_decoder_layers"]
    declared = names.signature(n)
    if variant == "fp16":
        kv = set(names.past_inputs(n) + names.cross_inputs(n) + names.present_outputs(n))
        inplace = declared[names.DECODER_INPLACE]
        declared[names.DECODER_INPLACE] = {k: (FLOAT16 if k in kv else t, d) for k, (t, d) in inplace.items()}
        declared[names.DECODER_INPLACE].update(names.token_choice_signature())
    return declared


def test_checker_names_dtypes_and_dimension_names(graphs):
    paths, cfg, variant = graphs
    declared = _declared(cfg, variant)
    assert set(paths) == set(names.ALL_GRAPHS) == set(declared)
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
    paths, _, _ = graphs
    for graph, path in paths.items():
        model = onnx.load(str(path))
        ops = {n.op_type for n in model.graph.node} | {n.op_type for f in model.functions for n in f.node}
        assert not ops & CONTROL_FLOW, (path.name, ops & CONTROL_FLOW)
        assert not any(a.type == onnx.AttributeProto.GRAPH for n in model.graph.node for a in n.attribute)
        opsets = {o.domain: o.version for o in model.opset_import}
        assert opsets[""] == 18
        if graph == names.DECODER_INPLACE:  # contrib ops: onnxruntime's com.microsoft domain, version 1
            assert opsets["com.microsoft"] == 1 and set(CONTRIB_OPS) <= ops


def test_loads_on_cpu_provider_with_declared_io(graphs):
    paths, cfg, variant = graphs
    declared = _declared(cfg, variant)
    for graph, path in paths.items():
        session = cpu_session(path)
        assert session.get_providers() == [CPU]
        io = session.get_inputs() + session.get_outputs()
        assert [(v.name, v.type) for v in io] == [(n, ORT_TYPES[t]) for n, (t, _) in declared[graph].items()]


@pytest.mark.parametrize("batch, past_len, src_len", [(0, 0, 1), (1, 0, 1), (1, 1, 7), (3, 1, 1)])
def test_dynamic_axes_take_zero_and_one(graphs, batch, past_len, src_len):
    """Exported with sizes 3 / 7 / 5; batch 0, past_len 0 and 1, src_len 1 run and give the declared shapes."""
    paths, cfg, _ = graphs
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


@pytest.mark.parametrize("batch, max_len, src_len", [(1, 1, 1), (1, 2, 7), (3, 1, 1), (3, 5, 2)])
def test_inplace_dynamic_axes_take_one(graphs, batch, max_len, src_len):
    """decoder_inplace: batch, max_len and src_len of 1 run, at the last column of the buffer, finite and shaped as
    declared. (Batch 0 is not run: onnxruntime 1.31's GroupQueryAttention dies of SIGFPE; inplace_step skips it.)"""
    paths, cfg, variant = graphs
    session = cpu_session(paths[names.DECODER_INPLACE])
    heads, head_dim, n = cfg["n_heads"], cfg["d_model"] // cfg["n_heads"], cfg["n_decoder_layers"]
    dtype = np.float16 if variant == "fp16" else np.float32
    kv = [np.zeros((batch, heads, max_len, head_dim), dtype) for _ in range(2 * n)]
    cross = [np.ones((batch, heads, src_len, head_dim), dtype) for _ in range(2 * n)]
    logits = inplace_step(session, np.full((batch, 1), 5), np.full(batch, max_len - 1), np.ones((batch, src_len)),
                          kv, cross)
    assert logits.shape == (batch, cfg["vocab_size"]) and logits.dtype == np.float32 and np.isfinite(logits).all()
    assert all(np.isfinite(buf).all() and buf[:, :, max_len - 1].any() for buf in kv)  # the last column written
    assert inplace_step(session, np.zeros((0, 1)), np.zeros(0), np.ones((0, src_len)), kv, cross).shape == (
        0, cfg["vocab_size"])
