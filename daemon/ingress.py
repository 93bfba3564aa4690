"""The control plane's sockets: cameras hand over their rings, readers ask for results.

Two SOCK_SEQPACKET listeners (from systemd's edgeinferd.socket, or bound here
when the daemon runs without it): the ingress socket for producers and the
results socket for readers. Every connection is identified by the kernel
(SO_PEERCRED, SO_PEERGROUPS) before its one hello is read; what it may do is
decided by `Admission` (admission.py). The connection of an accepted client
is kept: it is the liveness both ways.

Nothing a client does can stall the daemon: every socket is non-blocking, a
client silent for handshake_timeout_ms after connecting is dropped, at most
max_pending handshakes are in flight (a quarter of them per user), reader
connections are capped in total and per user, and refusals are counted and
logged at most once per 10 s per stream and reason.
"""
from __future__ import annotations

import collections
import errno
import grp
import logging
import os
import selectors
import socket
import stat
import struct
import time

from edgeinfer import ring
from edgeinfer.identity import Peer

log = logging.getLogger("edgeinferd")

SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)  # Linux >= 4.13; the constant is missing from Python
LOG_EVERY_S = 10.0
ACCEPT_PAUSE_S = 0.2  # a listener whose accept() failed (EMFILE/ENFILE) is not polled again for this long
UNKNOWN_STREAM = "(unknown)"  # the stream label of refusals for names not configured (bounded cardinality)


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

    def __init__(self, sock: socket.socket, kind: str, peer: Peer):
        self.sock = sock
        self.kind = kind            # "ingress" or "results": the socket it came in on
        self.peer = peer
        self.since = time.monotonic()
        self.stream = None          # the engine Stream, once admitted
        self.admitted = False

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def bind_listener(path: str, group: str | int | None) -> socket.socket:
    """A SOCK_SEQPACKET listener at `path`, mode 0660 (group `group`, default ours). A stale socket
    file (nobody listening) is replaced; a live daemon's is an error."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None:
        if not stat.S_ISSOCK(st.st_mode):
            raise OSError(errno.EEXIST, f"{path} exists and is not a socket")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            probe.connect(path)
            raise OSError(errno.EADDRINUSE, f"another edgeinferd listens on {path}")
        except (ConnectionRefusedError, FileNotFoundError):
            os.unlink(path)  # left by a daemon that died
        finally:
            probe.close()
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
    old = os.umask(0o177)  # the socket file is born 0600, then opened to its group: no window for others
    try:
        s.bind(path)
    finally:
        os.umask(old)
    if group is not None:
        gid = group if isinstance(group, int) else grp.getgrnam(group).gr_gid
        os.chown(path, -1, gid)
    os.chmod(path, 0o660)
    s.listen(128)
    return s


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


class Ingress:
    """The listeners and every connection on them; `poll()` runs one round."""

    def __init__(self, cfg, admission, listeners: dict[str, socket.socket], owned_paths: list[str]):
        self.cfg = cfg.ingress
        self.admission = admission
        self.listeners = listeners          # "ingress"/"results" → listening socket
        self.owned_paths = owned_paths      # socket files we bound ourselves (removed at close)
        self.selector = selectors.DefaultSelector()
        for kind, s in listeners.items():
            s.setblocking(False)
            self.selector.register(s, selectors.EVENT_READ, kind)
        self.pending: dict[int, Client] = {}   # fd → connection still in its handshake
        self.readers: dict[int, Client] = {}   # fd → admitted reader
        self.producers: dict[int, Client] = {}  # fd → admitted producer
        self.refusals = RefusalLog()
        self.accepted = collections.Counter()   # (role) → handshakes accepted
        self._paused: dict[str, float] = {}     # listener kind → when to poll it again (accept failed)

    # ---------------------------------------------------------------- the loop's step

    def poll(self, timeout: float) -> None:
        """Waits up to `timeout` for socket events and handles them; expires slow handshakes."""
        if self._paused:
            self._resume_listeners()
        for key, _ in self.selector.select(timeout):
            what = key.data
            if what in ("ingress", "results"):
                self._accept(key.fileobj, what)
            elif isinstance(what, Client):
                self._readable(what)
        self._expire()

    def refuse_count(self) -> dict:
        return dict(self.refusals.counts)

    # ---------------------------------------------------------------- accepting

    def _accept(self, listener: socket.socket, kind: str) -> None:
        for _ in range(64):  # drain the backlog a bounded amount per round
            try:
                sock, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # EMFILE/ENFILE: leave it in the backlog, say so (rate-limited)
                role = "producer" if kind == "ingress" else "reader"
                self.refusals.add(UNKNOWN_STREAM, role, "accept_failed", f"accept on the {kind} socket: {e.strerror}")
                # The backlog keeps the listener readable: without a pause the main thread would spin here.
                self.selector.unregister(listener)
                self._paused[kind] = time.monotonic() + ACCEPT_PAUSE_S
                return
            sock.setblocking(False)
            try:
                peer = peer_of(sock)
            except OSError:
                sock.close()
                continue
            client = Client(sock, kind, peer)
            role = "producer" if kind == "ingress" else "reader"
            per_user = max(1, self.cfg.max_pending // 4)
            if len(self.pending) >= self.cfg.max_pending or \
                    sum(c.peer.uid == peer.uid for c in self.pending.values()) >= per_user:
                self._refuse(client, role, UNKNOWN_STREAM, Refusal(
                    "again", "too_many_pending", f"{peer}: too many connections in their handshake (ingress."
                    f"max_pending {self.cfg.max_pending}, {per_user} per user); try again"))
                continue
            self.pending[client.fileno()] = client
            self.selector.register(sock, selectors.EVENT_READ, client)

    def _resume_listeners(self) -> None:
        now = time.monotonic()
        for kind, at in list(self._paused.items()):
            if now >= at:
                del self._paused[kind]
                self.selector.register(self.listeners[kind], selectors.EVENT_READ, kind)

    def _expire(self) -> None:
        if not self.pending:
            return
        limit = time.monotonic() - self.cfg.handshake_timeout_ms / 1e3
        for client in [c for c in self.pending.values() if c.since < limit]:
            role = "producer" if client.kind == "ingress" else "reader"
            self._refuse(client, role, UNKNOWN_STREAM, Refusal(
                "protocol", "handshake_timeout", f"{client.peer}: no hello within "
                f"{self.cfg.handshake_timeout_ms} ms of connecting; dropped"))

    # ---------------------------------------------------------------- a connection has something

    def _readable(self, client: Client) -> None:
        if client.admitted:
            self._admitted_readable(client)
            return
        role = "producer" if client.kind == "ingress" else "reader"
        try:
            hello = ring.recv_hello(client.fileno())
        except ring.ConnectionClosed:
            self._forget(client)
            return
        except ring.RingError as e:
            self._refuse(client, role, UNKNOWN_STREAM, Refusal("protocol", "protocol", f"{client.peer}: {e}"))
            return
        if hello is None:
            return
        got_role, name, fd = hello
        try:
            self._admit(client, role, got_role, name, fd)
        finally:
            if fd >= 0:
                os.close(fd)  # admission kept its own copy if it wanted one

    def _admit(self, client: Client, role: str, got_role: int, name: str, fd: int) -> None:
        """Checks (admission decides), answers, and only then commits: a client that leaves before it
        hears the answer changes nothing."""
        stream_label = name if self.admission.knows(name) else UNKNOWN_STREAM
        want = ring.ROLE_PRODUCER if client.kind == "ingress" else ring.ROLE_READER
        ticket = ring_fd = None
        try:
            if got_role != want:
                raise Refusal("protocol", "wrong_socket", f"{client.peer}: a "
                              f"{'producer' if got_role == ring.ROLE_PRODUCER else 'reader'} hello on the "
                              f"{client.kind} socket")
            if role == "producer":
                if fd < 0:
                    raise Refusal("protocol", "protocol", f"{client.peer}: a producer hello without its ring fd")
                ticket = self.admission.check_producer(name, client, fd)
            else:
                if fd >= 0:
                    raise Refusal("protocol", "protocol", f"{client.peer}: a reader hello with an fd attached")
                self._check_reader_caps(client)
                ring_fd = self.admission.check_reader(name, client)
        except Refusal as r:
            self._refuse(client, role, stream_label, r)
            return
        try:
            ring.send_reply(client.fileno(), 0, "", -1 if ring_fd is None else ring_fd)
        except (ring.RingError, OSError):  # it left (or cannot take an answer): nothing was committed
            if ticket is not None:
                self.admission.discard(ticket)
            self._forget(client)
            return
        self.pending.pop(client.fileno(), None)
        client.admitted = True
        self.accepted[role] += 1
        if ticket is not None:
            self.producers[client.fileno()] = client
            self.admission.attach_producer(ticket)
        else:
            self.readers[client.fileno()] = client
            self.admission.readers_changed(client.stream, +1)

    def _check_reader_caps(self, client: Client) -> None:
        per_user = self.cfg.max_readers_per_user
        if len(self.readers) >= self.cfg.max_readers:
            raise Refusal("again", "too_many_readers", f"{client.peer}: {len(self.readers)} readers connected "
                          f"(ingress.max_readers); try again later")
        if sum(c.peer.uid == client.peer.uid for c in self.readers.values()) >= per_user:
            raise Refusal("again", "too_many_readers", f"{client.peer}: this user already holds {per_user} reader "
                          f"connections (ingress.max_readers_per_user)")

    def _admitted_readable(self, client: Client) -> None:
        """An admitted client sent something or left: either way, it is done."""
        try:
            data = client.sock.recv(1, socket.MSG_DONTWAIT | socket.MSG_PEEK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            why = "sent data after its handshake (a protocol violation); dropped"
            try:
                ring.send_reply(client.fileno(), ring.STATUS["protocol"], why)
            except (ring.RingError, OSError):
                pass
        else:
            why = "disconnected"
        self.drop(client, why)

    # ---------------------------------------------------------------- endings

    def drop(self, client: Client, why: str, goodbye: str | None = None) -> None:
        """Ends an admitted client: tells admission, optionally says why to the client, closes."""
        if goodbye:
            try:
                ring.send_reply(client.fileno(), ring.STATUS["refused"], goodbye)
            except (ring.RingError, OSError):
                pass
        fd = client.fileno()
        if self.producers.pop(fd, None) is not None:
            self.admission.producer_gone(client, why)
        if self.readers.pop(fd, None) is not None:
            self.admission.readers_changed(client.stream, -1)
        self._forget(client)

    def _refuse(self, client: Client, role: str, stream: str, r: Refusal) -> None:
        self.refusals.add(stream, role, r.reason, str(r))
        try:
            ring.send_reply(client.fileno(), ring.STATUS[r.status], str(r))
        except (ring.RingError, OSError):
            pass  # it left, or its buffer is full: the close says enough
        self._forget(client)

    def _forget(self, client: Client) -> None:
        self.pending.pop(client.fileno(), None)
        try:
            self.selector.unregister(client.sock)
        except (KeyError, ValueError):
            pass
        client.close()

    def adopt_producer(self, client: Client) -> None:
        """A producer connection restored from systemd's fd store (admitted by admission already)."""
        client.admitted = True
        self.producers[client.fileno()] = client
        self.selector.register(client.sock, selectors.EVENT_READ, client)

    def close(self) -> None:
        for c in list(self.pending.values()) + list(self.readers.values()) + list(self.producers.values()):
            self._forget(c)
        self.pending.clear()
        self.readers.clear()
        self.producers.clear()
        for s in self.listeners.values():
            try:
                self.selector.unregister(s)
            except (KeyError, ValueError):
                pass
            s.close()
        for path in self.owned_paths:
            try:
                os.unlink(path)
            except OSError:
                pass
        self.selector.close()
