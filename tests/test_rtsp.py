"""The ffmpeg producer against a real RTSP server (GStreamer's, tests/rtsp/rtsp_server.py): the stream is
served, and a server that is killed and comes back is reconnected with backoff and frames resume."""
from __future__ import annotations

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
SERVER = Path(__file__).parent / "rtsp" / "rtsp_server.py"
SYSTEM_PYTHON = "/usr/bin/python3"


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


class RtspServer:
    """GStreamer's RTSP server on a fixed port, which can be killed and started again on that port."""

    def __init__(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"rtsp://127.0.0.1:{self.port}/cam"
        self.proc = None
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen([SYSTEM_PYTHON, str(SERVER), str(self.port)], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
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


def test_the_stream_is_served(rtsp, tmp_path):
    r = subprocess.run(feed_args(rtsp.url, tmp_path, "--frames", "25"), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr.strip().endswith("published 25 frames"), r.stderr
    assert "reconnection" not in r.stderr  # (the daemon connection line says "reconnecting": no daemon here)


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
    assert len(lines) <= 8, err  # bounded backoff (0.5, 1, 2, 4 s …), not a busy loop


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
