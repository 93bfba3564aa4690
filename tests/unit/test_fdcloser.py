"""The fd closer (control/fdcloser.py): what a client hides is reached, and one party's blocked closes hold only
its own threads. The attacks themselves, as real users against the daemon, are
tests/reliability/test_isolation_closer.py."""
from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from edgeinfer.control import fdcloser
from edgeinfer.control.fdcloser import FdCloser, dispose


@pytest.fixture
def tcp():
    """(client, server) of a loopback TCP connection; a client closed abortively (SO_LINGER {1, 0}) makes the
    server's recv fail with ECONNRESET, a plain close gives it EOF."""
    lst = socket.create_server(("127.0.0.1", 0))
    c = socket.create_connection(lst.getsockname())
    s, _ = lst.accept()
    lst.close()
    yield c, s
    c.close()
    s.close()


def _reset(server: socket.socket) -> bool:
    server.settimeout(10)
    try:
        server.recv(1)
        return False
    except ConnectionResetError:
        return True


def _wrap(fd: int) -> int:
    """A Unix socket holding `fd` in its queue (ours closed)."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    socket.send_fds(a, [b"x"], [fd])
    os.close(fd)
    a.close()
    return b.detach()


def test_a_socket_nested_deeper_than_the_old_limit_is_reached(tcp):
    client, server = tcp
    fd = client.detach()
    depth = 0
    try:
        while depth < 12:
            fd = _wrap(fd)
            depth += 1
    except OSError:  # ETOOMANYREFS: the kernel's own nesting limit
        pass
    assert depth > 4, "the kernel nests deeper than the 4 levels the closer used to drain"
    assert dispose(fd, shut=True) == depth + 1
    assert _reset(server), f"the TCP socket {depth} levels deep was closed abortively"


def test_a_listener_with_more_than_1024_waiting_is_emptied(tcp, tmp_path):
    with open("/proc/sys/net/core/somaxconn") as f:
        if int(f.read()) < 1100:
            pytest.skip("net.core.somaxconn < 1100: a listener here cannot hold 1,100 waiting connections")
    client, server = tcp
    path = str(tmp_path / "l.sock")
    lst = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    lst.bind(path)
    lst.listen(1100)
    for i in range(1100):
        c = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        c.connect(path)
        if i == 1099:
            fd = client.detach()
            socket.send_fds(c, [b"x"], [fd])
            os.close(fd)
        c.close()
    assert dispose(lst.detach(), shut=True) == 1 + 1100 + 1
    assert _reset(server), "the TCP socket behind the 1,100th waiting connection was closed abortively"


def test_a_refused_connection_is_closed_in_place_unless_it_holds_an_fd():
    closer = FdCloser()
    try:
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        closer.close_refused(a, 7)  # nothing queued
        a, b2 = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        b2.send(b"hello")
        b2.send(b"")
        closer.close_refused(a, 7)  # messages without fds, an empty one among them
        assert closer.waiting_of(7) == 0 and closer.threads == 0 and closer.closed == 0  # closed in place
        a, b3 = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        r, w = os.pipe()
        b3.send(b"")  # an empty message in front of one with an fd
        socket.send_fds(b3, [b"x"], [r])
        os.close(r)
        closer.close_refused(a, 7)
        # It went to the threads (only they count `closed`), which may already have closed it: bounded wait.
        deadline = time.monotonic() + 10
        while closer.closed == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert closer.closed >= 1, "a connection holding an fd goes to the threads"
        for s in (b, b2, b3):
            s.close()
        os.close(w)
    finally:
        closer.stop(5)
    assert closer.waiting == 0


def test_a_party_whose_closes_block_holds_only_its_own_threads(monkeypatch):
    """A close that blocks is simulated here (dispose waits on an event for party 1's fds); the real ones (a FUSE
    file, lingering sockets) are in tests/reliability/test_isolation_closer.py."""
    release = threading.Event()
    blocked = threading.Semaphore(0)
    done = []
    blockers = set()

    def fake_dispose(fd, shut=False):
        if fd in blockers:
            blocked.release()
            release.wait(30)
        os.close(fd)
        done.append(fd)
        return 1
    monkeypatch.setattr(fdcloser, "dispose", fake_dispose)
    closer = FdCloser(party_limit=8)
    try:
        for _ in range(10):
            fd = os.open("/dev/null", os.O_RDONLY)
            blockers.add(fd)
            closer.close(fd, 1)
        assert blocked.acquire(timeout=10) and blocked.acquire(timeout=10)
        assert not blocked.acquire(timeout=0.5), "party 1 holds at most 2 threads"
        assert closer.full(1) and closer.waiting_of(1) == 10
        mine = [os.open("/dev/null", os.O_RDONLY) for _ in range(5)]
        for fd in mine:
            closer.close(fd, 2)
            assert not closer.full(2)
        for _ in range(200):
            if set(mine) <= set(done):
                break
            threading.Event().wait(0.05)
        assert set(mine) <= set(done), "party 2's fds are closed while party 1's block"
        assert closer.waiting_of(2) == 0 and closer.waiting_of(1) == 10
    finally:
        release.set()
        closer.stop(10)
    assert closer.waiting == 0
