"""The ffmpeg producer against a real RTSP server (GStreamer's, tests/rtsp/rtsp_server.py): the stream is
served, and a server that is killed and comes back is reconnected with backoff and frames resume."""
from __future__ import annotations

import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

CTL = [sys.executable, "-m", "edgeinfer.cli"]
SERVER = Path(__file__).parent.parent / "rtsp" / "rtsp_server.py"
SYSTEM_PYTHON = "/usr/bin/python3"


@functools.cache  # one probe per test session, however many modules ask
def _gst_rtsp_missing() -> str | None:
    if shutil.which("ffmpeg") is None:
        return "ffmpeg is not installed (make test installs it)"
    probe = subprocess.run([SYSTEM_PYTHON, "-c", "import gi; gi.require_version('GstRtspServer', '1.0'); "
                            "from gi.repository import Gst, GstRtspServer; Gst.init(None); "
                            "assert Gst.ElementFactory.find('x264enc')"], capture_output=True, timeout=60)
    if probe.returncode != 0:
        return ("GStreamer's RTSP server is not installed (make test installs gir1.2-gst-rtsp-server-1.0, "
                "python3-gi, gstreamer1.0-plugins-ugly)")
    return None


pytestmark = pytest.mark.skipif(bool(_gst_rtsp_missing()), reason=_gst_rtsp_missing() or "")


FAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"  # Debian's faketime (make test installs it)


class RtspServer:
    """GStreamer's RTSP server on a fixed port, which can be killed and started again on that port.
    clock_offset_s: the server's wall clock (CLOCK_REALTIME, which its RTCP sender reports carry) set that far off
    ours by libfaketime; its monotonic clock, and so its pacing, is left alone. netns: a network namespace
    (`ip netns`) to serve in instead of this one (the system tests' container has one of its own)."""

    def __init__(self, clock_offset_s: float | None = None, netns: str | None = None):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"rtsp://127.0.0.1:{self.port}/cam"
        self.proc = None
        self.env = None
        self.prefix = ["ip", "netns", "exec", netns] if netns else []
        if clock_offset_s is not None:
            if not os.path.exists(FAKETIME):
                pytest.skip(f"{FAKETIME} is missing (Debian's faketime: make test installs it)")
            self.env = {**os.environ, "LD_PRELOAD": FAKETIME, "FAKETIME": f"{clock_offset_s:+g}",
                        "FAKETIME_DONT_FAKE_MONOTONIC": "1", "FAKETIME_NO_CACHE": "1"}
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen([*self.prefix, SYSTEM_PYTHON, str(SERVER), str(self.port)], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=self.env)
        line = self.proc.stdout.readline().strip()
        assert line == f"READY {self.port}", (line, self.proc.stderr.read() if self.proc.poll() is not None else "")

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def close(self) -> None:
        self.kill()


@pytest.fixture
def rtsp():
    server = RtspServer()
    yield server
    server.close()


def feed_args(url: str, tmp_path, *extra: str) -> list[str]:
    return [*CTL, "feed", "--ffmpeg", url, "--stream", "cam", "--width", "64", "--height", "48", "--transport",
            "tcp", "--socket", str(tmp_path / "nobody.sock"), "--wait", "0", *extra]


@pytest.mark.parametrize("clock", ["sender", "stream"])
def test_the_stream_is_served(rtsp, tmp_path, children, clock):
    """By either decoder: PyAV's (the sender's clock, the default) and the ffmpeg program (--rtsp-clock stream)."""
    proc = children.spawn(feed_args(rtsp.url, tmp_path, "--frames", "25", "--rtsp-clock", clock))
    deadline = time.monotonic() + 30
    decoders = ""
    # (a child seen between fork and exec still shows the feed's own command line: wait for the decoder's)
    while not any(d in decoders for d in ("avdecode", "ffmpeg -nostdin")) and proc.poll() is None \
            and time.monotonic() < deadline:
        decoders = subprocess.run(["pgrep", "-a", "-P", str(proc.pid)], capture_output=True, text=True).stdout
        time.sleep(0.05)
    assert proc.wait(60) == 0
    err = proc.stderr.read()
    assert err.strip().endswith("published 25 frames"), err
    assert "reconnection" not in err  # (the daemon connection line says "reconnecting": no daemon here)
    assert ("edgeinfer.cameras.avdecode" in decoders) == (clock == "sender"), decoders


def _stamps(url: str, tmp_path, children, stream: str, frames: int) -> tuple[list, str]:
    """Feeds `frames` of the RTSP source into a ring read here: each frame's (capture time, CLOCK_REALTIME
    stamp, our monotonic clock when it was read), and what the feed said."""
    from ring_helpers import MiniIngress
    ingress = MiniIngress(str(tmp_path / "ingress.sock"))
    try:
        feed = children.spawn([*CTL, "feed", "--ffmpeg", url, "--stream", stream, "--width", "64", "--height", "48",
                               "--transport", "tcp", "--frames", str(frames), "--socket", ingress.path])
        reader, _, _ = ingress.accept(30)
        seen = []
        with reader:
            while (f := reader.next_frame(10.0)) is not None:
                with f:
                    seen.append((f.capture_ns, f.capture_realtime_ns, time.monotonic_ns()))
        assert feed.wait(30) == 0
    finally:
        ingress.close()
    return seen, feed.stderr.read()


def test_frames_are_stamped_by_the_senders_clock(tmp_path, children, stream):
    """The issue: "For RTSP, use the RTCP wall clock where present". The server's clock is 1.5 s behind ours, so
    by its sender reports every frame was captured 1.5 s before it reached us: once the first report is in, the
    frames' capture times are 1.5 s (plus the encode and transfer) before their arrival, on CLOCK_MONOTONIC,
    with the sender's wall clock beside it. Before the first report they are anchored on the stream."""
    server = RtspServer(clock_offset_s=-1.5)
    try:
        seen, err = _stamps(server.url, tmp_path, children, stream, 200)  # 8 s: reports come every few s
    finally:
        server.close()
    assert "frames are stamped by the sender's clock (RTCP sender reports)" in err, err
    ages = [(read - mono) / 1e9 for mono, _, read in seen]
    sender = [a for a in ages if a > 1.2]
    assert sender and ages[-1] > 1.2, ages  # the reports' clock, to the last frame
    assert all(a < 2.0 + 0.5 for a in sender), ages  # never stamped more than 2 s back (plus reading it here)
    assert ages.index(sender[0]) == len(ages) - len(sender), ages  # once it is in, every frame
    offset = time.time_ns() - time.monotonic_ns()  # CLOCK_REALTIME beside it: the same instant on our clocks
    assert all(abs(real - mono - offset) < 50_000_000 for mono, real, _ in seen), seen


def test_a_senders_clock_far_off_ours_is_not_trusted(tmp_path, children, stream):
    """A camera whose clock is an hour ahead (no NTP): its reports would put every frame in the future. The
    feed says so once and stamps from the stream's own timestamps: no frame is stamped after its arrival."""
    server = RtspServer(clock_offset_s=3600)
    try:
        seen, err = _stamps(server.url, tmp_path, children, stream, 200)
    finally:
        server.close()
    said = [x for x in err.splitlines() if "the sender's clock (RTCP sender reports) is" in x]
    assert len(said) == 1 and "stamped from the stream's own timestamps" in said[0], err
    off = float(said[0].split(" is ")[1].split(" s off")[0])
    assert 3598 < off <= 3600, said  # an hour ahead, less the frame's age at arrival
    assert "frames are stamped by the sender's clock" not in err, err
    assert all(0 <= read - mono < 2_500_000_000 for mono, _, read in seen), seen  # the stream clock's bound


def test_a_killed_server_is_reconnected_with_backoff_and_frames_resume(rtsp, tmp_path, children):
    proc = children.spawn(feed_args(rtsp.url, tmp_path, "--frames", "125", "--read-timeout", "2"))
    time.sleep(2.0)  # frames flowing
    rtsp.kill()
    time.sleep(3.0)  # down: the feed notices within its read timeout, then connection refused, backoff
    rtsp.start()
    assert proc.wait(60) == 0
    err = proc.stderr.read()
    assert err.strip().endswith("published 125 frames"), err  # 5 s of a 25 fps stream: it came back
    lines = [x for x in err.splitlines() if "reconnecting in" in x]
    assert lines and "reconnection 1" in lines[0], err
    assert any("connection refused" in x for x in lines), err  # while the server was gone
    # The source was up a moment ago: tried again at least every second (not 0.5, 1, 2, 4 s …: frames resume
    # within about a second of its return), and not in a busy loop either.
    delays = [float(x.split("reconnecting in ")[1].split(" s")[0]) for x in lines]
    assert delays[0] == 0.5 and all(0.5 <= d <= 1.0 for d in delays), delays
    assert len(lines) <= 8, err


def test_camera_test_shows_the_rtsp_source(rtsp, tmp_path):
    r = subprocess.run([*CTL, "camera", "add", "gate", "--source", rtsp.url, "--transport", "tcp", "--width", "64",
                        "--height", "48", "--no-user", "--dir", str(tmp_path / "cameras")],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([*CTL, "camera", "test", "gate", "--dir", str(tmp_path / "cameras"), "--frames", "25"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert f"source {rtsp.url}: h264 320x240" in r.stdout and "(the source rate)" in r.stdout, r.stdout
    assert os.path.exists(tmp_path / "cameras" / "gate.yaml")
