"""decoder_inplace.onnx's KV cache: self-attention K/V preallocated per slot, written in place by the graph itself.

Layout: per layer and kind a (C, H, L, Dh) buffer for C slots and L = the bundle's max_new_tokens; row b's cached
tokens are columns [0, n_b) and the step writes column n_b (GroupQueryAttention with present bound to the past's
memory). Cross-attention K/V (C, H, W, Dh) hold each row's source right-padded to W, the longest live source, with a
(C, W) mask. A step runs on slots [0, hi) only: the first hi rows of every buffer are contiguous, so they are bound as
they are, without a copy.

Nothing is copied when a row joins (its cross K/V go into its slot; its stale self K/V beyond n_b = 0 are never read),
when it leaves, or when a step appends a token. Only a longer source than any live one widens the cross buffers.
"""
from __future__ import annotations

import numpy as np
import onnxruntime as ort

from seqserve.contract import names
from seqserve.engine.runtime.device import Device
from seqserve.engine.runtime.slots import Slots
from seqserve.engine.step_output import FETCHES, Need, StepOutput


class InPlaceCache:
    graph = names.DECODER_INPLACE

    def __init__(self, device: Device, n_layers: int, heads: int, head_dim: int, capacity: int, max_len: int,
                 vocab: int, dtype=np.float32) -> None:
        if device.ort_device != "cpu":  # the buffers are host arrays written with numpy; see docs/architecture.md
            raise ValueError("the in-place KV cache runs on the CPU provider; use --kv-cache concat on CUDA")
        self.device, self.n_layers, self.heads, self.head_dim, self.dtype = device, n_layers, heads, head_dim, dtype
        shape = (capacity, heads, max_len, head_dim)
        self.self_kv = [np.zeros(shape, dtype) for _ in range(2 * n_layers)]  # (C, H, L, Dh): K0, V0, K1, V1, ...
        self._self_row_bytes = sum(b[0].nbytes for b in self.self_kv)
        self._ids = np.zeros((capacity, 1), np.int64)  # (C, 1) step inputs, refilled in place every step
        self._lens = np.zeros(capacity, np.int32)  # (C,)
        self._total = np.zeros((), np.int32)  # scalar: the longest row's length after this step
        self._logits = np.zeros((capacity, vocab), np.float32)  # (C, V) the step writes its output here
        self._outputs = {names.LOGITS: self._logits, names.NEXT_TOKEN_IDS: np.zeros(capacity, np.int64),  # (C,)
                         names.TOP_TOKEN_IDS: np.zeros((capacity, names.TOP_K), np.int64),  # (C, K)
                         names.TOP_LOGPROBS: np.zeros((capacity, names.TOP_K), np.float32)}  # (C, K)
        self._rows = np.arange(capacity)
        self._bindings: dict[tuple[int, int, Need], object] = {}
        self._reset_cross(capacity, 0)
        self._past, self._present = names.past_inputs(n_layers), names.present_outputs(n_layers)
        self._cross_names = names.cross_inputs(n_layers)

    def _reset_cross(self, capacity: int, width: int) -> None:
        self._bindings = {}  # they point into the buffers being replaced
        self.cross = [np.zeros((capacity, self.heads, width, self.head_dim), self.dtype)
                      for _ in range(2 * self.n_layers)]  # (C, H, W, Dh)
        self.src_mask = np.zeros((capacity, width), np.int64)  # (C, W) 1 = a source token of the slot's row

    @property
    def capacity(self) -> int:
        return self.self_kv[0].shape[0]

    @property
    def width(self) -> int:
        return self.src_mask.shape[1]

    def nbytes(self, live_rows: int) -> int:
        """Bytes reserved for the live rows (their self K/V buffers and cross K/V); the preallocated rest of the
        capacity is free, so an idle server reports 0."""
        return live_rows * (self._self_row_bytes + sum(c[0].nbytes for c in self.cross))

    def admit(self, crosses: list[list[np.ndarray]], into: list[int], empty: bool = False) -> None:
        """New rows' encoder K/V [(H, Sn, Dh) per layer and kind] go into their slots. empty: no other row is live,
        so the width may also shrink (only when more than twice what the new rows need: a width kept across requests
        keeps the step's IO bindings, which cost more to rebuild than a few padded source columns)."""
        width = max(c[0].shape[1] for c in crosses)
        if empty and self.width > 2 * width:
            self._reset_cross(self.capacity, width)
        if width > self.width:  # a longer source than any live one: widen (the only copy this cache makes)
            old_cross, old_mask, old_width = self.cross, self.src_mask, self.width
            self._reset_cross(self.capacity, width)
            for new, old in zip(self.cross, old_cross):
                new[:, :, :old_width] = old
            self.src_mask[:, :old_width] = old_mask
        for slot, cross in zip(into, crosses):
            n = cross[0].shape[1]
            for buf, kv in zip(self.cross, cross):
                buf[slot, :, :n] = kv
            self.src_mask[slot] = 0
            self.src_mask[slot, :n] = 1

    def release(self, slots: list[int]) -> None:
        self.src_mask[slots] = 0  # a free slot attends to no source: finite, ignored logits

    def after_leave(self, slots: Slots) -> None:
        """Nothing to do: rows never move, and a free slot's stale K/V are never read."""

    def reorder(self, dst: np.ndarray, src: np.ndarray, columns: int, shared: np.ndarray) -> None:
        """Beam search: rows dst take over the first `columns` self K/V columns of rows src, in place (dst and src are
        disjoint: Runner.reorder; the columns past a row's length are never read). A pair's first `shared` columns
        are skipped: both beams computed them from the same tokens in the same steps, so they are already equal
        where the graph's arithmetic does not depend on a row's place in the batch (Runner: int8 only; zeros
        otherwise). Beams share most of their prefix, so most of the copy goes. Row by row: one fancy-indexed copy
        of the pairs that diverged at the same column took longer, and of all rows, 1.4x the time."""
        pairs = [(d, s, c) for d, s, c in zip(dst.tolist(), src.tolist(), shared.tolist()) if c < columns]
        for buf in self.self_kv:
            for d, s, c in pairs:
                buf[d, :, c:columns] = buf[s, :, c:columns]

    def run(self, decoder, slots: Slots, rows: np.ndarray | None = None, need: Need = Need.LOGITS) -> StepOutput:
        """One step for slots [0, hi) in place (rows=None), or for some rows alone on copies of their buffers (a probe,
        which changes nothing). Returns what `need` asks for (step_output.py; the real step's arrays are valid until
        the next step); a decoder without the token-choice outputs is only asked for LOGITS."""
        if rows is not None:
            return StepOutput(self._probe(decoder, slots, rows))
        n = slots.hi
        self._ids[:n, 0] = slots.ids[self._rows[:n], slots.length[:n]]  # (n, 1) each row's last token
        self._lens[:n] = slots.length[:n]  # (n,) each row's cached tokens = its position and the column written
        self._total[...] = self._lens[:n].max() + 1
        binding = self._bindings.get((n, self.width, need)) or self._bind(decoder, n, need)
        decoder.run_with_iobinding(binding)
        fetched = {name: self._outputs[name][:n] for name in FETCHES[need]}
        return StepOutput(fetched.get(names.LOGITS), fetched.get(names.NEXT_TOKEN_IDS),
                          fetched.get(names.TOP_TOKEN_IDS), fetched.get(names.TOP_LOGPROBS))

    def _bind(self, decoder, n: int, need: Need):
        """An IO binding of every input and output for a batch of n, by pointer into this cache's fixed arrays: a step
        only refills the arrays, so it binds nothing (kept per (n, width, need); a wider source drops them all).
        Only the outputs `need` reads are bound: the others stay in onnxruntime's own memory."""
        binding = decoder.io_binding()
        fixed = [(names.DECODER_INPUT_IDS, self._ids), (names.PAST_SEQ_LENS, self._lens),
                 (names.ENCODER_ATTENTION_MASK, self.src_mask), *zip(self._cross_names, self.cross)]
        for name, array in fixed:
            binding.bind_input(name, "cpu", 0, array.dtype, (n, *array.shape[1:]), array.ctypes.data)
        binding.bind_input(names.TOTAL_SEQ_LEN, "cpu", 0, self._total.dtype, [], self._total.ctypes.data)
        for past, present, buf in zip(self._past, self._present, self.self_kv):
            shape = (n, *buf.shape[1:])  # the graph writes each row's new column into the buffer itself
            binding.bind_input(past, "cpu", 0, buf.dtype, shape, buf.ctypes.data)
            binding.bind_output(present, "cpu", 0, buf.dtype, shape, buf.ctypes.data)
        for name in FETCHES[need]:
            out = self._outputs[name]
            binding.bind_output(name, "cpu", 0, out.dtype, (n, *out.shape[1:]), out.ctypes.data)
        self._bindings[(n, self.width, need)] = binding
        return binding

    def _probe(self, decoder, slots: Slots, rows: np.ndarray) -> np.ndarray:
        return probe_rows(decoder, slots, rows, self.src_mask, zip(self._past, self._present, self.self_kv),
                          zip(self._cross_names, self.cross))


def probe_rows(decoder, slots: Slots, rows: np.ndarray, src_mask: np.ndarray, self_kv, cross) -> np.ndarray:
    """The step for these rows alone, on host copies of their buffers (a failure path: copies are fine here); self_kv
    is (past name, present name, buffer) per layer, cross (input name, buffer), each buffer (slots, ...) as numpy."""
    lens = slots.length[rows].astype(np.int32)  # (B,)
    binding = decoder.io_binding()
    binding.bind_output(names.LOGITS, "cpu")
    binding.bind_cpu_input(names.DECODER_INPUT_IDS, slots.ids[rows, slots.length[rows]].reshape(-1, 1))
    binding.bind_cpu_input(names.PAST_SEQ_LENS, lens)
    binding.bind_cpu_input(names.TOTAL_SEQ_LEN, np.array(int(lens.max()) + 1, np.int32))
    binding.bind_cpu_input(names.ENCODER_ATTENTION_MASK, src_mask[rows])
    for past, present, buf in self_kv:
        copy = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(buf[rows]))  # a probe writes into its own copy
        binding.bind_ortvalue_input(past, copy)
        binding.bind_ortvalue_output(present, copy)
    for name, buf in cross:
        binding.bind_cpu_input(name, np.ascontiguousarray(buf[rows]))
    decoder.run_with_iobinding(binding)
    return binding.get_outputs()[0].numpy()
