"""Encoder and decoder layers: attention + position-wise FFN, each wrapped in residual + LayerNorm (3.1, 3.3)."""
from __future__ import annotations

import math

import torch
from torch import nn

from seqserve.model.attention import MultiHeadAttention
from seqserve.model.config import ModelConfig
from seqserve.model.norm import make_norm

KV = tuple[torch.Tensor, torch.Tensor]  # keys, values: (B, H, S, Dh) each


class TanhGELU(nn.Module):
    """GELU's tanh approximation written as transformers' gelu_new (NewGELUActivation) computes it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


# GELU: the exact erf form, as HF's "gelu"
ACTIVATION = {"relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU, "gelu_tanh": TanhGELU}


class FeedForward(nn.Module):
    """FFN(x) = act(x W1 + b1) W2 + b2, act = ReLU in the paper (3.3); gated: (act(x W1) * x W3) W2 (T5 v1.1)."""

    def __init__(self, d_model: int, d_ff: int, dropout: float, activation: str = "relu", bias: bool = True,
                 gated: bool = False) -> None:
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff, bias=bias)
        self.w2 = nn.Linear(d_ff, d_model, bias=bias)
        self.w3 = nn.Linear(d_model, d_ff, bias=bias) if gated else None  # the gate's linear branch
        self.act = ACTIVATION[activation]()
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.w1(x))  # (B, T, F)
        if self.w3 is not None:
            h = h * self.w3(x)
        return self.w2(self.dropout(h))  # (B, T, D)


class Residual(nn.Module):
    """LayerNorm(x + Dropout(Sublayer(x))) post-LN (5.4), or x + Dropout(Sublayer(LayerNorm(x))) pre-LN."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.norm = make_norm(cfg)
        self.dropout = nn.Dropout(cfg.dropout)
        self.norm_first = cfg.norm_first

    def forward(self, x: torch.Tensor, sublayer) -> torch.Tensor:
        if self.norm_first:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))


def _attention(cfg: ModelConfig) -> MultiHeadAttention:
    return MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.dropout, cfg.head_dim, cfg.bias, cfg.scale_attention)


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = _attention(cfg)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.dropout, cfg.activation, cfg.bias, cfg.gated_ffn)
        self.res_attn = Residual(cfg)
        self.res_ffn = Residual(cfg)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        # x: (B, S, D); bias: (B, 1, 1, S) source padding, or (B, H, S, S) with relative positions
        x = self.res_attn(x, lambda h: self.self_attn(h, *self.self_attn.project_kv(h), bias))
        return self.res_ffn(x, self.ffn)  # (B, S, D)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = _attention(cfg)
        self.cross_attn = _attention(cfg)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.dropout, cfg.activation, cfg.bias, cfg.gated_ffn)
        self.res_self = Residual(cfg)
        self.res_cross = Residual(cfg)
        self.res_ffn = Residual(cfg)

    def forward(
        self, x: torch.Tensor, self_bias: torch.Tensor, past: KV | None, cross: KV, cross_bias: torch.Tensor
    ) -> tuple[torch.Tensor, KV]:
        # x: (B, T, D); self_bias: (B, 1, T, P+T); past: (B, H, P, Dh) x2 or None; cross: (B, H, S, Dh) x2
        present: list[KV] = []

        def self_block(h: torch.Tensor) -> torch.Tensor:
            k, v = self.self_attn.project_kv(h)  # (B, H, T, Dh)
            if past is not None:
                k = torch.cat([past[0], k], dim=2)  # (B, H, P+T, Dh)
                v = torch.cat([past[1], v], dim=2)
            present.append((k, v))
            return self.self_attn(h, k, v, self_bias)

        x = self.res_self(x, self_block)
        x = self.res_cross(x, lambda h: self.cross_attn(h, cross[0], cross[1], cross_bias))
        return self.res_ffn(x, self.ffn), present[0]  # (B, T, D), present self-attention K/V
