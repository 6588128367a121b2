"""Plain onnxruntime calls on the bundle's graphs (CPU provider, numpy in and out): no torch, no server state.

verify, the variant checks and the tests use these to run one graph on exactly the arrays they choose.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from seqserve.contract import names

CPU = "CPUExecutionProvider"


def cpu_session(path: str | Path, profile_prefix: str | None = None) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if profile_prefix is not None:
        opts.enable_profiling = True
        opts.profile_file_prefix = profile_prefix
    return ort.InferenceSession(str(path), sess_options=opts, providers=[CPU])


def encoder_feeds(ids: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
    return {names.INPUT_IDS: ids.astype(np.int64), names.ATTENTION_MASK: mask.astype(np.int64)}


def decoder_feeds(
    ids: np.ndarray,  # (batch, 1)
    positions: np.ndarray,  # (batch, 1)
    self_mask: np.ndarray,  # (batch, past_len + 1)
    src_mask: np.ndarray,  # (batch, src_len)
    past: list[np.ndarray],  # K0, V0, K1, V1, ... (batch, heads, past_len, head_dim)
    cross: list[np.ndarray],  # K0, V0, K1, V1, ... (batch, heads, src_len, head_dim)
) -> dict[str, np.ndarray]:
    n = len(past) // 2
    feeds = {names.DECODER_INPUT_IDS: ids.astype(np.int64), names.POSITION_IDS: positions.astype(np.int64),
             names.DECODER_ATTENTION_MASK: self_mask.astype(np.int64),
             names.ENCODER_ATTENTION_MASK: src_mask.astype(np.int64)}
    feeds.update(zip([names.past_input(i, k) for i in range(n) for k in names.KINDS], past))
    feeds.update(zip([names.cross_input(i, k) for i in range(n) for k in names.KINDS], cross))
    return {k: np.ascontiguousarray(v) for k, v in feeds.items()}


def random_decoder_feeds(model: dict, batch: int, past_len: int, src_len: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Feeds for a hard step: row 0 sees only its new token (no real past) and no source token at all."""
    rng = np.random.default_rng(seed)
    heads, head_dim, n = model["n_heads"], model["d_model"] // model["n_heads"], model["n_decoder_layers"]
    ids = rng.integers(4, model["vocab_size"], (batch, 1))
    positions = rng.integers(0, min(past_len + 1, model["max_positions"]), (batch, 1))
    self_mask = np.ones((batch, past_len + 1), np.int64)
    src_mask = np.ones((batch, src_len), np.int64)
    self_mask[0, :past_len], src_mask[0] = 0, 0  # fully masked cross-attention: a finite fill keeps it NaN-free
    past = [rng.standard_normal((batch, heads, past_len, head_dim), np.float32) for _ in range(2 * n)]
    cross = [rng.standard_normal((batch, heads, src_len, head_dim), np.float32) for _ in range(2 * n)]
    return decoder_feeds(ids, positions, self_mask, src_mask, past, cross)
