"""The decision log (bridges/decisionlog.py) without a bridge: append and query, commits batched by the fsync
interval (counted), rotation by age and by size, the read-only reader beside a writer, and its settings."""
from __future__ import annotations

import json
import os
import sqlite3

import pytest

from edgeinfer.bridges.decisionlog import DecisionLog, DecisionReader
from edgeinfer.bridges.mqttconfig import load_mqtt_config
from edgeinfer.support.yamlconf import ConfigError

T0 = 1_764_000_000_000_000_000  # 2025-11-24, ns


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self):
        self.ns = 1_000_000_000

    def __call__(self) -> int:
        return self.ns


def _event(stream="cam0", version="3", t=T0, kind="new", eid="e1", peak=0.9) -> dict:
    return {"id": eid, "type": kind, "stream": stream, "rule": "person", "label": "person", "peak_score": peak,
            "start_ns": t, "capture_ns": t, "model": {"name": "det", "version": version, "digest": None}}


def test_appends_within_an_interval_are_one_commit_and_the_interval_bounds_the_wait(tmp_path):
    mono = Clock()
    log = DecisionLog(str(tmp_path / "d.db"), fsync_interval_ms=200, monotonic=mono)
    for i in range(100):                      # 100 appends, 1 ms apart: all inside one 200 ms interval
        log.append_event(_event(eid=f"e{i}", t=T0 + i))
        mono.ns += 1_000_000
    assert log.commits == 0 and log.stats()["pending"] == 100
    assert 0.09 < log.due_in_s() <= 0.101
    mono.ns += 100_000_000                    # the oldest is now 200 ms old: the loop's flush commits them all
    assert log.flush()
    assert log.commits == 1 and log.committed_rows == 100
    assert log.max_commit_delay_ns == 200_000_000
    assert not log.flush() and log.commits == 1   # nothing waiting: no commit, no fsync
    log.append_event(_event(eid="last"))
    log.close()                               # close commits what waits
    assert log.commits == 2
    r = DecisionReader(str(tmp_path / "d.db"))
    assert len(list(r.query())) == 101


def test_a_zero_interval_commits_every_append(tmp_path):
    log = DecisionLog(str(tmp_path / "d.db"), fsync_interval_ms=0)
    for i in range(5):
        log.append_event(_event(eid=f"e{i}"))
    assert log.commits == 5
    log.close()


def test_queries_by_stream_time_version_and_kind(tmp_path):
    path = str(tmp_path / "d.db")
    log = DecisionLog(path, fsync_interval_ms=0)
    log.append_event(_event("cam0", "3", T0, eid="a"))
    log.append_event(_event("cam0", "4", T0 + 10, eid="b"))
    log.append_event(_event("cam1", "3", T0 + 20, eid="c"))
    log.append_result({"stream": "cam0", "capture_ns": T0 + 30, "frame_id": 7,
                       "model": {"name": "det", "version": "3"}, "items": []})
    r = DecisionReader(path)   # while the writer holds it open
    ids = lambda **kw: [d["record"].get("id", d["kind"]) for d in r.query(**kw)]  # noqa: E731
    assert ids(stream="cam0") == ["a", "b", "result"]
    assert ids(stream="cam0", model_version="3") == ["a", "result"]
    assert ids(stream="cam0", model_version="3", kind="event") == ["a"]
    assert ids(since_ns=T0 + 10) == ["b", "c", "result"]
    assert ids(since_ns=T0, until_ns=T0 + 20) == ["a", "b"]
    assert ids(model_version="9") == []
    one = next(r.query(stream="cam1"))
    assert one["model_name"] == "det" and one["model_version"] == "3" and one["time_ns"] == T0 + 20
    assert one["record"] == _event("cam1", "3", T0 + 20, eid="c")
    with pytest.raises(sqlite3.OperationalError):   # read-only: the reader cannot write
        r.db.execute("DELETE FROM decisions")
    plan = " ".join(str(row) for row in r.db.execute(
        "EXPLAIN QUERY PLAN SELECT * FROM decisions WHERE stream = 'cam0' AND time_ns >= 5"))
    assert "decisions_stream_time" in plan
    log.close()
    assert len(list(DecisionReader(path).query())) == 4   # closed (WAL checkpointed away): still readable
    with pytest.raises(ValueError, match="names its stream"):
        DecisionLog(str(tmp_path / "e.db")).append_event({"type": "new"})


def test_rotation_by_age_deletes_what_is_older_than_max_age(tmp_path):
    wall = Clock()
    wall.ns = T0
    path = str(tmp_path / "d.db")
    log = DecisionLog(path, fsync_interval_ms=0, max_age_days=1, clock=wall)
    for i in range(10):
        log.append_event(_event(eid=f"old{i}"))
    wall.ns += 86_400 * 10**9 // 2                # half a day later
    log.append_event(_event(eid="young"))
    wall.ns += 86_400 * 10**9 // 2 + 1             # the first ten are now a day and 1 ns old
    assert log.rotate() == {"age": 10, "size": 0}
    assert [d["record"]["id"] for d in DecisionReader(path).query()] == ["young"]
    assert log.rotated["age"] == 10
    log.close()


def test_rotation_by_size_keeps_the_file_under_max_bytes_and_drops_the_oldest(tmp_path):
    path = str(tmp_path / "d.db")
    max_bytes = 1 << 20
    log = DecisionLog(path, fsync_interval_ms=50, max_bytes=max_bytes)
    pad = "x" * 900
    n = 0
    for round_ in range(4):                      # ~4 MiB of decisions into a 1 MiB log
        for i in range(1000):
            log.append_event(dict(_event(eid=f"e{n}"), pad=pad))
            n += 1
        log.commit()                             # a commit that leaves the file over max_bytes rotates at once
        assert log.file_bytes() <= max_bytes, (round_, log.file_bytes())
        assert os.path.getsize(path) <= max_bytes
        assert log.rotated["size"] > 0
    log.close()
    assert os.path.getsize(path) <= max_bytes
    kept = [d["record"]["id"] for d in DecisionReader(path).query()]
    assert kept and kept[-1] == f"e{n - 1}"                  # the newest kept, the oldest gone
    assert kept == [f"e{i}" for i in range(n - len(kept), n)]
    assert len(kept) < n and log.rotated["size"] == n - len(kept)


def test_metrics_count_commits_and_appends(tmp_path):
    from prometheus_client import CollectorRegistry
    reg = CollectorRegistry()
    log = DecisionLog(str(tmp_path / "d.db"), fsync_interval_ms=0, registry=reg)
    log.append_event(_event())
    log.append_result({"stream": "cam0", "capture_ns": T0})
    assert reg.get_sample_value("edgeinfer_mqtt_decisions_commits_total") == 2
    assert reg.get_sample_value("edgeinfer_mqtt_decisions_appended_total", {"kind": "event"}) == 1
    assert reg.get_sample_value("edgeinfer_mqtt_decisions_bytes") > 0
    log.close()


def test_the_settings_have_defaults_and_refuse_unknown_keys_with_their_line(tmp_path):
    p = tmp_path / "mqtt.yaml"
    p.write_text("streams: {c: {}}\n")
    d = load_mqtt_config(str(p)).decisions
    assert d.enabled and not d.results and d.path == "/var/lib/edgeinfer-mqtt/decisions.db"
    assert d.fsync_interval_ms == 200 and d.max_bytes == 256 << 20 and d.max_age_days == 30
    p.write_text("streams: {c: {}}\ndecisions:\n  results: true\n  fsync_ms: 5\n")
    with pytest.raises(ConfigError) as e:
        load_mqtt_config(str(p))
    assert "mqtt.yaml:4: decisions.fsync_ms: unknown key" in str(e.value)
    p.write_text("streams: {c: {}}\ndecisions:\n  path: rel.db\n  max_bytes: 10\n")
    with pytest.raises(ConfigError) as e:
        load_mqtt_config(str(p))
    assert ":3: decisions.path" in str(e.value) and ":4: decisions.max_bytes" in str(e.value)


def test_every_row_holds_whole_json(tmp_path):
    path = str(tmp_path / "d.db")
    log = DecisionLog(path, fsync_interval_ms=0)
    log.append_event(_event())
    log.close()
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("PRAGMA auto_vacuum").fetchone()[0] == 2
    (rec,) = db.execute("SELECT record FROM decisions").fetchone()
    assert json.loads(rec)["id"] == "e1"


def test_the_bridge_logs_results_it_does_not_publish_and_commits_on_its_turn(tmp_path):
    import numpy as np
    from edgeinfer.abi import ring
    from edgeinfer.abi.vocabulary import KIND_CLASSIFICATION
    from edgeinfer.bridges.bridge import Bridge, BridgedStream
    p = tmp_path / "mqtt.yaml"
    db = str(tmp_path / "decisions.db")
    p.write_text(f"daemon_config: {tmp_path}/none.yaml\nmetrics: {{enabled: false}}\nstreams: {{c: {{results: false}}}}\n"
                 f"decisions: {{path: {db}, results: true, fsync_interval_ms: 0}}\n")
    cfg = load_mqtt_config(str(p))
    bridge = Bridge(cfg)
    bridge.decisions = DecisionLog(db, fsync_interval_ms=cfg.decisions.fsync_interval_ms,
                                   registry=bridge.metrics.registry)
    with ring.ResultWriter.create(64, records=16) as w:
        st = BridgedStream("c", ring.ResultReader.from_fd(w.fd, "c"), 0.0, False)
        bridge.streams = [st]
        for i in range(3):
            w.write(frame_id=i, capture_realtime_ns=T0 + i, kind=KIND_CLASSIFICATION,
                    payload=np.array([[1, 0.9]], np.float32).tobytes(), item_count=1, model_name="m",
                    model_version="5")
        bridge.turn()
        assert not bridge.publisher.depth                       # results: false: nothing published…
        got = list(DecisionReader(db).query(stream="c", model_version="5", kind="result"))
        assert [d["record"]["frame_id"] for d in got] == [0, 1, 2]   # …but every result logged
        assert got[0]["time_ns"] == T0 and got[0]["model_name"] == "m"
        assert bridge.metrics.registry.get_sample_value("edgeinfer_mqtt_decisions_commits_total") >= 1
        st.reader.close()
    bridge.streams = []
    bridge.close()
    assert bridge.decisions is None


def test_a_failing_disk_is_counted_and_the_decisions_wait_up_to_a_bound(tmp_path, monkeypatch):
    import edgeinfer.bridges.decisionlog as decisions
    monkeypatch.setattr(decisions, "MAX_PENDING", 50)
    path = str(tmp_path / "d.db")
    log = DecisionLog(path, fsync_interval_ms=0)
    log.append_event(_event(eid="before"))
    pages = log.db.execute("PRAGMA page_count").fetchone()[0]
    log.db.execute(f"PRAGMA max_page_count={pages}")           # the disk is full now
    for i in range(80):
        log.append_event(dict(_event(eid=f"e{i}"), pad="x" * 500))
    assert log.errors > 0 and log.stats()["pending"] == 50 and 0 < log.dropped <= 30
    log.db.execute("PRAGMA max_page_count=1000000")             # room again: the next flush writes what waited
    assert log.flush(force=True)
    log.close()
    ids = [d["record"]["id"] for d in DecisionReader(path).query()]
    assert ids[-50:] == [f"e{i}" for i in range(30, 80)]       # the newest waited and were written
    assert len(ids) == 1 + 80 - log.dropped and ids[0] == "before"


def test_edgeinferctl_decisions_reads_iso_and_relative_times():
    from edgeinfer.cli.commands.decisions import parse_time
    now = T0
    assert parse_time("10m", now) == now - 600 * 10**9
    assert parse_time("2h", now) == now - 7200 * 10**9 and parse_time("1.5d", now) == now - 129600 * 10**9
    assert parse_time("2026-11-25T20:00:00Z") == parse_time("2026-11-25T20:00:00") == 1_795_636_800 * 10**9
    assert parse_time("2026-11-25T21:00:00+01:00") == 1_795_636_800 * 10**9
    assert parse_time("2026-11-25T20:00:00.250Z") == 1_795_636_800 * 10**9 + 250_000_000
    with pytest.raises(ValueError, match="not a time"):
        parse_time("yesterday")


def test_pages_a_killed_rotation_left_free_are_given_back_at_the_next_start(tmp_path):
    path = str(tmp_path / "d.db")
    log = DecisionLog(path, fsync_interval_ms=60_000, max_bytes=4 << 20)
    for i in range(1500):
        log.append_event(dict(_event(eid=f"e{i}"), pad="x" * 900))
    log.commit()
    log.db.execute("DELETE FROM decisions WHERE id <= 1000")  # a rotation's DELETE, killed before its vacuum
    log.db.close()
    assert os.path.getsize(path) > 1 << 20
    log = DecisionLog(path, max_bytes=1 << 20)                 # live rows fit 1 MiB; the free pages did not
    assert log.file_bytes() <= 1 << 20 and log.rotated["size"] == 0
    log.close()
    assert os.path.getsize(path) <= 1 << 20
