"""Listeners (control/listeners.py) and admission (control/admission.py): caps and refusals, over socketpairs.

No root, no daemon, no listener: each client is one end of a real AF_UNIX SOCK_SEQPACKET socketpair that sends a
real hello (abi.h's ei_hello, with its ring's fd by SCM_RIGHTS); the other end is handed to Listeners as if its
listener had accepted it, and the answer is read back as a camera reads it. SO_PEERCRED of a socketpair is this
process's own uid, so the other-uid cases give Admission explicit credentials (Peer records). The lanes and the fd
store are stand-ins that keep what they are handed (no lane can run here). tests/integration covers the same on
the real daemon with real unprivileged users."""
from __future__ import annotations

import os
import select
import socket
import struct
import types

import pytest

from edgeinfer.abi import ring
from edgeinfer.config.identity import Peer
from edgeinfer.config.schema import load_config
from edgeinfer.control.admission import UNLISTED, Admission
from edgeinfer.control.clients import Client, Refusal
from edgeinfer.control.fdcloser import FdCloser
from edgeinfer.control.listeners import Listeners
from edgeinfer.control.streamstate import StreamState
from edgeinfer.lanes import dispatch
from edgeinfer.lanes.stream import Stream
from ring_helpers import memfd_with, ring_bytes

ABI_VERSION = 2                 # abi.h EI_ABI_VERSION
HELLO = struct.Struct("<8sII64s48x")  # ei_hello: magic, abi_version, role, stream, reserved
REPLY = struct.Struct("<8sIi240s")    # ei_reply: magic, abi_version, status, msg
UID = os.getuid()
STRANGER = 2_000_000_000        # a uid in no user database and named nowhere


class Lanes:
    def __init__(self):
        self.attached = []

    def attach(self, stream, reader, epoch, geometry):
        self.attached.append((stream.name, epoch, geometry))

    def detach(self, stream, epoch):
        pass


class FdStore:
    def store_fds(self, name, fds):
        pass

    def remove_fds(self, name):
        pass


class Listener:
    """Hands Listeners the daemon's ends of our socketpairs, as accept() would."""

    def __init__(self):
        self.queue = []

    def accept(self):
        if not self.queue:
            raise BlockingIOError
        return self.queue.pop(0), None


@pytest.fixture
def ingress(tmp_path):
    (tmp_path / "c.yaml").write_text(f"""\
model:
  bundle: /tmp/bundle
streams:
  - name: cam0
    producer: {{user: {UID}}}
    max_age_ms: 100
ingress:
  max_pending: 4
  max_pending_per_user: 2
""")
    cfg = load_config(str(tmp_path / "c.yaml"))
    table = dispatch.DispatchTable(1, 1)
    writer = ring.ResultWriter.create(256, records=4, label="edgeinfer-results:cam0")
    stream = Stream("cam0", writer, 100, index=0, model=cfg.model_of(cfg.all_streams()[0]),
                    stats=table.stream_stats(0, "cam0"), flags=table.stream_flags(0))
    states = [StreamState(stream)]
    lanes = Lanes()
    admission = Admission(cfg, states, lanes, FdStore())
    closer = FdCloser()
    ing = Listeners(cfg, admission, {}, [], closer)
    ing.listener, ing.lanes, ing.clients = Listener(), lanes, []
    try:
        yield ing
    finally:
        ing.close()
        for c in ing.clients:
            c.close()
        closer.stop()
        for s in states:
            if s.ring is not None:
                s.ring.close()
        writer.close()


def connect(ing) -> socket.socket:
    """A client connected to the ingress socket (accepted, before its hello); its end."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ing.listener.queue.append(theirs)
    ing._accept(ing.listener, "ingress")
    ing.clients.append(ours)
    return ours


def hello(sock: socket.socket, stream: str, fd: int | None, role: int = ring.ROLE_PRODUCER) -> None:
    data = HELLO.pack(b"EIHELLO2", ABI_VERSION, role, stream.encode())
    socket.send_fds(sock, [data], [] if fd is None else [fd])


def answer(ing, sock: socket.socket) -> tuple[str, str]:
    """(status name, message) of the daemon's reply; the ingress polled until it answers (bounded)."""
    for _ in range(50):
        if select.select([sock], [], [], 0)[0]:
            break
        ing.poll(0.01)
    data, fds, _f, _a = socket.recv_fds(sock, REPLY.size, 1)
    for fd in fds:
        os.close(fd)
    magic, _abi, status, msg = REPLY.unpack(data)
    assert magic == b"EIREPLY2"
    name = {v: k for k, v in ring.STATUS.items()}[status]
    return name, msg.rstrip(b"\0").decode()


def good_ring() -> int:
    return memfd_with(ring_bytes())


def reasons(ing) -> dict:
    return {reason: n for (_stream, _role, reason), n in ing.refuse_count().items()}


def test_a_good_hand_over_is_admitted_and_its_ring_goes_to_the_lanes(ingress):
    c = connect(ingress)
    fd = good_ring()
    try:
        hello(c, "cam0", fd)
    finally:
        os.close(fd)
    assert answer(ingress, c) == ("ok", "")
    assert ingress.accepted["producer"] == 1 and len(ingress.producers) == 1 and not ingress.pending
    assert ingress.lanes.attached == [("cam0", 1, ("bgr24", 8, 16))]


def test_a_third_pending_handshake_of_one_user_is_refused_with_the_reason(ingress):
    first, second = connect(ingress), connect(ingress)
    third = connect(ingress)
    status, why = answer(ingress, third)
    assert status == "again"
    assert f"uid {UID} already has 2 connections in their handshake" in why
    assert "max_pending_per_user" in why
    assert reasons(ingress) == {"too_many_pending": 1}
    assert len(ingress.pending) == 2
    fd = good_ring()  # the two held are still served
    try:
        hello(first, "cam0", fd)
    finally:
        os.close(fd)
    assert answer(ingress, first) == ("ok", "")


def test_an_unknown_stream_is_refused(ingress):
    c = connect(ingress)
    fd = good_ring()
    try:
        hello(c, "nosuch", fd)
    finally:
        os.close(fd)
    status, why = answer(ingress, c)
    assert status == "arg" and "no stream 'nosuch' is configured here" in why
    assert ingress.refuse_count() == {("(unknown)", "producer", "unknown_stream"): 1}
    assert not ingress.lanes.attached


@pytest.mark.parametrize("kind", ["pipe", "unsealed memfd"])
def test_a_ring_that_is_not_a_sealed_memfd_is_refused(ingress, kind):
    if kind == "pipe":
        fd, w = os.pipe()
        os.close(w)
    else:
        fd = memfd_with(ring_bytes(), seals=0)
    c = connect(ingress)
    try:
        hello(c, "cam0", fd)
    finally:
        os.close(fd)
    status, why = answer(ingress, c)
    assert status != "ok" and why
    assert reasons(ingress) == {"bad_ring": 1}
    assert not ingress.lanes.attached and not ingress.producers


def test_a_producer_hello_without_its_ring_is_refused(ingress):
    c = connect(ingress)
    hello(c, "cam0", None)
    status, why = answer(ingress, c)
    assert (status, why.endswith("a producer hello without its ring fd")) == ("protocol", True)


def test_a_second_producer_of_a_stream_is_refused_busy(ingress):
    a, b = connect(ingress), connect(ingress)
    for c in (a, b):
        fd = good_ring()
        try:
            hello(c, "cam0", fd)
        finally:
            os.close(fd)
    assert answer(ingress, a) == ("ok", "")
    status, why = answer(ingress, b)
    assert status == "busy" and "already has its producer" in why


def _client(ing, uid: int) -> Client:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ing.clients += [ours, theirs]
    return Client(theirs, "ingress", Peer(uid, uid, 1, frozenset()), ing.closer)


def test_a_uid_that_may_produce_nothing_is_refused_before_its_hello(ingress):
    with pytest.raises(Refusal) as r:
        ingress._check_pending_caps(_client(ingress, STRANGER))
    assert (r.value.status, r.value.reason) == ("denied", "identity")
    assert "refused before its hello" in str(r.value)


def test_uids_outside_the_user_database_are_one_party(ingress):
    adm = ingress.admission
    assert adm.party(Peer(STRANGER, STRANGER, 1, frozenset())) == UNLISTED
    assert adm.party(Peer(STRANGER + 1, STRANGER, 1, frozenset())) == UNLISTED
    assert adm.party(Peer(UID, UID, 1, frozenset())) == UID
    assert adm.pending_cap("ingress", UNLISTED) == 2
    assert adm.named("ingress", UID) and not adm.named("ingress", STRANGER)


def test_a_named_producer_gets_a_slot_beyond_the_full_pool(ingress):
    """max_pending (4) held by others: the named producer's first handshake still gets in, a stranger's does
    not (admission policy with explicit credentials)."""
    adm = ingress.admission
    adm.may_produce_any = lambda peer: True  # the strangers here stand for other users allowed by a group
    for uid in (STRANGER, STRANGER, STRANGER + 1, STRANGER + 2):
        c = _client(ingress, uid)
        c.party = uid
        ingress.pending[c.fileno()] = c
    ingress._check_pending_caps(_client(ingress, UID))  # named: passes
    with pytest.raises(Refusal) as r:
        ingress._check_pending_caps(_client(ingress, STRANGER + 3))
    assert r.value.reason == "too_many_pending" and "ingress.max_pending" in str(r.value)
    ingress.pending.clear()
