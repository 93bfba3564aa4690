"""Prometheus metrics and health endpoints, at the edge of the daemon.

A custom prometheus-client collector reads the loop's native counters and
histograms only when scraped (nothing is pushed from the hot path). One bounded
HTTP listener (daemon/edgeinfer/telemetry/httplistener.py; loopback by default) serves
/metrics, /healthz (the loop made progress within its deadline) and /readyz
(model verified, loaded and warm; a stream attached, if configured).
"""
from __future__ import annotations

import json
from typing import Callable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from edgeinfer.support.version import VERSION
from edgeinfer.abi import ring
from edgeinfer.abi.hist import STAGES, cumulative_at
from edgeinfer.telemetry.httplistener import HttpListener, Response, SharedRender
from edgeinfer.telemetry.snapshot import DriftView, Snapshot, provider_fallback

# Histogram buckets for 100 µs - 1 s (seconds).
BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1,
           0.25, 0.5, 1.0)
from edgeinfer.abi.vocabulary import OUTCOMES


def _histogram(family: HistogramMetricFamily, labels: list[str], hist, stage: int) -> None:
    counts, sum_ns, _total = hist.snapshot(stage)
    cum = cumulative_at(counts, BUCKETS)
    total = int(counts.sum())  # the buckets' own total: consistent with them even mid-record
    buckets = [(repr(b), c) for b, c in zip(BUCKETS, cum)] + [("+Inf", total)]
    family.add_metric(labels, buckets, sum_ns / 1e9)


class DaemonCollector:
    """Reads a snapshot of the daemon's state (the dispatch table the lanes write, live) on every scrape."""

    def __init__(self, snapshot: Callable[[], Snapshot], health: "Health"):
        self.snapshot = snapshot
        self.health = health

    def collect(self):
        d = self.snapshot()
        streams = d.streams
        stage = HistogramMetricFamily("edgeinfer_stage_duration_seconds",
                                      "Time per pipeline stage per frame (wait = the loop asleep before it, age = "
                                      "capture to start, pick = the loop's wake to start, inference, decode, "
                                      "publish).", labels=["stream", "model", "stage"])
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
        pooled = GaugeMetricFamily("edgeinfer_stream_pool",
                                   "1 for a stream of a network front's pool (pools: of the configuration), absent "
                                   "for a camera's: a pool stream's end-to-end latency is its request's age by "
                                   "design (the front's own latency is the figure to watch).",
                                   labels=["stream", "model", "pool"])
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
            readers.add_metric(ids, float(s.readers))
            if s.pool is not None:
                pooled.add_metric([*ids, s.pool], 1.0)
            last_lane.add_metric(ids, float(s.stats.last_lane))
        yield from (stage, e2e, frames, rolling, connected, readers, pooled, last_lane)

        yield from self._lanes(d)
        yield from self._models(d)
        if d.drift is not None:
            yield from _drift(d.drift)

        refused = CounterMetricFamily("edgeinfer_ingress_refusals",
                                      "Connections refused, by stream ((unknown) for names not configured), role "
                                      "(producer, reader) and reason.", labels=["stream", "role", "reason"])
        for (st, role, reason), n in sorted(d.refusals.items()):
            refused.add_metric([st, role, reason], n)
        yield refused
        loop = d.loop
        yield GaugeMetricFamily("edgeinfer_control_plane_loop_age_seconds",
                                "Seconds since the control plane's loop (handshakes, lanes' news, watchdog) last "
                                "turned; it turns every 50 ms or so, and grows live during a stall.",
                                value=loop.age_s)
        yield CounterMetricFamily("edgeinfer_control_plane_stalls",
                                  "Turns of the control plane's loop that took longer than 1 s (each logged with its "
                                  "length when it ended).", value=loop.stalls)
        yield CounterMetricFamily("edgeinfer_control_plane_stall_seconds",
                                  "Time the control plane's loop spent in those stalls.", value=loop.stalled_s)
        if d.fds is not None:
            closer = d.fds
            yield GaugeMetricFamily("edgeinfer_fd_closer_waiting",
                                    "Fds sent by clients (and their connections) handed to the fd closer threads and "
                                    "not closed yet.", value=float(closer.waiting))
            yield CounterMetricFamily("edgeinfer_fd_closer_slow_closes",
                                      "Closes of a client's fd that took longer than 1 s (a file whose close "
                                      "blocks): a closer thread of that client's party waited, the control plane "
                                      "did not.", value=closer.slow)
            yield GaugeMetricFamily("edgeinfer_fd_closer_full_parties",
                                    f"Parties (uids) with {closer.limit} fds still closing: their new connections "
                                    "are refused (reason closer_backlog) until they are closed.",
                                    value=float(closer.full_parties))
            yield GaugeMetricFamily("edgeinfer_fd_closer_threads",
                                    "Closer threads now (at most 2 per party with fds closing).",
                                    value=float(closer.threads))
        yield CounterMetricFamily("edgeinfer_producers_restored",
                                  "Producers served on from systemd's fd store when this daemon started.",
                                  value=d.restored)
        yield CounterMetricFamily("edgeinfer_state_write_failures",
                                  "Failed writes of the state directory's files (the anti-rollback state, the "
                                  "known-good record: full or read-only state directory).",
                                  value=d.registry.state_write_failures)
        yield CounterMetricFamily("edgeinfer_segment_truncations",
                                  "Reads of frame-ring pages that were gone (absorbed; the stream was dropped). A "
                                  "sealed ring cannot shrink, so this stays 0: defence in depth.",
                                  value=ring.sigbus_absorbed())
        yield GaugeMetricFamily("edgeinfer_uptime_seconds", "Seconds since the daemon started, on its monotonic "
                                "clock, when this scrape's figures were read: the time between two scrapes' "
                                "counters is the difference of theirs (edgeinferctl status divides by it).",
                                value=d.uptime_s)
        h = self.health
        yield GaugeMetricFamily("edgeinfer_healthy", "1 when every lane made progress within its deadline.",
                                value=1.0 if h.healthy() else 0.0)
        yield GaugeMetricFamily("edgeinfer_ready", "1 when every model is verified and loaded, the lanes run (and a "
                                "stream is attached, if required).", value=1.0 if h.ready() else 0.0)

    @staticmethod
    def _lanes(d: Snapshot):
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
        copies = CounterMetricFamily("edgeinfer_lane_batch_copies", "Frames copied: into a batch tensor "
                                     "(micro-batching), or a rollout's sampled frame for its trial thread; the only "
                                     "copies of a frame the daemon makes.", labels=["lane"])
        mutes = CounterMetricFamily("edgeinfer_lane_doorbell_mutes", "Times the lane stopped sleeping on a "
                                    "camera's doorbell for 100 ms because it rang without frames (polled every "
                                    "1 ms meanwhile; the log names the stream).", labels=["lane"])
        wakeups = CounterMetricFamily("edgeinfer_lane_wakeups", "Times the lane's loop woke with a ring ready: a "
                                      "frame nobody took yet (a camera's doorbell or flags alone never count).",
                                      labels=["lane"])
        gc_time = CounterMetricFamily("edgeinfer_lane_gc_seconds", "Time the lane's process spent in Python's cyclic "
                                      "garbage collector: its loop waits meanwhile.", labels=["lane"])
        gc_longest = GaugeMetricFamily("edgeinfer_lane_gc_longest_seconds", "The lane's longest single garbage "
                                       "collection since it started (a frame served meanwhile was that late).",
                                       labels=["lane"])
        for name, ln in d.lanes.items():
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
            mutes.add_metric([name], ln["doorbell_mutes"])
            wakeups.add_metric([name], ln["wakeups"])
            gc_time.add_metric([name], ln["gc_ns"] / 1e9)
            gc_longest.add_metric([name], ln["gc_longest_ns"] / 1e9)
        yield from (up, realtime, progress, busy, served, restarts, cancelled, holds, sessions, evictions, batches,
                    copies, mutes, wakeups, gc_time, gc_longest)

    @staticmethod
    def _models(d: Snapshot):
        info = GaugeMetricFamily("edgeinfer_model_info", "The version of each model being served (value 1).",
                                 labels=["model", "name", "version", "sha256"])
        failures = CounterMetricFamily("edgeinfer_model_reload_failures", "Reloads refused, by model and reason.",
                                       labels=["model", "reason"])
        reloads = CounterMetricFamily("edgeinfer_model_reloads", "Successful model reloads.", labels=["model"])
        threads = GaugeMetricFamily("edgeinfer_ort_intra_op_threads", "ONNX Runtime intra-op threads per lane "
                                    "(the loop included).", labels=["model"])
        fallback = GaugeMetricFamily("edgeinfer_model_known_good_fallback", "1 while the model serves its last "
                                     "known-good bundle because the configured one was refused at start (the log "
                                     "and /healthz say why).", labels=["model"])
        provider = GaugeMetricFamily("edgeinfer_model_provider", "Lanes serving the model on each execution "
                                     "provider, by the one configured.", labels=["model", "configured", "serving"])
        provider_fallback = GaugeMetricFamily("edgeinfer_model_provider_fallback", "Lanes serving the model on the CPU "
                                              "provider because its configured one failed to load, compile or warm "
                                              "up (the log and /healthz say why).", labels=["model", "configured"])
        for m in d.models:
            name = m.name
            serving: dict[str, int] = {}
            for label, _why in m.lane_providers.values():
                serving[label] = serving.get(label, 0) + 1
            for label, n in serving.items():
                provider.add_metric([name, m.provider, label], float(n))
            provider_fallback.add_metric([name, m.provider], float(sum(1 for _, why in m.lane_providers.values()
                                                                        if why)))
            if m.served is not None:
                info.add_metric([name, *m.served], 1.0)
            for reason, n in m.failures.items():
                failures.add_metric([name, reason], n)
            reloads.add_metric([name], m.reloads)
            threads.add_metric([name], float(m.ort_threads))
            fallback.add_metric([name], 1.0 if m.fallback else 0.0)
        yield from (info, failures, reloads, threads, fallback, provider, provider_fallback)
        yield from DaemonCollector._rollouts(d)

    @staticmethod
    def _rollouts(d: Snapshot):
        """Each model's rollout (control/rollout.py): the candidate under way against its gates, and the decisions
        taken, labelled with the model and both versions."""
        versions = ["model", "serving", "candidate"]
        active = GaugeMetricFamily("edgeinfer_rollout_active", "1 while a candidate version of the model is rolled "
                                   "out (policy: shadow or canary).", labels=[*versions, "policy"])
        frames = GaugeMetricFamily("edgeinfer_rollout_compared_frames", "Frames on which the candidate's answers "
                                   "were compared with the serving version's, this rollout.", labels=versions)
        agreement = GaugeMetricFamily("edgeinfer_rollout_agreement", "Share of answers the candidate gives as the "
                                      "serving version does (top-1, or boxes matched at IoU 0.5).", labels=versions)
        ratio = GaugeMetricFamily("edgeinfer_rollout_p99_ratio", "The candidate's p99 run time divided by the "
                                  "serving version's, over the paired runs (informs; the gate is the median "
                                  "ratio's).", labels=versions)
        bounds = {k: GaugeMetricFamily(f"edgeinfer_rollout_{k}", help_, labels=versions) for k, help_ in (
            ("time_ratio", "Median of the paired run-time ratios candidate / serving (same frame, same thread)."),
            ("time_ratio_high", "Upper confidence bound of that median (the gate passes when it is <= the gate)."),
            ("agreement_low", "Lower Wilson confidence bound of the agreement (the gate passes when >= the gate)."))}
        errors = GaugeMetricFamily("edgeinfer_rollout_error_rate", "The candidate's failed, cancelled or undecodable "
                                   "runs divided by its runs.", labels=versions)
        elapsed = GaugeMetricFamily("edgeinfer_rollout_elapsed_seconds", "Seconds since this rollout began.",
                                    labels=versions)
        gates = GaugeMetricFamily("edgeinfer_rollout_gate", "The model's rollout gates and window (min_agreement, "
                                  "max_time_ratio, max_error_rate, confidence, min_frames, min_seconds, max_seconds).",
                                  labels=["model", "gate"])
        decisions = CounterMetricFamily("edgeinfer_rollout_decisions", "Rollouts decided since the start, by "
                                        "decision (promote, rollback).", labels=[*versions, "decision"])
        for m in d.models:
            r = m.rollout
            if r is None or r.policy == "immediate" and not r.decisions:
                continue
            for gate, value in r.gates.items():
                if value is not None:
                    gates.add_metric([m.name, gate], float(value))
            for (serving, candidate, decision), n in r.decisions.items():
                decisions.add_metric([m.name, serving, candidate, decision], n)
            f = r.figures
            if r.candidate is None or f is None:
                continue
            labels = [m.name, r.serving, r.candidate]
            active.add_metric([*labels, r.policy], 1.0)
            frames.add_metric(labels, f.frames)
            elapsed.add_metric(labels, f.elapsed_s)
            for family, value in ((agreement, f.agreement), (ratio, f.p99_ratio), (errors, f.error_rate),
                                  (bounds["time_ratio"], f.time_ratio), (bounds["time_ratio_high"], f.time_ratio_high),
                                  (bounds["agreement_low"], f.agreement_low)):
                if value is not None:
                    family.add_metric(labels, value)
        yield from (active, frames, agreement, ratio, errors, elapsed, *bounds.values(), gates, decisions)


def _drift(view: DriftView):
    ids = ["model", "version", "stream"]
    figure = GaugeMetricFamily("edgeinfer_model_drift_psi", "Population stability index of the model's decoded "
                               "outputs in the stream's window against its version's reference: the largest of its "
                               "features' (stream=\"*\": every stream of that version pooled). Under 0.1: no shift; "
                               "0.1-0.25: a moderate one; over 0.25: a large one. Absent while the window holds "
                               "fewer than drift.min_window_frames frames.", labels=ids)
    feature = GaugeMetricFamily("edgeinfer_model_drift_feature_psi", "The PSI of one feature (classes: top-1 class "
                                "or boxes' classes; score; boxes: boxes per frame).", labels=[*ids, "feature"])
    frames = GaugeMetricFamily("edgeinfer_model_drift_window_frames", "Frames in the stream's window "
                               "(drift.window_s).", labels=ids)
    ref = GaugeMetricFamily("edgeinfer_model_drift_reference_frames", "Frames in the version's reference (so "
                            "far, while it is being taken).", labels=["model", "version", "source"])
    complete = GaugeMetricFamily("edgeinfer_model_drift_reference_complete", "1 once the version has its "
                                 "reference (from its bundle, this host's state directory or its first frames).",
                                 labels=["model", "version"])
    records = CounterMetricFamily("edgeinfer_model_drift_records", "Result records the drift chore read from the "
                                  "stream's result ring, and those overwritten before it could (missed: it samples).",
                                  labels=["stream", "outcome"])
    for f in view.figures:
        labels = [f.model, f.version, f.stream]
        frames.add_metric(labels, float(f.frames))
        if f.psi is not None:
            figure.add_metric(labels, f.psi)
            for name, v in f.features.items():
                feature.add_metric([*labels, name], v)
    for r in view.references:
        ref.add_metric([r.model, r.version, r.source], float(r.frames))
        complete.add_metric([r.model, r.version], 1.0 if r.complete else 0.0)
    for stream, (read, missed) in view.records.items():
        records.add_metric([stream, "read"], read)
        records.add_metric([stream, "missed"], missed)
    yield from (figure, feature, frames, ref, complete, records)
    yield CounterMetricFamily("edgeinfer_model_drift_cpu_seconds", "CPU time of the control plane's drift chore.",
                              value=view.cpu_s)


class Health:
    """Liveness from the lanes' progress counters, readiness from start-up state. The control plane sets
    model_ready; the HTTP thread only reads."""

    def __init__(self, lanes, models, streams, deadline_s: float, requires_stream: bool):
        """lanes: the Supervisor (stuck lanes); models: the model registry (its `served`: fallbacks); streams: the
        streams' states (`connected`)."""
        self.lanes = lanes
        self.models = models
        self.streams = streams
        self.deadline_s = deadline_s
        self.requires_stream = requires_stream
        self.model_ready = False

    def stuck(self) -> list[str]:
        """Lanes that are down or made no progress within the deadline."""
        return self.lanes.stuck(self.deadline_s)

    def healthy(self) -> bool:
        if not self.model_ready:
            return True  # starting up (or stopping): alive; /readyz says the rest
        return not self.stuck()

    def fallbacks(self) -> dict[str, dict]:
        """The models serving their last known-good bundle because the configured one was refused at start."""
        out = {}
        for name, m in list(self.models.served.items()):
            fb, rt = m.fallback, m.runtime
            if fb and rt is not None:
                out[name] = {"configured": fb["configured"], "refused": fb["kind"], "reason": fb["reason"],
                             "serving": fb["bundle"], "version": f"{rt.name} {rt.version}"}
        return out

    def provider_fallbacks(self) -> dict[str, dict]:
        """The models that serve on the CPU provider in some lane because their configured provider failed there."""
        out = {}
        for name, m in list(self.models.served.items()):
            fb = provider_fallback(m.provider.label, self.lanes.providers(name))
            if fb:
                out[name] = fb
        return out

    def ready(self) -> bool:
        if not (self.model_ready and self.healthy()):
            return False
        return not self.requires_stream or any(s.connected for s in self.streams)


class MetricsServer:
    """/metrics, /healthz, /readyz on one bounded listener (daemon/edgeinfer/telemetry/httplistener.py): an asyncio thread that
    answers the probes fresh, and one thread that renders /metrics, at most once per METRICS_CACHE_S, shared
    by every scrape meanwhile unless liveness changed. Also the collector of the listener's own counters
    (edgeinfer_http_*)."""

    # Short, and no answer is older than this: at 0.5 s the isolation row that reads a killed camera's stream
    # from /metrics saw 0.43-1.7 s (a render from before the kill); liveness never waits for it (the key).
    METRICS_CACHE_S = 0.1

    def __init__(self, snapshot: Callable[[], Snapshot], health: Health, listen: str):
        host, _, port = listen.rpartition(":")
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(DaemonCollector(snapshot, health))
        self.registry.register(self)
        registry = self.registry

        def metrics() -> Response:
            return 200, CONTENT_TYPE_LATEST, generate_latest(registry)

        def probe(check) -> Callable[[], Response]:
            def answer() -> Response:  # on the listener's loop, never cached: liveness is now
                ok = check()
                # ok: a model on its last known-good bundle serves; the body says which, and why
                # ok too: a model on the CPU provider because its own failed (degraded: it serves, said here)
                body = {"ok": ok, "version": VERSION, "stuck_lanes": health.stuck(),
                        "known_good_fallback": health.fallbacks(), "provider_fallback": health.provider_fallbacks()}
                return (200 if ok else 503), "application/json", json.dumps(body).encode() + b"\n"
            return answer

        def liveness():  # a scrape never gets a cached render that this has changed since
            return (health.healthy(), health.ready(),
                    tuple(id(m.runtime) for m in health.models.served.values()),
                    tuple(s.connected for s in health.streams))

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
