"""A loaded graph against the manifest: its static dimensions, and a probe at the manifest's positional limit.

The manifest's model config drives the server (cache shapes, request limits); a graph that disagrees would fail in
the middle of serving (a KV-cache concatenation, or a positional-table lookup out of range), so it is refused at load.
"""
from __future__ import annotations

import numpy as np

from seqserve.contract import names

ENCODER, DECODER = names.GRAPHS
_FLOATS = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


class GraphMismatch(ValueError):
    """The graph disagrees with the manifest (the caller adds the file name)."""


def kv_names(n_layers: int) -> set[str]:
    """Every K/V input or output name: (batch, heads, length, head_dim) tensors."""
    kv = set(names.encoder_outputs(n_layers))
    for i in range(n_layers):
        for k in names.KINDS:
            kv |= {names.past_input(i, k), names.cross_input(i, k), names.present_output(i, k)}
    return kv


def check_dims(session, model: dict) -> None:
    """heads and head_dim of every K/V tensor, and vocab of the logits, equal the manifest's (static dimensions)."""
    heads, head_dim, vocab = model["n_heads"], names.head_dim(model), model["vocab_size"]
    kv = kv_names(model["n_decoder_layers"])
    for arg in [*session.get_inputs(), *session.get_outputs()]:
        shape = list(arg.shape)
        if arg.name in kv and len(shape) == 4:
            for axis, want, what in ((1, heads, "model.n_heads"), (3, head_dim, "model.d_kv or d_model / n_heads")):
                if isinstance(shape[axis], int) and shape[axis] != want:
                    raise GraphMismatch(f"{arg.name} has {shape[axis]} at axis {axis} (shape {shape}) but the "
                                        f"manifest's {what} is {want}")
        if arg.name == names.LOGITS and isinstance(shape[-1], int) and shape[-1] != vocab:
            raise GraphMismatch(f"{arg.name} has {shape[-1]} classes but the manifest's model.vocab_size is {vocab}")
    check_token_choice(session)


def check_token_choice(session) -> None:
    """A graph's token-choice outputs, if it has any: all of them, with their types and TOP_K candidates a row."""
    outputs = {o.name: o for o in session.get_outputs()}
    present = [n for n in names.TOKEN_CHOICE_OUTPUTS if n in outputs]
    if present and len(present) != len(names.TOKEN_CHOICE_OUTPUTS):
        raise GraphMismatch(f"has token-choice outputs {present} but not all of {list(names.TOKEN_CHOICE_OUTPUTS)}")
    types = {names.INT64: "tensor(int64)", names.FLOAT32: "tensor(float)"}
    for name in present:
        dtype, dims = names.token_choice_signature()[name]
        shape = list(outputs[name].shape)
        if outputs[name].type != types[dtype] or len(shape) != len(dims):
            raise GraphMismatch(f"{name} is {outputs[name].type} {shape}, expected {dtype} {dims}")
        if len(dims) == 2 and shape[1] != names.TOP_K:
            raise GraphMismatch(f"{name} has {shape[1]} candidates a row, expected names.TOP_K={names.TOP_K}")


def probe(session, graph: str, model: dict, special: dict) -> None:
    """One run at the manifest's max_positions: the encoder reads a source that long, the decoder steps at the last
    position. A positional table shorter than the manifest claims fails here, not on a client's request."""
    longest = model["max_positions"]
    inputs = {i.name: i for i in session.get_inputs()}
    if graph == ENCODER and set(inputs) == set(names.encoder_inputs()):
        feeds = {names.INPUT_IDS: np.full((1, longest), special["unk_id"], np.int64),
                 names.ATTENTION_MASK: np.ones((1, longest), np.int64)}
    elif graph == DECODER and set(inputs) == set(names.decoder_inputs(model["n_decoder_layers"])):
        feeds = _decoder_feeds(inputs, model, special, position=longest - 1)
    else:  # another graph kind (its own inputs): the dimension check still applied
        return
    try:
        session.run(None, feeds)
    except Exception as exc:  # onnxruntime raises its own exception types
        message = str(exc).split("Status Message:")[-1].strip().splitlines()[0][:200]
        raise GraphMismatch(f"cannot run at the manifest's model.max_positions={longest} ({message}): the "
                            "manifest overstates what the graph supports") from None


def _decoder_feeds(inputs: dict, model: dict, special: dict, position: int) -> dict:
    heads, head_dim = model["n_heads"], names.head_dim(model)
    feeds = {names.DECODER_INPUT_IDS: np.array([[special["bos_id"]]], np.int64),
             names.POSITION_IDS: np.array([[position]], np.int64),
             names.DECODER_ATTENTION_MASK: np.ones((1, 1), np.int64),  # no past: the new token alone
             names.ENCODER_ATTENTION_MASK: np.ones((1, 1), np.int64)}
    past = {names.past_input(i, k) for i in range(model["n_decoder_layers"]) for k in names.KINDS}
    for name, arg in inputs.items():
        if name not in feeds:
            length = 0 if name in past else 1  # an empty self-attention past, a one-token source
            feeds[name] = np.zeros((1, heads, length, head_dim), _FLOATS.get(arg.type, np.float32))
    return feeds


def check_graph(session, graph: str, manifest) -> None:
    """Raises GraphMismatch naming the disagreement."""
    check_dims(session, manifest.model)
    probe(session, graph, manifest.model, manifest.special_tokens)
