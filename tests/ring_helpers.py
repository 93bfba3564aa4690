"""The test pattern shared by the C example, the Python test producer and the checks.

Byte i of frame `seq` is (seq * 7 + i // 64) mod 256: two different frames
(seq differing by less than 256/gcd(7,256) = 256) differ in every byte, so a
frame mixed from two writes is caught wherever the mix happens.
"""
from __future__ import annotations

import os
import struct

import numpy as np

_index_cache: dict[int, np.ndarray] = {}


def _index(nbytes: int) -> np.ndarray:
    idx = _index_cache.get(nbytes)
    if idx is None:
        idx = _index_cache[nbytes] = ((np.arange(nbytes, dtype=np.uint64) >> 6) & 0xFF).astype(np.uint8)
    return idx


def fill(flat: np.ndarray, seq: int, nbytes: int) -> None:
    """Writes the pattern of `seq` into the first nbytes of a flat uint8 view."""
    np.add(_index(nbytes), np.uint8((seq * 7) & 0xFF), out=flat[:nbytes])


def is_whole(flat: np.ndarray, seq: int, nbytes: int) -> bool:
    """True when the first nbytes hold exactly the pattern of `seq`."""
    return bool(np.array_equal(flat[:nbytes], _index(nbytes) + np.uint8((seq * 7) & 0xFF)))


LATEST_OFFSET = 128  # ring.h: offsetof(ei_frame_ring_header, latest)


def publish_into_slot(path: str, slot: int) -> None:
    """What a producer that truncated its ring to the header page can still do: publish. `latest` then
    names a newer frame in `slot`, whose pages may be gone (plain pread/pwrite: no mapping of our own)."""
    fd = os.open(path, os.O_RDWR)
    try:
        latest = struct.unpack("<Q", os.pread(fd, 8, LATEST_OFFSET))[0]
        os.pwrite(fd, struct.pack("<Q", ((latest >> 8) + 1) << 8 | slot), LATEST_OFFSET)
    finally:
        os.close(fd)


# ------------------------------------------------------------------ rings built by hand (for bad-ring tests)

F_ADD_SEALS, F_GET_SEALS = 1033, 1034
F_SEAL_SEAL, F_SEAL_SHRINK, F_SEAL_GROW, F_SEAL_WRITE, F_SEAL_FUTURE_WRITE = 1, 2, 4, 8, 16
FRAME_SEALS = F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW


def memfd_with(data: bytes, seals: int = FRAME_SEALS, name: str = "test-ring") -> int:
    """A memfd holding `data`, sealed with `seals` (0: unsealed). The caller owns (closes) the fd."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.write(fd, data)
    if seals:
        import fcntl
        fcntl.fcntl(fd, F_ADD_SEALS, seals)
    return fd


def ring_bytes(width: int = 16, height: int = 8, slots: int = 3, pixel_format: str = "bgr24") -> bytes:
    """The bytes of a real, valid frame ring with one published frame (its `latest` names it)."""
    from edgeinfer.abi import ring
    with ring.FrameWriter.create(width, height, pixel_format, slots=slots) as w:
        w.begin()[:] = 5
        w.publish()
        return os.pread(w.fd, os.fstat(w.fd).st_size, 0)


class MiniIngress:
    """The daemon's side of the handshake and nothing else, for ring tests without a daemon: accepts
    producers on a socket and hands back their rings as FrameReaders (replying as the daemon would)."""

    def __init__(self, path: str):
        import socket
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.bind(path)
        self.sock.listen(8)
        self.conns = []

    def accept(self, timeout: float = 10.0):
        """(FrameReader, stream name, the connection) of the next producer; its ring accepted."""
        import select
        from edgeinfer.abi import ring
        if not select.select([self.sock], [], [], timeout)[0]:
            raise TimeoutError(f"no producer connected to {self.path} within {timeout} s")
        conn, _ = self.sock.accept()
        if not select.select([conn], [], [], timeout)[0]:
            raise TimeoutError("the producer sent no hello")
        role, name, fd = ring.recv_hello(conn.fileno())
        try:
            reader = ring.FrameReader(fd, f"stream {name}")
        finally:
            os.close(fd)
        ring.send_reply(conn.fileno(), 0, "")
        self.conns.append(conn)
        return reader, name, conn

    def close(self) -> None:
        for c in self.conns:
            c.close()
        self.sock.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
