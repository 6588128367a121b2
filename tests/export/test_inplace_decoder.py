"""decoder_inplace.onnx (GroupQueryAttention over preallocated K/V buffers written in place, fused cross-attention)
computes what PyTorch and the plain concat graph compute, step by step, while rows join at different steps, sit at
different lengths and sources, leave, and a new row reuses a slot whose stale K/V must not leak into its output."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from seqserve.contract import names
from seqserve.export.inplace_decoder import CONTRIB_OPS, export_inplace_decoder
from seqserve.export.ort_io import cpu_session, decoder_feeds, encoder_feeds, inplace_step
from seqserve.model.config import ModelConfig
from seqserve.model.transformer import Transformer

ATOL = 1e-4  # logits and K/V, absolute (fp32)
SLOTS, MAX_LEN, SRC_WIDTH = 3, 12, 12  # MAX_LEN < max_positions (32): the runner picks the buffers' length
# (source length, step it joins at, tokens it generates): slot 1 goes r1 -> r3 (shorter source, shorter past),
# slot 0 goes r0 -> r4, slot 2 stays free until r2 joins at step 2.
SCHEDULE = [(7, 0, 5), (12, 0, 7), (9, 2, 9), (3, 7, 4), (5, 5, 6)]


@pytest.fixture(scope="module")
def inplace_session(small_model, tmp_path_factory):
    path = tmp_path_factory.mktemp("inplace") / names.DECODER_INPLACE_FILE
    export_inplace_decoder(small_model, path)
    return cpu_session(path)


@dataclass(eq=False)
class Row:
    """One request and its two references, each with a cache of its own (a batch of one)."""

    source: np.ndarray
    join: int
    length: int
    slot: int = -1
    tokens: list[int] = field(default_factory=list)  # fed tokens: BOS, then the in-place graph's greedy choices
    torch_past: list | None = None
    onnx_past: list[np.ndarray] | None = None

    @property
    def n(self) -> int:  # cached tokens = the position of the token fed now
        return len(self.tokens) - 1


def _torch_step(model, row: Row, torch_cross) -> tuple[np.ndarray, list[np.ndarray]]:
    n = row.n
    with torch.no_grad():
        logits, present = model.decode(torch.tensor([[row.tokens[-1]]]), torch.tensor([[n]]),
                                       torch.ones((1, n + 1), dtype=torch.int64),
                                       torch.ones((1, len(row.source)), dtype=torch.int64), torch_cross,
                                       row.torch_past, causal=False)
    row.torch_past = present
    return logits[0, -1].numpy(), [t[0, :, -1].numpy() for kv in present for t in kv]  # (V,), new column (H, Dh)


def _concat_step(decoder, cfg, row: Row, cross: list[np.ndarray]) -> np.ndarray:
    if row.onnx_past is None:
        row.onnx_past = [np.zeros((1, cfg.n_heads, 0, cfg.head_dim), np.float32)] * (2 * cfg.n_decoder_layers)
    n = row.n
    out = decoder.run(None, decoder_feeds(np.array([[row.tokens[-1]]]), np.array([[n]]), np.ones((1, n + 1)),
                                          np.ones((1, len(row.source))), row.onnx_past, cross))
    row.onnx_past = out[1:]
    return out[0][0]


def test_rows_join_leave_and_reuse_slots_like_pytorch_and_the_concat_graph(small_model, small_sessions,
                                                                           inplace_session):
    cfg = small_model.cfg
    encoder, decoder = small_sessions
    rng = np.random.default_rng(5)
    rows = [Row(rng.integers(4, cfg.vocab_size, s), join, length) for s, join, length in SCHEDULE]
    kv_shape = (SLOTS, cfg.n_heads, MAX_LEN, cfg.head_dim)
    # Garbage everywhere a row has not written: only columns [0, n_b] may ever be read.
    self_kv = [100 * rng.standard_normal(kv_shape).astype(np.float32) for _ in range(2 * cfg.n_decoder_layers)]
    cross = [100 * rng.standard_normal((SLOTS, cfg.n_heads, SRC_WIDTH, cfg.head_dim)).astype(np.float32)
             for _ in range(2 * cfg.n_decoder_layers)]
    src_mask = np.zeros((SLOTS, SRC_WIDTH), np.int64)
    slots: list[Row | None] = [None] * SLOTS
    own_cross, history, step = {}, {slot: [] for slot in range(SLOTS)}, 0
    while any(len(r.tokens) < r.length + 1 for r in rows):
        for r in rows:  # leave: a row that fed its last token frees its slot
            if r.slot >= 0 and len(r.tokens) == r.length + 1:
                slots[r.slot], src_mask[r.slot], r.slot = None, 0, -2
        for r in rows:  # join: the first free slot; its old self K/V stay where they are
            if r.join <= step and r.slot == -1 and None in slots:
                r.slot = slots.index(None)
                history[r.slot].append(rows.index(r))
                slots[r.slot], r.tokens = r, [cfg.bos_id]
                ids, mask = r.source[None], np.ones((1, len(r.source)), np.int64)
                own_cross[id(r)] = encoder.run(None, encoder_feeds(ids, mask))
                for buf, kv in zip(cross, own_cross[id(r)]):
                    buf[r.slot, :, : len(r.source)] = kv[0]  # the previous occupant's columns beyond stay
                src_mask[r.slot] = 0
                src_mask[r.slot, : len(r.source)] = 1
        live = [r for r in slots if r is not None]
        ids = np.array([[r.tokens[-1] if r else cfg.pad_id] for r in slots], np.int64)
        lens = np.array([r.n if r else 0 for r in slots], np.int32)
        logits = inplace_step(inplace_session, ids, lens, src_mask, self_kv, cross)
        assert np.isfinite(logits).all()  # free slots included
        for r in live:
            with torch.no_grad():
                source = torch.from_numpy(r.source[None])  # (1, S) alone, no padding
                torch_cross = small_model.cross_kv(small_model.encode(source, torch.ones_like(source)))
            want, columns = _torch_step(small_model, r, torch_cross)
            concat = _concat_step(decoder, cfg, r, own_cross[id(r)])
            np.testing.assert_allclose(logits[r.slot], want, atol=ATOL, rtol=0)
            np.testing.assert_allclose(logits[r.slot], concat, atol=ATOL, rtol=0)
            for buf, column in zip(self_kv, columns):  # the step wrote its K/V into the slot's column n_b
                np.testing.assert_allclose(buf[r.slot, :, r.n], column, atol=ATOL, rtol=0)
            best = int(logits[r.slot].argmax())
            assert best == int(want.argmax()) == int(concat.argmax())
            r.tokens.append(best)
        step += 1
    # Slots 0 and 1 were reused (slot 1 by a shorter row with a shorter source); rows overlapped for 11 steps.
    assert history == {0: [0, 4], 1: [1, 3], 2: [2]} and step == 11


def _random_model(**overrides) -> Transformer:
    torch.manual_seed(1)
    cfg = dict(vocab_size=40, d_model=24, n_heads=3, n_encoder_layers=1, n_decoder_layers=3, d_ff=48, dropout=0.0,
               max_positions=16)
    return Transformer(ModelConfig(**(cfg | overrides))).eval()


@pytest.mark.parametrize("norm_first, tie", [(True, False), (False, False), (True, True)])
def test_pre_ln_and_untied_models_equal_pytorch(tmp_path, norm_first, tie):
    """The builder's other paths: pre-LN (norms fused forward, a final LayerNorm) and an untied output projection."""
    model = _random_model(norm_first=norm_first, tie_embeddings=tie)
    cfg = model.cfg
    export_inplace_decoder(model, tmp_path / "d.onnx")
    session = cpu_session(tmp_path / "d.onnx")
    rng = np.random.default_rng(2)
    b, src_len, steps = 4, 6, 5
    src = torch.from_numpy(rng.integers(4, cfg.vocab_size, (b, src_len)))
    mask = torch.ones((b, src_len), dtype=torch.int64)
    mask[1, 2:], mask[3, 5:] = 0, 0
    with torch.no_grad():
        cross = model.cross_kv(model.encode(src, mask))
    self_kv = [np.zeros((b, cfg.n_heads, 8, cfg.head_dim), np.float32) for _ in range(2 * cfg.n_decoder_layers)]
    ages = np.array([0, 2, 1, 3])  # rows start at their own lengths: prefill them with PyTorch's own K/V
    tokens = torch.from_numpy(rng.integers(4, cfg.vocab_size, (b, 3 + steps)))
    past = []
    for i in range(b):
        if ages[i] == 0:
            past.append(None)
            continue
        with torch.no_grad():
            _, kv = model.decode(tokens[i : i + 1, : ages[i]], torch.arange(ages[i])[None],
                                 torch.ones((1, ages[i]), dtype=torch.int64), mask[i : i + 1],
                                 [(k[i : i + 1], v[i : i + 1]) for k, v in cross])
        for buf, t in zip(self_kv, [t for pair in kv for t in pair]):
            buf[i, :, : ages[i]] = t[0].numpy()
        past.append(kv)
    flat_cross = [t.numpy() for pair in cross for t in pair]
    for s in range(steps):
        n = ages + s
        ids = np.array([[int(tokens[i, n[i]])] for i in range(b)])
        logits = inplace_step(session, ids, n, mask.numpy(), self_kv, flat_cross)
        for i in range(b):
            with torch.no_grad():
                want, past[i] = model.decode(torch.tensor([[ids[i, 0]]]), torch.tensor([[n[i]]]),
                                             torch.ones((1, n[i] + 1), dtype=torch.int64), mask[i : i + 1],
                                             [(k[i : i + 1], v[i : i + 1]) for k, v in cross], past[i], causal=False)
            np.testing.assert_allclose(logits[i], want[0, -1].numpy(), atol=ATOL, rtol=0)
            assert int(logits[i].argmax()) == int(want[0, -1].argmax())


def test_step_writes_one_column_per_row_and_nothing_else(small_model, inplace_session):
    """IO binding shares past and present: row b's buffers change only at column n_b; plain run() (separate present
    buffers) gives the same logits and the same new columns."""
    cfg = small_model.cfg
    rng = np.random.default_rng(8)
    b, src_len = 4, 5
    self_kv = [rng.standard_normal((b, cfg.n_heads, MAX_LEN, cfg.head_dim)).astype(np.float32)
               for _ in range(2 * cfg.n_decoder_layers)]
    cross = [rng.standard_normal((b, cfg.n_heads, src_len, cfg.head_dim)).astype(np.float32)
             for _ in range(2 * cfg.n_decoder_layers)]
    before = [buf.copy() for buf in self_kv]
    ids, lens, mask = rng.integers(4, 50, (b, 1)), np.array([0, 3, MAX_LEN - 1, 1], np.int32), np.ones((b, src_len))
    n = cfg.n_decoder_layers
    feeds = {names.DECODER_INPUT_IDS: ids, names.PAST_SEQ_LENS: lens,
             names.TOTAL_SEQ_LEN: np.array(lens.max() + 1, np.int32),
             names.ENCODER_ATTENTION_MASK: mask.astype(np.int64)}
    feeds |= dict(zip(names.past_inputs(n), before)) | dict(zip(names.cross_inputs(n), cross))
    plain = inplace_session.run(None, feeds)
    logits = inplace_step(inplace_session, ids, lens, mask, self_kv, cross)
    np.testing.assert_array_equal(logits, plain[0])
    for buf, old, present in zip(self_kv, before, plain[1:]):
        assert present.shape == buf.shape  # present has the buffers' max_len, not past_len + 1
        for row, col in enumerate(lens):
            np.testing.assert_array_equal(buf[row, :, col], present[row, :, col])
            np.testing.assert_array_equal(np.delete(buf[row], col, axis=1), np.delete(old[row], col, axis=1))
    with pytest.raises(ValueError, match="past_lens must lie in"):  # onnxruntime would write past the buffer
        inplace_step(inplace_session, ids, np.array([0, 1, MAX_LEN, 2]), mask, self_kv, cross)


def test_fused_graph_has_far_fewer_nodes(small_model, small_graphs, tmp_path):
    export_inplace_decoder(small_model, tmp_path / "d.onnx")
    graph = onnx.load(str(tmp_path / "d.onnx")).graph
    plain = onnx.load(str(Path(small_graphs) / names.DECODER_FILE)).graph
    ops = [node.op_type for node in graph.node]
    n = small_model.cfg.n_decoder_layers
    # embedding 3, mask cast 1, 20 per layer (3 skip norms of Add, Add, LayerNormalization), logits 2
    assert len(ops) == 3 + 1 + 20 * n + 2 < len(plain.node) / 2, (len(ops), len(plain.node))
    for op in CONTRIB_OPS:
        assert {o.domain for o in graph.node if o.op_type == op} == {"com.microsoft"}
    assert ops.count("GroupQueryAttention") == ops.count("MultiHeadAttention") == n
    assert not {"Softmax", "Transpose", "Concat"} & set(ops)
    # the CPU's fused SkipLayerNormalization is 5x slower than these two nodes (CUDA sessions leave the fusion on)
    assert ops.count("LayerNormalization") == 3 * n and "SkipLayerNormalization" not in ops
    print(f"decoder_inplace: {len(ops)} nodes; decoder (concat): {len(plain.node)} nodes")
