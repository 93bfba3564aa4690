"""What a reference producer tells its operator about its connection to the daemon."""
from __future__ import annotations

import sys

from edgeinfer.abi import ring


class ConnectionReporter:
    """Prints one line to stderr whenever the writer's connection to the daemon changes state:
    a supervisor's log then says when the daemon went away and came back, and why."""

    def __init__(self, writer: ring.FrameWriter, out=sys.stderr):
        self.writer = writer
        self.out = out
        self.state = None
        self()  # say where it starts: connected, or waiting for the daemon (and why)

    def __call__(self) -> None:
        state = self.writer.connection_state
        if state == self.state or state == "handshake":
            return
        if state == "connected":
            print(f"edgeinferctl: stream {self.writer.stream}: connected to edgeinferd", file=self.out, flush=True)
        else:
            why = self.writer.connection["last_error"] or "the connection closed"
            print(f"edgeinferctl: stream {self.writer.stream}: not connected ({why}); frames go on into the ring, "
                  f"reconnecting with backoff", file=self.out, flush=True)
        self.state = state
