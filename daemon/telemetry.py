"""Prometheus metrics and health endpoints, at the edge of the daemon.

A custom prometheus-client collector reads the loop's native counters and
histograms only when scraped (nothing is pushed from the hot path). One bounded
HTTP listener (daemon/httplistener.py; loopback by default) serves
/metrics, /healthz (the loop made progress within its deadline) and /readyz
(model verified, loaded and warm; a stream attached, if configured).
"""
from __future__ import annotations

import json
import time
from typing import Callable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from edgeinfer import ring
from edgeinfer._hist import STAGES, cumulative_at
from edgeinfer.httplistener import HttpListener, Response, SharedRender

# Histogram buckets for 100 µs - 1 s (seconds).
BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1,
           0.25, 0.5, 1.0)
from edgeinfer.stats import OUTCOMES


def _histogram(family: HistogramMetricFamily, labels: list[str], hist, stage: int) -> None:
    counts, sum_ns, _total = hist.snapshot(stage)
    cum = cumulative_at(counts, BUCKETS)
    total = int(counts.sum())  # the buckets' own total: consistent with them even mid-record
    buckets = [(repr(b), c) for b, c in zip(BUCKETS, cum)] + [("+Inf", total)]
    family.add_metric(labels, buckets, sum_ns / 1e9)


class DaemonCollector:
    """Reads the daemon's state on every scrape."""

    def __init__(self, daemon):
        self.daemon = daemon

    def collect(self):
        d = self.daemon
        engine = d.engine
        streams = list(d.streams)
        stage = HistogramMetricFamily("edgeinfer_stage_duration_seconds",
                                      "Time per pipeline stage per frame (wait, age = capture to start, inference, "
                                      "decode, publish).", labels=["stream", "stage"])
        e2e = HistogramMetricFamily("edgeinfer_e2e_latency_seconds",
                                    "Producer capture clock to result published.", labels=["stream"])
        frames = CounterMetricFamily("edgeinfer_frames", "Frames offered by producers, by outcome.",
                                     labels=["stream", "outcome"])
        # Exact rolling quantiles are a summary (the only type that may carry a "quantile" label).
        rolling = Metric("edgeinfer_e2e_latency_recent_seconds",
                         "Exact quantiles of end-to-end latency over the last 4096 frames.", "summary")
        connected = GaugeMetricFamily("edgeinfer_stream_connected",
                                      "1 while the stream's producer is connected (its connection is the liveness).",
                                      labels=["stream"])
        readers = GaugeMetricFamily("edgeinfer_stream_readers", "Result reader connections held.", labels=["stream"])
        for s in streams:
            for i, name in enumerate(STAGES):
                if name == "e2e":
                    _histogram(e2e, [s.name], s.stats.stages, i)
                else:
                    _histogram(stage, [s.name, name], s.stats.stages, i)
            for o in OUTCOMES:
                frames.add_metric([s.name, o], getattr(s.stats, o))
            quantiles, n, total_s = s.stats.rolling_window()
            for q, v in quantiles.items():
                rolling.add_sample(rolling.name, {"stream": s.name, "quantile": q}, v)
            rolling.add_sample(rolling.name + "_count", {"stream": s.name}, n)
            rolling.add_sample(rolling.name + "_sum", {"stream": s.name}, total_s)
            connected.add_metric([s.name], 1.0 if s.connected else 0.0)
            readers.add_metric([s.name], float(s.reader_count))
        yield from (stage, e2e, frames, rolling, connected, readers)

        refused = CounterMetricFamily("edgeinfer_ingress_refusals",
                                      "Connections refused, by stream ((unknown) for names not configured), role "
                                      "(producer, reader) and reason.", labels=["stream", "role", "reason"])
        if d.ingress is not None:
            for (st, role, reason), n in sorted(d.ingress.refuse_count().items()):
                refused.add_metric([st, role, reason], n)
        yield refused
        yield CounterMetricFamily("edgeinfer_producers_restored",
                                  "Producers served on from systemd's fd store when this daemon started.",
                                  value=d.restored)
        if d.model is not None:
            yield GaugeMetricFamily("edgeinfer_model_sessions", "Model sessions held (one per frame geometry; "
                                    "runtime.max_sessions caps them).", value=float(len(d.model.geometries)))
            yield CounterMetricFamily("edgeinfer_model_session_evictions",
                                      "Sessions dropped to stay within runtime.max_sessions.", value=d.model.evictions)

        reloads = CounterMetricFamily("edgeinfer_model_reload_failures", "Reloads refused, by reason.",
                                      labels=["reason"])
        for reason in ("signature", "rollback", "load"):
            reloads.add_metric([reason], d.reload_failures.get(reason, 0))
        yield reloads
        yield CounterMetricFamily("edgeinfer_model_reloads", "Successful model reloads.", value=d.reloads)
        yield CounterMetricFamily("edgeinfer_state_write_failures",
                                  "Failed writes of the anti-rollback state (full or read-only state directory).",
                                  value=d.state_write_failures)
        yield CounterMetricFamily("edgeinfer_segment_truncations",
                                  "Reads of frame-ring pages that were gone (absorbed; the stream was dropped). A "
                                  "sealed ring cannot shrink, so this stays 0: defence in depth.",
                                  value=ring.sigbus_absorbed())
        if d.model is not None:
            info = GaugeMetricFamily("edgeinfer_model_info", "The model being served (value 1).",
                                     labels=["name", "version", "sha256"])
            info.add_metric([d.model.name, d.model.version, d.model.bundle.sha256], 1.0)
            yield info
        yield GaugeMetricFamily("edgeinfer_realtime_active", "1 when the loop runs with a real-time policy.",
                                value=1.0 if engine and engine.realtime_active else 0.0)
        yield GaugeMetricFamily("edgeinfer_ort_intra_op_threads", "ONNX Runtime intra-op threads (loop included).",
                                value=float(d.cfg.runtime.ort_threads))
        yield GaugeMetricFamily("edgeinfer_loop_progress", "Iterations of the real-time loop (it never stops "
                                "counting while healthy, frames or not).", value=float(engine.progress if engine else 0))
        h = d.health
        yield GaugeMetricFamily("edgeinfer_healthy", "1 when the loop made progress within its deadline.",
                                value=1.0 if h.healthy() else 0.0)
        yield GaugeMetricFamily("edgeinfer_ready", "1 when the model is verified, loaded and warm (and a stream is "
                                "attached, if required).", value=1.0 if h.ready() else 0.0)


class Health:
    """Liveness from the loop's progress counter, readiness from start-up state.
    The main thread calls tick() often; the HTTP thread only reads."""

    def __init__(self, daemon, deadline_s: float, requires_stream: bool):
        self.daemon = daemon
        self.deadline_s = deadline_s
        self.requires_stream = requires_stream
        self.model_ready = False
        self._last_progress = -1
        self._last_change = time.monotonic()

    def tick(self) -> None:
        e = self.daemon.engine
        p = e.progress if e else -1
        if p != self._last_progress:
            self._last_progress = p
            self._last_change = time.monotonic()

    def healthy(self) -> bool:
        e = self.daemon.engine
        if e is None:
            return not self.model_ready  # starting up: alive; the loop does not exist yet
        return e.alive and time.monotonic() - self._last_change <= self.deadline_s

    def ready(self) -> bool:
        if not (self.model_ready and self.healthy()):
            return False
        return not self.requires_stream or any(s.connected for s in self.daemon.streams)


class MetricsServer:
    """/metrics, /healthz, /readyz on one bounded listener (daemon/httplistener.py): an asyncio thread that
    answers the probes fresh, and one thread that renders /metrics, at most once per METRICS_CACHE_S, shared
    by every scrape meanwhile unless liveness changed. Also the collector of the listener's own counters
    (edgeinfer_http_*)."""

    # Short, and no answer is older than this: at 0.5 s the isolation row that reads a killed camera's stream
    # from /metrics saw 0.43-1.7 s (a render from before the kill); liveness never waits for it (the key).
    METRICS_CACHE_S = 0.1

    def __init__(self, daemon, listen: str):
        host, _, port = listen.rpartition(":")
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(DaemonCollector(daemon))
        self.registry.register(self)
        health = daemon.health
        registry = self.registry

        def metrics() -> Response:
            return 200, CONTENT_TYPE_LATEST, generate_latest(registry)

        def probe(check) -> Callable[[], Response]:
            def answer() -> Response:  # on the listener's loop, never cached: liveness is now
                ok = check()
                return (200 if ok else 503), "application/json", json.dumps({"ok": ok}).encode() + b"\n"
            return answer

        def liveness():  # a scrape never gets a cached render that this has changed since
            return (health.healthy(), health.ready(), id(daemon.model),
                    tuple(s.connected for s in daemon.streams))

        self.metrics_route = SharedRender(metrics, self.METRICS_CACHE_S, key=liveness)
        self.listener = HttpListener(host.strip("[]"), int(port), {
            "/metrics": self.metrics_route, "/healthz": probe(health.healthy), "/readyz": probe(health.ready)})
        self.address = self.listener.address

    def start(self) -> None:
        self.listener.start()

    def stop(self) -> None:
        self.listener.stop()

    def collect(self):
        """The listener's own counters: what a flood of slow or half-open clients cost."""
        lst = self.listener
        yield GaugeMetricFamily("edgeinfer_http_connections", "Open connections to the metrics listener.",
                                value=float(lst.open_connections))
        closed = CounterMetricFamily("edgeinfer_http_connections_closed",
                                     "Connections the listener closed unanswered, by reason (evicted: the oldest "
                                     "without a request when over the cap; refused: over the cap, nothing "
                                     "evictable; timeout: no whole request or answer within the timeout).",
                                     labels=["reason"])
        closed.add_metric(["evicted"], lst.evicted_connections)
        closed.add_metric(["refused"], lst.refused_connections)
        closed.add_metric(["timeout"], lst.timed_out_connections)
        yield closed
        route = self.metrics_route
        yield CounterMetricFamily("edgeinfer_http_metrics_renders", "Times /metrics was rendered (a render starts "
                                  f"at most once per {self.METRICS_CACHE_S:g} s; scrapes in between share it).",
                                  value=route.renders)
        yield CounterMetricFamily("edgeinfer_http_metrics_render_failures", "Renders of /metrics that raised "
                                  "(answered 500; logged at most once a minute).", value=route.failures)
