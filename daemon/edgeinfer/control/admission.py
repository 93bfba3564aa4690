"""What it takes for a client to be served, stream by stream.

A producer is admitted when it is the stream's configured producer (kernel
credentials), the stream has no live producer, its ring passes every check
(a sealed memfd of the declared size), the stream is not cooling down from
changing geometry too often, and its model can take one more geometry (the
lanes holding the model build and warm its session, off their real-time
loops, before they serve the ring). A reader is admitted when the stream's `readers` list names it; it
gets the stream's result ring, sealed read-only.

Admitted producers' rings and connections go into systemd's fd store (when
there is one), so a restarted daemon serves on with no camera reconnecting
(restore.py serves them on).

Admission owns every stream's `StreamState` (streamstate.py). It gets what it
uses: the lanes (to hand a ring over or take it back) and the fd store.
"""
from __future__ import annotations

import dataclasses
import logging
import time

from edgeinfer.lanes import dispatch
from edgeinfer.abi import ring
from edgeinfer.config.identity import Ids, Peer, host_user
from edgeinfer.control.clients import Client, Refusal
from edgeinfer.control.streamstate import StreamState
from edgeinfer.abi.vocabulary import Geometry

log = logging.getLogger("edgeinferd")

MIB = 1 << 20
UNLISTED = -1  # the party of every uid that is neither in the host's user database nor named in the configuration


@dataclasses.dataclass
class Ticket:
    """A producer that passed every check, not yet attached (its answer is on its way)."""

    stream: StreamState
    client: Client
    reader: ring.FrameReader
    geometry: tuple  # (pixel format, height, width)


class Admission:
    """Policy and bookkeeping for every stream's producer and readers (control plane only)."""

    def __init__(self, cfg, streams: list[StreamState], lanes, fdstore):
        """lanes: the Supervisor (attach, detach); fdstore: systemd's fd store (store_fds, remove_fds: the
        Notifier, a no-op without systemd)."""
        self.cfg = cfg
        self.lanes = lanes
        self.fdstore = fdstore
        self.streams = {s.name: s for s in streams}
        self.producer_ids: dict[str, Ids] = {}
        self.reader_ids: dict[str, Ids] = {}
        by_name = {s.name: s for s in cfg.all_streams()}
        for s in streams:
            sc = by_name[s.name]
            self.producer_ids[s.name] = cfg.producer_of(sc).resolve()
            self.reader_ids[s.name] = sc.readers.resolve(strict=False)  # the default group may not exist
            s.producer_desc = str(cfg.producer_of(sc))
            s.readers_desc = str(sc.readers)
        self.rt = cfg.runtime
        self.max_ring = cfg.ingress.max_ring_mib * MIB

    def knows(self, name: str) -> bool:
        return name in self.streams

    def _stream(self, name: str) -> StreamState:
        s = self.streams.get(name)
        if s is None:
            shown = ", ".join(sorted(self.streams)[:8]) + (" …" if len(self.streams) > 8 else "")
            raise Refusal("arg", "unknown_stream", f"no stream {name!r} is configured here (a stream added to the configuration "
                          f"is served after `systemctl restart edgeinferd`; streams: {shown})")
        return s

    def geometries_in_use(self, model: str) -> set:
        """Geometries the attached streams of `model` are served with (their sessions are never evicted)."""
        return {s.geometry for s in self.streams.values() if s.conn is not None and s.model == model}

    # ------------------------------------------------------------- who is a party (the caps of listeners.py)

    def party(self, peer: Peer) -> int:
        """Whom a connection counts against in the caps: its uid when that uid is a user of the host's user
        database or named in the configuration (a distinct party), else UNLISTED: every other uid, e.g. the
        subordinate uids of any user namespace, together (they cannot be told apart from one another)."""
        uid = peer.uid
        if host_user(uid) or any(uid in ids.uids for ids in self.producer_ids.values()) or \
                any(uid in ids.uids for ids in self.reader_ids.values()):
            return uid
        return UNLISTED

    @staticmethod
    def party_desc(party: int) -> str:
        return "the uids outside the user database (as one)" if party == UNLISTED else f"uid {party}"

    def may_produce_any(self, peer: Peer) -> bool:
        """Whether `peer` may produce at least one configured stream (else it is refused before its hello)."""
        return any(ids.allows(peer) for ids in self.producer_ids.values())

    def named(self, kind: str, uid: int) -> bool:
        """Whether `uid` is named as a user (not only through a group) as some stream's producer ("ingress")
        or reader ("results"): such a uid gets one handshake slot beyond the socket's shared pool."""
        table = self.producer_ids if kind == "ingress" else self.reader_ids
        return any(uid in ids.uids for ids in table.values())

    def pending_cap(self, kind: str, party: int) -> int:
        """Handshakes `party` may hold at once on the ingress ("ingress") or results socket: ingress.
        max_pending_per_user, or the streams it is named for (as a user) on that socket where they are more. A
        front's pool connects all its streams at once, at its start and again after each daemon restart: the
        shipped pool of 4 streams tripped the shipped cap of 2 at every start, and logged refusals."""
        table = self.producer_ids if kind == "ingress" else self.reader_ids
        own = sum(party in ids.uids for ids in table.values())
        return max(self.cfg.ingress.max_pending_per_user, own)

    def named_reader(self, stream: str, uid: int) -> bool:
        return uid in self.reader_ids[stream].uids

    # ---------------------------------------------------------------- producers

    def check_producer(self, name: str, client: Client, fd: int) -> Ticket:
        s = self._stream(name)
        if not self.producer_ids[name].allows(client.peer):
            raise Refusal("denied", "identity", f"{client.peer} may not produce stream {name} (its producer is "
                          f"{s.producer_desc})")
        if s.conn is not None:  # alive: ingress ends a dead one first (dead_producer)
            raise Refusal("busy", "busy", f"stream {name} already has its producer ({s.conn.peer}); a second "
                          f"one is refused")
        now = time.monotonic()
        if now < s.cooldown_until:
            reason, why = s.cooldown_why
            raise Refusal("again", reason, f"stream {name} {why}: refused for another "
                          f"{s.cooldown_until - now:.0f} s")
        # Every hand-over counts, the same ring again included: each one costs every lane of the model an
        # attach (and under `scheduling: other` the neighbours' CPU), whatever its geometry.
        self._churn(s, s.handovers, now, self.rt.handovers, "handover_churn",
                    f"was handed a ring more than {self.rt.handovers} times in {self.rt.geometry_window_s:g} s "
                    f"(runtime.handovers)")
        try:
            # Joined, not initialised: the same ring handed over again (a reconnect) may still have lanes asleep
            # on it, counted in its `waiters`; resetting that line would lose their wake-ups.
            reader = ring.FrameReader(fd, f"stream {name}", self.max_ring, join=True)
        except ring.RingError as e:
            status = next((k for k, v in ring.STATUS.items() if v == e.code), "refused")
            raise Refusal(status, "bad_ring", f"{client.peer}: {e}") from None
        except OSError as e:  # ours, not the ring's (ENOMEM mapping it, EMFILE): passes by itself, so "again"
            # (a client cannot see our errno: to it EI_ERR_SYS in a reply is permanent, ring.h ei_error_transient)
            raise Refusal("again", "bad_ring", f"{client.peer}: {e.strerror or e}") from None
        lay = reader.layout
        geometry = Geometry(ring.format_name(lay), lay["height"], lay["width"])
        try:
            self._count_geometry_change(s, geometry, now)
            in_use = self.geometries_in_use(s.model)
            if geometry not in in_use and len(in_use) >= self.rt.max_sessions:
                raise Refusal("refused", "model", f"stream {name}: cannot serve {geometry[2]}x{geometry[1]} "
                              f"{geometry[0]} frames: all {self.rt.max_sessions} sessions of model {s.model} "
                              f"(runtime.max_sessions) serve other frame geometries in use")
        except Refusal:
            reader.close()
            raise
        return Ticket(s, client, reader, geometry)

    def dead_producer(self, name: str) -> Client | None:
        """The connection of stream `name`'s producer when it is gone but its hang-up is not handled yet."""
        s = self.streams.get(name)
        if s is not None and s.conn is not None and not ring.sock_alive(s.conn.fileno()):
            return s.conn
        return None

    def _count_geometry_change(self, s: StreamState, geometry: tuple, now: float) -> None:
        if s.last_geometry is None or geometry == s.last_geometry:
            return
        self._churn(s, s.geometry_changes, now, self.rt.geometry_changes, "geometry_churn",
                    f"changed its frame geometry more than {self.rt.geometry_changes} times in "
                    f"{self.rt.geometry_window_s:g} s (runtime.geometry_changes)")

    def _churn(self, s: StreamState, times, now: float, limit: int, reason: str, why: str) -> None:
        """Counts one event of a stream's churn (`times`: their recent monotonic times); more than `limit`
        within runtime.geometry_window_s: the stream's producers are refused for geometry_cooldown_s."""
        times.append(now)
        while times and times[0] < now - self.rt.geometry_window_s:
            times.popleft()
        if len(times) > limit:
            s.cooldown_until = now + self.rt.geometry_cooldown_s
            s.cooldown_why = (reason, why)
            times.clear()
            raise Refusal("again", reason, f"stream {s.name} {why}: refused for {self.rt.geometry_cooldown_s:g} s")

    def discard(self, ticket: Ticket) -> None:
        ticket.reader.close()

    def attach_producer(self, t: Ticket, restored: bool = False) -> None:
        s = t.stream
        s.conn, s.ring, s.geometry = t.client, t.reader, t.geometry
        s.last_geometry = t.geometry
        s.attach_count += 1
        t.client.stream = s
        self.lanes.attach(s.stream, t.reader, s.attach_count, t.geometry)
        if not restored:  # a restored pair is in the store already
            self.fdstore.store_fds(f"ring.{s.name}", [t.reader.fd])
            self.fdstore.store_fds(f"conn.{s.name}", [t.client.fileno()])
        fmt, h, w = t.geometry
        log.info("stream %s: producer %s %s (%dx%d %s)", s.name, t.client.peer,
                 "restored from the fd store" if restored else "attached", w, h, fmt)

    def producer_gone(self, client: Client, why: str) -> None:
        s = client.stream
        if s is None or s.conn is not client:
            return
        self.lanes.detach(s.stream, s.attach_count)  # each lane drops it between frames
        s.ring.close()
        s.conn = s.ring = None
        self.fdstore.remove_fds(f"ring.{s.name}")
        self.fdstore.remove_fds(f"conn.{s.name}")
        log.info("stream %s: producer %s %s", s.name, client.peer, why)

    # ---------------------------------------------------------------- readers

    def check_reader(self, name: str, client: Client) -> int:
        s = self._stream(name)
        if not self.reader_ids[name].allows(client.peer):
            raise Refusal("denied", "identity", f"{client.peer} may not read stream {name} (its readers: "
                          f"{s.readers_desc})")
        client.stream = s
        return s.stream.writer.fd

    def readers_changed(self, s: StreamState, delta: int) -> None:
        s.reader_count += delta
        # Readers cannot say they sleep: the lanes wake them on every record while any may be listening.
        s.stream.flags[dispatch.FLAG_WAKE] = 1 if s.reader_count > 0 else 0
