"""Prometheus metrics of one server (its own registry, so several apps can live in one process)."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

#: label for requests that name no served model (bad JSON, unknown model): bounded cardinality
NO_MODEL = "-"

_LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    """The counters and histograms ``GET /metrics`` exposes."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("kvembed_requests", "Embedding requests by model and HTTP status (499: the client disconnected first)", ["model", "status"], registry=r)
        self.texts = Counter("kvembed_texts", "Inputs embedded (successful requests)", ["model"], registry=r)
        self.tokens = Counter("kvembed_tokens", "Tokens embedded, prompt included (usage.prompt_tokens)", ["model"], registry=r)
        self.batch_size = Histogram(
            "kvembed_batch_size", "Rows per batch (a batch runs in graph calls of at most the runtime's per-call budget)", ["model"], buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512), registry=r
        )
        self.batch_tokens = Histogram(
            "kvembed_batch_tokens", "Padded tokens (rows x longest row) per batch", ["model"],
            buckets=tuple(2**k for k in range(4, 18)), registry=r,
        )
        self.queue_depth = Gauge("kvembed_queue_depth", "Inputs waiting for the graph", ["model"], registry=r)
        self.calls_running = Gauge("kvembed_graph_calls_running", "Graph calls running now (at most --workers per lane)", ["model"], registry=r)
        self.timeouts = Counter(
            "kvembed_timeouts", "Requests ended by a timeout, by stage: headers (--read-timeout: connection closed), "
            "body (--read-timeout: 408), request (--request-timeout: 504)", ["stage"], registry=r)
        self.reading = Gauge("kvembed_request_bodies_reading", "Request bodies being received (they hold no request slot yet)",
                             registry=r)
        self.in_flight = Gauge("kvembed_requests_in_flight", "Embedding requests being served", registry=r)
        self.inference = Histogram("kvembed_inference_seconds", "Time of one batch (its graph calls)", ["model"], buckets=_LATENCY, registry=r)
        self.latency = Histogram("kvembed_request_seconds", "Time from request to response", ["model"], buckets=_LATENCY, registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)
