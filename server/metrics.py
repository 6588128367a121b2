"""Every Prometheus metric seqserve exports, in one place (prefix seqserve_, base units, low-cardinality labels).

Each server owns its registry, so several servers in one process (the tests) never share counters.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

# Latency buckets in seconds, fine around milliseconds where a decoder step lives.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("seqserve_requests", "gRPC calls by method and final status code",
                                ["method", "code"], registry=r)
        self.request_duration = Histogram("seqserve_request_duration_seconds", "End-to-end time of a generation",
                                          ["method"], buckets=LATENCY_BUCKETS, registry=r)
        self.queue_duration = Histogram("seqserve_queue_duration_seconds", "Time from arrival to joining the batch",
                                        buckets=LATENCY_BUCKETS, registry=r)
        self.time_to_first_token = Histogram("seqserve_time_to_first_token_seconds", "Arrival to first generated token",
                                             buckets=LATENCY_BUCKETS, registry=r)
        self.inter_token_latency = Histogram("seqserve_inter_token_latency_seconds", "Time between a row's tokens",
                                             buckets=LATENCY_BUCKETS, registry=r)
        self.encoder_duration = Histogram("seqserve_encoder_duration_seconds", "encoder.onnx run for admitted rows",
                                          buckets=LATENCY_BUCKETS, registry=r)
        self.decoder_step_duration = Histogram("seqserve_decoder_step_duration_seconds",
                                               "decoder.onnx run for one step of the whole batch",
                                               buckets=LATENCY_BUCKETS, registry=r)
        self.batch_rows = Histogram("seqserve_batch_rows", "Rows in each decoder step", buckets=ROW_BUCKETS, registry=r)
        self.running = Gauge("seqserve_running_requests", "Rows in the running batch", registry=r)
        self.waiting = Gauge("seqserve_waiting_requests", "Requests queued for admission", registry=r)
        self.kv_cache_bytes = Gauge("seqserve_kv_cache_bytes", "Bytes held by the KV cache", registry=r)
        self.input_tokens = Counter("seqserve_input_tokens", "Source tokens encoded", registry=r)
        self.generated_tokens = Counter("seqserve_generated_tokens", "Tokens generated", registry=r)
        self.finished = Counter("seqserve_finished_requests", "Finished generations by finish reason", ["reason"],
                                registry=r)
        self.rejected = Counter("seqserve_rejected_requests", "Requests refused before running, by reason", ["reason"],
                                registry=r)
        self.model = Info("seqserve_model", "The loaded bundle and where it runs", registry=r)
        self.inflight_bytes = Gauge("seqserve_inflight_request_bytes", "Request payload bytes held by calls in flight",
                                    registry=r)
