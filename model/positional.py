"""Sinusoidal positional encoding (Vaswani et al. 2017, section 3.5)."""
from __future__ import annotations

import math

import torch


def sinusoid_table(max_positions: int, d_model: int) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)), in radians."""
    pos = torch.arange(max_positions, dtype=torch.float64).unsqueeze(1)  # (P, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (D/2,)
    angle = pos / torch.pow(10000.0, two_i / d_model)  # (P, D/2)
    table = torch.zeros(max_positions, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return table.to(torch.float32)  # computed in float64 so large positions stay accurate


class PositionalEncoding(torch.nn.Module):
    """Looks positions up by index, so every row of a batch may sit at its own absolute position."""

    def __init__(self, max_positions: int, d_model: int) -> None:
        super().__init__()
        self.register_buffer("table", sinusoid_table(max_positions, d_model), persistent=False)
        self.scale = math.sqrt(d_model)

    def forward(self, embedded: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # embedded: (B, T, D) token embeddings; positions: (B, T) int64 absolute positions
        return embedded * self.scale + self.table[positions]  # (B, T, D); embeddings scaled by sqrt(d) (3.4)
