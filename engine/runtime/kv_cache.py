"""The plain decoder.onnx's KV cache (the fallback for providers without onnxruntime's contrib attention ops): one
padded batch of slots, with the named batch operations admit / release / trim / compact / advance.

Layout: self-attention K/V per layer (B, H, P, Dh) on the device, a host mask (B, P) marking each slot's real past
columns, and cross-attention K/V (B, H, S, Dh) right-padded to the longest source with a (B, S) source mask.
A row joins with P empty columns (holes); every decoder step appends one column for all slots, so a row's columns
are the last `age` ones. Positions are explicit per row, so holes never change a row's output.

A finished row only frees its slot (its masks are zeroed: a free slot attends to nothing and its logits are
ignored); the next admitted row takes it over. So under steady load rows join and leave without copying the past:
copies happen when the batch grows, when the past has grown twice as long as any live row needs (trim), and when
many slots stay free (compact). Cross K/V keep a host mirror: a joining row is written into it and the mirror is
uploaded (on CPU the OrtValues wrap the mirror itself, so nothing is copied).
"""
from __future__ import annotations

import numpy as np

from seqserve.contract import names
from seqserve.engine.runtime.device import Device
from seqserve.engine.runtime.slots import Slots
from seqserve.engine.step_output import Need, StepOutput

MIN_TRIM = 8  # leading unused past columns worth a copy of the past (trimming is amortised: only when half is unused)


class ConcatCache:
    """decoder.onnx returns past + one column as a new tensor every step; the cache keeps it as the next past."""

    graph = names.DECODER

    def __init__(self, device: Device, n_layers: int, heads: int, head_dim: int, dtype=np.float32) -> None:
        self.device = device
        self.n_layers, self.heads, self.head_dim, self.dtype = n_layers, heads, head_dim, dtype
        self._past_names, self._cross_names = names.past_inputs(n_layers), names.cross_inputs(n_layers)
        self._present_names = names.present_outputs(n_layers)
        self._reset()

    def run(self, decoder, slots: Slots, rows: np.ndarray | None = None, need: Need = Need.LOGITS) -> StepOutput:
        """One step for every cache row (rows=None: the real step, which advances the cache) or for some rows
        alone, on copies (a probe, which changes nothing). Returns the logits (B, V) float32 whatever `need` says
        (decoder.onnx has no token-choice outputs)."""
        whole = rows is None
        rows = np.arange(self.batch) if whole else rows
        last = slots.ids[rows, slots.length[rows]]  # (B,)
        step_mask = self.step_mask()[rows]  # (B, P+1)
        binding = decoder.io_binding()
        binding.bind_cpu_input(names.DECODER_INPUT_IDS, np.ascontiguousarray(last.reshape(-1, 1)))
        binding.bind_cpu_input(names.POSITION_IDS, np.ascontiguousarray(slots.length[rows].reshape(-1, 1)))
        binding.bind_cpu_input(names.DECODER_ATTENTION_MASK, np.ascontiguousarray(step_mask))
        binding.bind_cpu_input(names.ENCODER_ATTENTION_MASK, np.ascontiguousarray(self.src_mask[rows]))
        for name, value in zip(self._past_names + self._cross_names, self.past + self.cross):
            binding.bind_ortvalue_input(name, value if whole else self.device.put(self.device.get(value)[rows]))
        binding.bind_output(names.LOGITS, "cpu")  # sampling happens on the host
        for name in self._present_names:
            binding.bind_output(name, self.device.ort_device)
        decoder.run_with_iobinding(binding)
        outputs = binding.get_outputs()
        if whole:
            self.advance(outputs[1:], step_mask)
        return StepOutput(outputs[0].numpy())

    def after_leave(self, slots: Slots) -> None:
        """Compacts once more than a quarter of the cache rows are free (nobody came to take them); otherwise only
        trims past columns no live row uses. Runs before a step, after that step's admissions took free slots."""
        live = np.flatnonzero(slots.live[: self.batch]).tolist()
        if 4 * (self.batch - len(live)) > self.batch:
            self.compact(live)
            for new, old in enumerate(live):  # ascending, so a row only ever moves down into a slot already vacated
                if new != old:
                    slots.move(old, new)
        else:
            self.trim()

    def reorder(self, dst: np.ndarray, src: np.ndarray, columns: int, shared: np.ndarray) -> None:
        """Beam search: rows dst take over the past of rows src (all read before any is written; a row's past is
        right-aligned and the step's present is a new array, so the whole past is copied)."""
        self.past = [self.device.put(_copy_rows(self.device.get(v), dst, src)) for v in self.past]
        self.self_mask[dst] = self.self_mask[src]

    def _reset(self) -> None:
        empty = np.zeros((0, self.heads, 0, self.head_dim), self.dtype)
        self.past = [self.device.put(empty) for _ in range(2 * self.n_layers)]  # (B, H, P, Dh): K0, V0, K1, V1, ...
        self.cross_host = [empty.copy() for _ in range(2 * self.n_layers)]  # (B, H, S, Dh) host mirror
        self.cross = [self.device.put(c) for c in self.cross_host]  # (B, H, S, Dh) on the device
        self.self_mask = np.zeros((0, 0), np.int64)  # (B, P) 1 = the slot's real past column
        self.src_mask = np.zeros((0, 0), np.int64)  # (B, S)
        self.live = np.zeros(0, np.int64)  # (B,) 1 = a row holds the slot; a free slot's masks stay all zero

    @property
    def batch(self) -> int:
        return self.self_mask.shape[0]

    @property
    def past_len(self) -> int:
        return self.self_mask.shape[1]

    def nbytes(self, live_rows: int = 0) -> int:
        """Bytes the cache holds on the device, free slots included (they stay until compacted)."""
        per_slot = 2 * self.n_layers * self.heads * self.head_dim * np.dtype(self.dtype).itemsize
        return self.batch * (self.past_len + self.src_mask.shape[1]) * per_slot

    def release(self, slots: list[int]) -> None:
        """Frees finished rows' slots: masked out, kept in place until a new row takes them or compact() drops them."""
        self.self_mask[slots] = 0
        self.src_mask[slots] = 0
        self.live[slots] = 0

    def admit(self, crosses: list[list[np.ndarray]], into: list[int], empty: bool = False) -> None:
        """New rows: each one's encoder K/V per layer and kind [(H, Sn, Dh), ...] goes into its slot. A slot at or past
        the batch's end grows the batch (slots are handed out lowest first, so growth is always at the end)."""
        width = max([self.src_mask.shape[1]] + [c[0].shape[1] for c in crosses])
        if width > self.src_mask.shape[1]:  # a longer source: every row's cross K/V is padded wider
            self.cross_host = [_pad_to(c, width) for c in self.cross_host]
            self.src_mask = _pad_mask(self.src_mask, width)
        grow = max(into) + 1 - self.batch
        if grow > 0:
            self.cross_host = [np.concatenate([host, np.zeros((grow, *host.shape[1:]), self.dtype)])
                               for host in self.cross_host]
            self.src_mask = np.concatenate([self.src_mask, np.zeros((grow, width), np.int64)])
            holes = np.zeros((grow, self.heads, self.past_len, self.head_dim), self.dtype)
            self.past = [self.device.put(np.concatenate([self.device.get(v), holes])) for v in self.past]
            self.self_mask = np.concatenate([self.self_mask, np.zeros((grow, self.past_len), np.int64)])
            self.live = np.concatenate([self.live, np.zeros(grow, np.int64)])
        for slot, cross in zip(into, crosses):
            n = cross[0].shape[1]
            for host, kv in zip(self.cross_host, cross):
                host[slot] = 0
                host[slot, :, :n] = kv
            self.src_mask[slot], self.self_mask[slot] = 0, 0  # a new row has no past: all its columns are holes
            self.src_mask[slot, :n], self.live[slot] = 1, 1
        self.cross = [self.device.put(c) for c in self.cross_host]

    def trim(self) -> None:
        """Drops leading past columns no live row uses, once they are at least half of the past (amortised)."""
        used = self.self_mask.any(axis=0)
        first = int(used.argmax()) if used.any() else self.past_len
        if first >= MIN_TRIM and 2 * first >= self.past_len:
            self.past = [self.device.put(self.device.get(v)[:, :, first:]) for v in self.past]
            self.self_mask = self.self_mask[:, first:]

    def compact(self, keep: list[int]) -> None:
        """Keeps only the given slots (in that order) and trims the past columns and source width nobody uses."""
        if not keep:
            return self._reset()
        mask = self.self_mask[keep]  # (B', P)
        used = mask.any(axis=0)
        first = int(used.argmax()) if used.any() else mask.shape[1]
        src_mask = self.src_mask[keep]
        width = int(src_mask.any(axis=0).nonzero()[0].max()) + 1 if src_mask.any() else 0
        self.past = [self.device.put(self.device.get(v)[keep, :, first:]) for v in self.past]
        self.cross_host = [np.ascontiguousarray(c[keep, :, :width]) for c in self.cross_host]
        self.cross = [self.device.put(c) for c in self.cross_host]
        self.self_mask, self.src_mask, self.live = mask[:, first:], src_mask[:, :width], self.live[keep]

    def step_mask(self) -> np.ndarray:
        """The decoder's attention mask for the next step: real past columns plus the new token (B, P+1).

        A free slot attends to nothing (finite fill, no NaN) and so never marks a column as used."""
        return np.concatenate([self.self_mask, self.live[:, None]], axis=1)

    def advance(self, present: list, step_mask: np.ndarray) -> None:
        """The step's present K/V (B, H, P+1, Dh) become the past; they stay where they are (device-resident)."""
        self.past, self.self_mask = list(present), step_mask


def _copy_rows(a: np.ndarray, dst: list[int], src: list[int]) -> np.ndarray:
    a = np.array(a)  # a writable host copy (the step's present may be read-only)
    a[dst] = a[src]
    return a


def _pad_to(kv: np.ndarray, width: int) -> np.ndarray:
    # (B, H, S, Dh) -> (B, H, width, Dh), zeros on the right
    return np.pad(kv, ((0, 0), (0, 0), (0, width - kv.shape[2]), (0, 0)))


def _pad_mask(mask: np.ndarray, width: int) -> np.ndarray:
    return np.pad(mask, ((0, 0), (0, width - mask.shape[1])))
