"""A restarted daemon serves on the producers its predecessor kept in systemd's fd store.

Every stored (ring, connection) pair is checked as if its producer had just
connected (the configuration may have changed): admitted pairs are served on
with no camera reconnecting, the rest are answered, closed off the control
plane and removed from the store.
"""
from __future__ import annotations

import logging
import socket

from edgeinfer.abi import ring
from edgeinfer.control.admission import Admission
from edgeinfer.control.fdcloser import FdCloser
from edgeinfer.control.clients import Client, Refusal, peer_of
from edgeinfer.control.listeners import Listeners

log = logging.getLogger("edgeinferd")


def restore_producers(stored: dict[str, list[int]], admission: Admission, ingress: Listeners, fdstore,
                      closer: FdCloser) -> int:
    """stored: the fd store's content by name ({"ring.cam0": [fd], "conn.cam0": [fd], ...}), emptied here (every
    fd is used or closed). Returns how many producers were served on."""
    restored = 0
    for name, s in admission.streams.items():
        ring_fds, conn_fds = stored.pop(f"ring.{name}", []), stored.pop(f"conn.{name}", [])
        if len(ring_fds) == 1 and len(conn_fds) == 1:
            restored += _restore_one(name, ring_fds[0], conn_fds[0], admission, ingress, fdstore, closer)
        else:
            for fd in ring_fds + conn_fds:
                closer.close(fd)  # a stored connection's unread messages may hold fds
            if ring_fds or conn_fds:
                _forget_stored(fdstore, name, "its connection or ring was missing from the store")
    for key, fds in stored.items():  # streams no longer configured, or names not ours
        for fd in fds:
            closer.close(fd)
        fdstore.remove_fds(key)
        log.info("fd store: dropped %s (no such stream configured now)", key)
    stored.clear()
    return restored


def _restore_one(name: str, ring_fd: int, conn_fd: int, admission: Admission, ingress: Listeners, fdstore,
                 closer: FdCloser) -> int:
    sock = socket.socket(fileno=conn_fd)
    try:
        sock.setblocking(False)
        if sock.type != socket.SOCK_SEQPACKET or not ring.sock_alive(sock.fileno()):
            raise Refusal("closed", "closed", "its producer left while the daemon was down")
        client = Client(sock, "ingress", peer_of(sock), closer)
        ticket = admission.check_producer(name, client, ring_fd)
    except Refusal as r:
        try:
            ring.send_reply(sock.fileno(), ring.STATUS[r.status], str(r))
        except (ring.RingError, OSError):
            pass
        closer.close_socket(sock)  # its unread messages may hold fds whose close blocks
        _forget_stored(fdstore, name, str(r))
        return 0
    except OSError as e:
        closer.close_socket(sock)
        _forget_stored(fdstore, name, f"cannot use it: {e}")
        return 0
    finally:
        closer.close(ring_fd)
    ingress.adopt_producer(client)
    admission.attach_producer(ticket, restored=True)
    return 1


def _forget_stored(fdstore, name: str, why: str) -> None:
    fdstore.remove_fds(f"ring.{name}")
    fdstore.remove_fds(f"conn.{name}")
    log.info("stream %s: stored producer not restored: %s", name, why)
