"""Closes what clients sent, and their connections, off the control plane, each party on its own budget.

A client decides how long closing what it sent takes: a TCP socket with a full send buffer and
SO_LINGER {1, L} holds the last close() of it for L seconds, and so does closing a Unix socket (a
client's connection with an unread message, a socket it sent, a listener with connections waiting)
that holds such an fd, however deep: the kernel drops the fds queued in a socket in the closing
thread. A file on a FUSE mount whose server never answers FLUSH holds its close() (every close of
it, not only the last) for as long as the server lets it. So the control plane never closes a
client's fd itself: it hands it here (`close`, `close_socket`; never blocks) with the party it came
from (Admission.party: a uid of the host, or every uid outside its user database as one), and
threads dispose of it, without the GIL:

- every socket is set to SO_LINGER {1, 0} (an abortive close: it returns at once); a Unix socket is
  first shut down (a socket a client sent; a client's own connection is not: it may be in systemd's
  fd store too) so nothing new can be queued in it, then emptied: its queued messages read and their
  fds disposed of the same way, a listener's waiting connections accepted and disposed of. There is
  no depth or count limit: the work is a list, not a recursion, and a shut-down socket's queue ends.
  So no socket, however nested, makes a close wait on a linger.
- what can still block (a FUSE file, say) holds a thread of its own party only: a party is served by
  at most PER_PARTY threads at a time, threads are started as parties need them (at most
  MAX_THREADS in all) and end when idle. One party's backlog never takes another party's capacity.
- a party with `party_limit` fds waiting here is `full`: the ingress refuses its new connections
  (counted, reason closer_backlog) until they are closed, and takes everyone else's in as before.

A close that took longer than SLOW_CLOSE_S is counted and logged (at most once per 10 s).
"""
from __future__ import annotations

import collections
import logging
import os
import socket
import struct
import threading
import time

log = logging.getLogger("edgeinferd")

SLOW_CLOSE_S = 1.0
LOG_EVERY_S = 10.0
PER_PARTY = 2        # threads one party's fds may hold at once (a close that blocks holds one)
MAX_THREADS = 64     # closer threads in all; more parties than MAX_THREADS / PER_PARTY with blocked closes wait
IDLE_S = 5.0         # a closer thread with nothing to do for this long ends
PARTY_LIMIT = 64     # fds a party may have waiting here before its new connections are refused
OWN = -2             # the party of fds the daemon itself took in (systemd's fd store)
_ABORT = struct.pack("ii", 1, 0)  # struct linger {l_onoff 1, l_linger 0}
# Room for every fd one message can carry (SCM_MAX_FD), and for what a socket a client sent may add to it
# (SO_PASSCRED, SO_PASSPIDFD, SO_PASSSEC are set by whoever holds it): a truncated message's fds are dropped by
# the kernel in this thread, which is what the draining is for.
_ANCILLARY = socket.CMSG_SPACE(253 * 4) + 4096
_CREDS = socket.CMSG_SPACE(struct.calcsize("3i"))  # struct ucred: room for SCM_CREDENTIALS only
_REFUSED_READS = 16  # messages read out of a refused connection here (a client sends one hello); more: the threads


def _fds_of(anc) -> list[int]:
    fds: list[int] = []
    for level, kind, raw in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.extend(struct.unpack(f"{len(raw) // 4}i", raw[:len(raw) - len(raw) % 4]))
    return fds


def dispose(fd: int, shut: bool = False) -> int:
    """Closes `fd` and everything queued in or behind it so that no socket's linger makes a close wait: see the
    module's docstring. `shut`: shut `fd` down first (not for a client's own connection). Returns how many fds
    were closed. Runs on a closer thread (not bounded in time: a FUSE file's close can still block)."""
    work = [(fd, shut)]
    n = 0
    while work:
        f, shut_it = work.pop()
        n += 1
        try:
            s = socket.socket(fileno=f)
        except OSError:  # not a socket
            os.close(f)
            continue
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _ABORT)
        except OSError:
            pass
        if s.family == socket.AF_UNIX:
            _drain(s, shut_it, work)
        s.close()
    return n


def _drain(s: socket.socket, shut: bool, work: list) -> None:
    """Takes every fd queued in Unix socket `s` (or every connection waiting on it) onto `work`, shut down."""
    s.setblocking(False)
    try:
        listening = s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
    except OSError:
        listening = 0
    if shut:  # nothing more can be queued in it, nor connect to it: the loop below ends
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
    while True:
        try:
            if listening:
                conn, _ = s.accept()
                work.append((conn.detach(), True))
                continue
            data, anc, flags, _ = s.recvmsg(65536, _ANCILLARY, socket.MSG_DONTWAIT | socket.MSG_CMSG_CLOEXEC)
        except OSError:  # nothing more waits (EAGAIN), or it cannot be read
            return
        work.extend((f, True) for f in _fds_of(anc))
        if flags & socket.MSG_CTRUNC:
            log.warning("fd closer: a message's ancillary data was cut short (its other fds were dropped by the "
                        "kernel here)")
        if not data and not anc:
            return  # EOF


class FdCloser:
    """Closes the fds handed to it (dispose) on threads budgeted per party."""

    def __init__(self, party_limit: int = PARTY_LIMIT, per_party: int = PER_PARTY, max_threads: int = MAX_THREADS):
        self.limit = party_limit
        self.per_party = per_party
        self.max_threads = max_threads
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._queues: dict[int, collections.deque] = {}  # party → (fd, shut) waiting for a thread
        self._waiting: collections.Counter = collections.Counter()  # party → fds handed over, not closed yet
        self._busy: collections.Counter = collections.Counter()     # party → its fds being closed now
        self._ready: collections.deque = collections.deque()        # parties with fds and a thread to spare
        self._threads = 0
        self._idle = 0
        self._serial = 0
        self._stopping = False
        self.closed = 0             # fds closed (the ones handed over, and what was queued in them)
        self.slow = 0               # closes that took longer than SLOW_CLOSE_S
        self._logged_at = -LOG_EVERY_S

    # ------------------------------------------------------------ the control plane's side (never blocks)

    def close(self, fd: int, party: int = OWN, shut: bool = True) -> None:
        """Closes `fd` (sent by `party`) off this thread. `shut`: a socket is shut down first (the default for
        what a client sent; not for a client's connection)."""
        if fd < 0:
            return
        with self._lock:
            if self._stopping:
                start = False
            else:
                q = self._queues.get(party)
                if q is None:
                    q = self._queues[party] = collections.deque()
                q.append((fd, shut))
                self._waiting[party] += 1
                if len(q) == 1 and self._busy[party] < self.per_party:
                    self._ready.append(party)
                start = self._idle == 0 and self._threads < self.max_threads
                if start:
                    self._threads += 1
                    self._idle += 1  # until it takes its first fd
                    self._serial += 1
                    serial = self._serial
                else:
                    self._work.notify()
        if self._stopping:
            return  # stopped: left to the process's exit (closing it here could block)
        if start:
            threading.Thread(target=self._run, name=f"edgeinfer-closer{serial}", daemon=True).start()

    def close_socket(self, sock: socket.socket, party: int = OWN) -> None:
        """Closes a client's connection (a socket object, detached at once) off this thread; not shut down."""
        try:
            fd = sock.detach()
        except OSError:
            return
        self.close(fd, party, shut=False)

    def close_refused(self, sock: socket.socket, party: int) -> None:
        """Closes a connection refused before anything of it was kept (not in systemd's fd store): shut down, so
        nothing more can be queued in it; the messages queued in it that carry no fd are read and dropped; if
        nothing else waits in it, it is closed here (a Unix socket with an empty queue: its close cannot block),
        else handed to the threads. So a flood of connections carrying no fd costs its party no closer budget.
        With SO_PASSCRED every queued message carries its sender's credentials, so a peek tells a message (even
        an empty one) from the end of the queue; with no room for fds, one that carries fds is flagged
        (MSG_CTRUNC) and only the references the peek took are dropped: nothing of it is closed here."""
        try:
            sock.shutdown(socket.SHUT_RDWR)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            for _ in range(_REFUSED_READS):
                _, anc, flags, _ = sock.recvmsg(1, _CREDS, socket.MSG_PEEK | socket.MSG_DONTWAIT)
                if flags & socket.MSG_CTRUNC:
                    break  # it carries fds (or more than its credentials): the threads close it
                if not anc:
                    sock.close()  # the end of its queue: nothing can be queued any more
                    return
                sock.recvmsg(1, _CREDS, socket.MSG_DONTWAIT)  # the message just peeked: it carries no fd
        except OSError:
            pass
        self.close_socket(sock, party)

    def full(self, party: int) -> bool:
        """Whether `party` has its limit of fds waiting here (its new connections are refused)."""
        return self._waiting.get(party, 0) >= self.limit

    def waiting_of(self, party: int) -> int:
        return self._waiting.get(party, 0)

    @property
    def waiting(self) -> int:
        with self._lock:
            return sum(self._waiting.values())

    @property
    def full_parties(self) -> int:
        with self._lock:
            return sum(n >= self.limit for n in self._waiting.values())

    @property
    def threads(self) -> int:
        return self._threads

    def stop(self, timeout_s: float = 1.0) -> None:
        """Lets what waits be closed (up to `timeout_s` in all), then ends the threads; a close still blocked
        then is left to the process's exit."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while sum(self._waiting.values()) and time.monotonic() < deadline:
                self._work.wait(max(0.0, min(0.05, deadline - time.monotonic())))
            self._stopping = True
            left = sum(self._waiting.values())
            self._work.notify_all()
        if left:
            log.warning("fd closer: %d fd(s) still closing after %g s at stop", left, timeout_s)

    # ------------------------------------------------------------ the closer threads

    def _take(self):
        """(party, fd, shut) to close next, or None when this thread has been idle IDLE_S (it ends). Lock held; a
        thread counts as idle (`_idle`) whenever it is not closing something."""
        while not self._ready:
            if self._stopping or not self._work.wait(IDLE_S) and not self._ready:
                return None
        self._idle -= 1
        party = self._ready.popleft()
        q = self._queues[party]
        fd, shut = q.popleft()
        self._busy[party] += 1
        if q and self._busy[party] < self.per_party:
            self._ready.append(party)  # another thread may take its next one
        return party, fd, shut

    def _done(self, party: int, closed: int, took: float) -> None:
        """Lock held."""
        self._idle += 1
        self._busy[party] -= 1
        self._waiting[party] -= 1
        self.closed += closed
        q = self._queues[party]
        if q and self._busy[party] == self.per_party - 1 and party not in self._ready:
            self._ready.append(party)
        if not q and not self._busy[party]:
            del self._queues[party], self._busy[party], self._waiting[party]
        if took >= SLOW_CLOSE_S:
            self.slow += 1

    def _run(self) -> None:
        while True:
            with self._lock:
                got = self._take()
                if got is None:
                    self._threads -= 1
                    self._idle -= 1
                    self._work.notify_all()
                    return
            party, fd, shut = got
            t0 = time.monotonic()
            closed = 1
            try:
                closed = dispose(fd, shut)
            except OSError:
                pass
            took = time.monotonic() - t0
            with self._lock:
                self._done(party, closed, took)
                self._work.notify_all()
            if took >= SLOW_CLOSE_S and t0 - self._logged_at >= LOG_EVERY_S:
                self._logged_at = t0
                log.warning("fd closer: closing an fd of %s took %.1f s (a client's fd whose close blocks; only "
                            "that party's closer threads waited)", _party_desc(party), took)


def _party_desc(party: int) -> str:
    return {OWN: "the daemon's own", -1: "the uids outside the user database"}.get(party, f"uid {party}")
