"""edgeinfer-mqtt: results off the host (edgeinfer-mqtt.service, or `edgeinferctl mqtt`).

An unprivileged reader of the result rings of the streams its file lists (a stream whose `readers` do not allow
its user is refused by the daemon: logged, counted, and the others go on). One loop reads every ring
(ResultReader, woken by ring.wait_any), turns each record into a message (messages.py), rate-limits it per
stream and offers it to the publisher's bounded queue, which never makes the loop wait; paho's thread talks to
the broker. A slow or dead broker costs the cameras nothing: the lanes never wait for readers, and the bridge
drops (and counts) what it cannot send.

Start: configuration → password file → broker connection (in the background) → rings → READY=1. The watchdog
is pinged only while this loop turns and paho's network thread lives. SIGTERM/SIGINT: "stopped" (retained) to
the broker, then disconnect, exit 0.

`Bridge.handle` is the one place a record becomes messages: the stream's rules (rules.py), fed every decoded
record whatever the results' rate limit, add `<prefix>/<stream>/event` (KIND_EVENT: kept before results) and the
retained `.../state` (each stream's states start inactive: a restart carries no episode over).
"""
from __future__ import annotations

import json
import logging
import signal
import time

from edgeinfer.abi import ring
from edgeinfer.abi.ringdefs import RingError
from edgeinfer.bridges.decisionlog import DecisionLog
from edgeinfer.bridges.messages import Digests, result_message
from edgeinfer.bridges.bridgemetrics import BridgeMetrics
from edgeinfer.bridges.publisher import KIND_EVENT, KIND_RESULT, KIND_STATE, Outgoing, Publisher
from edgeinfer.bridges.rules import StreamRules, observation
from edgeinfer.bridges.mqttconfig import MqttConfig, load_mqtt_config
from edgeinfer.config.labels import LabelSource
from edgeinfer.config.schema import load_config
from edgeinfer.support.liveness import Liveness
from edgeinfer.support.signals import STOP, Signals
from edgeinfer.support.startfiles import StartFile, StartFileError, check_start_files
from edgeinfer.support.systemd import Notifier, Watchdog
from edgeinfer.telemetry.probes import ProbeListener

log = logging.getLogger("edgeinfer-mqtt")

WAIT_S = 0.05            # longest sleep on the rings between turns
BATCH = 256              # records read from one ring per turn (then the others get theirs)
MESSAGE_OVERHEAD = 160   # bytes the publish time and latency add to a message's estimated size
STATUS_INTERVAL_S = 5.0


class BridgedStream:
    def __init__(self, name: str, reader: ring.ResultReader | None, max_rate_hz: float, results: bool,
                 rules: StreamRules | None = None):
        self.name = name
        self.rules = rules   # the stream's events engine (None: no rules)
        self.reader = reader
        self.results = results
        self.interval_ns = int(1e9 / max_rate_hz) if max_rate_hz > 0 else 0
        self.next_ns = 0
        self.missed_seen = 0
        self.read_counter = None   # its metrics' children, looked up once (a turn visits every stream)
        self.attached_gauge = None
        self.attached = None       # what the gauge last said

    def allow(self, now_ns: int) -> bool:
        """Rate limit: at most one result message every 1/max_rate_hz seconds."""
        if not self.interval_ns:
            return True
        if now_ns < self.next_ns:
            return False
        self.next_ns = now_ns + self.interval_ns
        return True


class Bridge:
    def __init__(self, cfg: MqttConfig, signals: Signals | None = None):
        self.cfg = cfg
        self.signals = signals if signals is not None else Signals()
        self.notifier = Notifier()
        self.metrics = BridgeMetrics()
        self.streams: list[BridgedStream] = []
        self.listener: ProbeListener | None = None
        self.publisher = Publisher(cfg, self.metrics, self._status)
        self.live = Liveness("the reader loop")   # the watchdog's and /healthz's evidence
        publisher = self.publisher
        self.live.watch("the MQTT client's thread stopped", lambda: publisher.thread_alive)
        self.labels = LabelSource(config=cfg.daemon_config, warn=lambda m: log.warning("%s", m))
        self.digests = Digests(lambda: [b for b, _ in self.labels._candidates()])
        self.decisions: DecisionLog | None = None   # the decision log (decisionlog.py), opened by start()
        self._states_for = 0   # the broker connection the retained states were last offered for

    def start(self) -> None:
        cfg = self.cfg
        daemon = load_config(cfg.daemon_config)
        socket = daemon.ingress.results_socket
        d = cfg.decisions
        if d.enabled:  # before the broker: a log that cannot be opened stops the start (exit 1, logged)
            self.decisions = DecisionLog(d.path, fsync_interval_ms=d.fsync_interval_ms, max_bytes=d.max_bytes,
                                         max_age_days=d.max_age_days, registry=self.metrics.registry)
            log.info("decision log %s: events%s, committed every %g ms", d.path, " and results" if d.results
                     else "", d.fsync_interval_ms)
        self.publisher.start()
        try:
            for name, out in cfg.streams.items():
                try:
                    reader = ring.ResultReader.watch(name, socket=socket)
                except RingError as e:  # not transient: the daemon refuses this reader (its `readers`)
                    self.metrics.refused.labels(name).inc()
                    log.error("stream %s: refused by edgeinferd (%s); its results are not published (the other "
                              "streams go on). In %s, is the stream there, and do its `readers` allow this user?",
                              name, e, cfg.daemon_config)
                    continue
                if reader.last_error is not None:
                    log.warning("stream %s: edgeinferd not there yet (%s): attached when it comes", name,
                                reader.last_error)
                rules = StreamRules(name, cfg.node, out.rules) if out.rules else None
                self.streams.append(BridgedStream(name, reader, out.max_rate_hz, out.results, rules))
                if rules is not None:  # at start no rule is active: a restart does not carry an episode over
                    self._offer_state(self.streams[-1])
                log.info("stream %s: results to %s/%s/result%s", name, cfg.prefix, name,
                         f" (at most {out.max_rate_hz:g}/s)" if out.max_rate_hz else "")
            if cfg.metrics.enabled:
                self.listener = ProbeListener(self.metrics.registry, cfg.metrics.listen,
                                              {"/healthz": self.live.problems})
                self.listener.start()
                log.info("mqtt bridge metrics and health on http://%s", self.listener.address)
        except BaseException:
            self.close()
            raise
        if not self.streams:
            log.error("no stream of %s may be read: publishing availability only", cfg.daemon_config)

    # ------------------------------------------------------------------ one record → messages

    def handle(self, st: BridgedStream, rec: ring.ResultRecord) -> None:
        st.read_counter.inc()
        send = st.results and st.allow(time.monotonic_ns())
        if st.results and not send:
            self.metrics.dropped.labels(KIND_RESULT, "rate_limit").inc()
        keep = self.decisions is not None and self.cfg.decisions.results  # every result to the decision log
        if not send and st.rules is None and not keep:
            return
        labels = self.labels.labels(rec.model_name, rec.model_version)
        msg = result_message(rec, st.name, self.cfg.node, labels,
                             self.digests.digest(rec.model_name, rec.model_version))
        if keep:
            self.decisions.append_result(msg)  # serialised now: the publisher's later additions are not logged
        if st.rules is not None:  # every record, whatever the result's rate limit
            self._offer_events(st, st.rules.feed(observation(msg, rec.frame_id, rec.capture_realtime_ns,
                                                             msg["model"], msg["ok"])), rec.done_ns)
        if not send:
            return
        size = len(rec.payload) * 6 + 600 + MESSAGE_OVERHEAD  # JSON of the decoded floats, without building it twice
        self.publisher.offer(Outgoing(KIND_RESULT, f"{self.cfg.prefix}/{st.name}/result", msg, size,
                                      self.cfg.qos.result, done_ns=rec.done_ns))
        # The events engine (rules) and the decision log take the same record here (issue 26, parts 2 and 3).

    def _offer_events(self, st: BridgedStream, events: list[dict], done_ns: int = 0) -> None:
        """Rule events to PREFIX/STREAM/event (qos.event), then the stream's retained state (qos.state)."""
        for ev in events:
            self.metrics.events.labels(st.name, ev["rule"], ev["type"]).inc()
            if self.decisions is not None:
                self.decisions.append_event(ev)
            log.info("stream %s: rule %s: %s %s (frame %d)", st.name, ev["rule"], ev["type"], ev["id"], ev["frame_id"])
            self.publisher.offer(Outgoing(KIND_EVENT, f"{self.cfg.prefix}/{st.name}/event", dict(ev),
                                          len(json.dumps(ev)) + MESSAGE_OVERHEAD, self.cfg.qos.event, done_ns=done_ns))
        if events:
            self._offer_state(st)

    def _offer_state(self, st: BridgedStream) -> None:
        state = st.rules.state()
        self.publisher.offer(Outgoing(KIND_STATE, f"{self.cfg.prefix}/{st.name}/state", state,
                                      len(json.dumps(state)) + MESSAGE_OVERHEAD, self.cfg.qos.state, retain=True))

    def turn(self) -> int:
        n = 0
        now_ns = time.time_ns()
        connections = self.publisher.connections
        if connections > self._states_for:
            # A new connection: a broker that restarted without persistence lost its retained messages, so each
            # stream's state goes again ("online" likewise, from the publisher). The first: start() offered them.
            if self._states_for:
                for st in self.streams:
                    if st.rules is not None:
                        self._offer_state(st)
            self._states_for = connections
        for st in self.streams:  # end_after_ms episodes of streams that fell silent
            if st.rules is not None:
                self._offer_events(st, st.rules.expire(now_ns))
        for st in self.streams:
            r = st.reader
            if st.read_counter is None:
                st.read_counter = self.metrics.results_read.labels(st.name)
                st.attached_gauge = self.metrics.attached.labels(st.name)
            for _ in range(BATCH):
                try:
                    rec = r.read(0.0)
                except RingError as e:
                    log.error("stream %s: %s", st.name, e)
                    break
                if rec is None:
                    break
                self.handle(st, rec)
                n += 1
            missed = r.missed
            if missed > st.missed_seen:
                self.metrics.missed.labels(st.name).inc(missed - st.missed_seen)
                log.warning("stream %s: the ring lapped the bridge: %d record(s) missed", st.name,
                            missed - st.missed_seen)
                st.missed_seen = missed
            attached = r.connected
            if attached != st.attached:
                st.attached = attached
                st.attached_gauge.set(1 if attached else 0)
        if self.decisions is not None:
            self.decisions.flush()  # commits what waited fsync_interval_ms (records or not); the loop turns ≤ WAIT_S
        self.publisher.pump()
        self.publisher.keep()
        return n

    def _status(self) -> None:
        if self.notifier.enabled:
            try:
                self.notifier.send("STATUS=" + self.status_line())
            except OSError:
                pass

    def status_line(self) -> str:
        return (f"broker {'connected' if self.publisher.connected else 'not connected'}; "
                f"{sum(1 for s in self.streams if s.reader.connected)}/{len(self.cfg.streams)} stream(s) read; "
                f"queue {self.publisher.depth}")

    def serve(self) -> int:
        self.notifier.send("READY=1", "STATUS=" + self.status_line())
        watchdog = Watchdog(self.notifier, self.live, 0.0)
        next_status = time.monotonic() + STATUS_INTERVAL_S
        while not self.signals.requested(*STOP):
            self.turn()
            self.live.turned()
            watchdog.tick()
            if time.monotonic() >= next_status:
                next_status += STATUS_INTERVAL_S
                self._status()
            waiting = [s.reader for s in self.streams if s.reader.native is not None]
            timeout = 0.005 if self.publisher.depth and self.publisher.connected else WAIT_S
            if waiting:
                ring.wait_any(waiting[:ring.MAX_WAIT], timeout)
            else:
                time.sleep(timeout)
        return 0

    def close(self) -> None:
        self.notifier.stopping()  # a stop goes on whether systemd hears it or not
        self.publisher.stop()
        if self.decisions is not None:
            self.decisions.close()  # commits what waits
            self.decisions = None
        for st in self.streams:
            st.reader.close()
        self.streams = []
        if self.listener is not None:
            self.listener.stop()
            self.listener = None


# The owner and mode of each file the bridge (user edgeinfer-mqtt, group edgeinfer) reads at start
# (docs/operations/install-and-upgrade.md, "Files each service reads at start").
CONFIG_NEED = "readable by user edgeinfer-mqtt: 0644 root:root, as the package ships it"
SECRET_NEED = "0640 root:edgeinfer-mqtt (install -m 0640 -o root -g edgeinfer-mqtt FILE PATH)"
CERT_NEED = "readable by user edgeinfer-mqtt: 0644 root:root (or 0640 root:edgeinfer-mqtt)"


def mqtt_start_files(cfg: MqttConfig) -> list[StartFile]:
    """What the bridge reads at start besides mqtt.yaml: edgeinferd.yaml, the password file, broker.tls's files."""
    b = cfg.broker
    files = [StartFile(cfg.daemon_config, "daemon_config", CONFIG_NEED)]
    if b.password_file:
        files.append(StartFile(b.password_file, "broker.password_file", SECRET_NEED))
    if b.tls is not None:
        files += [StartFile(path, f"broker.tls.{key}", need) for key, path, need in
                  (("ca", b.tls.ca, CERT_NEED), ("cert", b.tls.cert, CERT_NEED), ("key", b.tls.key, SECRET_NEED))
                  if path]
    return files


def run(config_path: str) -> int:
    """`edgeinferctl mqtt`: runs until SIGTERM or SIGINT. Exit 2: a configuration that cannot work."""
    from edgeinfer.support.yamlconf import ConfigError
    signals = Signals(signal.SIGTERM, signal.SIGINT)
    try:
        check_start_files([StartFile(config_path, "--config", CONFIG_NEED)])
        cfg = load_mqtt_config(config_path)
        check_start_files(mqtt_start_files(cfg))
        bridge = Bridge(cfg, signals)
        bridge.start()
    except StartFileError as e:
        for line in e.problems:
            log.error("cannot start: %s", line)
        return 2
    except ConfigError as e:
        log.error("%s", e)
        return 2
    except (OSError, ValueError) as e:  # a password file others may read, no daemon config
        log.error("cannot start: %s", e)
        return 2 if isinstance(e, PermissionError) else 1
    try:
        return bridge.serve()
    finally:
        bridge.close()
