"""Every Prometheus metric seqserve exports, in one place (prefix seqserve_, base units, low-cardinality labels).

Each server owns its registry, so several servers in one process (the tests) never share counters. Every metric
but seqserve_inflight_request_bytes (one server-wide budget) has a `model` label: the served model's name, or ""
for a call refused before its model was known (an unknown model, an undecodable message, no token). A model's
engine and calls see a ModelMetrics (`Metrics.for_model`): the same attribute names with the model label filled in.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

MODEL = "model"  # the label naming the served model

# Latency buckets in seconds, fine around milliseconds where a decoder step lives.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("seqserve_requests", "gRPC calls by method and final status code",
                                [MODEL, "method", "code"], registry=r)
        self.request_duration = Histogram("seqserve_request_duration_seconds", "End-to-end time of a generation",
                                          [MODEL, "method"], buckets=LATENCY_BUCKETS, registry=r)
        self.queue_duration = Histogram("seqserve_queue_duration_seconds", "Time from arrival to joining the batch",
                                        [MODEL], buckets=LATENCY_BUCKETS, registry=r)
        self.time_to_first_token = Histogram("seqserve_time_to_first_token_seconds", "Arrival to first generated token",
                                             [MODEL], buckets=LATENCY_BUCKETS, registry=r)
        self.inter_token_latency = Histogram("seqserve_inter_token_latency_seconds", "Time between a row's tokens",
                                             [MODEL], buckets=LATENCY_BUCKETS, registry=r)
        self.encoder_duration = Histogram("seqserve_encoder_duration_seconds", "encoder.onnx run for admitted rows",
                                          [MODEL], buckets=LATENCY_BUCKETS, registry=r)
        self.decoder_step_duration = Histogram("seqserve_decoder_step_duration_seconds",
                                               "decoder.onnx run for one step of the whole batch",
                                               [MODEL], buckets=LATENCY_BUCKETS, registry=r)
        self.batch_rows = Histogram("seqserve_batch_rows", "Rows in each decoder step", [MODEL], buckets=ROW_BUCKETS,
                                    registry=r)
        self.running = Gauge("seqserve_running_requests", "Rows in the running batch", [MODEL], registry=r)
        self.waiting = Gauge("seqserve_waiting_requests", "Requests queued for admission", [MODEL], registry=r)
        self.kv_cache_bytes = Gauge("seqserve_kv_cache_bytes", "Bytes held by the KV cache", [MODEL], registry=r)
        self.input_tokens = Counter("seqserve_input_tokens", "Source tokens encoded", [MODEL], registry=r)
        self.generated_tokens = Counter("seqserve_generated_tokens", "Tokens generated", [MODEL], registry=r)
        self.finished = Counter("seqserve_finished_requests", "Finished generations by finish reason",
                                [MODEL, "reason"], registry=r)
        self.rejected = Counter("seqserve_rejected_requests", "Requests refused before running, by reason",
                                [MODEL, "reason"], registry=r)
        self.model = Info("seqserve_model", "A served bundle and where it runs", [MODEL], registry=r)
        self.inflight_bytes = Gauge("seqserve_inflight_request_bytes", "Request payload bytes held by calls in flight",
                                    registry=r)
        self.model_memory = Gauge("seqserve_model_memory_bytes", "Host memory a served model may take: graph files, "
                                  "KV cache and encode-ahead budgets (GetModelInfo.memory_bytes)", [MODEL], registry=r)
        self.model_state = Gauge("seqserve_model_ready", "1 while a model takes calls; 0 while a removed one drains, "
                                 "or while its engine process is silent or restarting", [MODEL], registry=r)
        self.engine_restarts = Counter("seqserve_engine_restarts", "Engine processes started again, by cause: exited "
                                       "(on its own), killed (by a signal), hung (silent past the bound, killed)",
                                       [MODEL, "cause"], registry=r)

    def for_model(self, name: str) -> ModelMetrics:
        """The metrics as one model's engine and calls use them: its label filled in."""
        return ModelMetrics(self, name)

    def forget(self, name: str) -> None:
        """A model was unloaded and its last call counted: every series labelled with its name leaves /metrics
        (a rate over a counter still covers the time it served: Prometheus keeps the samples it scraped), so
        serving ever new names does not grow the exposition or the process."""
        for metric in vars(self).values():
            names = getattr(metric, "_labelnames", ())  # prometheus_client keeps a metric's label names here
            if names[:1] != (MODEL,):
                continue
            found = {tuple(s.labels[n] for n in names) for family in metric.collect() for s in family.samples
                     if s.labels.get(MODEL) == name}
            for values in found:
                metric.remove(*values)


class _Labelled:
    """A metric with more labels than the model: `.labels(*rest)` gives the child for this model."""

    def __init__(self, metric, model: str) -> None:
        self.metric, self.model = metric, model
        self._children: dict[tuple[str, ...], object] = {}  # prometheus_client's labels() locks and copies per call

    def labels(self, *values: str):
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self.metric.labels(self.model, *values)
        return child


class ModelMetrics:
    """One model's view of Metrics: every attribute of Metrics, its model label set (only `.labels(...)` of the
    remaining labels is left to the caller)."""

    def __init__(self, metrics: Metrics, model: str) -> None:
        self.parent, self.name, self.registry = metrics, model, metrics.registry
        for attr, metric in vars(metrics).items():
            if attr == "registry":
                continue
            names = getattr(metric, "_labelnames", ())  # prometheus_client keeps a metric's label names here
            if names[:1] != (MODEL,):
                setattr(self, attr, metric)  # server-wide (inflight bytes)
            elif len(names) == 1:
                setattr(self, attr, metric.labels(model))
            else:
                setattr(self, attr, _Labelled(metric, model))
