"""Position encodings: the paper's sinusoids (section 3.5), interleaved or in halves (Marian), fairseq's sinusoids
from an offset (M2M100, NLLB), or a learned table with an offset (BART); and the token embedding's scale (3.4)."""
from __future__ import annotations

import math

import torch
from torch import nn


def sinusoid_table(max_positions: int, d_model: int, halves: bool = False) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)), in radians.

    halves=True puts every sin first and every cos after them (Marian's and CTranslate2's layout), same angles."""
    pos = torch.arange(max_positions, dtype=torch.float64).unsqueeze(1)  # (P, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (D/2,)
    angle = pos / torch.pow(10000.0, two_i / d_model)  # (P, D/2)
    table = torch.zeros(max_positions, d_model, dtype=torch.float64)
    if halves:
        half = (d_model + 1) // 2  # an odd d_model gives sin one more column, as Marian does
        table[:, :half] = torch.sin(angle)
        table[:, half:] = torch.cos(angle[:, : d_model - half])
    else:
        table[:, 0::2] = torch.sin(angle)
        table[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return table.to(torch.float32)  # computed in float64 so large positions stay accurate


def fairseq_sinusoid_table(rows: int, d_model: int) -> torch.Tensor:
    """M2M100's (fairseq's) table: sin(pos * w_i) in the first half and cos in the second, w_i = 10000^(-i/(h-1))
    with h = d/2 (not the paper's 10000^(-2i/d)); an odd d_model gets a zero last column."""
    half = d_model // 2
    freq = torch.exp(torch.arange(half, dtype=torch.float64) * -(math.log(10000.0) / (half - 1)))  # (D/2,)
    angle = torch.arange(rows, dtype=torch.float64).unsqueeze(1) * freq.unsqueeze(0)  # (P, D/2)
    table = torch.zeros(rows, d_model, dtype=torch.float64)
    table[:, :half], table[:, half: 2 * half] = torch.sin(angle), torch.cos(angle)
    return table.to(torch.float32)


class PositionalEncoding(nn.Module):
    """embedding * scale + table[position + offset], looked up by index, so every row of a batch may sit at its own
    absolute position. A sinusoid table is a buffer (not saved); a learned one is a parameter `table`."""

    def __init__(self, max_positions: int, d_model: int, kind: str = "sinusoidal", offset: int = 0,
                 scale: bool = True) -> None:
        super().__init__()
        if kind == "relative":  # no position vectors (T5: a bias on the attention scores instead)
            self.register_buffer("table", torch.zeros(0, d_model), persistent=False)
        elif kind == "learned":
            self.table = nn.Parameter(torch.zeros(max_positions + offset, d_model))  # (P + offset, D)
        elif kind == "sinusoidal_fairseq":  # position 0 is row `offset` (M2M100: padding_idx + 1)
            self.register_buffer("table", fairseq_sinusoid_table(max_positions + offset, d_model), persistent=False)
        else:
            self.register_buffer("table", sinusoid_table(max_positions, d_model, kind == "sinusoidal_halves"),
                                 persistent=False)
        self.offset = offset
        self.scale = math.sqrt(d_model) if scale else 1.0

    def rows(self) -> torch.Tensor:
        """(P, D): the vectors of positions 0..P-1 (the offset's rows dropped): what the ONNX graphs gather."""
        return self.table[self.offset:]

    def forward(self, embedded: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # embedded: (B, T, D) token embeddings; positions: (B, T) int64 absolute positions
        if not len(self.table):
            return embedded * self.scale  # (B, T, D)
        return embedded * self.scale + self.table[positions + self.offset]  # (B, T, D)
