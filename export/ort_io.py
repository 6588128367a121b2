"""Plain onnxruntime calls on the bundle's graphs (CPU provider, numpy in and out): no torch, no server state.

verify, the variant checks and the tests use these to run one graph on exactly the arrays they choose.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from seqserve.contract import names

CPU = "CPUExecutionProvider"


def cpu_session(path: str | Path, profile_prefix: str | None = None, threads: int = 0) -> ort.InferenceSession:
    """threads: intra-op threads (0 = onnxruntime's default); 1 also turns spinning off, as benchmarks here want."""
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if threads:
        opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
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
    feeds.update(zip(names.past_inputs(n), past))
    feeds.update(zip(names.cross_inputs(n), cross))
    return {k: np.ascontiguousarray(v) for k, v in feeds.items()}


def random_decoder_feeds(model: dict, batch: int, past_len: int, src_len: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Feeds for a hard step: row 0 sees only its new token (no real past) and no source token at all."""
    rng = np.random.default_rng(seed)
    heads, head_dim, n = model["n_heads"], names.head_dim(model), model["n_decoder_layers"]
    ids = rng.integers(4, model["vocab_size"], (batch, 1))
    positions = rng.integers(0, min(past_len + 1, model["max_positions"]), (batch, 1))
    self_mask = np.ones((batch, past_len + 1), np.int64)
    src_mask = np.ones((batch, src_len), np.int64)
    self_mask[0, :past_len], src_mask[0] = 0, 0  # fully masked cross-attention: a finite fill keeps it NaN-free
    past = [rng.standard_normal((batch, heads, past_len, head_dim), np.float32) for _ in range(2 * n)]
    cross = [rng.standard_normal((batch, heads, src_len, head_dim), np.float32) for _ in range(2 * n)]
    return decoder_feeds(ids, positions, self_mask, src_mask, past, cross)


def inplace_step(
    session: ort.InferenceSession,
    ids: np.ndarray,  # (batch, 1) int64: each row's last token
    past_lens: np.ndarray,  # (batch,) each row's cached tokens n_b: its position and the K/V column written now
    src_mask: np.ndarray,  # (batch, src_len) 1 = source token
    self_kv: list[np.ndarray],  # K0, V0, K1, V1, ... (batch, heads, max_len, head_dim), C-contiguous: written in place
    cross: list[np.ndarray],  # K0, V0, K1, V1, ... (batch, heads, src_len, head_dim)
    fetch: str = names.LOGITS,  # or a token-choice output (names.NEXT_TOKEN_IDS, ...) of a graph that has them
) -> np.ndarray:
    """One decoder_inplace step: present.* is bound to the memory of past_key_values.*, so the step writes column
    n_b of row b's buffers (nothing else) and returns only `fetch`: the logits (batch, vocab) float32 by default.

    A free slot is a row with n_b = 0 and an all-zero src_mask: it attends to its own new token only, writes its
    column 0 and its logits are finite and meaningless. A slot is reused by setting n_b = 0 and writing the new
    row's cross K/V and mask; its old self K/V stay and are never read (columns beyond n_b are not). Cross K/V
    beyond a row's source must be finite (masked scores are finite, so 0 x NaN would leak).
    """
    lens = np.ascontiguousarray(past_lens, np.int32)
    if lens.size == 0:  # onnxruntime 1.31's CPU GroupQueryAttention divides by zero on an empty batch (SIGFPE)
        if fetch != names.LOGITS:
            return np.zeros((0,) if fetch == names.NEXT_TOKEN_IDS else (0, names.TOP_K),
                            np.float32 if fetch == names.TOP_LOGPROBS else np.int64)
        return np.zeros((0, session.get_outputs()[0].shape[-1]), np.float32)
    max_len = self_kv[0].shape[2]
    if not (0 <= lens.min() and lens.max() < max_len):  # onnxruntime does not check: it would write out of bounds
        raise ValueError(f"past_lens must lie in [0, {max_len}) (the buffers' max_len), got {lens.tolist()}")
    for buf in self_kv:
        if not buf.flags.c_contiguous or buf.dtype != self_kv[0].dtype or buf.shape != self_kv[0].shape:
            raise ValueError("self_kv buffers must be C-contiguous and share one dtype and shape")
    n = len(self_kv) // 2
    binding = session.io_binding()
    binding.bind_output(fetch, "cpu")  # bound first: get_outputs() follows the binding order
    binding.bind_cpu_input(names.DECODER_INPUT_IDS, np.ascontiguousarray(ids, np.int64).reshape(-1, 1))
    binding.bind_cpu_input(names.PAST_SEQ_LENS, lens)
    binding.bind_cpu_input(names.TOTAL_SEQ_LEN, np.array(int(lens.max()) + 1, np.int32))
    binding.bind_cpu_input(names.ENCODER_ATTENTION_MASK, np.ascontiguousarray(src_mask, np.int64))
    for past, present, buf in zip(names.past_inputs(n), names.present_outputs(n), self_kv):
        value = ort.OrtValue.ortvalue_from_numpy(buf)  # wraps buf's memory (no copy) for input and output alike
        binding.bind_ortvalue_input(past, value)
        binding.bind_ortvalue_output(present, value)
    for name, value in zip(names.cross_inputs(n), cross):
        binding.bind_cpu_input(name, np.ascontiguousarray(value))
    session.run_with_iobinding(binding)
    return binding.get_outputs()[0].numpy()
