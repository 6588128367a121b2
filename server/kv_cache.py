"""The running rows' KV cache as one padded batch, with the named batch operations filter / concatenate / advance.

Layout: self-attention K/V per layer (B, H, P, Dh) and a host mask (B, P) marking each row's real slots.
A row joins with P empty slots (holes); every decoder step appends one column for all rows, so a row's
slots are the last `age` columns. Columns no row uses any more are trimmed from the left when rows leave,
so P stays the age of the oldest row. Positions are explicit per row, so holes never change a row's output.
Cross-attention K/V (B, H, S, Dh) are right-padded to the longest source, with a (B, S) source mask.
"""
from __future__ import annotations

import numpy as np

from server.device import Device


class KVCache:
    def __init__(self, device: Device, n_layers: int, heads: int, head_dim: int, dtype=np.float32) -> None:
        self.device = device
        self.n_layers, self.heads, self.head_dim, self.dtype = n_layers, heads, head_dim, dtype
        self._reset()

    def _reset(self) -> None:
        empty = np.zeros((0, self.heads, 0, self.head_dim), self.dtype)
        self.past = [self.device.put(empty) for _ in range(2 * self.n_layers)]  # (B, H, P, Dh): K0, V0, K1, V1, ...
        self.cross = [self.device.put(empty) for _ in range(2 * self.n_layers)]  # (B, H, S, Dh)
        self.self_mask = np.zeros((0, 0), np.int64)  # (B, P) 1 = the row's real slot
        self.src_mask = np.zeros((0, 0), np.int64)  # (B, S)

    @property
    def batch(self) -> int:
        return self.self_mask.shape[0]

    @property
    def past_len(self) -> int:
        return self.self_mask.shape[1]

    @property
    def nbytes(self) -> int:
        per_slot = 2 * self.n_layers * self.heads * self.head_dim * np.dtype(self.dtype).itemsize
        return self.batch * (self.past_len + self.src_mask.shape[1]) * per_slot

    def filter(self, keep: list[int]) -> None:
        """Keeps only the given rows (in that order) and trims the slot columns nobody uses any more."""
        if not keep:
            return self._reset()
        mask = self.self_mask[keep]  # (B', P)
        used = mask.any(axis=0)
        first = int(used.argmax()) if used.any() else mask.shape[1]
        src_mask = self.src_mask[keep]
        width = int(src_mask.any(axis=0).nonzero()[0].max()) + 1 if src_mask.any() else 0
        self.past = [self.device.put(self.device.get(v)[keep, :, first:]) for v in self.past]
        self.cross = [self.device.put(self.device.get(v)[keep, :, :width]) for v in self.cross]
        self.self_mask, self.src_mask = mask[:, first:], src_mask[:, :width]

    def concatenate(self, cross: list[np.ndarray], src_mask: np.ndarray) -> None:
        """Appends new rows: their encoder K/V (Bn, H, Sn, Dh) per layer; their past is all holes."""
        n_new, width = src_mask.shape[0], max(self.src_mask.shape[1], src_mask.shape[1])
        self.cross = [self.device.put(np.concatenate([_pad_to(self.device.get(old), width), _pad_to(new, width)]))
                      for old, new in zip(self.cross, cross)]
        holes = np.zeros((n_new, self.heads, self.past_len, self.head_dim), self.dtype)
        self.past = [self.device.put(np.concatenate([self.device.get(old), holes])) for old in self.past]
        self.src_mask = np.concatenate([_pad_mask(self.src_mask, width), _pad_mask(src_mask, width)])
        self.self_mask = np.concatenate([self.self_mask, np.zeros((n_new, self.past_len), np.int64)])

    def step_mask(self) -> np.ndarray:
        """The decoder's attention mask for the next step: real past slots plus the new token (B, P+1)."""
        return np.concatenate([self.self_mask, np.ones((self.batch, 1), np.int64)], axis=1)

    def advance(self, present: list, step_mask: np.ndarray) -> None:
        """The step's present K/V (B, H, P+1, Dh) become the past; they stay where they are (device-resident)."""
        self.past, self.self_mask = list(present), step_mask


def _pad_to(kv: np.ndarray, width: int) -> np.ndarray:
    # (B, H, S, Dh) -> (B, H, width, Dh), zeros on the right
    return np.pad(kv, ((0, 0), (0, 0), (0, width - kv.shape[2]), (0, 0)))


def _pad_mask(mask: np.ndarray, width: int) -> np.ndarray:
    return np.pad(mask, ((0, 0), (0, width - mask.shape[1])))
