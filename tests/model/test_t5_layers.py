"""T5's pieces against transformers' own (the oracle): the relative position buckets, the RMS norm, gelu_new; and the
relative-position model's cached decoding against its full forward pass, with past slots that are holes."""
from __future__ import annotations

import pytest
import torch

from seqserve.model.config import ModelConfig
from seqserve.model.decoding import greedy_decode
from seqserve.model.layers import TanhGELU
from seqserve.model.norm import RMSNorm
from seqserve.model.relative_position import RelativePositionBias, relative_bucket
from seqserve.model.transformer import Transformer

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("buckets, distance", [(32, 128), (8, 20), (4, 3), (64, 256)])
@pytest.mark.parametrize("bidirectional", [True, False])
def test_buckets_equal_transformers(buckets, distance, bidirectional):
    from transformers.models.t5.modeling_t5 import T5Attention

    relative = torch.arange(-600, 601)  # (1201,) key - query
    want = T5Attention._relative_position_bucket(relative, bidirectional, buckets, distance)
    assert torch.equal(relative_bucket(relative, bidirectional, buckets, distance), want)
    table = RelativePositionBias(3, buckets, distance, bidirectional, max_positions=601)
    assert torch.equal(table.buckets, want)  # every relative position the model can see, looked up


def test_rms_norm_and_gelu_new_equal_transformers_bitwise():
    from transformers.activations import NewGELUActivation
    from transformers.models.t5.modeling_t5 import T5LayerNorm

    x = torch.randn(3, 5, 32) * 4  # (B, T, D)
    theirs = T5LayerNorm(32, eps=1e-6)
    ours = RMSNorm(32, 1e-6)
    with torch.no_grad():
        theirs.weight.normal_()
        ours.weight.copy_(theirs.weight)
    assert torch.equal(ours(x), theirs(x))
    assert torch.equal(TanhGELU()(x), NewGELUActivation()(x))


def t5_model(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=40, d_model=32, n_heads=3, d_kv=16, n_encoder_layers=2, n_decoder_layers=2, d_ff=48,
                      dropout=0.0, max_positions=64, norm_first=True, positions="relative", scale_embeddings=False,
                      final_logits_bias=False, bias=False, norm="rms", norm_eps=1e-6, scale_attention=False,
                      gated_ffn=True, activation="gelu_tanh", relative_buckets=8, relative_max_distance=20,
                      pad_id=0, bos_id=0, eos_id=1, unk_id=2, tie_output=False)
    return Transformer(cfg).eval()


@torch.no_grad()
def test_cached_steps_with_holes_equal_the_full_forward_pass():
    """Row 1 joins two steps late: its first two past slots are holes (mask 0). Its key positions come from the mask
    (real keys before it), so each cached step's logits equal the teacher-forced forward pass of that row alone."""
    model = t5_model()
    src = torch.tensor([[5, 6, 7, 8, 9, 1], [11, 12, 1, 0, 0, 0]])
    src_mask = (src != 0).long()
    src_mask[0, -1] = 1
    cross = model.cross_kv(model.encode(src, src_mask))
    targets = [[0, 7, 9, 11, 13, 15, 17], [0, 21, 23, 25, 27]]  # row 1 starts at step 2
    past, hist = None, []
    for t in range(7):
        ids = torch.tensor([[targets[0][t]], [targets[1][t - 2] if t >= 2 else 0]])
        positions = torch.tensor([[t], [max(t - 2, 0)]])
        hist.append([1, int(t >= 2)])
        self_mask = torch.tensor(hist).T  # (B, P+1): row 1's first two columns are holes
        logits, past = model.decode(ids, positions, self_mask, src_mask, cross, past, causal=False)
        for row, start in ((0, 0), (1, 2)):
            if t < start:
                continue
            n = t - start + 1
            full = model(src[row:row + 1], src_mask[row:row + 1], torch.tensor([targets[row][:n]]),
                         torch.ones(1, n, dtype=torch.long))
            assert torch.allclose(logits[row, -1], full[0, -1], atol=1e-5, rtol=0), (t, row)
    assert greedy_decode(model, [[5, 6, 1]], 12, True) == greedy_decode(model, [[5, 6, 1]], 12, False)
