"""The architecture against the paper's equations and the seeds' worked examples."""
from __future__ import annotations

import math

import pytest
import torch

from seqserve.model.attention import MultiHeadAttention
from seqserve.model.config import ModelConfig
from seqserve.model.decoding import greedy_decode, pad_batch
from seqserve.model.positional import sinusoid_table
from seqserve.model.transformer import Transformer


def small_model(norm_first: bool = False, seed: int = 0, tie: bool = True) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=40, d_model=32, n_heads=4, n_encoder_layers=2, n_decoder_layers=2, d_ff=64,
                      dropout=0.0, max_positions=64, norm_first=norm_first, tie_embeddings=tie)
    return Transformer(cfg).eval()


def identity_attention(d: int, heads: int) -> MultiHeadAttention:
    mha = MultiHeadAttention(d, heads, dropout=0.0)
    with torch.no_grad():
        for lin in (mha.q_proj, mha.k_proj, mha.v_proj, mha.o_proj):
            lin.weight.copy_(torch.eye(d))
            lin.bias.zero_()
    return mha


@pytest.mark.parametrize("scores,expected", [((6.0, 4.0), (0.62, 0.38)), ((3.0, 8.0), (0.22, 0.78))])
def test_scaled_dot_product_worked_examples(scores, expected):
    # One head of width 16: raw scores q.k are divided by sqrt(16) = 4 before the softmax.
    mha = identity_attention(16, 1)
    q = torch.zeros(1, 1, 16)
    q[0, 0, 0] = 1.0
    k = torch.zeros(1, 1, 2, 16)
    k[0, 0, :, 0] = torch.tensor(scores)
    v = torch.zeros(1, 1, 2, 16)
    v[0, 0, 0, 1] = 1.0  # value 0 -> channel 1, value 1 -> channel 2: output channels are the weights
    v[0, 0, 1, 2] = 1.0
    out = mha(q, k, v, torch.zeros(1))
    weights = out[0, 0, 1:3].tolist()
    assert weights == pytest.approx(expected, abs=0.005)
    assert sum(weights) == pytest.approx(1.0, abs=1e-6)


def test_positional_encoding_formula_in_radians():
    table = sinusoid_table(50, 16)
    assert table[1, 0].item() == pytest.approx(math.sin(1.0), abs=1e-7)  # 0.841..., radians not degrees
    assert table[1, 0].item() == pytest.approx(0.841, abs=1e-3)
    assert table[0, 1].item() == pytest.approx(1.0)  # cos(0)
    pos, i, d = 7, 3, 16
    assert table[pos, 2 * i].item() == pytest.approx(math.sin(pos / 10000 ** (2 * i / d)), abs=1e-6)
    assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(pos / 10000 ** (2 * i / d)), abs=1e-6)


@pytest.mark.parametrize("d", [16, 17])
def test_fairseq_sinusoids_equal_m2m100s_table(d):
    """M2M100/NLLB's positions: sin half, cos half, frequencies 10000^(-i/(d/2-1)), an odd width's last column 0."""
    from seqserve.model.positional import fairseq_sinusoid_table

    table = fairseq_sinusoid_table(40, d)
    half, pos, i = d // 2, 9, 3
    assert table[pos, i].item() == pytest.approx(math.sin(pos * 10000 ** (-i / (half - 1))), abs=1e-6)
    assert table[pos, half + i].item() == pytest.approx(math.cos(pos * 10000 ** (-i / (half - 1))), abs=1e-6)
    transformers = pytest.importorskip("transformers")
    embedding = transformers.models.m2m_100.modeling_m2m_100.M2M100SinusoidalPositionalEmbedding
    assert torch.allclose(table, embedding.get_embedding(40, d).float(), atol=1e-6)


@pytest.mark.parametrize("k", [1, 5, 17])
def test_positional_encoding_relative_shift_is_a_fixed_rotation(k):
    d = 16
    table = sinusoid_table(200, d).double()
    rotation = torch.zeros(d, d, dtype=torch.float64)
    for i in range(d // 2):
        w = k / 10000 ** (2 * i / d)  # [sin(a+b), cos(a+b)] = [[cos b, sin b], [-sin b, cos b]] [sin a, cos a]
        rotation[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = torch.tensor(
            [[math.cos(w), math.sin(w)], [-math.sin(w), math.cos(w)]], dtype=torch.float64)
    shifted = table[:-k] @ rotation.T  # the same matrix for every pos
    assert torch.allclose(shifted, table[k:], atol=1e-5)


def test_multi_head_attention_equals_per_head_formula():
    torch.manual_seed(1)
    d, h = 24, 3
    dh = d // h
    mha = MultiHeadAttention(d, h, dropout=0.0).eval()
    x = torch.randn(2, 5, d)
    mem = torch.randn(2, 7, d)
    got = mha(x, *mha.project_kv(mem), torch.zeros(1))
    heads = []
    for i in range(h):
        sl = slice(i * dh, (i + 1) * dh)
        q = x @ mha.q_proj.weight[sl].T + mha.q_proj.bias[sl]
        k = mem @ mha.k_proj.weight[sl].T + mha.k_proj.bias[sl]
        v = mem @ mha.v_proj.weight[sl].T + mha.v_proj.bias[sl]
        heads.append(torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(dh), dim=-1) @ v)
    want = torch.cat(heads, dim=-1) @ mha.o_proj.weight.T + mha.o_proj.bias
    assert torch.allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_future_target_tokens_never_change_earlier_logits(norm_first):
    model = small_model(norm_first)
    src, src_mask = pad_batch([[5, 6, 7, 2], [8, 9, 2]], 0)
    tgt = torch.tensor([[1, 10, 11, 12, 13], [1, 14, 15, 16, 17]])
    tgt_mask = torch.ones_like(tgt)
    base = model(src, src_mask, tgt, tgt_mask)
    changed = tgt.clone()
    changed[:, 3:] = torch.tensor([[30, 31], [32, 33]])
    after = model(src, src_mask, changed, tgt_mask)
    assert torch.equal(base[:, :3], after[:, :3])
    assert not torch.allclose(base[:, 3:], after[:, 3:])  # the change itself is visible


@pytest.mark.parametrize("norm_first", [False, True])
def test_padded_positions_never_change_real_outputs(norm_first):
    model = small_model(norm_first)
    src, src_mask = pad_batch([[5, 6, 7, 8, 2], [8, 9, 2]], 0)
    tgt = torch.tensor([[1, 10, 11, 0], [1, 14, 0, 0]])
    tgt_mask = (tgt != 0).long()
    tgt_mask[:, 0] = 1
    base = model(src, src_mask, tgt, tgt_mask)
    noisy_src, noisy_tgt = src.clone(), tgt.clone()
    noisy_src[1, 3:] = torch.tensor([21, 22])  # padding slots get arbitrary tokens
    noisy_tgt[0, 3], noisy_tgt[1, 2:] = 23, torch.tensor([24, 25])
    after = model(noisy_src, src_mask, noisy_tgt, tgt_mask)
    real = tgt_mask.bool()
    assert torch.allclose(base[real], after[real], atol=1e-6)
    assert torch.allclose(model.encode(src, src_mask)[1, :3], model.encode(noisy_src, src_mask)[1, :3], atol=1e-6)


@pytest.mark.parametrize("norm_first", [False, True])
def test_cached_decoding_equals_uncached_over_a_generation(norm_first):
    model = small_model(norm_first, tie=not norm_first)
    src, src_mask = pad_batch([[5, 6, 7, 8, 2], [9, 10, 2]], 0)
    cross = model.cross_kv(model.encode(src, src_mask))
    tokens = torch.tensor([[1], [1]])
    past = None
    with torch.no_grad():
        for step in range(20):
            pos = torch.full((2, 1), step)
            cached, past = model.decode(tokens[:, -1:], pos, torch.ones(2, step + 1, dtype=torch.long),
                                        src_mask, cross, past, causal=False)
            t = tokens.shape[1]
            full, _ = model.decode(tokens, torch.arange(t).expand(2, t), torch.ones(2, t, dtype=torch.long),
                                   src_mask, cross)
            assert torch.allclose(cached[:, 0], full[:, -1], atol=1e-5, rtol=0)
            tokens = torch.cat([tokens, cached[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert past[0][0].shape == (2, 4, 20, 8)  # (B, H, P, Dh)
    assert greedy_decode(model, [[5, 6, 7, 8, 2]], 20, True) == greedy_decode(model, [[5, 6, 7, 8, 2]], 20, False)


def test_row_alone_equals_row_in_padded_batch():
    model = small_model()
    sources = [[5, 6, 7, 8, 9, 10, 2], [11, 2], [12, 13, 14, 2]]
    batched = greedy_decode(model, sources, 15)
    alone = [greedy_decode(model, [s], 15)[0] for s in sources]
    assert batched == alone
    src, mask = pad_batch(sources, 0)
    one, one_mask = pad_batch(sources[1:2], 0)
    assert torch.allclose(model.encode(src, mask)[1, :2], model.encode(one, one_mask)[0], atol=1e-5)


def test_config_round_trip_and_validation(tmp_path):
    cfg = small_model().cfg
    cfg.save(tmp_path / "config.json")
    assert ModelConfig.load(tmp_path / "config.json") == cfg
    with pytest.raises(ValueError, match="divisible"):
        ModelConfig(vocab_size=10, d_model=30, n_heads=4)
