"""One engine's figures as Prometheus metrics: every StepReport's StepStats, applied on the event loop.

The engine measures plain numbers (engine/api.py StepStats) and knows nothing of Prometheus; this is the one place
they become the metrics server/metrics.py defines. The gauges are the latest report's, per engine, so a model's
versions (one serving, one draining) add up instead of overwriting each other (App._report_gauges).
"""
from __future__ import annotations

from seqserve.engine.api import StepStats
from seqserve.server.metrics import ModelMetrics


class EngineMetrics:
    def __init__(self, metrics: ModelMetrics) -> None:
        self.metrics = metrics
        self.running = self.waiting = self.kv_cache_bytes = 0  # as this engine's latest report left them

    def apply(self, stats: StepStats) -> None:
        """One step's figures (event loop only)."""
        m = self.metrics
        for metric, values in ((m.encoder_duration, stats.encoder_seconds),
                               (m.decoder_step_duration, stats.decoder_seconds), (m.batch_rows, stats.batch_rows),
                               (m.queue_duration, stats.queue_seconds),
                               (m.time_to_first_token, stats.first_token_seconds),
                               (m.inter_token_latency, stats.inter_token_seconds)):
            for value in values:
                metric.observe(value)
        for reason in stats.finished:
            m.finished.labels(reason).inc()
        if stats.input_tokens:
            m.input_tokens.inc(stats.input_tokens)
        if stats.generated_tokens:
            m.generated_tokens.inc(stats.generated_tokens)
        self.running, self.waiting, self.kv_cache_bytes = stats.running, stats.waiting, stats.kv_cache_bytes

    def gauge(self, i: int) -> int:
        """Running rows (0), waiting requests (1) or KV-cache bytes (2), as the latest report left them."""
        return (self.running, self.waiting, self.kv_cache_bytes)[i]
