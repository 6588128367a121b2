"""The one place naming the ONNX graphs' inputs, outputs and dimensions (export, server and tests import it).

Names follow optimum's convention: `past_key_values.{i}.decoder.key` in, `present.{i}.decoder.key` out.
Dimension names are the same in shape comments, ONNX dynamic axes and tests.
"""
from __future__ import annotations

# Dimensions: `heads`, `head_dim` and `vocab` are static (fixed by the model config).
BATCH, SRC_LEN, PAST_LEN = "batch", "src_len", "past_len"
TOTAL_LEN = "past_len + 1"  # the name the dynamo exporter derives for present K/V
MAX_LEN = "max_len"  # decoder_inplace: the preallocated self-attention K/V buffers' length (the runner chooses it)
HEADS, HEAD_DIM, VOCAB = "heads", "head_dim", "vocab"


def head_dim(model: dict) -> int:
    """A manifest model's head width: d_kv (T5, where n_heads * d_kv may differ from d_model) or d_model / n_heads."""
    return model.get("d_kv") or model["d_model"] // model["n_heads"]


ENCODER_FILE = "encoder.onnx"
DECODER_FILE = "decoder.onnx"
DECODER_INPLACE_FILE = "decoder_inplace.onnx"
ENCODER, DECODER, DECODER_INPLACE = "encoder", "decoder", "decoder_inplace"
GRAPHS = (ENCODER, DECODER)  # every bundle has these; decoder is the plain-ONNX step (concatenated K/V cache)
OPTIONAL_GRAPHS = (DECODER_INPLACE,)  # in-place K/V cache with com.microsoft contrib ops (a bundle may lack it)
ALL_GRAPHS = GRAPHS + OPTIONAL_GRAPHS
# Which decoder graph the engine runs: inplace (decoder_inplace), concat (decoder), or auto: inplace when the bundle
# has it and the provider is the CPU (onnxruntime's CUDA GroupQueryAttention takes only fp16/bf16).
KV_CACHES = ("auto", "inplace", "concat")
# A decoder entry's manifest "kv_cache": concat = present is past plus a column (a new tensor every step);
# inplace = present is bound to past's own buffer, which the step writes one column of.
KV_CONCAT, KV_INPLACE = "concat", "inplace"


def graph_files(variant: str) -> dict[str, str]:
    """{graph: file} of a variant: encoder.onnx / decoder_inplace.onnx for fp32, encoder.int8.onnx for int8, ..."""
    if variant == "fp32":
        return {ENCODER: ENCODER_FILE, DECODER: DECODER_FILE, DECODER_INPLACE: DECODER_INPLACE_FILE}
    return {graph: f"{graph}.{variant}.onnx" for graph in ALL_GRAPHS}

# encoder.onnx inputs
INPUT_IDS = "input_ids"  # int64 [batch, src_len]
ATTENTION_MASK = "attention_mask"  # int64 [batch, src_len], 1 = token, 0 = padding

# decoder.onnx inputs (one step for the whole batch)
DECODER_INPUT_IDS = "input_ids"  # int64 [batch, 1]: each row's last token
POSITION_IDS = "position_ids"  # int64 [batch, 1]: each row's own absolute position
DECODER_ATTENTION_MASK = "decoder_attention_mask"  # int64 [batch, past_len + 1]: 1 = a real past slot or the new token
ENCODER_ATTENTION_MASK = "encoder_attention_mask"  # int64 [batch, src_len]

# decoder_inplace.onnx inputs besides DECODER_INPUT_IDS and ENCODER_ATTENTION_MASK (its K/V names are the decoder's).
# Row b's cached tokens sit in columns [0, n_b) of its K/V buffers; the step writes column n_b in place and reads
# only [0, n_b], so columns beyond a row's length may hold anything (a previous row's K/V). onnxruntime checks
# neither n_b < max_len (it writes out of bounds) nor batch > 0 (its CPU kernel dies of SIGFPE): callers must.
PAST_SEQ_LENS = "past_sequence_lengths"  # int32 [batch]: n_b, the new token's position and K/V column
TOTAL_SEQ_LEN = "total_sequence_length"  # int32 scalar []: max(n_b) + 1

LOGITS = "logits"  # float32 [batch, vocab]

# Token choice computed in the graph from the logits, so a GPU step copies ids to the host instead of the logits.
# A decoder graph has all three or none (a bundle exported before them: the server chooses from the logits).
NEXT_TOKEN_IDS = "next_token_ids"  # int64 [batch]: each row's argmax (ties: the lower id, as numpy's argmax)
TOP_TOKEN_IDS = "top_token_ids"  # int64 [batch, top_k]: each row's TOP_K best ids, best first, ties: the lower id
TOP_LOGPROBS = "top_logprobs"  # float32 [batch, top_k]: their log_softmax, computed in float32 in every variant
TOKEN_CHOICE_OUTPUTS = (NEXT_TOKEN_IDS, TOP_TOKEN_IDS, TOP_LOGPROBS)
TOP_K = 16  # beams keep 2 x num_beams candidates a row: covers num_beams <= 8 (the server's default max_num_beams)
TOP = "top_k"  # the dimension name of TOP_TOKEN_IDS / TOP_LOGPROBS (static: TOP_K)

KINDS = ("key", "value")


def cross_output(layer: int, kind: str) -> str:
    """encoder.onnx output: a decoder layer's cross-attention K or V, float [batch, heads, src_len, head_dim]."""
    return f"present.{layer}.encoder.{kind}"


def cross_input(layer: int, kind: str) -> str:
    """decoder.onnx input fed from cross_output(layer, kind)."""
    return f"past_key_values.{layer}.encoder.{kind}"


def past_input(layer: int, kind: str) -> str:
    """decoder.onnx input: self-attention K or V so far, float [batch, heads, past_len, head_dim]."""
    return f"past_key_values.{layer}.decoder.{kind}"


def present_output(layer: int, kind: str) -> str:
    """decoder.onnx output: past plus this step, float [batch, heads, past_len + 1, head_dim]."""
    return f"present.{layer}.decoder.{kind}"


def past_inputs(n_layers: int) -> list[str]:
    return [past_input(i, k) for i in range(n_layers) for k in KINDS]


def cross_inputs(n_layers: int) -> list[str]:
    return [cross_input(i, k) for i in range(n_layers) for k in KINDS]


def present_outputs(n_layers: int) -> list[str]:
    return [present_output(i, k) for i in range(n_layers) for k in KINDS]


def encoder_inputs() -> list[str]:
    return [INPUT_IDS, ATTENTION_MASK]


def encoder_outputs(n_layers: int) -> list[str]:
    return [cross_output(i, k) for i in range(n_layers) for k in KINDS]


def decoder_inputs(n_layers: int) -> list[str]:
    return [DECODER_INPUT_IDS, POSITION_IDS, DECODER_ATTENTION_MASK, ENCODER_ATTENTION_MASK] + past_inputs(
        n_layers) + cross_inputs(n_layers)


def decoder_outputs(n_layers: int) -> list[str]:
    return [LOGITS] + present_outputs(n_layers)


def decoder_inplace_inputs(n_layers: int) -> list[str]:
    """Past self-attention K/V [batch, heads, max_len, head_dim] are the very buffers the step writes (IO binding)."""
    return [DECODER_INPUT_IDS, PAST_SEQ_LENS, TOTAL_SEQ_LEN, ENCODER_ATTENTION_MASK] + past_inputs(
        n_layers) + cross_inputs(n_layers)


def decoder_inplace_outputs(n_layers: int) -> list[str]:
    """present.{i}.decoder.* [batch, heads, max_len, head_dim]: bind each to its past input's buffer."""
    return decoder_outputs(n_layers)


def token_choice_signature() -> dict[str, tuple[str, list]]:
    """The token-choice outputs' element types and dimensions (a decoder graph may end with them)."""
    return {NEXT_TOKEN_IDS: (INT64, [BATCH]), TOP_TOKEN_IDS: (INT64, [BATCH, TOP]),
            TOP_LOGPROBS: (FLOAT32, [BATCH, TOP])}


def kv_dims(length: str) -> list[str]:
    return [BATCH, HEADS, length, HEAD_DIM]


INT32, INT64, FLOAT32 = "int32", "int64", "float32"


def signature(n_layers: int) -> dict[str, dict[str, tuple[str, list]]]:
    """Every graph input/output's declared element type and dimensions, by graph then name, in graph order.

    Dynamic dimensions by their name; static ones by HEADS / HEAD_DIM / VOCAB (fixed by the config) or the literal 1.
    """
    def kv(length: str) -> tuple[str, list]:
        return FLOAT32, kv_dims(length)

    encoder = {INPUT_IDS: (INT64, [BATCH, SRC_LEN]), ATTENTION_MASK: (INT64, [BATCH, SRC_LEN])}
    encoder.update({name: kv(SRC_LEN) for name in encoder_outputs(n_layers)})
    decoder = {DECODER_INPUT_IDS: (INT64, [BATCH, 1]), POSITION_IDS: (INT64, [BATCH, 1]),
               DECODER_ATTENTION_MASK: (INT64, [BATCH, TOTAL_LEN]), ENCODER_ATTENTION_MASK: (INT64, [BATCH, SRC_LEN])}
    decoder.update({past_input(i, k): kv(PAST_LEN) for i in range(n_layers) for k in KINDS})
    decoder.update({cross_input(i, k): kv(SRC_LEN) for i in range(n_layers) for k in KINDS})
    decoder[LOGITS] = (FLOAT32, [BATCH, VOCAB])
    decoder.update({present_output(i, k): kv(TOTAL_LEN) for i in range(n_layers) for k in KINDS})
    inplace = {DECODER_INPUT_IDS: (INT64, [BATCH, 1]), PAST_SEQ_LENS: (INT32, [BATCH]), TOTAL_SEQ_LEN: (INT32, []),
               ENCODER_ATTENTION_MASK: (INT64, [BATCH, SRC_LEN])}
    inplace.update({past_input(i, k): kv(MAX_LEN) for i in range(n_layers) for k in KINDS})
    inplace.update({cross_input(i, k): kv(SRC_LEN) for i in range(n_layers) for k in KINDS})
    inplace[LOGITS] = (FLOAT32, [BATCH, VOCAB])
    inplace.update({present_output(i, k): kv(MAX_LEN) for i in range(n_layers) for k in KINDS})
    return {ENCODER: encoder, DECODER: decoder, DECODER_INPLACE: inplace}
