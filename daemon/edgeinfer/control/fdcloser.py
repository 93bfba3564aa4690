"""Closes what clients sent, and their connections, off the control plane.

A client decides how long closing what it sent takes: a TCP socket with a full send buffer and
SO_LINGER {1, L} holds the last close() of it for L seconds, and so does closing a Unix socket (a
client's connection with an unread message, or a socket it sent) that holds such an fd in its queue:
the kernel drops the queued fds in the closing thread. So the control plane never closes a client's
fd itself: it hands it here (`close`, `close_socket`; never blocks), and THREADS threads dispose of
it, without the GIL: a socket is set to SO_LINGER {1, 0} (an abortive close: it returns at once;
ring.h ei_fd_close_received does the same); a Unix socket is emptied first (its
queued messages read, their fds disposed of the same way, down to the kernel's nesting limit; a
listener's waiting connections accepted and disposed of), then closed. What can still block (a
file on a FUSE mount whose server does not answer its flush, say) holds one of the threads, not
the control plane.

Bounded: while `limit` fds wait here, the control plane takes in nothing new (no accept, no hello
read: `saturated`), so what waits is bounded by the connections already held; nothing blocks the
control plane, and nothing is dropped unclosed. A close that took longer than SLOW_CLOSE_S is
counted and logged (at most once per 10 s).
"""
from __future__ import annotations

import logging
import os
import queue
import socket
import struct
import threading
import time

log = logging.getLogger("edgeinferd")

SLOW_CLOSE_S = 1.0
LOG_EVERY_S = 10.0
THREADS = 4          # one close that blocks holds one of them; the others go on
MAX_DEPTH = 4        # Unix sockets inside Unix sockets in flight: the kernel refuses deeper nesting
MAX_DRAIN = 1024     # messages (or waiting connections) taken out of one socket before it is closed
_ABORT = struct.pack("ii", 1, 0)  # struct linger {l_onoff 1, l_linger 0}
_ANCILLARY = socket.CMSG_SPACE(253 * 4)  # room for every fd one message can carry (SCM_MAX_FD)


def dispose(fd: int, depth: int = 0) -> None:
    """Closes `fd` so that nothing a client put in it or behind it can make the close wait on a socket's linger:
    see the module's docstring. Runs on a closer thread (it is not bounded in time: a close can still block)."""
    try:
        s = socket.socket(fileno=fd)
    except OSError:  # not a socket
        os.close(fd)
        return
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _ABORT)
    except OSError:
        pass
    if s.family == socket.AF_UNIX and depth < MAX_DEPTH:
        s.setblocking(False)
        try:
            listening = s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
        except OSError:
            listening = 0
        # Not shut down: a socket is shared by every fd of it (a producer's connection is also in systemd's fd store,
        # for the next daemon). A message sent after the queue was emptied can still hold one closer thread.
        for _ in range(MAX_DRAIN):
            try:
                if listening:
                    conn, _ = s.accept()
                    dispose(conn.detach(), depth + 1)
                    continue
                data, anc, _, _ = s.recvmsg(65536, _ANCILLARY, socket.MSG_DONTWAIT | socket.MSG_CMSG_CLOEXEC)
            except OSError:  # nothing more waits (EAGAIN), or it cannot be read
                break
            fds = []
            for level, kind, raw in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.extend(struct.unpack(f"{len(raw) // 4}i", raw[:len(raw) - len(raw) % 4]))
            for f in fds:
                dispose(f, depth + 1)
            if not data and not anc:
                break  # EOF
    s.close()


class FdCloser:
    """THREADS threads that close the fds handed to them (dispose)."""

    def __init__(self, limit: int = 1024):
        self.limit = limit
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self.queued = 0             # fds handed over (written by the control plane only)
        self._closed = [0] * THREADS  # fds closed, by each thread (each writes its own)
        self._slow = [0] * THREADS   # closes that took longer than SLOW_CLOSE_S, likewise
        self._logged_at = -LOG_EVERY_S
        self._threads = [threading.Thread(target=self._run, args=(i,), name=f"edgeinfer-closer{i}", daemon=True)
                         for i in range(THREADS)]
        for t in self._threads:
            t.start()

    @property
    def closed(self) -> int:
        return sum(self._closed)

    @property
    def slow(self) -> int:
        return sum(self._slow)

    def close(self, fd: int) -> None:
        """Closes `fd` off this thread. Never blocks."""
        if fd < 0:
            return
        self.queued += 1
        self._q.put(fd)

    def close_socket(self, sock: socket.socket) -> None:
        """Closes a connection (a socket object) off this thread; the object is detached at once."""
        try:
            fd = sock.detach()
        except OSError:
            return
        self.close(fd)

    @property
    def saturated(self) -> bool:
        return self.queued - self.closed >= self.limit

    @property
    def waiting(self) -> int:
        return max(0, self.queued - self.closed)

    def stop(self, timeout_s: float = 1.0) -> None:
        """Lets what waits be closed (up to `timeout_s` in all), then ends the threads; a close still blocked
        then is left to the process's exit."""
        for _ in self._threads:
            self._q.put(None)
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        if any(t.is_alive() for t in self._threads):
            log.warning("fd closer: %d fd(s) still closing after %g s at stop", self.waiting, timeout_s)

    def _run(self, me: int) -> None:
        while True:
            fd = self._q.get()
            if fd is None:
                return
            t0 = time.monotonic()
            try:
                dispose(fd)
            except OSError:
                pass
            took = time.monotonic() - t0
            self._closed[me] += 1
            if took >= SLOW_CLOSE_S:
                self._slow[me] += 1
                if t0 - self._logged_at >= LOG_EVERY_S:
                    self._logged_at = t0
                    log.warning("fd closer: closing a client's fd took %.1f s (a client's fd whose close blocks; "
                                "the control plane did not wait for it)", took)
