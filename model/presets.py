"""Training configuration as a typed dataclass, and the named presets."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

# What picks the checkpoint that training keeps (see TrainConfig.select_by).
SELECT_BY: tuple[str, ...] = ("loss", "chrf", "exact_match")


@dataclass(frozen=True)
class ArchConfig:
    """The ModelConfig fields a preset chooses (vocab size and special ids come from the tokenizer)."""

    d_model: int = 256
    n_heads: int = 4
    n_encoder_layers: int = 3
    n_decoder_layers: int = 3
    d_ff: int = 1024
    dropout: float = 0.1
    max_positions: int = 256
    norm_first: bool = False
    tie_embeddings: bool = True


@dataclass(frozen=True)
class TrainConfig:
    preset: str = "default"
    task: str = "verbalise"  # "verbalise" (the default corpus), "copy" (tiny), or "tsv" (bring your own)
    data: str | None = None  # TSV path when task == "tsv"
    n_train: int = 60_000
    n_valid: int = 1_000
    n_test: int = 2_000
    vocab_size: int = 2_000
    arch: ArchConfig = field(default_factory=ArchConfig)
    max_tokens: int = 6_000  # per batch, padding included, summed over source and target
    lr: float = 1e-3  # peak learning rate after warmup
    warmup_steps: int = 300
    max_steps: int = 3_000
    weight_decay: float = 0.01
    label_smoothing: float = 0.1
    clip_norm: float = 1.0
    eval_every: int = 500
    eval_samples: int = 500  # validation examples decoded at each evaluation (exact match, chrF, BLEU)
    eval_loss_samples: int = 2_000  # validation examples scored by teacher forcing (no decoding: cheap)
    # The kept checkpoint is the evaluation with the lowest validation loss (default), or the highest chrF or exact
    # match (ties broken by the lower loss). Loss is the default: it ranks any two evaluations (no ties, no
    # saturation at 100%), needs no decoding budget, and on real text exact match is a handful of hits that pick an
    # early step (a run kept step 400 at test chrF 19.1 against 27.6 for the last step).
    select_by: str = "loss"
    max_minutes: float = 0.0  # wall-clock budget of the training loop (0 = none): it stops at the best so far
    seed: int = 0
    threads: int = 0  # torch intra-op threads; 0 = torch's default

    def __post_init__(self) -> None:
        if self.select_by not in SELECT_BY:
            raise ValueError(f"select_by must be one of {SELECT_BY}, got {self.select_by!r}")
        if self.max_minutes < 0:
            raise ValueError(f"max_minutes must be >= 0 (0 = no budget), got {self.max_minutes}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "TrainConfig":
        data = dict(data)
        data["arch"] = ArchConfig(**data.get("arch", {}))
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "TrainConfig":
        return cls.from_dict(json.loads(Path(path).read_text()))


PRESETS: dict[str, TrainConfig] = {
    # Tests: a copy task (1400 steps took 278 s with 1 thread on 2 cores loaded by other work). 1400 steps, because
    # when the copy alignment is found varies by seed and thread count: at 1000 steps the test exact match was 96%
    # and 99% (seed 0, 2 and 1 threads), 100% (seed 1) and 92% (seed 2); at 1400, 99.5% (seed 0), 100% (seeds 2, 3).
    "tiny": TrainConfig(
        preset="tiny", task="copy", n_train=4_000, n_valid=200, n_test=200, vocab_size=64,
        arch=ArchConfig(d_model=64, n_heads=4, n_encoder_layers=2, n_decoder_layers=2, d_ff=128,
                        dropout=0.0, max_positions=64),
        max_tokens=2_400, lr=3e-3, warmup_steps=60, max_steps=1_400, eval_every=700, eval_samples=200,
    ),
    # The shipped model: multilingual number verbalisation, >= 99% exact match in under 10 minutes on 2 cores.
    # Sized by measurement (README "The default model"): d_model 128 steps ~3x faster than 192 on 2 cores and
    # passes 96% valid exact match by step 1200; 2400 steps are ~6 passes over 60k pairs, too few to need dropout.
    "default": TrainConfig(
        preset="default", task="verbalise", max_tokens=4_000, lr=1.5e-3, warmup_steps=300, max_steps=2_400,
        eval_every=400, eval_samples=300,
        arch=ArchConfig(d_model=128, n_heads=4, n_encoder_layers=3, n_decoder_layers=3, d_ff=512, dropout=0.0),
    ),
}


def preset(name: str, **overrides) -> TrainConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose from {sorted(PRESETS)}")
    return replace(PRESETS[name], **overrides)


# Standard model sizes for benchmarks with random weights (seqserve bench --shape, export/step_bench.py): small, and
# Transformer-base / MarianMT's; vocabulary 8,000. The architecture only: no training preset uses them.
SHAPES: dict[str, ArchConfig] = {
    "small": ArchConfig(d_model=256, n_heads=4, n_encoder_layers=3, n_decoder_layers=3, d_ff=1024, dropout=0.0),
    "base": ArchConfig(d_model=512, n_heads=8, n_encoder_layers=6, n_decoder_layers=6, d_ff=2048, dropout=0.0),
}
SHAPE_VOCAB = 8_000
