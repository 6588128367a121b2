"""Multi-head scaled dot-product attention, written from the equations (section 3.2)."""
from __future__ import annotations

import math

import torch
from torch import nn

from seqserve.model.config import MASK_FILL


def padding_bias(mask: torch.Tensor) -> torch.Tensor:
    """(B, S) 1 = attend / 0 = padding -> additive bias (B, 1, 1, S) with a finite fill."""
    return (1.0 - mask.to(torch.float32))[:, None, None, :] * MASK_FILL


def causal_bias(n_queries: int, n_keys: int, device: torch.device | None = None) -> torch.Tensor:
    """(1, 1, T, P+T): query t (absolute index P+t) may see key j only if j <= P+t (3.2.3 look-ahead mask)."""
    past = n_keys - n_queries
    q = torch.arange(n_queries, device=device)[:, None] + past  # (T, 1)
    k = torch.arange(n_keys, device=device)[None, :]  # (1, P+T)
    return (k > q).to(torch.float32)[None, None] * MASK_FILL


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O, head_i = softmax(Q W_i^Q (K W_i^K)^T / sqrt(d_k)) V W_i^V."""

    def __init__(self, d_model: int, n_heads: int, dropout: float, head_dim: int | None = None, bias: bool = True,
                 scale: bool = True) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = head_dim or d_model // n_heads
        inner = n_heads * self.head_dim  # d_model, except in T5 models whose n_heads * d_kv differs from it
        self.q_proj = nn.Linear(d_model, inner, bias=bias)
        self.k_proj = nn.Linear(d_model, inner, bias=bias)
        self.v_proj = nn.Linear(d_model, inner, bias=bias)
        self.o_proj = nn.Linear(inner, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)
        self.scale = scale  # T5 leaves scores unscaled (its initialisation accounts for it)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape  # (B, T, D)
        return x.view(b, t, self.n_heads, self.head_dim).transpose(1, 2)  # (B, T, H * Dh) -> (B, H, T, Dh)

    def project_kv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of x, split into heads: the tensors a KV cache stores."""
        return self.split_heads(self.k_proj(x)), self.split_heads(self.v_proj(x))  # 2 x (B, H, S, Dh)

    def forward(self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        # x: (B, T, D) queries' input; k, v: (B, H, S, Dh); bias: additive, broadcastable to (B, H, T, S)
        q = self.split_heads(self.q_proj(x))  # (B, H, T, Dh)
        scores = q @ k.transpose(-2, -1)  # (B, H, T, S)
        scores = (scores / math.sqrt(self.head_dim) if self.scale else scores) + bias
        weights = self.dropout(torch.softmax(scores, dim=-1))  # (B, H, T, S)
        out = weights @ v  # (B, H, T, Dh)
        b, _, t, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))  # (B, T, D): heads concatenated, then W^O
