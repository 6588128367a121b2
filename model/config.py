"""Model configuration: one small dataclass saved as config.json beside every checkpoint."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

# Additive mask value for forbidden attention scores: finite so a fully masked row never yields NaN,
# and small enough in magnitude to stay finite in float16 (max 65504).
MASK_FILL = -1.0e4
LN_EPSILON = 1e-5  # every LayerNorm's epsilon (torch's and Hugging Face's default)

# Architecture options (docs/architecture.md "Model options"); the first of each is the seeds' choice.
# interleaved sin/cos; sin half then cos half (Marian); fairseq's halves from an offset (M2M100); learned (BART)
# relative: no position vectors, a learned bias per (bucket of key - query, head) on attention scores (T5)
POSITIONS = ("sinusoidal", "sinusoidal_halves", "sinusoidal_fairseq", "learned", "relative")
OFFSET_POSITIONS = ("learned", "sinusoidal_fairseq")  # the kinds whose position 0 may sit at a table row > 0
ACTIVATIONS = ("relu", "gelu", "silu", "gelu_tanh")  # gelu: the exact (erf) form; silu = swish; gelu_tanh: gelu_new
NORMS = ("layer", "rms")  # LayerNorm; RMS norm without mean or bias, its variance in float32 (T5)


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    d_model: int = 256
    n_heads: int = 4
    n_encoder_layers: int = 3
    n_decoder_layers: int = 3
    d_ff: int = 1024
    dropout: float = 0.1
    max_positions: int = 256  # longest source or target (tokens) the position table covers
    norm_first: bool = False  # False = the paper's post-LN; True = pre-LN (+ a final LayerNorm)
    tie_embeddings: bool = True  # share source and target embeddings (paper 3.4)
    tie_output: bool | None = None  # output projection = target embedding; None = as tie_embeddings
    positions: str = "sinusoidal"  # one of POSITIONS
    position_offset: int = 0  # learned / sinusoidal_fairseq: the table row of position 0 (BART: 2, M2M100: pad + 1)
    embed_norm: bool = False  # a LayerNorm after embeddings + positions (BART, mBART)
    activation: str = "relu"  # the FFN's, one of ACTIVATIONS
    scale_embeddings: bool = True  # token embeddings times sqrt(d_model) (paper 3.4)
    final_logits_bias: bool = False  # a bias added to the logits (Marian, BART)
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    unk_id: int = 3
    decoder_start_id: int | None = None  # the decoder's first input; None = bos_id (Marian: pad, BART: eos)
    # T5's switches (DESIGN "Pretrained encoder-decoders"); each default is every other family's choice.
    d_kv: int | None = None  # each head's width; None = d_model / n_heads (T5: n_heads * d_kv may differ from d_model)
    bias: bool = True  # linear layers have biases (T5: none)
    norm: str = "layer"  # one of NORMS
    norm_eps: float = LN_EPSILON
    scale_attention: bool = True  # scores / sqrt(head_dim) (T5: unscaled)
    gated_ffn: bool = False  # act(x W1) * (x W3), then W2 (T5 v1.1, Flan-T5, mT5: gated-gelu)
    relative_buckets: int = 32  # relative positions: buckets of the bias table
    relative_max_distance: int = 128  # relative positions: distances from here on share the last bucket
    scale_output: bool = False  # the decoder output times d_model^-0.5 before out_proj (T5 v1.0)

    def __post_init__(self) -> None:
        if self.d_kv is None and self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if min(self.vocab_size, self.d_model, self.n_heads, self.d_ff, self.max_positions) <= 0:
            raise ValueError(f"ModelConfig sizes must be positive: {self}")
        if self.positions not in POSITIONS:
            raise ValueError(f"positions must be one of {POSITIONS}, got {self.positions!r}")
        if self.norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, got {self.norm!r}")
        if min(self.d_kv or 1, self.relative_buckets, self.relative_max_distance) <= 0:
            raise ValueError(f"d_kv, relative_buckets and relative_max_distance must be positive: {self}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        if self.position_offset < 0 or (self.position_offset and self.positions not in OFFSET_POSITIONS):
            raise ValueError(f"position_offset must be >= 0 and only with {' or '.join(OFFSET_POSITIONS)} positions, "
                             f"got {self.position_offset} with {self.positions!r}")
        # Resolved once, so to_dict() says exactly what the model does (frozen: set through object.__setattr__).
        if self.tie_output is None:
            object.__setattr__(self, "tie_output", self.tie_embeddings)
        if self.decoder_start_id is None:
            object.__setattr__(self, "decoder_start_id", self.bos_id)
        for name in ("pad_id", "bos_id", "eos_id", "unk_id", "decoder_start_id"):
            if not 0 <= getattr(self, name) < self.vocab_size:
                raise ValueError(f"{name}={getattr(self, name)} is outside the vocabulary "
                                 f"(vocab_size={self.vocab_size})")

    @property
    def head_dim(self) -> int:
        return self.d_kv or self.d_model // self.n_heads

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
