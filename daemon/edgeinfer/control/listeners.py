"""The control plane's sockets: cameras hand over their rings, readers ask for results.

Two SOCK_SEQPACKET listeners (from systemd's edgeinferd.socket, or bound here
when the daemon runs without it): the ingress socket for producers and the
results socket for readers. Every connection is identified by the kernel
(SO_PEERCRED, SO_PEERGROUPS) before its one hello is read; what it may do is
decided by `Admission` (admission.py). The connection of an accepted client
is kept: it is the liveness both ways.

Nothing a client does can stall the daemon: every socket is non-blocking, a
client silent for handshake_timeout_ms after connecting is dropped, and no
party (a uid of the host, or all uids outside its user database as one:
Admission.party) can take what another needs: a connection to the ingress socket
from a peer that may produce no stream is refused before its hello; each socket
has its own pool of max_pending handshakes, a party holds at most
max_pending_per_user of them, and a uid named as a producer (ingress) or reader
(results) has one slot beyond the pool; reader connections are capped in total,
per stream and per party, a stream's first READER_RESERVE pass the total cap,
and where a shared cap is full the biggest holder's oldest connection held past
reader_idle_s gives way to the newcomer. Refusals are counted and
logged at most once per 10 s per stream and reason. Nothing a client sent, nor its connection, is
closed on this thread: a client decides how long that close takes (a socket with SO_LINGER, a FUSE
file, say), so each goes to the fd closer (fdcloser.py) with the client's party, and the hello is
received without the GIL. A party with fdcloser.PARTY_LIMIT fds still closing there has its new
connections refused (closer_backlog) until they are closed; nothing else stops the intake.
"""
from __future__ import annotations

import collections
import logging
import os
import selectors
import socket
import time
from typing import TYPE_CHECKING

from edgeinfer.abi import ring
from edgeinfer.control.admission import UNLISTED
from edgeinfer.control.clients import Client, Refusal, RefusalLog, peer_of
from edgeinfer.control.fdcloser import FdCloser

if TYPE_CHECKING:
    from edgeinfer.config.schema import Config
    from edgeinfer.control.admission import Admission

log = logging.getLogger("edgeinferd")

ACCEPT_PAUSE_S = 0.2  # a listener whose accept() failed (EMFILE/ENFILE) is not polled again for this long
READER_RESERVE = 4  # reader connections a stream is given even when ingress.max_readers is reached
UNKNOWN_STREAM = "(unknown)"  # the stream label of refusals for names not configured (bounded cardinality)


class Listeners:
    """The listeners and every connection on them; `poll()` runs one round."""

    def __init__(self, cfg: Config, admission: Admission, listeners: dict[str, socket.socket], owned_paths: list[str],
                 closer: FdCloser) -> None:
        """closer: where every fd a client sent, and its connection, is closed (its owner stops it)."""
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
        self.accepted: collections.Counter[str] = collections.Counter()  # role → handshakes accepted
        self._paused: dict[str, float] = {}     # listener kind → when to poll it again (accept failed)
        self.closer = closer

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
                self.closer.close_socket(sock, UNLISTED)
                continue
            client = Client(sock, kind, peer, self.closer)
            client.party = self.admission.party(peer)  # whom its fds' closes and its caps count against
            role = "producer" if kind == "ingress" else "reader"
            try:
                self._check_pending_caps(client)
            except Refusal as r:
                self._refuse(client, role, UNKNOWN_STREAM, r)
                continue
            self.pending[client.fileno()] = client
            self.selector.register(sock, selectors.EVENT_READ, client)

    def _check_pending_caps(self, client: Client) -> None:
        """Before its hello: may this connection wait for one? (Refusal if not.)"""
        adm, peer, kind = self.admission, client.peer, client.kind
        if kind == "ingress" and not adm.may_produce_any(peer):
            raise Refusal("denied", "identity", f"{peer} may produce no stream configured here (refused before "
                          f"its hello)")
        if self.closer.full(client.party):
            raise Refusal("again", "closer_backlog", f"{peer}: {adm.party_desc(client.party)} has "
                          f"{self.closer.waiting_of(client.party)} fds it sent still closing (their close blocks; "
                          f"at most {self.closer.limit} per party); try again")
        pool = [c for c in self.pending.values() if c.kind == kind]
        held = sum(c.party == client.party for c in pool)
        per_party = adm.pending_cap(kind, client.party)  # max_pending_per_user, or its own streams where more
        if held >= per_party:
            raise Refusal("again", "too_many_pending", f"{peer}: {adm.party_desc(client.party)} already has "
                          f"{held} connections in their handshake on the {kind} socket (ingress."
                          f"max_pending_per_user, or the streams it is named for); try again")
        if len(pool) >= self.cfg.max_pending and not (held == 0 and adm.named(kind, peer.uid)):
            raise Refusal("again", "too_many_pending", f"{peer}: {len(pool)} connections in their handshake on "
                          f"the {kind} socket (ingress.max_pending); try again")

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
        extra: list[int] = []  # fds that came with the message and are not the hello's own
        try:
            hello = ring.recv_hello(client.fileno(), extra)
        except ring.ConnectionClosed:
            self._forget(client)
            return
        except ring.TryAgain as e:  # our fd limit: the hello's fds could not be taken (EMFILE), not its fault
            self._refuse(client, role, UNKNOWN_STREAM, Refusal("again", "accept_failed", f"{client.peer}: {e}"))
            return
        except ring.RingError as e:
            self._refuse(client, role, UNKNOWN_STREAM, Refusal("protocol", "protocol", f"{client.peer}: {e}"))
            return
        finally:
            for f in extra:
                self.closer.close(f, client.party)
        if hello is None:
            return
        got_role, name, fd = hello
        try:
            self._admit(client, role, got_role, name, fd)
        finally:
            self.closer.close(fd, client.party)  # admission kept its own copy if it wanted one (a checked memfd)

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
                dead = self.admission.dead_producer(name)
                if dead is not None:
                    self.drop(dead, "disconnected")  # gone, but its hang-up is not handled yet
                ticket = self.admission.check_producer(name, client, fd)
            else:
                if fd >= 0:
                    raise Refusal("protocol", "protocol", f"{client.peer}: a reader hello with an fd attached")
                ring_fd = self.admission.check_reader(name, client)
                self._check_reader_caps(client, stream_label)
        except Refusal as r:
            self._refuse(client, role, stream_label, r)
            return
        # A reader gets an open file description of its own, read-only: never the daemon's O_RDWR one, whose
        # file status flags (F_SETFL) every holder shares.
        # (Out of fds for it, the connection closes and the reader retries, as when it cannot take the answer.)
        reply_fd = -1
        try:
            if ring_fd is not None:
                reply_fd = os.open(f"/proc/self/fd/{ring_fd}", os.O_RDONLY | os.O_CLOEXEC)
            ring.send_reply(client.fileno(), 0, "", reply_fd)
        except (ring.RingError, OSError):  # it left (or cannot take an answer): nothing was committed
            if ticket is not None:
                self.admission.discard(ticket)
            self._forget(client)
            return
        finally:
            if reply_fd >= 0:
                os.close(reply_fd)  # ours, of a memfd: a close that cannot block
        self.pending.pop(client.fileno(), None)
        client.admitted = True
        self.accepted[role] += 1
        if ticket is not None:
            self.producers[client.fileno()] = client
            self.admission.attach_producer(ticket)
        else:
            self.readers[client.fileno()] = client
            self.admission.readers_changed(client.stream, +1)

    def _check_reader_caps(self, client: Client, name: str) -> None:
        """A reader allowed to read stream `name` (client.stream): its party's, the stream's and the total cap.
        Where the stream's or the total cap is full, the biggest other holder's oldest connection held past
        ingress.reader_idle_s gives way (_give_way); the party's own cap is its own."""
        adm, party, s = self.admission, client.party, client.stream
        per_party = self.cfg.max_readers_per_user
        if sum(c.party == party for c in self.readers.values()) >= per_party:
            raise Refusal("again", "too_many_readers", f"{client.peer}: {adm.party_desc(party)} already holds "
                          f"{per_party} reader connections (ingress.max_readers_per_user)")
        on_stream = [c for c in self.readers.values() if c.stream is s]
        if len(on_stream) >= self.cfg.max_readers_per_stream and not (
                adm.named_reader(name, client.peer.uid) and not any(c.peer.uid == client.peer.uid for c in on_stream)) \
                and not self._give_way(on_stream, client, name):
            raise Refusal("again", "too_many_readers", f"{client.peer}: stream {name} has {len(on_stream)} reader "
                          f"connections (ingress.max_readers_per_stream); try again later")
        if len(self.readers) >= self.cfg.max_readers and len(on_stream) >= READER_RESERVE and \
                not self._give_way(list(self.readers.values()), client, name):
            raise Refusal("again", "too_many_readers", f"{client.peer}: {len(self.readers)} readers connected "
                          f"(ingress.max_readers); try again later")

    def _give_way(self, pool: list, client: Client, name: str) -> bool:
        """Drops the oldest connection of the party that holds the most of `pool` (at least two more than the
        newcomer's party), if it was held past ingress.reader_idle_s: a held reader connection carries nothing
        after its handshake, so the daemon cannot tell a reading client from an idle one, and this is the
        bound on how long held connections can keep a new reader out. True if one was dropped."""
        counts = collections.Counter(c.party for c in pool)
        if not counts:
            return False
        top, most = counts.most_common(1)[0]
        if top == client.party or most < counts[client.party] + 2:
            return False
        oldest = min((c for c in pool if c.party == top), key=lambda c: c.since)
        if time.monotonic() - oldest.since < self.cfg.reader_idle_s:
            return False
        held = (oldest.stream.name if oldest.stream is not None else UNKNOWN_STREAM)
        self.refusals.add(held, "reader", "gave_way", f"{oldest.peer}: its reader connection to stream {held}, "
                          f"held {time.monotonic() - oldest.since:.0f} s (ingress.reader_idle_s), closed for a new "
                          f"reader of stream {name} ({client.peer}): {self.admission.party_desc(top)} held "
                          f"{most} of {len(pool)}")
        self.drop(oldest, "gave way to a new reader")
        return True

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
        """Closes a connection off this thread. One never admitted (in no fd store) is closed here when nothing
        queued in it holds an fd (FdCloser.close_refused), so a flood of refused connections carrying no fd
        takes none of its party's closer budget."""
        self.pending.pop(client.fileno(), None)
        try:
            self.selector.unregister(client.sock)
        except (KeyError, ValueError):
            pass
        if client.admitted:
            client.close()
        else:
            self.closer.close_refused(client.sock, client.party)

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
