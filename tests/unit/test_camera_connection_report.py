"""A camera's start is not an error (issue 35: each camera logged "not connected … reconnecting" before its first
connection). The reporter says "connecting" once; only after QUIET_ATTEMPTS failed attempts that it still waits;
"not connected … reconnecting" only of a connection that was had and then lost."""
from __future__ import annotations

import io
import time

from edgeinfer.abi import ring
from edgeinfer.cameras.connection import QUIET_ATTEMPTS, ConnectionReporter


def test_a_start_without_the_daemon_is_quiet_then_says_it_waits(tmp_path):
    # A real frame ring, its daemon's socket absent (the daemon not started yet): every attempt fails.
    writer = ring.FrameWriter.connect("cam0", 64, 48, "bgr24", socket=str(tmp_path / "ingress.sock"), wait=0)
    out = io.StringIO()
    try:
        report = ConnectionReporter(writer, out)
        assert out.getvalue() == "edgeinferctl: stream cam0: connecting to edgeinferd\n"
        deadline = time.monotonic() + 30
        while writer.connection["attempts"] < QUIET_ATTEMPTS - 1 and time.monotonic() < deadline:
            writer.step()
            report()
            time.sleep(0.01)
        assert out.getvalue().count("\n") == 1, out.getvalue()  # the first attempts: nothing more said
        while writer.connection["attempts"] < QUIET_ATTEMPTS + 1 and time.monotonic() < deadline:
            writer.step()
            report()
            time.sleep(0.01)
        lines = out.getvalue().splitlines()
        assert len(lines) == 2 and "still waiting for edgeinferd after" in lines[1], lines  # said once
        assert "not connected" not in out.getvalue() and "connected to edgeinferd" not in out.getvalue()
    finally:
        writer.close()


class _Writer:
    """A stand-in for FrameWriter's connection (state, last error): a lost connection needs a daemon that goes
    away, which tests/system/inside.sh and tests/integration/test_cli.py run for real."""
    stream = "cam0"

    def __init__(self):
        self.connection_state = "connected"
        self.connection = {"attempts": 1, "last_error": None}


def test_a_lost_connection_is_said_and_its_return():
    w, out = _Writer(), io.StringIO()
    report = ConnectionReporter(w, out)
    report()
    w.connection_state, w.connection["last_error"] = "disconnected", "edgeinferd went away"
    report()
    report()
    w.connection_state = "handshake"
    report()
    w.connection_state = "connected"
    report()
    assert out.getvalue().splitlines() == [
        "edgeinferctl: stream cam0: connected to edgeinferd",
        "edgeinferctl: stream cam0: not connected (edgeinferd went away); frames go on into the ring, reconnecting "
        "with backoff",
        "edgeinferctl: stream cam0: connected to edgeinferd"]
