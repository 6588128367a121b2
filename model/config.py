"""Model configuration: one small dataclass saved as config.json beside every checkpoint."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

# Additive mask value for forbidden attention scores: finite so a fully masked row never yields NaN,
# and small enough in magnitude to stay finite in float16 (max 65504).
MASK_FILL = -1.0e4


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    d_model: int = 256
    n_heads: int = 4
    n_encoder_layers: int = 3
    n_decoder_layers: int = 3
    d_ff: int = 1024
    dropout: float = 0.1
    max_positions: int = 256  # longest source or target (tokens) the sinusoid table covers
    norm_first: bool = False  # False = the paper's post-LN; True = pre-LN (+ a final LayerNorm)
    tie_embeddings: bool = True  # share source/target embeddings and the output projection (paper 3.4)
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    unk_id: int = 3

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if min(self.vocab_size, self.d_model, self.n_heads, self.d_ff, self.max_positions) <= 0:
            raise ValueError(f"ModelConfig sizes must be positive: {self}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "ModelConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown ModelConfig fields: {sorted(unknown)}")
        return cls(**data)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "ModelConfig":
        return cls.from_dict(json.loads(Path(path).read_text()))
