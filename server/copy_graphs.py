"""The device cache's copies as tiny onnxruntime graphs (onnx_wire.py), bound by device pointer: nothing crosses the
bus. place: rows of an encoder output, first n source columns, padded with zeros to the cache's width, into slots;
copy: one slot's whole self K/V into another (a beam taking its parent's past). Each runs every layer's tensors in one
call; a session per tensor count and dtype is made on first use."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort

from seqserve.server import onnx_wire as w
from seqserve.server.device import Device

_END, _PADS, _ZERO, _AXIS = "end", "pads", "zero", "axis"


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
            else:
                nodes, inits = [w.node("Identity", [f"x{i}"], [f"y{i}"]) for i in range(k)], []
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

    def copy_rows(self, buffers: list, src: int, dst: int, row_bytes: int) -> None:
        """buffers[j][dst] = buffers[j][src] (every j), whole rows of row_bytes bytes."""
        session, where = self._session("copy", len(buffers)), self.device.ort_device
        binding = session.io_binding()
        row = row_bytes // self.dtype.itemsize
        for i, buf in enumerate(buffers):
            binding.bind_input(f"x{i}", where, 0, self.dtype, [1, 1, 1, row], buf.data_ptr() + src * row_bytes)
            binding.bind_output(f"y{i}", where, 0, self.dtype, [1, 1, 1, row], buf.data_ptr() + dst * row_bytes)
        session.run_with_iobinding(binding)


_DTYPES = {"tensor(float)": np.dtype(np.float32), "tensor(float16)": np.dtype(np.float16)}
