"""The device cache's copies as tiny onnxruntime graphs (onnx_wire.py), bound by device pointer: nothing crosses the
bus. place: rows of an encoder output, first n source columns, padded with zeros to the cache's width, into slots;
reorder: slots take over other slots' whole self K/V (beams taking their parents' past: Gather by parent index, then
ScatterND into the buffer itself). Each runs every layer's tensors in one call; a session per tensor count and dtype
is made on first use."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort

from seqserve.engine.runtime import onnx_proto as w
from seqserve.engine.runtime.device import Device

_END, _PADS, _ZERO, _AXIS, _SRC, _DST = "end", "pads", "zero", "axis", "src", "dst"


class CopyGraphs:
    def __init__(self, device: Device, dtype) -> None:
        self.device, self.dtype = device, np.dtype(dtype)
        self._sessions: dict[tuple[str, int, np.dtype], ort.InferenceSession] = {}

    def _session(self, kind: str, k: int, src=None) -> ort.InferenceSession:
        src = np.dtype(src or self.dtype)  # place: the encoder's float32 into float16 buffers casts on the way
        if (kind, k, src) not in self._sessions:
            dims = ["b", "h", "s", "d"]
            ins = [w.value(f"x{i}", src, dims) for i in range(k)]
            outs = [w.value(f"y{i}", self.dtype, ["b", "h", "w", "d"] if kind == "place" else dims) for i in range(k)]
            if kind == "place":  # y = Pad(Slice(x, [0], end, [2]), pads): the first n columns, zeros to the width
                ins += [w.value(_END, np.int64, [1]), w.value(_PADS, np.int64, [8])]
                cast = src != self.dtype
                nodes = [n for i in range(k) for n in (
                    w.node("Slice", [f"x{i}", _ZERO, _END, _AXIS], [f"s{i}"]),
                    *([w.node("Cast", [f"s{i}"], [f"c{i}"], to=w.ELEM[self.dtype])] if cast else []),
                    w.node("Pad", [f"c{i}" if cast else f"s{i}", _PADS], [f"y{i}"]))]
                inits = [w.initializer(_ZERO, np.zeros(1, np.int64)), w.initializer(_AXIS, np.array([2], np.int64))]
            else:  # y = ScatterND(x, dst, Gather(x, src)), y bound to x's memory: every row is read before any write
                ins += [w.value(_SRC, np.int64, ["n"]), w.value(_DST, np.int64, ["n", 1])]
                nodes = [n for i in range(k) for n in (w.node("Gather", [f"x{i}", _SRC], [f"g{i}"], axis=0),
                                                        w.node("ScatterND", [f"x{i}", _DST, f"g{i}"], [f"y{i}"]))]
                inits = []
            self._sessions[(kind, k, src)] = self.device.session_from_bytes(w.model(kind, nodes, ins, outs, inits))
        return self._sessions[(kind, k, src)]

    def place(self, src: list, row: int, n: int, dst: list, slot: int, count: int) -> None:
        """dst[j][slot : slot + count, :, :W] = src[j][row : row + count, :, :n] padded with zeros (every j)."""
        src_type = _DTYPES[src[0].data_type()]
        session, where = self._session("place", len(src), src_type), self.device.ort_device
        binding = session.io_binding()
        for i, (x, y) in enumerate(zip(src, dst)):
            (_, h, s, d), width = x.shape(), y.shape()[2]
            binding.bind_input(f"x{i}", where, 0, src_type, [count, h, s, d],
                               x.data_ptr() + row * h * s * d * src_type.itemsize)
            binding.bind_output(f"y{i}", where, 0, self.dtype, [count, h, width, d],
                                y.data_ptr() + slot * h * width * d * self.dtype.itemsize)
        binding.bind_cpu_input(_END, np.array([n], np.int64))
        binding.bind_cpu_input(_PADS, np.array([0, 0, 0, 0, 0, 0, width - n, 0], np.int64))
        session.run_with_iobinding(binding)

    def reorder(self, buffers: list, src: np.ndarray, dst: np.ndarray) -> None:
        """buffers[j][dst] = buffers[j][src] (every j), in place on the device."""
        session, where = self._session("reorder", len(buffers)), self.device.ort_device
        binding = session.io_binding()
        for i, buf in enumerate(buffers):
            shape = buf.shape()
            binding.bind_input(f"x{i}", where, 0, self.dtype, shape, buf.data_ptr())
            binding.bind_output(f"y{i}", where, 0, self.dtype, shape, buf.data_ptr())
        binding.bind_cpu_input(_SRC, np.ascontiguousarray(src, np.int64))
        binding.bind_cpu_input(_DST, np.ascontiguousarray(dst, np.int64).reshape(-1, 1))
        session.run_with_iobinding(binding)


_DTYPES = {"tensor(float)": np.dtype(np.float32), "tensor(float16)": np.dtype(np.float16)}
