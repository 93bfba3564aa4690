"""A client of the control plane's sockets: its connection, who it is, and how it is refused.

`Client` is one connection (a producer's or a reader's, pending or admitted),
identified by the kernel (`peer_of`: SO_PEERCRED, SO_PEERGROUPS) before its
hello is read. A `Refusal` is the one way a check says no: the status a client
reads in its reply, the reason counted, and the words logged; `RefusalLog`
counts them and logs each kind at most once per LOG_EVERY_S.
"""
from __future__ import annotations

import collections
import errno
import logging
import socket
import struct
import time

from edgeinfer.abi import ring
from edgeinfer.config.identity import Peer
from edgeinfer.control.fdcloser import FdCloser

log = logging.getLogger("edgeinferd")

SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)  # Linux >= 4.13; the constant is missing from Python
LOG_EVERY_S = 10.0


class Refusal(Exception):
    """A client is refused: `status` (a ring.STATUS name, sent to it), `reason` (the metric label)."""

    def __init__(self, status: str, reason: str, message: str):
        super().__init__(message)
        self.status, self.reason = status, reason


def peer_of(sock: socket.socket) -> Peer:
    uid, gid, pid = ring.peer_cred(sock.fileno())
    groups: frozenset = frozenset()
    size = 4 * 256
    while size <= 4 * 65536:
        try:
            buf = sock.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, size)
            groups = frozenset(struct.unpack(f"{len(buf) // 4}I", buf))
            break
        except OSError as e:
            if e.errno != errno.ERANGE:
                break
            size *= 16
    return Peer(uid, gid, pid, groups)


class Client:
    """One accepted connection."""

    def __init__(self, sock: socket.socket, kind: str, peer: Peer, closer: FdCloser):
        self.sock = sock
        self.closer = closer        # closes the connection off the control plane (an unread message may hold fds)
        self.kind = kind            # "ingress" or "results": the socket it came in on
        self.peer = peer
        self.party = peer.uid       # whom it counts against in the caps (Admission.party), set at accept
        self.since = time.monotonic()
        self.stream = None          # its stream's StreamState (streamstate.py), once admitted
        self.admitted = False

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        self.closer.close_socket(self.sock, self.party)


class RefusalLog:
    """Counts refusals per (stream, role, reason) and logs each kind at most once per LOG_EVERY_S."""

    def __init__(self):
        self.counts: collections.Counter = collections.Counter()
        self._last: dict = {}
        self._quiet: collections.Counter = collections.Counter()

    def add(self, stream: str, role: str, reason: str, message: str) -> None:
        key = (stream, role, reason)
        self.counts[key] += 1
        now = time.monotonic()
        if now - self._last.get(key, -LOG_EVERY_S) >= LOG_EVERY_S:
            more = f" ({self._quiet[key]} more like it since the last line)" if self._quiet[key] else ""
            log.warning("%s refused: %s%s", role, message, more)
            self._last[key] = now
            self._quiet[key] = 0
        else:
            self._quiet[key] += 1
