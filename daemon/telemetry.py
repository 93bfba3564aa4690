"""Prometheus metrics and health endpoints, at the edge of the daemon.

A custom prometheus-client collector reads the loop's native counters and
histograms only when scraped (nothing is pushed from the hot path). One small
threaded HTTP server on the metrics listener (loopback by default) serves
/metrics, /healthz (the loop made progress within its deadline) and /readyz
(model verified, loaded and warm; a stream attached, if configured).
"""
from __future__ import annotations

import http.server
import json
import threading
import time

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from edgeinfer import ring
from edgeinfer._hist import STAGES, cumulative_at

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
    """Reads the daemon's state (the dispatch table the lanes write) on every scrape."""

    def __init__(self, daemon):
        self.daemon = daemon

    def collect(self):
        d = self.daemon
        streams = list(d.streams)
        stage = HistogramMetricFamily("edgeinfer_stage_duration_seconds",
                                      "Time per pipeline stage per frame (wait, age = capture to start, inference, "
                                      "decode, publish).", labels=["stream", "model", "stage"])
        e2e = HistogramMetricFamily("edgeinfer_e2e_latency_seconds",
                                    "Producer capture clock to result published.", labels=["stream", "model"])
        frames = CounterMetricFamily("edgeinfer_frames", "Frames offered by producers, by outcome.",
                                     labels=["stream", "model", "outcome"])
        # Exact rolling quantiles are a summary (the only type that may carry a "quantile" label).
        rolling = Metric("edgeinfer_e2e_latency_recent_seconds",
                         "Exact quantiles of end-to-end latency over the last 4096 frames.", "summary")
        connected = GaugeMetricFamily("edgeinfer_stream_connected",
                                      "1 while the stream's producer is connected (its connection is the liveness).",
                                      labels=["stream", "model"])
        readers = GaugeMetricFamily("edgeinfer_stream_readers", "Result reader connections held.",
                                    labels=["stream", "model"])
        last_lane = GaugeMetricFamily("edgeinfer_stream_last_lane", "The lane that served the stream's last frame.",
                                      labels=["stream", "model"])
        for s in streams:
            ids = [s.name, s.model]
            for i, name in enumerate(STAGES):
                if name == "e2e":
                    _histogram(e2e, ids, s.stats.stages, i)
                else:
                    _histogram(stage, [*ids, name], s.stats.stages, i)
            for o in OUTCOMES:
                frames.add_metric([*ids, o], getattr(s.stats, o))
            quantiles, n, total_s = s.stats.rolling_window()
            for q, v in quantiles.items():
                rolling.add_sample(rolling.name, {"stream": s.name, "model": s.model, "quantile": q}, v)
            rolling.add_sample(rolling.name + "_count", {"stream": s.name, "model": s.model}, n)
            rolling.add_sample(rolling.name + "_sum", {"stream": s.name, "model": s.model}, total_s)
            connected.add_metric(ids, 1.0 if s.connected else 0.0)
            readers.add_metric(ids, float(s.reader_count))
            last_lane.add_metric(ids, float(s.stats.last_lane))
        yield from (stage, e2e, frames, rolling, connected, readers, last_lane)

        yield from self._lanes(d)
        yield from self._models(d)

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
        yield CounterMetricFamily("edgeinfer_state_write_failures",
                                  "Failed writes of the anti-rollback state (full or read-only state directory).",
                                  value=d.models.state_write_failures)
        yield CounterMetricFamily("edgeinfer_segment_truncations",
                                  "Reads of frame-ring pages that were gone (absorbed; the stream was dropped). A "
                                  "sealed ring cannot shrink, so this stays 0: defence in depth.",
                                  value=ring.sigbus_absorbed())
        h = d.health
        yield GaugeMetricFamily("edgeinfer_healthy", "1 when every lane made progress within its deadline.",
                                value=1.0 if h.healthy() else 0.0)
        yield GaugeMetricFamily("edgeinfer_ready", "1 when every model is verified and loaded, the lanes run (and a "
                                "stream is attached, if required).", value=1.0 if h.ready() else 0.0)

    @staticmethod
    def _lanes(d):
        up = GaugeMetricFamily("edgeinfer_lane_up", "1 while the lane runs its loop.", labels=["lane"])
        realtime = GaugeMetricFamily("edgeinfer_realtime_active", "1 when the lane's loop runs with a real-time "
                                     "policy.", labels=["lane"])
        progress = GaugeMetricFamily("edgeinfer_loop_progress", "Iterations of the lane's loop (it never stops "
                                     "counting while healthy, frames or not).", labels=["lane"])
        busy = CounterMetricFamily("edgeinfer_lane_busy_seconds", "Time the lane spent serving frames.",
                                   labels=["lane"])
        served = CounterMetricFamily("edgeinfer_lane_frames", "Results the lane published.", labels=["lane"])
        restarts = CounterMetricFamily("edgeinfer_lane_restarts", "Times the lane was restarted (it died or hung).",
                                       labels=["lane"])
        cancelled = CounterMetricFamily("edgeinfer_runs_cancelled", "Inferences cancelled at runtime.run_deadline_ms.",
                                        labels=["lane"])
        holds = GaugeMetricFamily("edgeinfer_lane_model", "1 for each model the lane holds.", labels=["lane", "model"])
        sessions = GaugeMetricFamily("edgeinfer_model_sessions", "Model sessions the lane holds (one per model and "
                                     "frame geometry; runtime.max_sessions caps them per model).", labels=["lane"])
        evictions = CounterMetricFamily("edgeinfer_model_session_evictions", "Sessions dropped to stay within "
                                        "runtime.max_sessions.", labels=["lane"])
        batches = CounterMetricFamily("edgeinfer_lane_batches", "Runs of more than one frame (micro-batching).",
                                      labels=["lane"])
        copies = CounterMetricFamily("edgeinfer_lane_batch_copies", "Frames copied into a batch tensor: the only "
                                     "copy of a frame the daemon makes (micro-batching).", labels=["lane"])
        lanes = d.lanes.status(0) if d.lanes else {}
        for name, ln in lanes.items():
            up.add_metric([name], 1.0 if ln["state"] == "ready" else 0.0)
            realtime.add_metric([name], 1.0 if ln["realtime"] else 0.0)
            progress.add_metric([name], float(ln["progress"]))
            busy.add_metric([name], ln["busy_ns"] / 1e9)
            served.add_metric([name], ln["frames"])
            restarts.add_metric([name], ln["restarts"])
            cancelled.add_metric([name], ln["runs_cancelled"])
            for m in ln["models"]:
                holds.add_metric([name, m], 1.0)
            sessions.add_metric([name], float(ln["sessions"]))
            evictions.add_metric([name], ln["session_evictions"])
            batches.add_metric([name], ln["batches"])
            copies.add_metric([name], ln["batch_copies"])
        yield from (up, realtime, progress, busy, served, restarts, cancelled, holds, sessions, evictions, batches,
                    copies)

    @staticmethod
    def _models(d):
        info = GaugeMetricFamily("edgeinfer_model_info", "The version of each model being served (value 1).",
                                 labels=["model", "name", "version", "sha256"])
        failures = CounterMetricFamily("edgeinfer_model_reload_failures", "Reloads refused, by model and reason.",
                                       labels=["model", "reason"])
        reloads = CounterMetricFamily("edgeinfer_model_reloads", "Successful model reloads.", labels=["model"])
        threads = GaugeMetricFamily("edgeinfer_ort_intra_op_threads", "ONNX Runtime intra-op threads per lane "
                                    "(the loop included).", labels=["model"])
        for name, m in d.models.served.items():
            if m.runtime is not None:
                info.add_metric([name, m.runtime.name, m.runtime.version, m.runtime.bundle.sha256], 1.0)
            for reason, n in m.failures.items():
                failures.add_metric([name, reason], n)
            reloads.add_metric([name], m.reloads)
            threads.add_metric([name], float(m.entry.ort_threads))
        yield from (info, failures, reloads, threads)


class Health:
    """Liveness from the lanes' progress counters, readiness from start-up state.
    The control plane calls tick() often; the HTTP thread only reads."""

    def __init__(self, daemon, deadline_s: float, requires_stream: bool):
        self.daemon = daemon
        self.deadline_s = deadline_s
        self.requires_stream = requires_stream
        self.model_ready = False

    def tick(self) -> None:
        pass  # the lanes' progress is tracked by LaneSet.poll()

    def stuck(self) -> list[str]:
        """Lanes that are down or made no progress within the deadline."""
        lanes = self.daemon.lanes
        return lanes.stuck(self.deadline_s) if lanes is not None else []

    def healthy(self) -> bool:
        if not self.model_ready:
            return True  # starting up (or stopping): alive; /readyz says the rest
        return not self.stuck()

    def ready(self) -> bool:
        if not (self.model_ready and self.healthy()):
            return False
        return not self.requires_stream or any(s.connected for s in self.daemon.streams)


class MetricsServer:
    """/metrics, /healthz, /readyz on one listener, in a background thread."""

    def __init__(self, daemon, listen: str):
        host, _, port = listen.rpartition(":")
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(DaemonCollector(daemon))
        health = daemon.health
        registry = self.registry

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    body, status, ctype = generate_latest(registry), 200, CONTENT_TYPE_LATEST
                elif path in ("/healthz", "/readyz"):
                    ok = health.healthy() if path == "/healthz" else health.ready()
                    body = json.dumps({"ok": ok, "stuck_lanes": health.stuck()}).encode() + b"\n"
                    status, ctype = (200 if ok else 503), "application/json"
                else:
                    body, status, ctype = b"not found\n", 404, "text/plain"
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):  # scrapes are not log events
                pass

        host = host.strip("[]")
        self.server = http.server.ThreadingHTTPServer((host, int(port)), Handler)
        self.server.daemon_threads = True
        self.address = "%s:%d" % self.server.server_address[:2]
        self.thread = threading.Thread(target=self.server.serve_forever, name="edgeinfer-metrics", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
