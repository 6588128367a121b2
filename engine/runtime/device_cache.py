"""decoder_inplace's KV cache with every buffer an onnxruntime OrtValue on the session's device: on CUDA a step moves
only each row's last id and length to the device and the ids it needs back (step_output.py); on the CPU the same code
runs on 'cpu' OrtValues.

Layout and rules are InPlaceCache's (inplace_cache.py): per layer and kind a (C, H, L, Dh) self K/V buffer written in
place by GroupQueryAttention, (C, H, W, Dh) cross K/V with a (C, W) source mask, a step on slots [0, n) bound by
pointer. What InPlaceCache does with numpy here runs as a tiny graph on the device (copy_graphs.py): a joining row's
cross K/V go from the encoder's output into its slot (Slice + Pad), beams' rows from their parents' (Gather and
ScatterND).
With CUDA graphs (Device.cuda_graphs) a step is padded to a batch bucket, its inputs live at fixed device addresses
and total_sequence_length is pinned to L, so one captured graph per bucket replays every step.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from seqserve.contract import names
from seqserve.engine.runtime.copy_graphs import CopyGraphs
from seqserve.engine.runtime.device import Device
from seqserve.engine.runtime.inplace_cache import probe_rows
from seqserve.engine.runtime.slots import Slots
from seqserve.engine.step_output import FETCHES, Need, StepOutput


@dataclass(frozen=True)
class DeviceCross:
    """A source's cross K/V still in the encoder's output on the device: row `row` of (B, H, S, Dh), n tokens."""

    values: list  # OrtValues (B, H, S, Dh) per layer and kind
    row: int
    n: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.n, self.values[0].shape()[2]


CAPTURE_RUNS = 2  # onnxruntime runs a graph id once as usual, then captures it


def buckets(capacity: int) -> list[int]:
    """The batch sizes a CUDA-graph step is padded to: powers of two, then the capacity."""
    out, b = [], 1
    while b < capacity:
        out.append(b)
        b *= 2
    return out + [capacity]


class DeviceInPlaceCache:
    graph = names.DECODER_INPLACE
    device_resident = True  # the runner keeps encoder outputs on the device (DeviceCross) for admit

    def __init__(self, device: Device, n_layers: int, heads: int, head_dim: int, capacity: int, max_len: int,
                 vocab: int, dtype=np.float32, width: int = 0) -> None:
        self.device, self.n_layers, self.heads, self.head_dim = device, n_layers, heads, head_dim
        self.dtype, self.max_len, self.vocab = np.dtype(dtype), max_len, vocab
        self.graphs = CopyGraphs(device, self.dtype)
        self.self_kv = [self._zeros((capacity, heads, max_len, head_dim), self.dtype) for _ in range(2 * n_layers)]
        self._row_bytes = heads * max_len * head_dim * self.dtype.itemsize  # one slot of one self K/V buffer
        self._ids = self._zeros((capacity, 1), np.int64)  # (C, 1) step inputs, refilled in place every step
        self._lens = self._zeros((capacity,), np.int32)  # (C,)
        self._ids_host, self._lens_host = np.zeros((capacity, 1), np.int64), np.zeros(capacity, np.int32)
        self._total = np.zeros((), np.int32)  # a CPU input of GroupQueryAttention on every provider
        self._fixed_width = width  # CUDA graphs: the cross width never changes (0: grows with the sources)
        # Captured mode (CUDA graphs): steps padded to a bucket, total_sequence_length pinned to L, every output
        # bound (a captured graph has one set of addresses), one binding per bucket. The CPU tests set it by hand.
        self.captured = device.cuda_graphs
        self._outputs: dict[tuple[int, str], ort.OrtValue] = {}
        self._bindings: dict[tuple, object] = {}
        self._past, self._present = names.past_inputs(n_layers), names.present_outputs(n_layers)
        self._cross_names = names.cross_inputs(n_layers)
        self._reset_cross(capacity, width)

    def _zeros(self, shape, dtype) -> ort.OrtValue:
        return self.device.put(np.zeros(shape, dtype))

    def _reset_cross(self, capacity: int, width: int) -> None:
        self._bindings = {}  # they point into the buffers being replaced
        self.cross = [self._zeros((capacity, self.heads, width, self.head_dim), self.dtype)
                      for _ in range(2 * self.n_layers)]  # (C, H, W, Dh)
        self.src_mask = np.zeros((capacity, width), np.int64)  # (C, W) host copy of the mask
        self._mask = self.device.put(self.src_mask)  # (C, W) on the device
        self._mask_dirty = False

    @property
    def capacity(self) -> int:
        return self.src_mask.shape[0]

    @property
    def width(self) -> int:
        return self.src_mask.shape[1]

    def nbytes(self, live_rows: int) -> int:
        cross_row = 2 * self.n_layers * self.heads * self.width * self.head_dim * self.dtype.itemsize
        return live_rows * (2 * self.n_layers * self._row_bytes + cross_row)

    def admit(self, crosses: list, into: list[int], empty: bool = False) -> None:
        """New rows' cross K/V (DeviceCross, or host arrays [(H, Sn, Dh)] per layer and kind) go into their slots on
        the device; a longer source than any live one widens the buffers there (the same rules as InPlaceCache)."""
        width = max(_n(c) for c in crosses)
        if not self._fixed_width and empty and self.width > 2 * width:
            self._reset_cross(self.capacity, width)
        if width > self.width:
            if self._fixed_width:
                raise ValueError(f"a source of {width} tokens is longer than the cache's fixed width {self.width}")
            old, old_mask = self.cross, self.src_mask
            self._reset_cross(self.capacity, width)
            self.graphs.place(old, 0, old[0].shape()[2], self.cross, 0, self.capacity)  # every row, padded wider
            self.src_mask[:, : old_mask.shape[1]] = old_mask
        for slot, cross in zip(into, crosses):
            n = _n(cross)
            if not isinstance(cross, DeviceCross):  # host arrays (H, n, Dh): a probe or a caller without a device
                cross = DeviceCross([self.device.put(c[None]) for c in cross], 0, n)
            self.graphs.place(cross.values, cross.row, n, self.cross, slot, 1)
            self.src_mask[slot] = 0
            self.src_mask[slot, :n] = 1
        self._mask_dirty = True

    def release(self, slots: list[int]) -> None:
        self.src_mask[slots] = 0  # a free slot attends to no source: finite, ignored logits
        self._mask_dirty = True

    def after_leave(self, slots: Slots) -> None:
        """Nothing to do: rows never move, and a free slot's stale K/V are never read."""

    def reorder(self, dst: np.ndarray, src: np.ndarray, columns: int, shared: np.ndarray) -> None:
        """Beam search: rows dst take over rows src's self K/V on the device, by parent index in one call (dst and src
        are disjoint). Whole rows are copied: a row's buffer is contiguous, its first columns are not."""
        self.graphs.reorder(self.self_kv, np.asarray(src), np.asarray(dst))

    def run(self, decoder, slots: Slots, rows: np.ndarray | None = None, need: Need = Need.LOGITS) -> StepOutput:
        if rows is not None:
            return StepOutput(self._probe(decoder, slots, rows))
        hi = slots.hi
        n = self._batch(hi)
        self._ids_host[:hi, 0] = slots.ids[np.arange(hi), slots.length[:hi]]
        self._ids_host[hi:n] = 0
        self._lens_host[:hi], self._lens_host[hi:n] = slots.length[:hi], 0  # rows padded in: free slots, length 0
        self._ids.update_inplace(self._ids_host)
        self._lens.update_inplace(self._lens_host)
        if self._mask_dirty:
            self._mask.update_inplace(self.src_mask)
            self._mask_dirty = False
        self._total[...] = self.max_len if self.captured else self._lens_host[:n].max() + 1
        key = (n, self.width) if self.captured else (n, self.width, need)
        binding = self._bindings.get(key) or self._bind(decoder, n, need, key)
        decoder.run_with_iobinding(binding, self.device.run_options(n))
        got = {name: self._outputs[(n, name)].numpy()[:hi] for name in FETCHES[need]}  # the only device -> host copy
        return StepOutput(got.get(names.LOGITS), got.get(names.NEXT_TOKEN_IDS), got.get(names.TOP_TOKEN_IDS),
                          got.get(names.TOP_LOGPROBS))

    def _batch(self, hi: int) -> int:
        """The rows a step runs: hi, or the bucket above it when CUDA graphs replay one graph per bucket."""
        return next(b for b in buckets(self.capacity) if b >= hi) if self.captured else hi

    def capture(self, decoder, slots: Slots) -> int:
        """Warm-up with no row live: each bucket's graph is captured (onnxruntime captures on a graph id's second
        run and replays from then on). Free slots attend to nothing, so the runs change no row. Returns the buckets."""
        if not self.captured or slots.n_live:
            return 0
        hi = slots.hi
        for n in buckets(self.capacity):
            slots.hi = n
            for _ in range(CAPTURE_RUNS):
                self.run(decoder, slots)
        slots.hi = hi
        return len(buckets(self.capacity))

    def _output(self, n: int, name: str) -> ort.OrtValue:
        if (n, name) not in self._outputs:
            shape = {names.LOGITS: (n, self.vocab), names.NEXT_TOKEN_IDS: (n,)}.get(name, (n, names.TOP_K))
            dtype = np.float32 if name in (names.LOGITS, names.TOP_LOGPROBS) else np.int64
            self._outputs[(n, name)] = self._zeros(shape, dtype)
        return self._outputs[(n, name)]

    def _bind(self, decoder, n: int, need: Need, key: tuple):
        """Every input and output of a batch of n bound by device pointer (kept per key: (n, width, need), or
        (n, width) with every output bound when captured)."""
        binding, where = decoder.io_binding(), self.device.ort_device
        for name, value in [(names.DECODER_INPUT_IDS, self._ids), (names.PAST_SEQ_LENS, self._lens),
                            (names.ENCODER_ATTENTION_MASK, self._mask), *zip(self._cross_names, self.cross)]:
            shape = value.shape()
            binding.bind_input(name, where, 0, _np_type(value), [n, *shape[1:]], value.data_ptr())
        binding.bind_input(names.TOTAL_SEQ_LEN, "cpu", 0, np.int32, [], self._total.ctypes.data)
        for past, present, buf in zip(self._past, self._present, self.self_kv):
            shape = [n, *buf.shape()[1:]]  # the graph writes each row's new column into the buffer itself
            binding.bind_input(past, where, 0, self.dtype, shape, buf.data_ptr())
            binding.bind_output(present, where, 0, self.dtype, shape, buf.data_ptr())
        have = {o.name for o in decoder.get_outputs()}
        wanted = [name for name in (names.LOGITS, *names.TOKEN_CHOICE_OUTPUTS) if name in have] if self.captured \
            else FETCHES[need]
        for name in wanted:
            binding.bind_ortvalue_output(name, self._output(n, name))
        self._bindings[key] = binding
        return binding

    def _probe(self, decoder, slots: Slots, rows: np.ndarray) -> np.ndarray:
        """Rows alone on host copies of their buffers (inplace_cache.probe_rows)."""
        return probe_rows(decoder, slots, rows, self.src_mask,
                          [(past, present, buf.numpy()) for past, present, buf in zip(self._past, self._present,
                                                                                       self.self_kv)],
                          [(name, buf.numpy()) for name, buf in zip(self._cross_names, self.cross)])


def _n(cross) -> int:
    return cross.n if isinstance(cross, DeviceCross) else cross[0].shape[1]


_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64,
          "tensor(int32)": np.int32}


def _np_type(value: ort.OrtValue):
    return _TYPES[value.data_type()]
