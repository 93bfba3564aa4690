"""A ring check that needs root, moved as it was from tests/unit/test_ring_basic.py (whose other tests run as
any user, in make check): root passes a result ring's 0400 mode, and the seals must still hold."""
from __future__ import annotations

import fcntl
import mmap
import os

import pytest

from edgeinfer.abi import ring
from test_ring_basic import F_GET_SEALS, SEALS


def test_a_result_ring_is_read_only_for_every_mapping_but_the_writers():
    """Sealed F_SEAL_FUTURE_WRITE after the writer mapped it: a reader (even root, even through a
    reopened /proc/self/fd) cannot map it writable, write it, resize it or punch holes in it."""
    with ring.ResultWriter.create(64, records=4) as w:
        fd = w.fd
        seals = fcntl.fcntl(fd, F_GET_SEALS)
        assert seals == SEALS["seal"] | SEALS["shrink"] | SEALS["grow"] | SEALS["future_write"]
        reopened = os.open(f"/proc/self/fd/{fd}", os.O_RDWR)  # root passes the 0400 mode; the seals still hold
        try:
            for f in (fd, reopened):
                with pytest.raises(PermissionError):
                    mmap.mmap(f, 4096, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
                with pytest.raises(PermissionError):
                    os.pwrite(f, b"forged", 4096)
                with pytest.raises(PermissionError):
                    os.ftruncate(f, 4096)
        finally:
            os.close(reopened)
        w.write(frame_seq=1)  # the writer's own mapping (made before sealing) still writes
        r = ring.ResultReader.from_fd(fd, from_oldest=True)
        assert r.read(1.0).frame_seq == 1
        assert os.stat(f"/proc/self/fd/{fd}").st_mode & 0o777 == 0o400
