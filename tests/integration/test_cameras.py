"""Cameras as services (issue 14, item 1), outside systemd: `edgeinferctl camera add|list|test|run`.
`camera run` speaks the notify protocol to a socket standing in for systemd's (the booted-systemd test,
tests/system/inside.sh, runs the real unit): READY once the first frame is published, WATCHDOG only while
frames flow, STATUS with the reason of a stall."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from test_ffmpeg_feed import SilentServer
from test_systemd_notify import FakeSystemd

CTL = [sys.executable, "-m", "edgeinfer.cli"]


def ctl(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*CTL, *args], capture_output=True, text=True, timeout=timeout)


def add(tmp_path, name: str, *args: str) -> subprocess.CompletedProcess:
    return ctl("camera", "add", name, "--no-user", "--dir", str(tmp_path / "cameras"), *args)


def test_add_writes_a_checked_camera_file_and_says_what_to_do_next(tmp_path):
    r = add(tmp_path, "gate1", "--source", "synthetic", "--width", "64", "--height", "48", "--fps", "10",
            "--socket", str(tmp_path / "ingress.sock"))
    assert r.returncode == 0, r.stderr
    assert "producer: {user: edgeinfer-cam-gate1}" in r.stdout
    assert "systemctl enable --now edgeinfer-camera@gate1" in r.stdout
    text = (tmp_path / "cameras" / "gate1.yaml").read_text()
    assert "source: synthetic" in text and "width: 64" in text
    # Refused before anything is written, with the line of the bad key.
    r = add(tmp_path, "gate2", "--source", "synthetic", "--width", "0")
    assert r.returncode == 1 and "gate2.yaml:2: width: Input should be greater than or equal to 1" in r.stderr, \
        r.stderr
    assert not (tmp_path / "cameras" / "gate2.yaml").exists()
    r = add(tmp_path, "../etc", "--source", "synthetic")
    assert r.returncode == 1 and "camera name '../etc'" in r.stderr
    r = ctl("camera", "list", "--dir", str(tmp_path / "cameras"))
    assert r.returncode == 0 and r.stdout.split()[:1] == ["gate1"] and "synthetic" in r.stdout, r.stdout


def test_run_is_ready_at_the_first_frame_and_feeds_the_watchdog_while_frames_flow(tmp_path, children):
    assert add(tmp_path, "gate1", "--source", "synthetic", "--width", "64", "--height", "48", "--fps", "20",
               "--socket", str(tmp_path / "ingress.sock")).returncode == 0
    sd = FakeSystemd(tmp_path / "notify.sock")
    try:
        env = {**os.environ, "NOTIFY_SOCKET": sd.path, "WATCHDOG_USEC": "1000000"}
        proc = children.spawn([*CTL, "camera", "run", "gate1", "--dir", str(tmp_path / "cameras")], env=env)
        ready = sd.wait_for("READY=1", 30)
        sd.pump(3.0)
        pings = sd.times("WATCHDOG=1", since=ready)
        assert len(pings) >= 4, pings  # every half interval (0.5 s) while frames flow
        assert any("frames flow to stream gate1" in m for _, m in sd.messages)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
        assert "camera gate1: published" in proc.stderr.read()
    finally:
        sd.close()


@pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="ffmpeg is not installed (make test installs it)")
def test_a_stalled_source_is_never_ready_and_never_feeds_the_watchdog(tmp_path, children):
    """systemd then fails the start (TimeoutStartSec) or restarts the unit (WatchdogSec): the unit file's
    choice. Meanwhile the producer reconnects with backoff and STATUS says why."""
    silent = SilentServer()
    try:
        assert add(tmp_path, "door", "--source", silent.url, "--connect-timeout", "1",
                   "--socket", str(tmp_path / "ingress.sock")).returncode == 0
        sd = FakeSystemd(tmp_path / "notify.sock")
        try:
            env = {**os.environ, "NOTIFY_SOCKET": sd.path, "WATCHDOG_USEC": "1000000"}
            proc = children.spawn([*CTL, "camera", "run", "door", "--dir", str(tmp_path / "cameras")], env=env)
            sd.pump(4.0)
            assert not sd.times("READY=1") and not sd.times("WATCHDOG=1"), sd.messages
            status = [m for _, m in sd.messages if m.startswith("STATUS=")]
            assert any("waited 1 s for the first frame" in m and "reconnecting" in m for m in status), status
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(5) == 0
        finally:
            sd.close()
    finally:
        silent.close()


@pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="ffmpeg is not installed (make test installs it)")
def test_test_shows_the_source_geometry_and_the_rate(tmp_path):
    video = tmp_path / "v.mkv"
    subprocess.run(["ffmpeg", "-loglevel", "error", "-f", "lavfi", "-i", "testsrc=size=320x240:rate=25",
                    "-frames:v", "60", str(video)], check=True, timeout=60)
    assert add(tmp_path, "door", "--source", str(video), "--width", "160", "--height", "120").returncode == 0
    r = ctl("camera", "test", "door", "--dir", str(tmp_path / "cameras"), "--frames", "30")
    assert r.returncode == 0, r.stderr
    assert f"source {video}: h264 320x240 at 25/1 fps" in r.stdout, r.stdout
    # The decoder's own YUV, BT.601 limited (the source says no colour space and is under 720 lines).
    assert "frames 160x120 i420; 30 in" in r.stdout and "(decode rate)" in r.stdout, r.stdout
    assert add(tmp_path, "gone", "--source", str(tmp_path / "missing.mkv")).returncode == 0
    r = ctl("camera", "test", "gone", "--dir", str(tmp_path / "cameras"))
    assert r.returncode == 1 and "no such file" in r.stderr, r.stderr


def test_camera_names_are_checked_as_useradd_checks_their_users():
    """The name check is what useradd accepts for the camera's user edgeinfer-cam-NAME (at most 32 characters on
    Debian): 18 characters pass, 19 are refused by the check itself (not later by useradd), with the limit said.
    As root where group edgeinfer exists (the package makes it; the booted container's camera_add check does this
    always), useradd is asked too: the longest name's user is made (and removed)."""
    from edgeinfer.cameras import units as cameras
    longest = "Gate_1-" + "x" * (cameras.NAME_MAX - 7)
    assert cameras.check_name(longest) == longest and len(cameras.user_of(longest)) == 32
    for bad in (longest + "y", "-gate", "../etc", "gate.1", ""):
        with pytest.raises(ValueError, match=rf"camera name .*at most {cameras.NAME_MAX}, .*at most 32 characters"):
            cameras.check_name(bad)
    r = ctl("camera", "add", longest + "y", "--source", "synthetic", "--no-user", "--dir", "/nonexistent")
    assert r.returncode == 1 and f"at most {cameras.NAME_MAX}" in r.stderr and "Traceback" not in r.stderr, r.stderr
    import grp
    if os.geteuid() == 0 and shutil.which("useradd") and "edgeinfer" in {g.gr_name for g in grp.getgrall()}:
        user = cameras.user_of(longest)
        try:
            cameras.ensure_user(longest)
            import pwd
            assert pwd.getpwnam(user).pw_shell == "/usr/sbin/nologin"
        finally:
            subprocess.run(["userdel", user], capture_output=True, timeout=30)


def test_a_camera_added_is_served_after_the_restart_camera_add_asks_for(bundles, children, tmp_path):
    """`camera add` says: add the stream, restart the daemon. A reload (SIGHUP) adds no stream: it says so in the
    log, naming the stream, and the camera is refused with the same advice; after the restart it is served."""
    from daemon_helpers import poll, start_daemon, stop_daemon, write_config
    config = write_config(tmp_path, bundles("cls-tiny"), [{"name": "cam0"}])
    log = str(tmp_path / "daemon.log")
    proc = start_daemon(children, config, log_file=log)
    r = add(tmp_path, "gate", "--source", "synthetic", "--width", "96", "--height", "48")
    assert r.returncode == 0, r.stderr
    assert "systemctl restart edgeinferd" in r.stdout and "reload edgeinferd" not in r.stdout, r.stdout
    assert r.stdout.index("systemctl restart edgeinferd") < r.stdout.index("systemctl enable --now "
                                                                          "edgeinfer-camera@gate"), r.stdout
    write_config(tmp_path, bundles("cls-tiny"), [{"name": "cam0"}, {"name": "gate"}])  # the operator's edit
    proc.send_signal(signal.SIGHUP)
    said = poll(lambda: [x for x in open(log).read().splitlines() if "streams added: gate" in x], 30)
    assert said and "systemctl restart edgeinferd" in said[0] and config in said[0], open(log).read()[-2000:]
    feed = [*CTL, "feed", "--synthetic", "--stream", "gate", "--width", "96", "--height", "48", "--fps", "20",
            "--frames", "40", "--socket", proc.ingress, "--wait", "10"]
    r = subprocess.run(feed, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "no stream 'gate' is configured here" in r.stderr and \
        "systemctl restart edgeinferd" in r.stderr, r.stderr
    assert stop_daemon(proc) == 0
    proc = start_daemon(children, config)  # the restart
    r = subprocess.run(feed, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "published 40 frames" in r.stderr, r.stderr
    got = ctl("results", "gate", "--from-oldest", "--count", "3", "--timeout", "30", "--socket", proc.results,
              "--no-labels")
    assert got.returncode == 0 and len(got.stdout.splitlines()) == 3, got.stderr
    assert stop_daemon(proc) == 0


@pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="ffmpeg is not installed (make test installs it)")
def test_a_file_camera_with_loop_plays_its_file_again_and_never_exits(tmp_path, children):
    """`loop: true` (camera add --loop): a 20-frame file gives frame 61 and more (its frames are numbered as the
    source sent them), and the camera is still running; without it the camera ends at the file's end (exit 0,
    systemd's Restart= would start it again). loop is refused for a source that is not a file."""
    from ring_helpers import MiniIngress
    video = tmp_path / "short.mkv"
    subprocess.run(["ffmpeg", "-loglevel", "error", "-f", "lavfi", "-i", "testsrc=size=64x48:rate=25",
                    "-frames:v", "20", str(video)], check=True, timeout=60)
    ingress = MiniIngress(str(tmp_path / "ingress.sock"))
    try:
        for name, loop in (("looped", ["--loop"]), ("once", [])):
            assert add(tmp_path, name, "--source", str(video), "--fps", "0", "--socket", ingress.path,
                       *loop).returncode == 0
            assert ("loop: true" in (tmp_path / "cameras" / f"{name}.yaml").read_text()) == bool(loop)
        proc = children.spawn([*CTL, "camera", "run", "looped", "--dir", str(tmp_path / "cameras")])
        reader, stream, _ = ingress.accept(30)
        newest = 0
        with reader:
            deadline = time.monotonic() + 60
            while newest <= 60 and time.monotonic() < deadline:
                f = reader.next_frame(5.0)
                if f is not None:
                    with f:
                        newest = max(newest, f.frame_id)
        assert stream == "looped" and newest > 60, newest  # three times the file, and more
        assert proc.poll() is None, proc.stderr.read()  # still playing
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
        once = subprocess.run([*CTL, "camera", "run", "once", "--dir", str(tmp_path / "cameras")],
                              capture_output=True, text=True, timeout=60)
        assert once.returncode == 0 and "camera once: published 20 frames" in once.stderr, once.stderr
    finally:
        ingress.close()
    r = add(tmp_path, "live", "--source", "rtsp://127.0.0.1:1/x", "--loop")
    assert r.returncode == 1 and "loop: only a file source is played again at its end" in r.stderr, r.stderr


def test_the_retry_delay_is_capped_at_a_second_for_a_source_that_was_up_recently():
    """The schedule the feed computes (the decision itself; its effect is asserted against a real RTSP server in
    test_rtsp.py): a source whose last frame is recent is retried at least every RETRY_UP_S; one that never sent a
    frame, or not for UP_RECENTLY_S, backs off 0.5, 1, 2, 4, 8, 10 s (bounded)."""
    from edgeinfer.cameras.ffmpeg import RETRY_UP_S, UP_RECENTLY_S, retry_delay
    backoffs = [0.5, 1, 2, 4, 8, 10, 10]
    assert RETRY_UP_S == 1.0
    assert [retry_delay(b, None) for b in backoffs] == backoffs
    assert [retry_delay(b, 3.0) for b in backoffs] == [0.5, 1, 1, 1, 1, 1, 1]
    assert retry_delay(10, UP_RECENTLY_S - 0.1) == 1 and retry_delay(10, UP_RECENTLY_S) == 10

