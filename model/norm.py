"""The residual blocks' normalisation: LayerNorm, or T5's RMS norm (no mean, no bias, the variance in float32)."""
from __future__ import annotations

import torch
from torch import nn

from seqserve.model.config import ModelConfig


class RMSNorm(nn.Module):
    """weight * x / sqrt(mean(x^2) + eps), as transformers' T5LayerNorm computes it (the mean of squares in float32
    whatever x's dtype)."""

    def __init__(self, d_model: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model))  # (D,)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)  # (..., 1)
        return self.weight * (x * torch.rsqrt(variance + self.eps))  # (..., D)


def make_norm(cfg: ModelConfig) -> nn.Module:
    """The model's norm over d_model (cfg.norm, cfg.norm_eps)."""
    if cfg.norm == "rms":
        return RMSNorm(cfg.d_model, cfg.norm_eps)
    return nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
