"""What the engine measures during a step, kept as plain numbers until the step hands them back (api.StepStats)."""
from __future__ import annotations

from dataclasses import dataclass, field

from seqserve.engine.api import StepStats


@dataclass
class Stats:
    """Filled by the engine thread alone during a step; taken once at its end."""

    input_tokens: int = 0
    generated_tokens: int = 0
    encoder_seconds: list[float] = field(default_factory=list)
    decoder_seconds: list[float] = field(default_factory=list)
    batch_rows: list[int] = field(default_factory=list)
    queue_seconds: list[float] = field(default_factory=list)
    first_token_seconds: list[float] = field(default_factory=list)
    inter_token_seconds: list[float] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)

    def take(self, running: int, waiting: int, kv_cache_bytes: int) -> StepStats:
        """The step's figures by value, with the gauges as the step left them; the record starts empty again."""
        out = StepStats(self.input_tokens, self.generated_tokens, tuple(self.encoder_seconds),
                        tuple(self.decoder_seconds), tuple(self.batch_rows), tuple(self.queue_seconds),
                        tuple(self.first_token_seconds), tuple(self.inter_token_seconds), tuple(self.finished),
                        running, waiting, kv_cache_bytes)
        self.__init__()
        return out
