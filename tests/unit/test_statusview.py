"""`edgeinferctl status`/`top`: rates over the time between the figures of two scrapes (the daemon's own uptime,
edgeinfer_uptime_seconds), never over the pause between them; a timed-out scrape said apart from a refused one.
The expositions are the daemon's real ones (DaemonCollector over a Snapshot), served by a real HTTP listener on
loopback; only the daemon's state is made up (a snapshot with known counters and a known interval)."""
from __future__ import annotations

import dataclasses
import http.server
import socket
import threading

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from edgeinfer.cli import statusview
from edgeinfer.telemetry.metrics import DaemonCollector, Health
from test_status_snapshot import _Lanes, _Models, _snapshot


def _exposition(uptime_s: float, processed: int, busy_s: float, frames: int) -> bytes:
    snap = _snapshot()
    snap.streams[0].stats.processed = processed
    lane = dict(snap.lanes["lane0"], busy_ns=int(busy_s * 1e9), frames=frames)
    snap = dataclasses.replace(snap, uptime_s=uptime_s, lanes={"lane0": lane})
    health = Health(_Lanes([]), _Models(), [], deadline_s=3.0, requires_stream=False)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DaemonCollector(lambda: snap, health))
    return generate_latest(registry)


class _Server:
    """Answers /metrics with the next of `bodies` (the last one again when they run out)."""

    def __init__(self, bodies: list[bytes], delay: threading.Event | None = None):
        bodies = list(bodies)

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                if delay is not None:
                    delay.wait(10)  # a busy daemon: the answer comes after the client gave up
                body = bodies.pop(0) if len(bodies) > 1 else bodies[0]
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/metrics"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


def _row(out: str, first: str) -> list[str]:
    return next(line.split() for line in out.splitlines() if line.startswith(first))


def test_status_divides_by_the_daemons_interval_not_its_pause(capsys):
    # 30 frames and 1 s of lane time in the daemon's 2.0 s between the scrapes (uptime 10.0 -> 12.0): 15 fps,
    # 50 % busy. Divided by status's 0.5 s pause (0.1), it said 60 fps and 200 %.
    srv = _Server([_exposition(10.0, 90, 2.0, 90), _exposition(12.0, 120, 3.0, 120)])
    try:
        assert statusview.status(statusview.Endpoint(srv.url), pause=0.05) == 0
    finally:
        srv.close()
    out = capsys.readouterr().out
    lane = _row(out, "lane0")
    assert (lane[2], lane[3]) == ("50.0", "15.0"), out
    assert _row(out, "cam0")[1] == "15.0", out


def test_interval_without_the_daemons_clock_is_the_scrapes_own():
    before = {"uptime_s": None, "at": 100.0}
    now = {"uptime_s": None, "at": 101.5}
    assert statusview.interval(now, before) == 1.5
    # The daemon restarted in between: its counters began again, no rate.
    assert statusview.interval({"uptime_s": 1.0, "at": 2.0}, {"uptime_s": 50.0, "at": 1.0}) != \
        statusview.interval({"uptime_s": 1.0, "at": 2.0}, {"uptime_s": 50.0, "at": 1.0})  # nan


def test_a_timed_out_scrape_says_busy_and_suggests_timeout():
    hold = threading.Event()
    srv = _Server([_exposition(1.0, 0, 0.0, 0)], delay=hold)
    try:
        with pytest.raises(OSError) as e:
            statusview.Endpoint(srv.url, timeout=0.3).scrape()
    finally:
        hold.set()
        srv.close()
    msg = str(e.value)
    assert "did not answer within 0.3 s" in msg and "--timeout" in msg and "running?" not in msg, msg


def test_a_refused_scrape_asks_whether_the_daemon_runs():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(OSError) as e:
        statusview.Endpoint(f"http://127.0.0.1:{port}/metrics", timeout=2.0).scrape()
    assert "is edgeinferd running?" in str(e.value) and "--timeout" not in str(e.value), e.value
