"""Tiny ONNX graphs written straight in protobuf's wire format: the device cache's copy graphs (device_cache.py) are
built at run time, and the server does not depend on the onnx package (an export and test dependency).

Only what those graphs use: nodes with int / ints attributes, typed inputs and outputs with named or fixed dimensions,
int64 initializers, one default-domain opset. Field numbers are onnx.proto's.
"""
from __future__ import annotations

import numpy as np

IR_VERSION, OPSET = 10, 18
ELEM = {np.dtype(np.float32): 1, np.dtype(np.int64): 7, np.dtype(np.float16): 10, np.dtype(np.int32): 6}
_INT, _INTS = 2, 7  # AttributeProto.type


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # two's complement for negative int64
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _key(field: int, wire: int) -> bytes:
    return _varint(field << 3 | wire)


def _int(field: int, n: int) -> bytes:
    return _key(field, 0) + _varint(n)


def _bytes(field: int, data: bytes | str) -> bytes:
    data = data.encode() if isinstance(data, str) else data
    return _key(field, 2) + _varint(len(data)) + data


def node(op: str, inputs: list[str], outputs: list[str], **attrs: int | list[int]) -> bytes:
    body = b"".join(_bytes(1, i) for i in inputs) + b"".join(_bytes(2, o) for o in outputs)
    body += _bytes(3, f"{op}_{outputs[0]}") + _bytes(4, op)
    for name, value in attrs.items():
        if isinstance(value, int):
            attr = _bytes(1, name) + _int(3, value) + _int(20, _INT)
        else:
            attr = _bytes(1, name) + b"".join(_int(8, v) for v in value) + _int(20, _INTS)
        body += _bytes(5, attr)
    return body


def value(name: str, dtype, dims: list[int | str]) -> bytes:
    shape = b"".join(_bytes(1, _int(1, d) if isinstance(d, int) else _bytes(2, d)) for d in dims)
    tensor = _int(1, ELEM[np.dtype(dtype)]) + _bytes(2, shape)
    return _bytes(1, name) + _bytes(2, _bytes(1, tensor))


def initializer(name: str, array: np.ndarray) -> bytes:
    array = np.ascontiguousarray(array, array.dtype.newbyteorder("<"))  # raw_data is little-endian
    dims = b"".join(_int(1, d) for d in array.shape)
    return dims + _int(2, ELEM[array.dtype]) + _bytes(8, name) + _bytes(9, array.tobytes())


def model(name: str, nodes: list[bytes], inputs: list[bytes], outputs: list[bytes],
          initializers: list[bytes] = ()) -> bytes:
    """A serialised ModelProto onnxruntime.InferenceSession takes as bytes."""
    graph = b"".join(_bytes(1, n) for n in nodes) + _bytes(2, name)
    graph += b"".join(_bytes(5, t) for t in initializers)
    graph += b"".join(_bytes(11, v) for v in inputs) + b"".join(_bytes(12, v) for v in outputs)
    opset = _bytes(1, "") + _int(2, OPSET)
    return _int(1, IR_VERSION) + _bytes(2, "seqserve.server") + _bytes(7, graph) + _bytes(8, opset)

