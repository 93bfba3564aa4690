"""The sealed memfds of fused graphs handed over with rings (lanes/fusedfds.py): made once per model version and
geometry, real memfds, bounded, an older version's closed."""
from __future__ import annotations

import fcntl
import os

import pytest

from edgeinfer.lanes.fusedfds import FusedFds
from edgeinfer.lanes.protocol import from_memfd


class _Runtime:
    """A ModelRuntime as FusedFds uses it: fused_model(pixel_format, height, width) -> bytes, counted."""

    def __init__(self, tag: bytes):
        self.tag, self.fused = tag, 0

    def fused_model(self, fmt: str, h: int, w: int) -> bytes:
        self.fused += 1
        return self.tag + f"-{fmt}-{h}x{w}".encode()


_INODES: dict[int, int] = {}


def _made(fd: int) -> int:
    _INODES[fd] = os.fstat(fd).st_ino
    return fd


def _open(fd: int) -> bool:
    """fd still refers to the memfd it was made as (the number of a closed one may be given out again)."""
    try:
        return os.fstat(fd).st_ino == _INODES[fd]
    except OSError:
        return False


def test_one_sealed_memfd_per_version_and_geometry_older_ones_closed_and_bounded():
    fds = FusedFds(per_model=2)
    v1 = _Runtime(b"v1")
    a = _made(fds.fd("cls", v1, ("bgr24", 224, 224)))
    assert fds.fd("cls", v1, ("bgr24", 224, 224)) == a and v1.fused == 1  # handed over again, not rewritten
    assert from_memfd(a) == b"v1-bgr24-224x224"
    seals = fcntl.fcntl(a, fcntl.F_GET_SEALS)
    assert seals & fcntl.F_SEAL_SEAL and seals & fcntl.F_SEAL_SHRINK  # a lane cannot change what others get
    with pytest.raises(OSError):
        os.write(a, b"x")
    b = _made(fds.fd("cls", v1, ("bgr24", 480, 640)))
    other = _made(fds.fd("det", _Runtime(b"d"), ("bgr24", 416, 416)))
    c = _made(fds.fd("cls", v1, ("nv12", 720, 1280)))  # a third geometry of cls: its least recently used goes
    assert not _open(a) and _open(b) and _open(c) and _open(other)
    v2 = _Runtime(b"v2")  # a reload or a promotion: cls's older version is never handed over again
    d = fds.fd("cls", v2, ("bgr24", 480, 640))
    assert from_memfd(d) == b"v2-bgr24-480x640" and not _open(b) and not _open(c) and _open(other)
    _made(d)
    fds.close()
    assert not _open(d) and not _open(other)
