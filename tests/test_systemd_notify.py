"""sd_notify and the honest watchdog, against the real daemon.

The notify socket here is a datagram socket this test owns, standing in for
systemd's (PID 1 is not systemd on this machine). What systemd does with the
messages (restart on WATCHDOG=trigger, the unit's state) is the job of the
system tests in a booted systemd (issue #5)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from daemon_helpers import edgeinferd_args, sign_copy, start_daemon, stop_daemon, write_config
from edgeinfer.systemd import Notifier, NotifyError

CTL = [sys.executable, "-m", "edgeinfer.cli"]


class FakeSystemd:
    """Collects notify datagrams with the time they arrived."""

    def __init__(self, path):
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.1)
        self.messages: list[tuple[float, str]] = []

    def pump(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                self.messages.append((time.monotonic(), self.sock.recv(4096).decode()))
            except socket.timeout:
                pass

    def wait_for(self, field: str, timeout: float) -> float:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for t, m in self.messages:
                if field in m.split("\n"):
                    return t
            self.pump(0.1)
        pytest.fail(f"no {field!r} within {timeout}s; got {[m for _, m in self.messages][-8:]}")

    def times(self, field: str, since: float = 0.0) -> list[float]:
        return [t for t, m in self.messages if field in m.split("\n") and t >= since]


@pytest.fixture
def stream(shm_name):
    return shm_name.removeprefix("edgeinfer.")


def test_notify_without_socket_is_a_no_op_and_a_bad_socket_is_an_error(tmp_path):
    n = Notifier({})
    assert not n.enabled and n.watchdog_s == 0
    n.send("READY=1")  # nothing to send to, nothing raised
    with pytest.raises(NotifyError, match="NOTIFY_SOCKET=.*cannot connect"):
        Notifier({"NOTIFY_SOCKET": str(tmp_path / "absent")})


def test_ready_status_honest_watchdog_reload_and_stopping(children, tmp_path, stream, bundles):
    sd = FakeSystemd(tmp_path / "notify")
    cfg = write_config(tmp_path, bundles("cls-tiny"), [{"name": stream}],
                       runtime={"fault_injection": "true", "status_interval_s": 0.5})
    env = {**os.environ, "NOTIFY_SOCKET": sd.path, "WATCHDOG_USEC": "1000000"}
    proc = children.spawn(edgeinferd_args(cfg), env=env)
    started = time.monotonic()
    ready = sd.wait_for("READY=1", 60)
    assert ready > started
    feed = children.spawn([*CTL, "feed", "--synthetic", "--stream", stream, "--width", "96", "--height", "48",
                           "--fps", "30"])
    sd.pump(3.0)
    pings = sd.times("WATCHDOG=1", since=ready)
    assert len(pings) >= 4, "about two pings a second with WATCHDOG_USEC=1s"
    status = [m for _, m in sd.messages if m.startswith("STATUS=") and stream in m]
    assert status and "fps" in status[-1] and "ppocr-cls 2.0" in status[-1]

    stall_at = time.monotonic()
    proc.send_signal(signal.SIGUSR1)  # test-only hook: the loop makes no progress for 3 s
    sd.pump(2.5)
    # The watchdog may only be fed while the loop is progressing. The stall begins at
    # the loop's next iteration (≤ 0.2 s after the signal) and one ping may still
    # report progress made before it (≤ 0.5 s later); after that, silence, then
    # WATCHDOG=trigger once a whole interval (1 s) passed without progress.
    during = sd.times("WATCHDOG=1", since=stall_at + 0.8)
    assert during == [], f"pinged while the loop was stuck: {during}"
    trigger = sd.times("WATCHDOG=trigger", since=stall_at)
    assert trigger and 0.8 < trigger[0] - stall_at < 2.5

    proc.send_signal(signal.SIGHUP)  # reload: RELOADING=1 … READY=1
    t_hup = time.monotonic()
    sd.pump(4.0)
    msgs = [m for t, m in sd.messages if t >= t_hup]
    reloading = next(i for i, m in enumerate(msgs) if "RELOADING=1" in m.split("\n"))
    assert "MONOTONIC_USEC=" in msgs[reloading]
    assert any("READY=1" in m.split("\n") for m in msgs[reloading + 1:])
    feed.terminate()
    feed.wait(10)
    t_stop = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0
    sd.pump(0.3)
    assert sd.times("STOPPING=1", since=t_stop)


def test_a_run_past_its_deadline_is_cancelled_and_the_loop_lives_on(children, tmp_path, stream, bundles):
    """The detector takes ~100 ms here; with a 10 ms run deadline every run is
    terminated (RunOptions.terminate), counted as an error, and the loop keeps
    going: the watchdog keeps being fed, no WATCHDOG=trigger."""
    sd = FakeSystemd(tmp_path / "notify")
    cfg = write_config(tmp_path, bundles("detector"), [{"name": stream, "width": 416, "height": 416}],
                       runtime={"run_deadline_ms": 10})
    stats = str(tmp_path / "stats.json")
    env = {**os.environ, "NOTIFY_SOCKET": sd.path, "WATCHDOG_USEC": "2000000"}
    proc = children.spawn(edgeinferd_args(cfg, "--stats-file", stats), env=env)
    sd.wait_for("READY=1", 60)
    feed = children.spawn([*CTL, "feed", "--synthetic", "--stream", stream, "--width", "416", "--height", "416",
                           "--fps", "5"])
    sd.pump(5.0)
    feed.terminate()
    feed.wait(10)
    import json
    s = json.load(open(stats))["streams"][stream]
    # The main thread looks every 50 ms, so a run may occasionally finish before it is cancelled.
    assert s["error"] >= 3 and s["error"] > 3 * s["processed"]
    assert sd.times("WATCHDOG=1") and not sd.times("WATCHDOG=trigger")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0
