"""The MQTT bridge's metrics (/metrics, /healthz on its own loopback listener, default 127.0.0.1:9466)."""
from __future__ import annotations


from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
)


BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class BridgeMetrics:
    def __init__(self):
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.published = Counter("edgeinfer_mqtt_published", "Messages the broker took (QoS 0: written to the "
                                 "connection; QoS 1, 2: acknowledged), by topic kind (result, event, state, available).",
                                 ["kind"], registry=r)
        self.dropped = Counter("edgeinfer_mqtt_dropped", "Messages not published, by topic kind and reason "
                               "(rate_limit, queue_full, queue_bytes, too_large, disconnected (QoS 0 only), "
                               "not_connected, stopped).", ["kind", "reason"], registry=r)
        self.queue_depth = Gauge("edgeinfer_mqtt_queue_messages", "Messages waiting for the broker.", registry=r)
        self.queue_bytes = Gauge("edgeinfer_mqtt_queue_bytes", "Bytes waiting for the broker (estimated).",
                                 registry=r)
        self.inflight = Gauge("edgeinfer_mqtt_inflight", "Messages handed to the MQTT client, not yet written or "
                              "acknowledged.", registry=r)
        self.connected = Gauge("edgeinfer_mqtt_broker_connected", "1 while connected to the broker.", registry=r)
        self.connect_failures = Counter("edgeinfer_mqtt_connect_failures", "Connection attempts that failed, by "
                                        "reason (unreachable, or the broker's reason code).", ["reason"], registry=r)
        self.latency = Histogram("edgeinfer_mqtt_publish_latency_seconds", "Result committed by the daemon → "
                                 "published to the broker (CLOCK_MONOTONIC), by topic kind.", ["kind"],
                                 buckets=BUCKETS, registry=r)
        self.results_read = Counter("edgeinfer_mqtt_results_read", "Result records read, by stream.", ["stream"],
                                    registry=r)
        self.missed = Counter("edgeinfer_mqtt_results_missed", "Result records the ring overwrote before the "
                              "bridge read them (it lapped the bridge), by stream.", ["stream"], registry=r)
        self.refused = Counter("edgeinfer_mqtt_streams_refused", "Streams the daemon refused to let the bridge "
                               "read (its readers do not allow this user), by stream.", ["stream"], registry=r)
        self.events = Counter("edgeinfer_mqtt_events", "Rule events the engine fired (before the queue), by stream, "
                              "rule and type (new, update, end).", ["stream", "rule", "type"], registry=r)
        self.attached = Gauge("edgeinfer_mqtt_stream_attached", "1 while the stream's result ring is attached.",
                              ["stream"], registry=r)
