"""systemd integration at the edge of the daemon: sd_notify, an honest watchdog,
socket activation (sd_listen_fds) and the fd store.

No-op without NOTIFY_SOCKET (a foreground `edgeinferd` on a laptop). We speak
the datagram protocol ourselves (a few lines of the standard library) rather
than use the `sdnotify` package, which silently swallows every error: a
NOTIFY_SOCKET that is set but unusable is a misconfiguration to report, not
to ignore.

Watchdog honesty: WATCHDOG=1 goes out only when the real-time loop's progress
counter moved since the previous ping (the loop bumps it on every iteration,
idle waits included). ONNX Runtime releases the GIL in `run`, so a pinger
thread that does not look at the loop would keep pinging while the loop is
stuck. A run past its deadline is cancelled with RunOptions.terminate; if the
loop still makes no progress for a whole watchdog interval, WATCHDOG=trigger
asks systemd to restart us.
"""
from __future__ import annotations

import os
import socket
import time


class NotifyError(OSError):
    """NOTIFY_SOCKET is set but cannot be used."""


class Notifier:
    def __init__(self, env=os.environ):
        addr = env.get("NOTIFY_SOCKET")
        self.sock = None
        self.watchdog_s = 0.0  # WATCHDOG_USEC / 1e6 when systemd watches us, else 0
        if not addr:
            return
        if addr[0] == "@":
            addr = "\0" + addr[1:]  # abstract namespace
        try:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self.sock.connect(addr)
        except OSError as e:
            raise NotifyError(e.errno, f"NOTIFY_SOCKET={env.get('NOTIFY_SOCKET')}: cannot connect: {e.strerror}") \
                from None
        # Whether the watchdog is ours: WATCHDOG_PID, if set, names the process to ping for.
        pid = env.get("WATCHDOG_PID")
        usec = env.get("WATCHDOG_USEC")
        self.watchdog_s = int(usec) / 1e6 if usec and (not pid or int(pid) == os.getpid()) else 0.0

    @property
    def enabled(self) -> bool:
        return self.sock is not None

    def send(self, *fields: str) -> None:
        if self.sock is not None:
            self.sock.send("\n".join(fields).encode())

    def stopping(self, *fields: str) -> OSError | None:
        """STOPPING=1 (and `fields`) on a stop path, which goes on whatever happens: the error, if systemd's
        socket is gone, for the caller to say or not."""
        try:
            self.send("STOPPING=1", *fields)
        except OSError as e:
            return e
        return None

    def store_fds(self, name: str, fds: list[int]) -> bool:
        """Keeps copies of `fds` in systemd's fd store under `name` (FDSTORE=1): a restarted daemon gets
        them back (LISTEN_FDS). Needs FileDescriptorStoreMax= in the unit. False without systemd."""
        if self.sock is None:
            return False
        socket.send_fds(self.sock, [f"FDSTORE=1\nFDNAME={name}".encode()], fds)
        return True

    def remove_fds(self, name: str) -> None:
        """Drops every fd stored under `name` (FDSTOREREMOVE=1)."""
        self.send("FDSTOREREMOVE=1", f"FDNAME={name}")


def listen_fds(env=os.environ) -> list[tuple[int, str]]:
    """The fds systemd passed us (sockets of the .socket unit, and the fd store's content), as
    [(fd, name)], made close-on-exec; the LISTEN_* variables are consumed. [] when not ours."""
    n, pid = env.get("LISTEN_FDS"), env.get("LISTEN_PID")
    if not n or not pid or not pid.isdigit() or int(pid) != os.getpid():
        return []
    names = env.get("LISTEN_FDNAMES", "").split(":")
    out = []
    for i in range(int(n)):
        fd = 3 + i  # SD_LISTEN_FDS_START
        os.set_inheritable(fd, False)
        out.append((fd, names[i] if i < len(names) else "unknown"))
    for k in ("LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"):
        env.pop(k, None)
    return out


class Watchdog:
    """Pings systemd only while every lane progresses (or is idle), or may still be restarted by the
    control plane; gives up (WATCHDOG=trigger) once one cannot recover. The run deadline is not its
    business: each lane cancels its own overdue run."""

    def __init__(self, notifier: Notifier, lanes, deadline_s: float):
        self.notifier = notifier
        self.lanes = lanes
        self.interval = notifier.watchdog_s
        self.deadline_s = deadline_s
        self.pings = 0
        self.triggered = False
        self._last_ping = time.monotonic()
        self._good_at = time.monotonic()

    def tick(self) -> None:
        now = time.monotonic()
        if self.lanes.watchdog_ok(self._last_ping):
            self._good_at = now
        if not self.interval or self.triggered:
            return
        if now - self._last_ping >= self.interval / 2 and self._good_at > self._last_ping:
            self.notifier.send("WATCHDOG=1")
            self._last_ping = now
            self.pings += 1
        elif now - self._good_at >= self.interval:
            # A lane is down for good (restarts exhausted): let systemd restart the daemon.
            self.notifier.send("WATCHDOG=trigger")
            self.triggered = True
