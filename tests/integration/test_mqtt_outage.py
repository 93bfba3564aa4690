"""The broker killed (SIGKILL) for 10 s under load, end to end: the real daemon with two cameras (cam-a driven by the
test's schedule of rotations, so a rule fires an event pair every cycle; cam-b a synthetic camera at 15 fps whose
every result is published), edgeinferd-mqtt, a real mosquitto with persistence, and a real paho subscriber with a
persistent session. The broker first stalls (SIGSTOP), so that events are in flight, unacknowledged, when it dies. Every event the bridge decided (its decision log) reaches the subscriber once the broker is
back; per-frame results are dropped and counted; the bridge's memory stays bounded; the cameras never notice."""
from __future__ import annotations

import json
import signal
import sqlite3
import time

import pytest
from daemon_helpers import wait_for
from gateway_helpers import metric
from test_mqtt_bridge import Broker, Subscriber, _bridge_config, _daemon, _start_bridge
from test_mqtt_events import Schedule

from edgeinfer.abi.vocabulary import DROPS

jsonschema = pytest.importorskip("jsonschema", reason="jsonschema (requirements/dev.txt)")
RULE = {"labels": ["90"], "threshold": 0.5, "min_frames": 1, "end_after_frames": 1}  # one frame starts, one ends
OUTAGE_S = 10.0
QUEUE = {"max_messages": 100, "max_bytes": 1 << 20}
RSS_SLACK = 32 << 20   # the queue's bound in bytes is 1 MiB: the bridge may grow by its queue and some allocator slack


def _logged_events(db: str) -> list[tuple[str, str]]:
    """(id, type) of every event in the bridge's decision log, in order (read-only, beside the writer: WAL)."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        rows = con.execute("SELECT record FROM decisions WHERE kind = 'event' ORDER BY id").fetchall()
    finally:
        con.close()
    return [(json.loads(r)["id"], json.loads(r)["type"]) for (r,) in rows]


def _received_events(sub: Subscriber) -> list[tuple[str, str]]:
    return [(m["id"], m["type"]) for m in (json.loads(p) for p, _r, _t in sub.of("edgeinfer/cam-a/event"))]


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS:")).split()[1]) << 10


def _served(daemon) -> tuple[float, float]:
    """cam-b's frames processed, and its frames dropped for any reason, so far."""
    processed = metric(daemon.metrics_url, "edgeinfer_frames_total", stream="cam-b", outcome="processed")
    dropped = sum(metric(daemon.metrics_url, "edgeinfer_frames_total", stream="cam-b", outcome=o) for o in DROPS)
    return processed, dropped


def test_events_reach_a_persistent_subscriber_across_a_broker_killed_for_10_s(tmp_path, children, bundles):
    daemon_config, daemon = _daemon(tmp_path, children, bundles, streams=("cam-b",))
    broker = Broker(children, tmp_path, persistence=True)
    config = _bridge_config(tmp_path, daemon_config, broker.port,
                            {"cam-a": {"results": False, "rules": {"pitched": RULE}}, "cam-b": {}}, queue=QUEUE)
    db = str(tmp_path / "decisions.db")
    sub = Subscriber(broker.port, session="test-outage-subscriber")
    cam = Schedule(daemon)
    try:
        bridge = _start_bridge(children, tmp_path, config)
        wait_for(lambda: metric(bridge.metrics_url, "edgeinfer_mqtt_broker_connected") == 1, 20, "connected")
        cam.show("0", 2)
        wait_for(lambda: metric(bridge.metrics_url, "edgeinfer_mqtt_results_read_total", stream="cam-a") >= 2, 20,
                 "the bridge reading cam-a")

        def cycle():
            cam.show("90", 1)   # new
            cam.show("0", 1)    # end

        # With the broker up: a few event pairs, each one at the subscriber.
        for _ in range(3):
            cycle()
        wait_for(lambda: len(_logged_events(db)) == 6 and set(_received_events(sub)) == set(_logged_events(db)), 20,
                 "the first events at the subscriber")
        time.sleep(1.5)  # the broker's autosave (every second) has the subscriber's session on disk
        rss_before = _rss(bridge.pid)

        # The broker stalls (SIGSTOP: the connection stays up, nothing is acknowledged), then is killed with events
        # in flight: those the client sends again on the next connection. Meanwhile the bridge goes on deciding and
        # queueing, and the cameras go on being served.
        served_down = _served(daemon)
        broker.proc.send_signal(signal.SIGSTOP)
        t_kill = time.monotonic()
        rss_max, cycles = 0, 0
        cycle()
        cycles += 1
        wait_for(lambda: metric(bridge.metrics_url, "edgeinfer_mqtt_inflight") >= 1, 10, "events in flight")
        in_flight = metric(bridge.metrics_url, "edgeinfer_mqtt_inflight")
        broker.stop()
        wait_for(lambda: metric(bridge.metrics_url, "edgeinfer_mqtt_broker_connected") == 0, 10, "disconnected")
        while time.monotonic() - t_kill < OUTAGE_S:
            cycle()
            cycles += 1
            rss_max = max(rss_max, _rss(bridge.pid))
            assert bridge.poll() is None, bridge.log.read_text()[-2000:]
            time.sleep(0.3)
        served_after = _served(daemon)
        down_s = time.monotonic() - t_kill
        depth = metric(bridge.metrics_url, "edgeinfer_mqtt_queue_messages")
        results_dropped = metric(bridge.metrics_url, "edgeinfer_mqtt_dropped_total", kind="result")
        broker.start()

        logged = _logged_events(db)
        assert len(logged) == 6 + 2 * cycles, (len(logged), cycles)   # the log has every event, broker or not
        wait_for(lambda: set(_received_events(sub)) >= set(logged), 30,
                 "every logged event at the subscriber after the broker returned")
        received = _received_events(sub)
        assert metric(bridge.metrics_url, "edgeinfer_mqtt_dropped_total", kind="event") == 0
        assert metric(bridge.metrics_url, "edgeinfer_mqtt_broker_connected") == 1
        # Per-frame results: dropped during the outage (the queue holds 100, cam-b made ~150), counted.
        assert results_dropped > 0 and depth <= QUEUE["max_messages"], (results_dropped, depth)
        assert metric(bridge.metrics_url, "edgeinfer_mqtt_dropped_total", kind="result", reason="queue_full") > 0
        # Memory: bounded by the queue, not by the length of the outage.
        assert rss_max - rss_before <= RSS_SLACK, (rss_before >> 20, rss_max >> 20)
        # The cameras never notice: cam-b dropped nothing (every frame it offered while the bridge could not
        # publish was processed or is still counted as such) and kept being served. Its rates up and down are
        # printed, not compared: a rate is a timing figure (bench/mqtt.py compares the lanes' p99).
        processed_down = served_after[0] - served_down[0]
        assert served_after[1] == served_down[1], (served_down, served_after)
        assert processed_down > 0, (processed_down, down_s)
        print(f"outage {down_s:.1f} s ({in_flight:.0f} in flight at the kill): {2 * cycles} events decided, all {len(set(logged))} events delivered "
              f"({len(received) - len(set(received))} again after the reconnection); results dropped "
              f"{results_dropped:.0f}; queue at the end {depth:.0f}; bridge RSS {rss_before >> 20} -> max "
              f"{rss_max >> 20} MiB; cam-b processed {processed_down:.0f} while it was down")
        assert len(set(logged)) == len(logged)  # nothing decided twice
    finally:
        cam.close()
        sub.close()
