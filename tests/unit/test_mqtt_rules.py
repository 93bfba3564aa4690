"""The MQTT bridge's events engine (bridges/rules.py) on synthetic decoded records: debounce, the end by frames,
by time and by silence, the box filters, label sets, the update policy, and that nothing fires twice; the rules'
schema in mqtt.yaml; event and state messages against their JSON Schemas; the bridge's handle() feeding it."""
from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import ROOT

pytest.importorskip("paho.mqtt.client", reason="paho-mqtt (requirements/runtime.txt)")

from edgeinfer.bridges.rules import END, NEW, UPDATE, Item, Observation, StreamRules, best_match
from edgeinfer.bridges.mqttconfig import Rule, load_mqtt_config
from edgeinfer.support.yamlconf import ConfigError

MODEL = {"name": "m", "version": "1", "digest": None}
T0 = 1_700_000_000_000_000_000
MS = 1_000_000


def obs(i: int, *items: Item, t_ms: float | None = None, ok: bool = True) -> Observation:
    """Frame i, captured at T0 + i × 100 ms unless t_ms says otherwise."""
    return Observation(i, T0 + int((i * 100 if t_ms is None else t_ms) * MS), MODEL, tuple(items), ok)


def cls(label: str, score: float = 0.9) -> Item:
    return Item(label, score, int(label) // 90 if label.isdigit() else 0)


def run(engine: StreamRules, frames) -> list[dict]:
    out = []
    for o in frames:
        out += engine.feed(o)
    return out


def test_debounce_starts_after_min_frames_and_ends_after_frames_once():
    e = StreamRules("cam", "n", {"tilted": Rule(labels=["90", "180", "270"], threshold=0.5, min_frames=3,
                                                end_after_frames=2)})
    # 0 0 | 90 90 0 (a run of two: debounced) | 90 90 90 90 0 90 0 0 0 0 | 180 ×3
    labels = ["0", "0", "90", "90", "0", "90", "90", "90", "90", "0", "90", "0", "0", "0", "0", "180", "180", "180"]
    evs = run(e, [obs(i, cls(lab)) for i, lab in enumerate(labels)])
    assert [(ev["type"], ev["frame_id"]) for ev in evs] == [(NEW, 7), (END, 12), (NEW, 17)]
    new, end, again = evs
    assert new["start_frame_id"] == 5 and new["start_ns"] == T0 + 500 * MS and new["end_ns"] is None
    assert end["id"] == new["id"] == f"cam-tilted-5-{T0 + 500 * MS}" and again["id"] != new["id"]
    assert end["end_frame_id"] == 10 and end["end_ns"] == T0 + 1000 * MS and end["ended_by"] == "frames"
    assert end["frames"] == 5 and end["label"] == "90" and end["model"] == MODEL and end["rule"] == "tilted"
    assert again["start_frame_id"] == 15 and again["label"] == "180"
    st = e.state()["rules"]["tilted"]
    assert st["active"] and st["event"]["id"] == again["id"]


def test_end_after_ms_on_capture_time_and_by_silence():
    e = StreamRules("cam", "n", {"r": Rule(labels=["x"], min_frames=1, end_after_ms=1000)})
    frames = [obs(0, cls("x")), obs(1, cls("y"), t_ms=500), obs(2, cls("y"), t_ms=999),
              obs(3, cls("y"), t_ms=1000), obs(4, cls("y"), t_ms=1100)]
    evs = run(e, frames)
    assert [(ev["type"], ev["frame_id"], ev["ended_by"]) for ev in evs] == [(NEW, 0, None), (END, 3, "time")]
    assert evs[1]["end_frame_id"] == 0 and evs[1]["frames"] == 1
    # Silence: no record at all; expire() ends it once the wall clock is 1 s past the bound (not before).
    assert [ev["type"] for ev in e.feed(obs(10, cls("x"), t_ms=5000))] == [NEW]
    assert e.expire(T0 + 6500 * MS) == []
    (end,) = e.expire(T0 + 7000 * MS)
    assert end["type"] == END and end["ended_by"] == "silence" and end["end_frame_id"] == 10
    assert e.expire(T0 + 9000 * MS) == [] and not e.state()["rules"]["r"]["active"]
    # An end_after_frames rule waits for frames.
    f = StreamRules("cam", "n", {"r": Rule(min_frames=1, end_after_frames=1)})
    assert len(f.feed(obs(0, cls("x")))) == 1 and f.expire(T0 + 10**12) == []


def test_label_sets_threshold_and_failed_records():
    rule = Rule(labels=["90", "270"], threshold=0.6, end_after_frames=1)
    assert best_match(rule, [cls("90", 0.59)]) is None
    assert best_match(rule, [cls("180", 0.99)]) is None
    assert best_match(rule, [cls("0", 0.9), cls("270", 0.6), cls("90", 0.7)]).label == "90"
    assert best_match(Rule(end_after_frames=1), [cls("anything", 0.5)]) is not None  # no labels: any
    assert best_match(Rule(labels=["3"], end_after_frames=1), [Item(None, 0.9, 3)]) is not None  # by class id
    e = StreamRules("cam", "n", {"r": Rule(labels=["a"], min_frames=2, end_after_frames=1)})
    # A failed record is neither a match nor a miss: the run of two goes on across it.
    assert run(e, [obs(0, cls("a")), obs(1, ok=False), obs(2, cls("a"))])[0]["start_frame_id"] == 0


def test_detection_area_and_region_in_frame_pixels():
    rule = Rule(labels=["person"], threshold=0.5, min_area=400, region=(100, 100, 300, 300), end_after_frames=1)

    def det(box, score=0.9, label="person"):
        return Item(label, score, 0, box)
    assert best_match(rule, [det((190, 190, 210, 210))]) is not None          # 20×20 = 400, centre (200, 200)
    assert best_match(rule, [det((190, 190, 209, 210))]) is None              # 19×20 < 400
    assert best_match(rule, [det((290, 290, 330, 330))]) is None              # centre (310, 310): outside
    assert best_match(rule, [det((280, 280, 320, 320))]) is not None          # centre on the edge: inside
    assert best_match(rule, [det((190, 190, 210, 210), label="car")]) is None
    assert best_match(rule, [cls("person")]) is None                          # a box condition needs a box
    e = StreamRules("cam", "n", {"zone": rule})
    evs = run(e, [obs(0, det((0, 0, 50, 50))), obs(1, det((150, 150, 250, 250), 0.7)), obs(2, det((0, 0, 9, 9)))])
    assert [(ev["type"], ev["frame_id"], ev["peak_score"]) for ev in evs] == [(NEW, 1, 0.7), (END, 2, 0.7)]


def test_update_when_the_peak_rises_by_005_at_most_once_a_second():
    e = StreamRules("cam", "n", {"r": Rule(labels=["a"], min_frames=1, end_after_frames=3)})
    scores = [0.6, 0.64, 0.66, 0.70, 0.90, 0.95, 0.99, 0.5, 0.99]
    times = [0, 100, 200, 1100, 1200, 2300, 2400, 2500, 3600]
    evs = run(e, [obs(i, cls("a", s), t_ms=t) for i, (s, t) in enumerate(zip(scores, times))])
    # 0.66 is under 0.6 + 0.05 (well, 0.06 but within the second); at 1100 ms: 0.70 ≥ 0.65 → update;
    # 0.90 at 1200 is within a second of it; 0.95 at 2300 → update; 0.99 at 3600 → 0.99 ≥ 1.0? no.
    assert [(ev["type"], ev["frame_id"]) for ev in evs] == [(NEW, 0), (UPDATE, 3), (UPDATE, 5)]
    assert [ev["peak_score"] for ev in evs] == pytest.approx([0.6, 0.7, 0.95])
    assert len({ev["id"] for ev in evs}) == 1


def test_nothing_fires_twice_in_a_long_episode():
    e = StreamRules("cam", "n", {"r": Rule(labels=["a"], min_frames=2, end_after_frames=2),
                                 "s": Rule(labels=["a", "b"], min_frames=1, end_after_ms=300)})
    pattern = (["a"] * 50 + ["b"]) * 4 + ["c"] * 10
    evs = run(e, [obs(i, cls(lab, 0.8)) for i, lab in enumerate(pattern)])
    by = {(ev["rule"], ev["type"]) for ev in evs}
    assert [ev["type"] for ev in evs if ev["rule"] == "r"] == [NEW, END]   # one "b" is not two misses
    assert [ev["type"] for ev in evs if ev["rule"] == "s"] == [NEW, END]
    assert by == {("r", NEW), ("r", END), ("s", NEW), ("s", END)}
    assert e.feed(obs(999, cls("c"))) == [] and e.expire(T0 + 10**13) == []


def _write(tmp_path, text: str) -> str:
    p = tmp_path / "mqtt.yaml"
    p.write_text(text)
    return str(p)


def test_rules_in_the_file_are_strict_with_their_line(tmp_path):
    cfg = load_mqtt_config(_write(tmp_path, "streams:\n  cam0:\n    rules:\n      tilted:\n"
                                  "        labels: ['90', '180', '270']\n        threshold: 0.7\n"
                                  "        min_frames: 3\n        end_after_ms: 1000\n"))
    r = cfg.streams["cam0"].rules["tilted"]
    assert r.labels == ["90", "180", "270"] and r.end_after_ms == 1000 and r.end_after_frames is None
    assert cfg.qos.event == 1 and cfg.qos.state == 1
    bad = {"threshold: 1.5": ":5: streams.cam0.rules.r.threshold", "min_frames: 0": ":5: streams.cam0.rules.r.min_frames",
           "end_after_frames: 2": ":4: streams.cam0.rules.r", "thresold: 0.5": ":5: streams.cam0.rules.r.thresold",
           "region: [10, 10, 5, 20]": ":5: streams.cam0.rules.r.region"}
    for line, where in bad.items():
        with pytest.raises(ConfigError) as e:
            load_mqtt_config(_write(tmp_path, "streams:\n  cam0:\n    rules:\n      r:\n"
                                    f"        {line}\n        end_after_ms: 500\n"))
        assert where in str(e.value), (line, str(e.value))
    with pytest.raises(ConfigError) as e:  # neither end
        load_mqtt_config(_write(tmp_path, "streams:\n  cam0:\n    rules:\n      r: {min_frames: 2}\n"))
    assert "exactly one of end_after_frames and end_after_ms" in str(e.value)
    with pytest.raises(ConfigError):
        load_mqtt_config(_write(tmp_path, "streams:\n  cam0:\n    rules:\n      'a/b': {end_after_ms: 5}\n"))


def test_messages_follow_their_schemas_and_handle_feeds_the_rules(tmp_path):
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema (requirements/dev.txt)")
    from edgeinfer.abi import ring
    from edgeinfer.abi.vocabulary import KIND_CLASSIFICATION
    from edgeinfer.bridges.bridge import Bridge, BridgedStream
    from edgeinfer.bridges.messages import finish
    from edgeinfer.bridges.rules import StreamRules
    ev_schema = json.loads((ROOT / "docs" / "schemas" / "mqtt-event.schema.json").read_text())
    st_schema = json.loads((ROOT / "docs" / "schemas" / "mqtt-state.schema.json").read_text())
    cfg = load_mqtt_config(_write(tmp_path, f"daemon_config: {tmp_path}/none.yaml\nmetrics: {{enabled: false}}\n"
                                  "queue: {max_messages: 4, max_bytes: 1048576}\n"
                                  "streams: {c: {max_rate_hz: 0.001, rules: {one: {labels: ['1'], min_frames: 2, "
                                  "end_after_frames: 1}}}}\n"))
    bridge = Bridge(cfg)
    with ring.ResultWriter.create(64, records=64) as w:
        st = BridgedStream("c", ring.ResultReader.from_fd(w.fd, "c"), 0.001, True,
                         StreamRules("c", "node", cfg.streams["c"].rules))
        bridge.streams = [st]
        bridge._offer_state(st)
        for i, cid in enumerate([1, 1, 1, 0, 1, 1, 0, 0, 0, 0]):
            w.write(frame_id=i, capture_realtime_ns=T0 + i * 100 * MS, kind=KIND_CLASSIFICATION,
                    payload=np.array([[cid, 0.9]], np.float32).tobytes(), item_count=1, model_name="m",
                    model_version="1")
        bridge.turn()
        q = bridge.publisher._queues
        # The queue holds 4: the one result (rate limit) and the older states went first; the 4 events stay.
        events = [o.message for o in q["event"]]
        assert [(m["type"], m["frame_id"]) for m in events] == [(NEW, 1), (END, 3), (NEW, 5), (END, 6)]
        assert not q["result"] and not q["state"]

        def sample(name, **labels):
            return bridge.metrics.registry.get_sample_value(name, labels) or 0
        assert sample("edgeinfer_mqtt_events_total", stream="c", rule="one", type="new") == 2
        assert sample("edgeinfer_mqtt_events_total", stream="c", rule="one", type="end") == 2
        assert sample("edgeinfer_mqtt_dropped_total", kind="result", reason="queue_full") == 1
        assert sample("edgeinfer_mqtt_dropped_total", kind="state", reason="queue_full") == 5
        assert sample("edgeinfer_mqtt_dropped_total", kind="event", reason="queue_full") == 0
        assert all(o.qos == 1 and o.topic == "edgeinfer/c/event" and not o.retain for o in q["event"])
        for m in events:
            jsonschema.validate(json.loads(finish(dict(m), T0 + 10**9)), ev_schema)
        state = st.rules.state()
        assert state["rules"]["one"]["active"] is False and state["rules"]["one"]["event"]["type"] == END
        jsonschema.validate(json.loads(finish(state, T0 + 10**9)), st_schema)
        st.reader.close()
    bridge.streams = []
    bridge.close()
