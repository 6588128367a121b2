"""The running rows' KV cache as one padded batch of slots, with the named batch operations admit / release / trim /
compact / advance.

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

from seqserve.server.device import Device

MIN_TRIM = 8  # leading unused past columns worth a copy of the past (trimming is amortised: only when half is unused)


class KVCache:
    """The concat graph's cache (decoder.onnx returns past + one column as a new tensor every step)."""

    def __init__(self, device: Device, n_layers: int, heads: int, head_dim: int, dtype=np.float32) -> None:
        self.device = device
        self.n_layers, self.heads, self.head_dim, self.dtype = n_layers, heads, head_dim, dtype
        self._reset()

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

    @property
    def nbytes(self) -> int:
        """Bytes the cache holds on the device, free slots included."""
        per_slot = 2 * self.n_layers * self.heads * self.head_dim * np.dtype(self.dtype).itemsize
        return self.batch * (self.past_len + self.src_mask.shape[1]) * per_slot

    def release(self, slots: list[int]) -> None:
        """Frees finished rows' slots: masked out, kept in place until a new row takes them or compact() drops them."""
        self.self_mask[slots] = 0
        self.src_mask[slots] = 0
        self.live[slots] = 0

    def admit(self, crosses: list[list[np.ndarray]], into: list[int]) -> None:
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


def _pad_to(kv: np.ndarray, width: int) -> np.ndarray:
    # (B, H, S, Dh) -> (B, H, width, Dh), zeros on the right
    return np.pad(kv, ((0, 0), (0, 0), (0, width - kv.shape[2]), (0, 0)))


def _pad_mask(mask: np.ndarray, width: int) -> np.ndarray:
    return np.pad(mask, ((0, 0), (0, width - mask.shape[1])))
