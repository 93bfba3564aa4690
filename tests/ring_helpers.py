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
