"""Status and /metrics are built from one typed snapshot (telemetry/snapshot.py), never from the daemon object:
the same snapshot gives `edgeinferctl status`'s dict, systemd's STATUS= line and the Prometheus exposition."""
from __future__ import annotations

import dataclasses

from prometheus_client import CollectorRegistry, generate_latest

from edgeinfer.abi import ring
from edgeinfer.control.status import status, status_line
from edgeinfer.lanes.stats import StreamStats
from edgeinfer.telemetry.metrics import DaemonCollector, Health
from edgeinfer.telemetry.snapshot import (FdCloserView, LoopView, ModelView, RegistryView, Snapshot,
                                          StreamView)


def _snapshot() -> Snapshot:
    now = ring.monotonic_ns()
    cam = StreamStats("cam0")
    cam.processed = 90
    cam.overload = 10
    for i in range(90):
        cam.record(e2e=(4 + i % 3) * 1_000_000, infer=2_000_000, age=1_000_000, done=now - i * 1_000_000)
    idle = StreamStats("cam1")
    lane = {"state": "ready", "pid": 42, "cpus": [1], "models": ["orient"], "restarts": 1, "progress": 7,
            "busy_ns": 2_000_000_000, "frames": 90, "realtime": True, "tid": 43, "runs_cancelled": 0,
            "sessions": 1, "session_evictions": 0, "batches": 0, "batch_copies": 0, "doorbell_mutes": 0,
            "wakeups": 91, "gc_ns": 1_500_000, "gc_longest_ns": 400_000, "gc_frozen": 45_000,
            "last_error": None}
    return Snapshot(
        now_ns=now, uptime_s=10.0,
        streams=(StreamView("cam0", "orient", cam, True, "uid 1001 (cam)", ("rgb24", 224, 224), 2, 1),
                 StreamView("cam1", "orient", idle, False, None, None, 0, 0)),
        models=(ModelView("orient", "/b/orient", 1, ("orientation", "1.2.0", "ab" * 32), 3,
                          {"signature": 1, "rollback": 0, "load": 0}, "bad signature", None),),
        lanes={"lane0": lane},
        registry=RegistryView(3, 1, "bad signature", 0, None, None),
        refusals={("cam0", "producer", "busy"): 2, ("(unknown)", "reader", "unknown_stream"): 1},
        loop=LoopView(0.02, 1, 1.5),
        fds=FdCloserView(0, 0, 64, 0, 0),
        restored=1, chore_errors=0, metrics_address="127.0.0.1:9464")


def test_status_dict_and_line_come_from_the_snapshot():
    st = status(_snapshot())
    assert st["models"]["orient"]["version"] == "1.2.0"
    assert st["models"]["orient"]["streams"] == ["cam0", "cam1"]
    assert st["lanes"]["lane0"]["busy_pct"] == 20.0  # 2 s busy in 10 s
    cam0 = st["streams"]["cam0"]
    assert (cam0["processed"], cam0["overload"], cam0["offered"]) == (90, 10, 100)
    assert cam0["geometry"] == ["rgb24", 224, 224] and cam0["producer"] == "uid 1001 (cam)"
    assert cam0["refused"] == {"producer/busy": 2}
    assert st["refusals"]["(unknown)/reader/unknown_stream"] == 1
    assert st["restored_producers"] == 1 and st["realtime_active"] and st["loop_alive"]
    line = status_line(st)
    assert line.startswith("orient: orientation 1.2.0; 1/1 lanes ready; cam0:")
    assert "10 dropped" in line and "cam1: waiting for its producer" in line and "last reload refused" in line


class _Lanes:
    """What Health uses of the Supervisor (stuck()); a stand-in: the real one needs lane processes."""

    def __init__(self, stuck):
        self._stuck = stuck

    def stuck(self, deadline_s):
        return list(self._stuck)


class _Models:
    served = {}


def test_metrics_come_from_the_snapshot():
    snap = _snapshot()
    gw = StreamView("gw-0", "orient", StreamStats("gw-0"), True, "uid 1002 (edgeinfer-gw)", ("rgb24", 224, 224), 1, 1,
                    pool="gw")
    snap = dataclasses.replace(snap, streams=(*snap.streams, gw))
    health = Health(_Lanes([]), _Models(), [], deadline_s=3.0, requires_stream=False)
    health.model_ready = True
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DaemonCollector(lambda: snap, health))
    text = generate_latest(registry).decode()
    assert 'edgeinfer_frames_total{model="orient",outcome="processed",stream="cam0"} 90.0' in text
    assert 'edgeinfer_stream_connected{model="orient",stream="cam1"} 0.0' in text
    assert 'edgeinfer_stream_readers{model="orient",stream="cam0"} 1.0' in text
    assert 'edgeinfer_lane_busy_seconds_total{lane="lane0"} 2.0' in text
    assert 'edgeinfer_lane_gc_seconds_total{lane="lane0"} 0.0015' in text
    assert 'edgeinfer_lane_gc_longest_seconds{lane="lane0"} 0.0004' in text
    assert 'edgeinfer_model_info{model="orient",name="orientation",sha256="' + "ab" * 32 + '",version="1.2.0"} 1.0' \
        in text
    assert 'edgeinfer_model_reload_failures_total{model="orient",reason="signature"} 1.0' in text
    assert 'edgeinfer_ingress_refusals_total{reason="busy",role="producer",stream="cam0"} 2.0' in text
    assert "edgeinfer_control_plane_stalls_total 1.0" in text
    assert "edgeinfer_producers_restored_total 1.0" in text
    assert "edgeinfer_healthy 1.0" in text
    # A front's pool stream is marked (the p99 alert leaves it out), a camera's is not.
    assert 'edgeinfer_stream_pool{model="orient",pool="gw",stream="gw-0"} 1.0' in text
    assert not [line for line in text.splitlines() if line.startswith("edgeinfer_stream_pool{") and "cam" in line]
    assert "edgeinfer_uptime_seconds 10.0" in text
    health.lanes = _Lanes(["lane0"])  # a stuck lane: unhealthy, whatever the snapshot says
    assert "edgeinfer_healthy 0.0" in generate_latest(registry).decode()
