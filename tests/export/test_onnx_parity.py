"""onnxruntime computes what PyTorch computes: encoder, one decoder step over a grid of padded batches, teacher
forcing, a mixed batch against its rows alone, and IO binding against run(). PyTorch is the oracle throughout."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch

from seqserve.contract import names
from seqserve.export.ort_io import decoder_feeds, encoder_feeds

ATOL = RTOL = 1e-4
MAX = 32  # the small model's max_positions


def close(got: np.ndarray, want) -> None:
    want = want.detach().numpy() if isinstance(want, torch.Tensor) else want
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=RTOL)


def flat(pairs) -> list[torch.Tensor]:
    return [t for kv in pairs for t in kv]


def pairs(tensors: list) -> list[tuple]:
    return [(tensors[2 * i], tensors[2 * i + 1]) for i in range(len(tensors) // 2)]


def padded_sources(rng, batch: int, src_len: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, S) ids and mask: row 0 is full, the others padded to random lengths >= 1."""
    lengths = [src_len] + [int(rng.integers(1, src_len + 1)) for _ in range(batch - 1)]
    ids, mask = torch.zeros((batch, src_len), dtype=torch.int64), torch.zeros((batch, src_len), dtype=torch.int64)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.from_numpy(rng.integers(4, vocab, n))
        mask[i, :n] = 1
    return ids, mask


@pytest.mark.parametrize("batch", [1, 3, 5])
@pytest.mark.parametrize("src_len", [1, 7, MAX])
def test_encoder_parity(small_model, small_sessions, batch, src_len):
    ids, mask = padded_sources(np.random.default_rng(batch * 100 + src_len), batch, src_len, 50)
    with torch.no_grad():
        want = flat(small_model.cross_kv(small_model.encode(ids, mask)))
    got = small_sessions[0].run(None, encoder_feeds(ids.numpy(), mask.numpy()))
    assert len(got) == len(want) == 2 * small_model.cfg.n_decoder_layers
    for g, w in zip(got, want):
        close(g, w)


def step_inputs(cfg, rng, batch: int, past_len: int, src_len: int) -> dict:
    """A step where rows sit at their own past and source lengths: holes on the left of the past, padding on the
    right of the source, both filled with random values that the masks must hide."""
    _, src_mask = padded_sources(rng, batch, src_len, cfg.vocab_size)
    ages = [past_len] + [int(rng.integers(0, past_len + 1)) for _ in range(batch - 1)]
    self_mask = torch.ones((batch, past_len + 1), dtype=torch.int64)  # (B, P+1)
    for i, age in enumerate(ages):
        self_mask[i, : past_len - age] = 0
    kv = lambda n: torch.from_numpy(rng.standard_normal((batch, cfg.n_heads, n, cfg.head_dim), np.float32))
    return {"ids": torch.from_numpy(rng.integers(4, cfg.vocab_size, (batch, 1))),
            "positions": torch.tensor(ages)[:, None],  # (B, 1) each row's own absolute position
            "self_mask": self_mask, "src_mask": src_mask,
            "past": [kv(past_len) for _ in range(2 * cfg.n_decoder_layers)],
            "cross": [kv(src_len) for _ in range(2 * cfg.n_decoder_layers)]}


def ort_step(decoder, x: dict) -> list[np.ndarray]:
    np_ = lambda t: t.numpy() if isinstance(t, torch.Tensor) else t
    return decoder.run(None, decoder_feeds(np_(x["ids"]), np_(x["positions"]), np_(x["self_mask"]),
                                           np_(x["src_mask"]), [np_(t) for t in x["past"]],
                                           [np_(t) for t in x["cross"]]))


@pytest.mark.parametrize("batch", [1, 3, 5])
@pytest.mark.parametrize("past_len", [0, 1, 6, MAX - 2])
@pytest.mark.parametrize("src_len", [1, 7, MAX])
def test_decoder_step_parity(small_model, small_sessions, batch, past_len, src_len):
    x = step_inputs(small_model.cfg, np.random.default_rng([batch, past_len, src_len]), batch, past_len, src_len)
    with torch.no_grad():
        logits, present = small_model.decode(x["ids"], x["positions"], x["self_mask"], x["src_mask"],
                                             pairs(x["cross"]), pairs(x["past"]), causal=False)
    got = ort_step(small_sessions[1], x)
    assert got[0].shape == (batch, small_model.cfg.vocab_size) and got[0].dtype == np.float32
    for g, w in zip(got, [logits[:, -1]] + flat(present)):
        assert g.shape == tuple(w.shape)
        close(g, w)


def test_teacher_forcing_cached_steps_equal_one_full_forward(small_model, small_sessions):
    """N cached ORT steps, each feeding its present back as past, give the logits of PyTorch's causal forward."""
    rng = np.random.default_rng(7)
    batch, steps = 3, 10
    src, src_mask = padded_sources(rng, batch, 9, 50)
    tgt = torch.from_numpy(rng.integers(4, 50, (batch, steps)))
    tgt[:, 0] = small_model.cfg.bos_id
    with torch.no_grad():
        full = small_model(src, src_mask, tgt, torch.ones_like(tgt))  # (B, T, V) the training forward
    encoder, decoder = small_sessions
    cross = encoder.run(None, encoder_feeds(src.numpy(), src_mask.numpy()))
    cfg = small_model.cfg
    past = [np.zeros((batch, cfg.n_heads, 0, cfg.head_dim), np.float32)] * (2 * cfg.n_decoder_layers)
    for t in range(steps):
        out = decoder.run(None, decoder_feeds(tgt[:, t : t + 1].numpy(), np.full((batch, 1), t),
                                              np.ones((batch, t + 1)), src_mask.numpy(), past, cross))
        close(out[0], full[:, t])
        past = out[1:]


def test_mixed_batch_rows_equal_rows_alone(small_model, small_sessions):
    """Rows at different past and source lengths in one batch give each row's logits alone, and the same tokens."""
    encoder, decoder = small_sessions
    cfg = small_model.cfg
    rng = np.random.default_rng(3)
    sources = [rng.integers(4, 50, n) for n in (12, 3, 7, 1)]
    ages = (5, 0, 2, 9)  # decoder steps each row has already taken
    rows = [_alone_row(encoder, decoder, cfg, s, age) for s, age in zip(sources, ages)]
    batch = _batch_of(rows, cfg, rng)
    for _ in range(6):
        batch_out = decoder.run(None, batch["feeds"])
        for i, row in enumerate(rows):
            row_out = decoder.run(None, row["feeds"])
            np.testing.assert_allclose(batch_out[0][i : i + 1], row_out[0], atol=1e-4, rtol=0)  # <= 1e-4 absolute
            assert int(batch_out[0][i].argmax()) == int(row_out[0][0].argmax())
            _advance(row, row_out, int(row_out[0][0].argmax()))
        _advance(batch, batch_out, batch_out[0].argmax(-1))
    alone = [[step[0] for step in r["tokens"]] for r in rows]
    assert alone == [list(column) for column in zip(*batch["tokens"])]


def _alone_row(encoder, decoder, cfg, source: np.ndarray, age: int) -> dict:
    """A batch of one that has taken `age` greedy steps: its own past, no holes, no padding."""
    cross = encoder.run(None, encoder_feeds(source[None], np.ones((1, len(source)))))
    past = [np.zeros((1, cfg.n_heads, 0, cfg.head_dim), np.float32)] * (2 * cfg.n_decoder_layers)
    row = {"feeds": decoder_feeds(np.array([[cfg.bos_id]]), np.zeros((1, 1)), np.ones((1, 1)),
                                  np.ones((1, len(source))), past, cross), "tokens": []}
    for _ in range(age):
        out = decoder.run(None, row["feeds"])
        _advance(row, out, int(out[0][0].argmax()))
    row["tokens"] = []
    return row


def _batch_of(rows: list[dict], cfg, rng) -> dict:
    """Left-pads each row's past with holes and right-pads its source, filling both with random values."""
    mask_of = lambda r, name: r["feeds"][name][0]  # (P+1,) or (S,)
    total = max(len(mask_of(r, names.DECODER_ATTENTION_MASK)) for r in rows)  # past_len + 1
    src_len = max(len(mask_of(r, names.ENCODER_ATTENTION_MASK)) for r in rows)
    feeds = {name: np.concatenate([r["feeds"][name] for r in rows])
             for name in (names.DECODER_INPUT_IDS, names.POSITION_IDS)}
    feeds[names.DECODER_ATTENTION_MASK] = np.stack(  # holes on the left, as the server's KV cache keeps them
        [np.pad(m, (total - len(m), 0)) for m in (mask_of(r, names.DECODER_ATTENTION_MASK) for r in rows)])
    feeds[names.ENCODER_ATTENTION_MASK] = np.stack(
        [np.pad(m, (0, src_len - len(m))) for m in (mask_of(r, names.ENCODER_ATTENTION_MASK) for r in rows)])
    n = cfg.n_decoder_layers
    for i in range(n):
        for k in names.KINDS:
            past = rng.standard_normal((len(rows), cfg.n_heads, total - 1, cfg.head_dim)).astype(np.float32)
            cross = rng.standard_normal((len(rows), cfg.n_heads, src_len, cfg.head_dim)).astype(np.float32)
            for row, r in enumerate(rows):
                own_past, own_cross = r["feeds"][names.past_input(i, k)][0], r["feeds"][names.cross_input(i, k)][0]
                past[row, :, total - 1 - own_past.shape[1] :] = own_past
                cross[row, :, : own_cross.shape[1]] = own_cross
            feeds[names.past_input(i, k)], feeds[names.cross_input(i, k)] = past, cross
    return {"feeds": feeds, "tokens": []}


def _advance(state: dict, out: list[np.ndarray], chosen) -> None:
    """Feeds the chosen tokens and the step's present back, one position further."""
    feeds = state["feeds"]
    chosen = np.asarray(chosen, np.int64).reshape(-1, 1)  # (B, 1)
    n = (len(out) - 1) // 2
    feeds[names.DECODER_INPUT_IDS] = chosen
    feeds[names.POSITION_IDS] = feeds[names.POSITION_IDS] + 1
    mask = feeds[names.DECODER_ATTENTION_MASK]
    feeds[names.DECODER_ATTENTION_MASK] = np.concatenate([mask, np.ones((mask.shape[0], 1), np.int64)], axis=1)
    for name, present in zip(names.past_inputs(n), out[1:]):
        feeds[name] = present
    state["tokens"].append(chosen[:, 0].tolist())


def test_io_binding_equals_plain_run(small_model, small_sessions):
    """Preallocated output OrtValues, present fed back as past without copies, equal run() exactly."""
    encoder, decoder = small_sessions
    cfg = small_model.cfg
    rng = np.random.default_rng(11)
    batch, steps = 3, 6
    src, src_mask = padded_sources(rng, batch, 7, 50)
    cross = encoder.run(None, encoder_feeds(src.numpy(), src_mask.numpy()))
    ids = rng.integers(4, 50, (batch, steps))
    empty = np.zeros((batch, cfg.n_heads, 0, cfg.head_dim), np.float32)
    n = cfg.n_decoder_layers
    plain_past, bound_past = [empty] * (2 * n), [ort.OrtValue.ortvalue_from_numpy(empty)] * (2 * n)
    cross_values = [ort.OrtValue.ortvalue_from_numpy(c) for c in cross]
    for t in range(steps):
        feeds = decoder_feeds(ids[:, t : t + 1], np.full((batch, 1), t), np.ones((batch, t + 1)), src_mask.numpy(),
                              plain_past, cross)
        plain = decoder.run(None, feeds)
        binding = decoder.io_binding()
        for name in (names.DECODER_INPUT_IDS, names.POSITION_IDS, names.DECODER_ATTENTION_MASK,
                     names.ENCODER_ATTENTION_MASK):
            binding.bind_cpu_input(name, feeds[name])
        for name, value in zip(names.past_inputs(n), bound_past):
            binding.bind_ortvalue_input(name, value)
        for name, value in zip(names.cross_inputs(n), cross_values):
            binding.bind_ortvalue_input(name, value)
        logits = ort.OrtValue.ortvalue_from_shape_and_type([batch, cfg.vocab_size], np.float32)
        present = [ort.OrtValue.ortvalue_from_shape_and_type([batch, cfg.n_heads, t + 1, cfg.head_dim], np.float32)
                   for _ in range(2 * n)]
        binding.bind_ortvalue_output(names.LOGITS, logits)
        for name, value in zip(names.decoder_outputs(n)[1:], present):
            binding.bind_ortvalue_output(name, value)
        decoder.run_with_iobinding(binding)
        np.testing.assert_array_equal(logits.numpy(), plain[0])
        for value, want in zip(present, plain[1:]):
            np.testing.assert_array_equal(value.numpy(), want)
        plain_past, bound_past = plain[1:], present
