"""The gateway's metrics (/metrics on its own loopback listener): per front and model, requests by code, in
flight, shed, refusals by reason, and the latency of answered requests split into waiting for a ring, the
daemon (the frame's way through the lanes), and the answer."""
from __future__ import annotations


from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from edgeinfer.fronts.pool import Timing

BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5,
           5.0, 10.0)


class FrontMetrics:
    def __init__(self):
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("edgeinfer_front_requests", "Requests answered, by front, model and code (OK, "
                                "INVALID_ARGUMENT, NOT_FOUND, RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED, UNAVAILABLE, "
                                "INTERNAL; Frigate: LATE for an answer not sent after its timeout).",
                                ["front", "model", "code"], registry=r)
        self.refusals = Counter("edgeinfer_front_refusals", "Requests refused before any ring, by front and reason "
                                "(dtype, shape, size, data, unknown_model, shed, client_limit, ...).",
                                ["front", "reason"], registry=r)
        self.in_flight = Gauge("edgeinfer_front_in_flight", "Requests being served now (waiting for a ring or in "
                               "the daemon).", ["front", "model"], registry=r)
        self.latency = Histogram("edgeinfer_front_latency_seconds", "Answered requests' time by phase: ring "
                                 "(waiting for a free ring), daemon (frame written → its result read: the lanes), "
                                 "total (received → answered).", ["front", "model", "phase"], buckets=BUCKETS,
                                 registry=r)
        self.ready = Gauge("edgeinfer_front_model_ready", "1 once a warm-up frame of the model came back through "
                           "the daemon.", ["model"], registry=r)

    def answered(self, front: str, model: str, t: Timing) -> None:
        self.requests.labels(front, model, "OK").inc()
        self.latency.labels(front, model, "ring").observe((t.slot - t.received) / 1e9)
        self.latency.labels(front, model, "daemon").observe((t.answered - t.published) / 1e9)
        self.latency.labels(front, model, "total").observe(max(0, t.answered - t.received) / 1e9)

    def failed(self, front: str, model: str, code: str, reason: str) -> None:
        self.requests.labels(front, model, code).inc()
        self.refusals.labels(front, reason).inc()
