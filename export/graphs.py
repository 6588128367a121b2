"""nn.Module wrappers whose forward() is exactly one ONNX graph's signature (flat tensors in, flat tensors out)."""
from __future__ import annotations

import torch
from torch import nn

from seqserve.model.transformer import Transformer


class EncoderGraph(nn.Module):
    """input_ids, attention_mask (B, S) -> every decoder layer's cross-attention K, V (B, H, S, Dh)."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        cross = self.model.cross_kv(self.model.encode(input_ids, attention_mask))
        return tuple(t for kv in cross for t in kv)


class DecoderStepGraph(nn.Module):
    """One decoder step for a batch whose rows sit at their own past and source lengths."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model
        self.n_layers = model.cfg.n_decoder_layers

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, 1)
        position_ids: torch.Tensor,  # (B, 1)
        decoder_attention_mask: torch.Tensor,  # (B, P+1)
        encoder_attention_mask: torch.Tensor,  # (B, S)
        *kv: torch.Tensor,  # n_layers x (past K, V) (B, H, P, Dh), then n_layers x (cross K, V) (B, H, S, Dh)
    ) -> tuple[torch.Tensor, ...]:
        n = self.n_layers
        past = [(kv[2 * i], kv[2 * i + 1]) for i in range(n)]
        cross = [(kv[2 * n + 2 * i], kv[2 * n + 2 * i + 1]) for i in range(n)]
        logits, present = self.model.decode(input_ids, position_ids, decoder_attention_mask, encoder_attention_mask,
                                            cross, past, causal=False)
        # (B, V), then (B, H, P+1, Dh) per layer and kind
        return (logits[:, -1].float(),) + tuple(t for kv_pair in present for t in kv_pair)
