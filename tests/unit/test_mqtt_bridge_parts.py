"""The MQTT bridge's parts without a broker or a daemon: its file's schema, the password file's mode rule, the
bounded queue's drop order and counts, and the result message against the published JSON Schema."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from conftest import ROOT

pytest.importorskip("paho.mqtt.client", reason="paho-mqtt (requirements/runtime.txt)")

from edgeinfer.bridges.mqttconfig import load_mqtt_config, read_password
from edgeinfer.support.yamlconf import ConfigError


def _write(tmp_path, text: str) -> str:
    p = tmp_path / "mqtt.yaml"
    p.write_text(text)
    return str(p)


def test_the_file_is_strict_and_errors_name_their_line(tmp_path):
    cfg = load_mqtt_config(_write(tmp_path, "streams:\n  cam0: {max_rate_hz: 5}\n"))
    assert cfg.prefix == "edgeinfer" and cfg.broker.protocol == "5" and cfg.qos.availability == 1
    assert cfg.streams["cam0"].max_rate_hz == 5 and cfg.streams["cam0"].results
    assert cfg.metrics.listen == "127.0.0.1:9466" and cfg.node
    assert load_mqtt_config(_write(tmp_path, "broker: {protocol: 3.1.1}\nstreams: {c: {}}\n")).broker.protocol == \
        "3.1.1"
    with pytest.raises(ConfigError) as e:
        load_mqtt_config(_write(tmp_path, "streams:\n  cam0: {}\nbroker:\n  hots: x\n"))
    assert "mqtt.yaml:4: broker.hots: unknown key" in str(e.value)
    with pytest.raises(ConfigError) as e:
        load_mqtt_config(_write(tmp_path, "prefix: a/#\nstreams:\n  ../x: {}\n"))
    assert ":1: prefix:" in str(e.value) and ":2: streams:" in str(e.value)
    with pytest.raises(ConfigError):
        load_mqtt_config(_write(tmp_path, "streams: {}\n"))  # nothing to publish


def test_a_password_file_others_may_read_is_refused(tmp_path):
    p = tmp_path / "pw"
    p.write_text("secret\n")
    os.chmod(p, 0o640)
    assert read_password(str(p)) == "secret"
    os.chmod(p, 0o644)
    with pytest.raises(PermissionError, match="readable by every user"):
        read_password(str(p))


def test_the_queue_is_bounded_drops_results_oldest_first_and_counts_each(tmp_path):
    from edgeinfer.bridges.bridgemetrics import BridgeMetrics
    from edgeinfer.bridges.publisher import KIND_EVENT, KIND_RESULT, Outgoing, Publisher
    cfg = load_mqtt_config(_write(tmp_path, "queue: {max_messages: 3, max_bytes: 2048}\nstreams: {c: {}}\n"))
    m = BridgeMetrics()
    pub = Publisher(cfg, m)  # never started: nothing connects

    def dropped(kind, reason):
        return m.registry.get_sample_value("edgeinfer_mqtt_dropped_total", {"kind": kind, "reason": reason}) or 0
    pub.offer(Outgoing(KIND_EVENT, "t/e", {"n": "e0"}, 100, 1))
    for i in range(5):
        pub.offer(Outgoing(KIND_RESULT, "t/r", {"n": i}, 100, 0))
    assert pub.depth == 3 and dropped(KIND_RESULT, "queue_full") == 3 and dropped(KIND_EVENT, "queue_full") == 0
    assert [o.message["n"] for o in pub._queues[KIND_RESULT]] == [3, 4]  # the newest results kept
    pub.offer(Outgoing(KIND_RESULT, "t/r", {"n": "big"}, 1900, 0))  # over the bytes: results go first
    assert pub.queued_bytes <= 2048 and dropped(KIND_RESULT, "queue_bytes") >= 1
    assert [o.message["n"] for o in pub._queues[KIND_EVENT]] == ["e0"] or dropped(KIND_EVENT, "queue_bytes") == 1
    pub.offer(Outgoing(KIND_RESULT, "t/r", {}, 4096, 0))
    assert dropped(KIND_RESULT, "too_large") == 1
    assert pub.pump() == 0  # not connected: nothing leaves, nothing is lost
    pub.stop()


def test_a_result_message_follows_the_published_schema():
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema (requirements/dev.txt)")
    from edgeinfer.abi.ring import ResultRecord
    from edgeinfer.abi.vocabulary import KIND_CLASSIFICATION, KIND_DETECTION
    from edgeinfer.bridges.messages import finish, result_message
    schema = json.loads((ROOT / "docs" / "schemas" / "mqtt-result.schema.json").read_text())
    cls = np.array([[2, 0.9], [0, 0.1]], np.float32).tobytes()
    det = np.array([[10, 20, 30, 40, 0.8, 1]], np.float32).tobytes()
    for kind, payload, n in ((KIND_CLASSIFICATION, cls, 2), (KIND_DETECTION, det, 1)):
        for size in ((0, 0), (200, 80)):   # a record from a daemon before 0.3 says no frame size
            rec = ResultRecord(7, 7, 1234, 1_000, 1_700_000_000_000_000_000, 2_000_000, 3_000_000, 0, kind, n,
                               "m", "1.0", payload, 0, *size)
            msg = json.loads(finish(result_message(rec, "cam0", "node1", ["a", "b", "c"], None),
                                    1_700_000_000_050_000_000))
            jsonschema.validate(msg, schema)
            assert msg["latency_ms"] == 50.0 and msg["capture_time"] == "2023-11-14T22:13:20.000000Z"
            assert msg["frame_id"] == 1234 and msg["model"] == {"name": "m", "version": "1.0", "digest": None}
            assert msg["frame"] == ({"width": 200, "height": 80} if size[0] else None)
            if kind == KIND_DETECTION and size[0]:
                assert msg["detections"][0]["box"] == [10 / 200, 20 / 80, 30 / 200, 40 / 80]
            elif kind == KIND_DETECTION:
                assert msg["detections"][0]["box"] is None
    assert msg["detections"][0]["box_px"] == [10, 20, 30, 40] and msg["detections"][0]["label"] == "b"
    # The rules' areas and regions are in pixels: they take box_px, whatever the frame size says.
    from edgeinfer.bridges.rules import observation
    (item,) = observation(msg, 1234, 0, msg["model"], True).items
    assert item.box == (10, 20, 30, 40) and item.label == "b"


def test_a_lapped_ring_is_counted_and_the_rate_limit_drops_what_it_holds_back(tmp_path):
    from edgeinfer.abi import ring
    from edgeinfer.abi.vocabulary import KIND_CLASSIFICATION
    from edgeinfer.bridges.bridge import Bridge, BridgedStream
    from edgeinfer.bridges.mqttconfig import load_mqtt_config
    cfg = load_mqtt_config(_write(tmp_path, f"daemon_config: {tmp_path}/none.yaml\nmetrics: {{enabled: false}}\n"
                                  "streams: {fast: {}, slow: {max_rate_hz: 1}}\n"))
    bridge = Bridge(cfg)
    row = np.array([[1, 0.5]], np.float32).tobytes()
    with ring.ResultWriter.create(64, records=4) as fast, ring.ResultWriter.create(64, records=16) as slow:
        bridge.streams = [BridgedStream("fast", ring.ResultReader.from_fd(fast.fd, "fast"), 0, True),
                          BridgedStream("slow", ring.ResultReader.from_fd(slow.fd, "slow"), 1, True)]
        for w in (fast, slow):
            for i in range(10):
                w.write(frame_id=i + 1, capture_realtime_ns=1_700_000_000_000_000_000, kind=KIND_CLASSIFICATION,
                        payload=row, item_count=1, model_name="m", model_version="1")
        assert bridge.turn() >= 10 + 4 - 1  # all of slow; the newest of fast the ring still held

        def sample(name, **labels):
            return bridge.metrics.registry.get_sample_value(name, labels) or 0
        assert sample("edgeinfer_mqtt_results_missed_total", stream="fast") >= 6
        assert sample("edgeinfer_mqtt_results_missed_total", stream="slow") == 0
        assert sample("edgeinfer_mqtt_dropped_total", kind="result", reason="rate_limit") == 9
        queued = [o.message for o in bridge.publisher._queues["result"]]
        assert [m["frame_id"] for m in queued if m["stream"] == "slow"] == [1]
        assert [m["frame_id"] for m in queued if m["stream"] == "fast"][-1] == 10
        for st in bridge.streams:
            st.reader.close()
    bridge.streams = []
    bridge.close()


def test_the_example_in_the_guides_mqtt_page_is_a_valid_file():
    from edgeinfer.bridges.mqttconfig import MqttConfig
    from edgeinfer.support.yamlconf import load_yaml_model
    text = (ROOT / "docs" / "operations" / "mqtt.md").read_text()
    section = text[text.index("### Its file: /etc/edgeinfer/mqtt.yaml"):]
    example = section[section.index("```yaml\n") + 8:section.index("```\n", section.index("```yaml\n") + 8)]
    cfg = load_yaml_model(MqttConfig, example, "mqtt.md")
    assert cfg.broker.tls.ca and cfg.streams["dock"].max_rate_hz == 2 and not cfg.streams["yard"].results


def test_a_broker_outage_is_one_line_not_pahos_internals(tmp_path, caplog):
    """Issue 35: the bridge logged paho's internals during an outage. A real paho client against a port nothing
    listens on: each failed try is counted, the bridge says "cannot reach the broker" once, paho says nothing at
    the default level; a socket error paho logs at ERROR (a lost connection, which the bridge says itself) shows
    only at debug, as DEBUG."""
    import logging
    import socket
    import time

    from edgeinfer.bridges.bridgemetrics import BridgeMetrics
    from edgeinfer.bridges.publisher import PAHO_LOG, Publisher
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = load_mqtt_config(_write(tmp_path, f"broker: {{host: 127.0.0.1, port: {port}, reconnect_min_s: 1, "
                                            f"reconnect_max_s: 1}}\nstreams: {{c: {{}}}}\n"))
    m = BridgeMetrics()
    caplog.set_level(logging.INFO)
    pub = Publisher(cfg, m)
    pub.start()
    try:
        deadline = time.monotonic() + 20
        while m.connect_failures.labels("unreachable")._value.get() < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert m.connect_failures.labels("unreachable")._value.get() >= 3
    finally:
        pub.stop()
    said = [r.getMessage() for r in caplog.records if "cannot reach the broker" in r.getMessage()]
    assert len(said) == 1 and f"127.0.0.1:{port}" in said[0], said
    assert not [r for r in caplog.records if r.name == PAHO_LOG], [r.getMessage() for r in caplog.records]
    # paho's own line for a lost connection: dropped at info, a DEBUG line at debug.
    paho = logging.getLogger(PAHO_LOG)
    caplog.clear()
    paho.error("failed to receive on socket: %s", "[Errno 104] Connection reset by peer")
    assert not caplog.records
    caplog.set_level(logging.DEBUG)
    paho.error("failed to receive on socket: %s", "[Errno 104] Connection reset by peer")
    assert [r.levelname for r in caplog.records] == ["DEBUG"]
    paho.error("Caught exception in on_publish: %s", "boom")  # a callback of ours that raised: as paho logs it
    assert caplog.records[-1].levelname == "ERROR"
