"""Precision variants of the fp32 graphs: dynamic int8 for CPU, float16 weights with float32 I/O for GPU.

Each variant has the fp32 graphs' input/output names and float32 I/O types, so the server swaps one for another by
name (manifest.variants[name]) without changing anything else. onnx and the quantisation tools are imported only
where a variant is built: verify reads variants without them (onnx is a train/export dependency, not a serving one).
"""
from __future__ import annotations

import json
import logging
import tempfile
import warnings
from pathlib import Path

import numpy as np

from seqserve.contract import manifest as mf
from seqserve.contract import names
from seqserve.export.ort_io import cpu_session, random_decoder_feeds
from seqserve.export.token_choice import add_token_choice


def make_int8(src: Path, dst: Path) -> None:
    """int8 weights for every MatMul with a constant B; activations are quantised at run time (onnxruntime fuses
    each into DynamicQuantizeMatMul: uint8 activations x int8 weights, one scale per tensor).

    MatMulConstBOnly keeps attention's activation x activation products in float. DynamicQuantizeLinear picks one
    scale per tensor over the whole batch, so an int8 row's logits depend (slightly) on its batch mates.
    Only MatMul is quantised: a quantised embedding Gather made the tied output projection dequantize the whole
    table at every step. Transposed weights are folded first, so that projection is quantised too.
    """
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model = onnx.load(str(src))
    _fold_weight_transposes(model.graph)
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # the quantiser logs a pre-processing hint on the root logger for every graph
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folded = Path(tmp) / "folded.onnx"
            onnx.save(model, str(folded))
            # DefaultTensorType: ONNX shape inference cannot type the outputs of com.microsoft ops (decoder_inplace)
            quantize_dynamic(folded, dst, weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"],
                             extra_options={"MatMulConstBOnly": True, "DefaultTensorType": onnx.TensorProto.FLOAT})
    finally:
        root.setLevel(level)


def _fold_weight_transposes(graph) -> None:
    """MatMul(x, Transpose(W)) with W an initializer -> MatMul(x, W^T) with W^T an initializer of its own (the
    exporter writes the tied output projection that way; the quantiser takes only a constant B)."""
    from onnx import numpy_helper

    inits = {t.name: t for t in graph.initializer}
    transposed = {n.output[0]: n for n in graph.node if n.op_type == "Transpose" and n.input[0] in inits}
    for node in graph.node:
        if node.op_type == "MatMul" and node.input[1] in transposed:
            source = transposed[node.input[1]]
            perm = next((list(a.ints) for a in source.attribute if a.name == "perm"), None)
            weight = numpy_helper.to_array(inits[source.input[0]])
            name = f"{source.input[0]}.transposed"
            if name not in inits:
                inits[name] = numpy_helper.from_array(np.ascontiguousarray(weight.transpose(perm)), name)
                graph.initializer.append(inits[name])
            node.input[1] = name
    used = {i for n in graph.node for i in n.input}
    for out, node in transposed.items():  # a Transpose nobody reads any more
        if out not in used and out not in {o.name for o in graph.output}:
            graph.node.remove(node)


def make_fp16(src: Path, dst: Path) -> None:
    """float16 weights and activations; keep_io_types leaves every input and output float32 (Cast at the edges)."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # weights below fp16's range are flushed; the measured quality is the judge
        half = convert_float_to_float16(onnx.load(str(src)), keep_io_types=True)
    _topological_sort(half.graph)  # the converter appends the input Casts last, which onnx.checker refuses
    onnx.save(half, str(dst))


def make_fp16_inplace(src: Path, dst: Path) -> None:
    """decoder_inplace in float16 with float16 K/V buffers: past and present must stay one tensor (a Cast between
    them would copy), so only the logits keep float32. On CUDA, GroupQueryAttention runs only in float16/bfloat16.
    It is the CUDA graph, so it ends with the token-choice outputs, computed from the float32 logits."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        half = convert_float_to_float16(onnx.load(str(src)), keep_io_types=[names.LOGITS])
    _topological_sort(half.graph)
    add_token_choice(half)  # after the conversion: LogSoftmax stays float32
    onnx.save(half, str(dst))


def _topological_sort(graph) -> None:
    """Reorders nodes so each comes after the producers of its inputs (stable otherwise)."""
    ready = {""} | {v.name for v in graph.input} | {t.name for t in graph.initializer}
    pending, ordered = [_copy(n) for n in graph.node], []
    while pending:
        runnable = [n for n in pending if all(i in ready for i in n.input)]
        if not runnable:
            raise ValueError(f"graph has a cycle or a dangling input near node {pending[0].name!r}")
        for node in runnable:
            ready.update(node.output)
        ordered += runnable
        done = {id(n) for n in runnable}
        pending = [n for n in pending if id(n) not in done]
    del graph.node[:]
    graph.node.extend(ordered)


BUILDERS = {"int8": make_int8, "fp16": make_fp16}
INPLACE_BUILDERS = {"int8": make_int8, "fp16": make_fp16_inplace}
TOKEN_CHOICE_VARIANTS = ("fp16",)  # their decoder_inplace ends with the token-choice outputs (the CUDA graph)
KV_DTYPES = {"fp16": "float16"}  # decoder_inplace K/V buffers per variant (float32 otherwise)


def add_variant(directory: Path, manifest: mf.Manifest, variant: str) -> dict:
    """Writes a variant's graphs from the fp32 ones (decoder_inplace only if fp32 has it), checks them and lists
    them in manifest.variants, each with its fp32 entry's description (kv_cache, ...)."""
    if variant not in BUILDERS:
        raise ValueError(f"unknown variant {variant!r}; choose from {tuple(BUILDERS)}")
    import onnx

    fp32, out = names.graph_files("fp32"), names.graph_files(variant)
    entry: dict = {}
    for graph in [g for g in names.ALL_GRAPHS if g in manifest.variants["fp32"]]:
        src, dst = directory / fp32[graph], directory / out[graph]
        (INPLACE_BUILDERS if graph == names.DECODER_INPLACE else BUILDERS)[variant](src, dst)
        onnx.checker.check_model(str(dst), full_check=True)
        session = cpu_session(dst)  # refuses to load if an op has no CPU kernel at all
        mf.check_session_io(dst, session, graph, manifest)
        described = {k: v for k, v in manifest.variants["fp32"][graph].items() if k not in ("file", "sha256", "bytes")}
        if graph == names.DECODER_INPLACE:
            described["kv_dtype"] = KV_DTYPES.get(variant, "float32")
            if variant in TOKEN_CHOICE_VARIANTS:
                described["token_choice"] = list(names.TOKEN_CHOICE_OUTPUTS)
        _check_io_types(cpu_session(src), session, dst, manifest.n_layers, described.get("kv_dtype", "float32"))
        entry[graph] = mf.file_entry(directory, out[graph]) | described
    entry["quality"] = {}
    manifest.variants[variant] = entry
    return entry


def _check_io_types(reference, session, path: Path, n_layers: int, kv_dtype: str = "float32") -> None:
    """The fp32 graph's I/O types, except the decoder's K/V tensors in kv_dtype (decoder_inplace's float16 buffers)."""
    kv = set(names.past_inputs(n_layers) + names.cross_inputs(n_layers) + names.present_outputs(n_layers))
    kv_type = {"float32": "tensor(float)", "float16": "tensor(float16)"}[kv_dtype]
    want = [(v.name, kv_type if v.name in kv else v.type) for v in reference.get_inputs() + reference.get_outputs()]
    got = [(v.name, v.type) for v in session.get_inputs() + session.get_outputs()]
    choice = [(n, f"tensor({'int64' if t == names.INT64 else 'float'})")
              for n, (t, _) in names.token_choice_signature().items()]
    if got[len(want):] == choice and len(got) == len(want) + len(choice):  # the CUDA graph's token-choice outputs
        got = got[: len(want)]
    if got != want:
        raise mf.BundleError(f"{path}: input/output types {got} differ from fp32's {want}")


def cpu_kernel_precision(decoder: Path, model: dict) -> dict[str, list[str]]:
    """The op types the CPU provider actually ran in float16 and in float32 (Casts left out), from a profile.

    onnxruntime's CPU provider lacks float16 kernels for most compute ops; it inserts Casts and runs them in float32.
    """
    with tempfile.TemporaryDirectory() as tmp:
        session = cpu_session(decoder, profile_prefix=str(Path(tmp) / "profile"))
        session.run(None, random_decoder_feeds(model, batch=2, past_len=3, src_len=4))
        events = json.loads(Path(session.end_profiling()).read_text())
    ran: dict[str, set[str]] = {"float16": set(), "float32": set()}
    for event in events:
        args = event.get("args", {})
        op = args.get("op_name")
        if event.get("cat") != "Node" or not op or op == "Cast":
            continue
        types = {t for shape in args.get("input_type_shape", []) for t in shape}
        if "float16" in types:
            ran["float16"].add(op)
        elif "float" in types:
            ran["float32"].add(op)
    return {k: sorted(v) for k, v in ran.items()}


def _copy(node):
    copy = type(node)()
    copy.CopyFrom(node)
    return copy
