"""What a reference producer tells its operator about its connection to the daemon."""
from __future__ import annotations

import sys

from edgeinfer.abi import ring

# Failed attempts to reach the daemon before a producer that has never been connected says it is still waiting
# (a camera started beside the daemon usually gets in within a few; the daemon may still be loading its models).
QUIET_ATTEMPTS = 5


class ConnectionReporter:
    """Prints one line to stderr whenever the writer's connection to the daemon changes state: a supervisor's
    log then says when the daemon went away and came back, and why.

    Its start is not an error: before the first connection it says once that it is connecting, and only after
    QUIET_ATTEMPTS failed attempts that it is still waiting (and why); "not connected … reconnecting" is said
    only of a connection that was had and lost."""

    def __init__(self, writer: ring.FrameWriter, out=sys.stderr, quiet_attempts: int = QUIET_ATTEMPTS):
        self.writer = writer
        self.out = out
        self.quiet_attempts = quiet_attempts
        self.state = None
        self.ever_connected = False
        self.waiting_said = False
        if writer.connection_state != "connected":
            self._say("connecting to edgeinferd")
        self()  # connected already: say so

    def _say(self, what: str) -> None:
        print(f"edgeinferctl: stream {self.writer.stream}: {what}", file=self.out, flush=True)

    def __call__(self) -> None:
        state = self.writer.connection_state
        if state == "handshake" or (state == self.state and (self.ever_connected or self.waiting_said)):
            return
        if state == "connected":
            if state != self.state:
                self._say("connected to edgeinferd")
            self.ever_connected, self.waiting_said = True, False
        elif self.ever_connected:
            why = self.writer.connection["last_error"] or "the connection closed"
            self._say(f"not connected ({why}); frames go on into the ring, reconnecting with backoff")
        else:  # not yet connected: quiet for the first attempts
            conn = self.writer.connection
            if conn["attempts"] < self.quiet_attempts:
                return
            self._say(f"still waiting for edgeinferd after {conn['attempts']} attempts "
                      f"({conn['last_error'] or 'no answer'}); frames go on into the ring, retrying with backoff")
            self.waiting_said = True
        self.state = state
