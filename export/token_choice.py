"""The token-choice outputs of a decoder graph (contract/names.py): each row's argmax, and its TOP_K best ids with their
log-probabilities, computed on the device from the logits so a step copies ids to the host instead of (batch, vocab).

They go only into the graphs meant for CUDA (the fp16 decoder_inplace variant): onnxruntime's CPU ArgMax, TopK and
LogSoftmax take longer than numpy's argmax on the host (docs/architecture.md, "The device path").
"""
from __future__ import annotations

import numpy as np

from seqserve.contract import names

_K = "token_choice.k"


def add_token_choice(model):
    """Appends the token-choice nodes and outputs to a decoder graph whose `logits` output is float32 (in place).

    TopK ranks the logits themselves (ties: the lower id, as numpy does on the host), so float32 log_softmax
    rounding can never reorder two candidates; their log-probabilities are gathered from one LogSoftmax.
    model: an onnx.ModelProto (onnx is imported here only: verify reads variants without it)."""
    from onnx import TensorProto, helper, numpy_helper

    graph = model.graph
    outputs = [o.name for o in graph.output]
    if names.LOGITS not in outputs or any(n in outputs for n in names.TOKEN_CHOICE_OUTPUTS):
        raise ValueError(f"add_token_choice: needs a {names.LOGITS} output and no token-choice outputs yet")
    vocab = _vocab(graph)
    if vocab is not None and vocab < names.TOP_K:
        raise ValueError(f"add_token_choice: vocab {vocab} is smaller than TOP_K={names.TOP_K}")
    graph.initializer.append(numpy_helper.from_array(np.array([names.TOP_K], np.int64), _K))
    graph.node.extend([
        helper.make_node("ArgMax", [names.LOGITS], [names.NEXT_TOKEN_IDS], name="TokenChoice_ArgMax", axis=-1,
                         keepdims=0, select_last_index=0),  # (B,)
        helper.make_node("TopK", [names.LOGITS, _K], ["token_choice.top_logits", names.TOP_TOKEN_IDS],
                         name="TokenChoice_TopK", axis=-1, largest=1, sorted=1),  # (B, K) best first
        helper.make_node("LogSoftmax", [names.LOGITS], ["token_choice.log_softmax"], name="TokenChoice_LogSoftmax",
                         axis=-1),  # (B, V) float32
        helper.make_node("GatherElements", ["token_choice.log_softmax", names.TOP_TOKEN_IDS], [names.TOP_LOGPROBS],
                         name="TokenChoice_Gather", axis=-1),  # (B, K)
    ])
    elem = {names.INT64: TensorProto.INT64, names.FLOAT32: TensorProto.FLOAT}
    static = {names.TOP: names.TOP_K}
    for name, (dtype, dims) in names.token_choice_signature().items():
        graph.output.append(helper.make_tensor_value_info(name, elem[dtype], [static.get(d, d) for d in dims]))
    return model


def _vocab(graph) -> int | None:
    for out in graph.output:
        if out.name == names.LOGITS:
            dims = out.type.tensor_type.shape.dim
            return dims[-1].dim_value if dims and dims[-1].HasField("dim_value") else None
    return None
