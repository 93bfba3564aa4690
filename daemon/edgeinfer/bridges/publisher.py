"""The MQTT side of the bridge: one paho-mqtt 2.x client, its availability topic, and a bounded queue.

- `<prefix>/available`: the broker's last will is "offline" (retained); "online" (retained) on every connection;
  "stopped" (retained) on a clean stop. QoS: qos.availability.
- The queue is bounded by count and by bytes. Over a bound, per-frame results go first, oldest first, then
  retained states (each superseded by the next of its topic anyway), events only when neither is left; every
  drop is counted with its reason. Events go to the broker first, then states, then results. `offer` never waits:
  the reader loop calls it and goes on.
- Messages go to paho only while connected, at most MAX_INFLIGHT not yet written or acknowledged, so paho's own
  buffers stay small; paho's network thread (loop_start) reconnects with backoff (reconnect_delay_set).
- Across a lost connection, paho sends every QoS 1 message not yet acknowledged again (at least once: a subscriber
  may see an event twice, with the same id); QoS 0 messages not yet written are dropped and counted.
- Protocol 5 falls back to 3.1.1 when the broker refuses 5 (logged), once per process.
"""
from __future__ import annotations

import collections
import logging
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from edgeinfer.bridges.messages import finish
from edgeinfer.bridges.mqttconfig import MqttConfig, read_password

log = logging.getLogger("edgeinfer-mqtt")
PAHO_LOG = "edgeinfer-mqtt.paho"
# paho's lines about its connection (ERROR for each socket error or timeout, DEBUG for each retry): the bridge says
# each change of the connection once itself ("cannot reach the broker", "disconnected from the broker", "connected
# to the broker"), so these show only at --log-level debug.
_PAHO_STATE_LINES = ("failed to receive on socket", "timeout on socket", "Connection failed, retrying",
                     "Client is not connected")  # the last: ERROR at every turn of its loop while unreachable


class PahoLines(logging.Filter):
    """On paho's logger: its connection lines dropped (kept, as DEBUG, at debug level); the rest as paho logs it
    (its packet traces at DEBUG; at ERROR a callback of ours that raised)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and record.msg.startswith(_PAHO_STATE_LINES):
            if not logging.getLogger(PAHO_LOG).isEnabledFor(logging.DEBUG):
                return False
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


_PAHO_FILTER = PahoLines()

MAX_INFLIGHT = 64           # messages handed to paho and not yet written (QoS 0) or acknowledged (QoS 1, 2)
STOP_FLUSH_S = 2.0          # how long a clean stop waits for "stopped" to reach the broker
KIND_RESULT, KIND_EVENT, KIND_STATE = "result", "event", "state"
DROP_ORDER = (KIND_RESULT, KIND_STATE, KIND_EVENT)   # over a bound, the first non-empty loses its oldest
SEND_ORDER = (KIND_EVENT, KIND_STATE, KIND_RESULT)


@dataclass
class Outgoing:
    kind: str               # "result" (dropped first), "state" or "event" (kept longest)
    topic: str
    message: dict           # finished (publish time added) when handed to paho
    size: int               # estimated bytes, for the byte bound
    qos: int
    retain: bool = False
    queued_ns: int = field(default_factory=time.monotonic_ns)
    done_ns: int = 0        # the record's CLOCK_MONOTONIC done time (result → publish latency)


class Publisher:
    def __init__(self, cfg: MqttConfig, metrics, notify_state=lambda: None):
        self.cfg = cfg
        self.metrics = metrics
        self.available = f"{cfg.prefix}/available"
        self._queues: dict[str, collections.deque[Outgoing]] = {k: collections.deque() for k in SEND_ORDER}
        self._bytes = 0
        self._lock = threading.Lock()         # the inflight table (paho's thread calls on_publish)
        self._inflight: dict[int, Outgoing] = {}
        self._early: set[int] = set()         # mids acknowledged before publish() returned them
        self.connected = False
        self.connections = 0
        self._unreachable_said = False  # "cannot reach the broker" said since the last connection
        self._fallback = False
        self._stopping = False
        self._protocol = MQTTProtocolVersion.MQTTv5 if cfg.broker.protocol == "5" else MQTTProtocolVersion.MQTTv311
        self._password = read_password(cfg.broker.password_file) if cfg.broker.password_file else None
        self._notify_state = notify_state
        self.client = self._make_client()

    # ------------------------------------------------------------------ the client

    def _make_client(self) -> mqtt.Client:
        b, cfg = self.cfg.broker, self.cfg
        c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=b.client_id or f"edgeinfer-mqtt-{cfg.node}",
                        protocol=self._protocol, reconnect_on_failure=True)
        paho_log = logging.getLogger(PAHO_LOG)
        paho_log.addFilter(_PAHO_FILTER)  # once: the same filter is not added twice
        c.enable_logger(paho_log)
        if b.tls is not None:
            c.tls_set(ca_certs=b.tls.ca, certfile=b.tls.cert, keyfile=b.tls.key, cert_reqs=ssl.CERT_REQUIRED,
                      tls_version=ssl.PROTOCOL_TLS_CLIENT)
        if b.username is not None:
            c.username_pw_set(b.username, self._password)
        c.will_set(self.available, "offline", qos=cfg.qos.availability, retain=True)
        c.reconnect_delay_set(min_delay=max(1, round(b.reconnect_min_s)), max_delay=max(1, round(b.reconnect_max_s)))
        c.max_inflight_messages_set(MAX_INFLIGHT)
        c.on_connect = self._on_connect
        c.on_disconnect = self._on_disconnect
        c.on_publish = self._on_publish
        c.on_connect_fail = self._on_connect_fail
        return c

    def start(self) -> None:
        b = self.cfg.broker
        props = None
        if self._protocol == MQTTProtocolVersion.MQTTv5:
            from paho.mqtt.packettypes import PacketTypes
            from paho.mqtt.properties import Properties
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = 0
        self.client.connect_async(b.host, b.port, keepalive=b.keepalive, clean_start=True if props else
                                  mqtt.MQTT_CLEAN_START_FIRST_ONLY, properties=props)
        self.client.loop_start()
        log.info("broker %s:%d (%s, MQTT %s)", b.host, b.port, "TLS" if b.tls else "plain", b.protocol)

    @property
    def thread_alive(self) -> bool:
        t = getattr(self.client, "_thread", None)
        return t is not None and t.is_alive()

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        if reason_code.is_failure:
            self.metrics.connect_failures.labels(str(reason_code)).inc()
            if self._protocol == MQTTProtocolVersion.MQTTv5 and reason_code.value in (0x84, 0x01):
                self._fallback = True  # "Unsupported protocol version": rebuilt as 3.1.1 by keep()
            log.warning("broker refused the connection: %s", reason_code)
            return
        self._no_delay(client)
        self._unreachable_said = False
        self.connected = True
        self.connections += 1
        self.metrics.connected.set(1)
        client.publish(self.available, "online", qos=self.cfg.qos.availability, retain=True)
        self.metrics.published.labels("available").inc()
        log.info("connected to the broker (connection %d, MQTT %s)", self.connections,
                 "5" if self._protocol == MQTTProtocolVersion.MQTTv5 else "3.1.1")
        self._notify_state()

    @staticmethod
    def _no_delay(client) -> None:
        """TCP_NODELAY on the broker's connection: paho leaves Nagle's algorithm on, and a small message written
        behind one not yet acknowledged waited for the broker's delayed ACK (bench/mqtt.py: p99 13 ms at 30/s)."""
        sock = client.socket()
        try:
            if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError as e:
            log.warning("could not turn Nagle's algorithm off on the broker's connection: %s", e)

    def _on_connect_fail(self, client, userdata) -> None:
        self.metrics.connect_failures.labels("unreachable").inc()
        if not self._unreachable_said and not self._stopping:  # once per outage, not once per retry
            self._unreachable_said = True
            b = self.cfg.broker
            log.warning("cannot reach the broker %s:%d; retrying with backoff (%d-%d s, said once until it "
                        "connects; edgeinfer_mqtt_connect_failures_total counts each try)", b.host, b.port,
                        max(1, round(b.reconnect_min_s)), max(1, round(b.reconnect_max_s)))

    def _on_disconnect(self, client, userdata, flags, reason_code, properties) -> None:
        was = self.connected
        self.connected = False
        self.metrics.connected.set(0)
        # paho keeps every QoS 1 and 2 message not yet acknowledged and sends it again on the next connection
        # (flagged DUP: at least once; events carry an id). QoS 0 messages not yet written are gone with the socket.
        with self._lock:
            lost = [mid for mid, o in self._inflight.items() if o.qos == 0]
            lost = [self._inflight.pop(mid) for mid in lost]
            kept = len(self._inflight)
        for o in lost:
            self.metrics.dropped.labels(o.kind, "disconnected").inc()
        if kept:
            log.info("%d message(s) not yet acknowledged: sent again on reconnection", kept)
        if was and not self._stopping:
            log.warning("disconnected from the broker (%s); reconnecting with backoff", reason_code)
        self._notify_state()

    def _on_publish(self, client, userdata, mid, reason_code, properties) -> None:
        with self._lock:
            o = self._inflight.pop(mid, None)
            if o is None:
                self._early.add(mid)
                return
        self._published(o)

    def _published(self, o: Outgoing) -> None:
        self.metrics.published.labels(o.kind).inc()
        if o.done_ns:
            self.metrics.latency.labels(o.kind).observe(max(0, time.monotonic_ns() - o.done_ns) / 1e9)

    # ------------------------------------------------------------------ the queue

    def offer(self, o: Outgoing) -> None:
        """Queues a message; never waits. Over a bound, the oldest results go first (counted)."""
        if o.size > self.cfg.queue.max_bytes:
            self.metrics.dropped.labels(o.kind, "too_large").inc()
            return
        self._queues[o.kind].append(o)
        self._bytes += o.size
        q = self.cfg.queue
        while self.depth > q.max_messages or self._bytes > q.max_bytes:
            reason = "queue_full" if self.depth > q.max_messages else "queue_bytes"
            victims = next(self._queues[k] for k in DROP_ORDER if self._queues[k])
            v = victims.popleft()
            self._bytes -= v.size
            self.metrics.dropped.labels(v.kind, reason).inc()

    @property
    def depth(self) -> int:
        return sum(len(q) for q in self._queues.values())

    @property
    def queued_bytes(self) -> int:
        return self._bytes

    def pump(self) -> int:
        """Hands queued messages to paho while connected and under MAX_INFLIGHT (events, states, results); returns
        how many."""
        n = 0
        while self.connected:
            with self._lock:
                if len(self._inflight) >= MAX_INFLIGHT:
                    break
            q = next((self._queues[k] for k in SEND_ORDER if self._queues[k]), None)
            if q is None:
                break
            o = q.popleft()
            self._bytes -= o.size
            info = self.client.publish(o.topic, finish(o.message, time.time_ns()), qos=o.qos, retain=o.retain)
            if info.rc == mqtt.MQTT_ERR_NO_CONN and o.qos > 0:
                pass  # the connection went while this turn ran: paho keeps it and sends it on reconnection
            elif info.rc != mqtt.MQTT_ERR_SUCCESS:
                self.metrics.dropped.labels(o.kind, "not_connected" if info.rc == mqtt.MQTT_ERR_NO_CONN
                                            else f"client_{info.rc}").inc()
                continue
            with self._lock:
                if info.mid in self._early:
                    self._early.discard(info.mid)
                    done = True
                else:
                    self._inflight[info.mid] = o
                    done = False
            if done:
                self._published(o)
            n += 1
        self.metrics.queue_depth.set(self.depth)
        self.metrics.queue_bytes.set(self._bytes)
        with self._lock:
            self.metrics.inflight.set(len(self._inflight))
        return n

    def keep(self) -> None:
        """The main loop's chores: a protocol fallback (5 → 3.1.1) the broker asked for."""
        if self._fallback:
            self._fallback = False
            log.warning("the broker refuses MQTT 5: falling back to MQTT 3.1.1")
            self.client.loop_stop()
            self.client.disconnect()
            self._protocol = MQTTProtocolVersion.MQTTv311
            self.client = self._make_client()
            self.start()

    def stop(self) -> None:
        """Clean stop: "stopped" (retained) to the broker when connected, then disconnect (no last will)."""
        self._stopping = True
        for kind, q in self._queues.items():
            for _ in q:
                self.metrics.dropped.labels(kind, "stopped").inc()
            q.clear()
        self._bytes = 0
        sent = self.connected
        if sent:
            info = self.client.publish(self.available, "stopped", qos=self.cfg.qos.availability, retain=True)
            try:
                info.wait_for_publish(STOP_FLUSH_S)
            except (RuntimeError, ValueError):
                pass
        self.client.disconnect()
        self.client.loop_stop()
        with self._lock:  # what the broker had not acknowledged by now
            unacked, self._inflight = list(self._inflight.values()), {}
        for o in unacked:
            self.metrics.dropped.labels(o.kind, "stopped").inc()
        if sent:
            log.info("stopped: \"stopped\" sent to %s", self.available)
        else:
            log.info("stopped (not connected to the broker: nothing sent to %s)", self.available)
