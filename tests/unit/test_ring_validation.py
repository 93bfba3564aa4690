"""Bad rings and bad fds: each is refused, before anything is mapped where it can be,
with its own error type and a message naming the ring; a producer that lies in
`latest` or `payload_len` costs only its own frames; a fuzz of header fields
never crashes the reader."""
from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import ROOT, require_tool
from edgeinfer.abi import ring
from ring_helpers import (F_SEAL_FUTURE_WRITE, F_SEAL_GROW, F_SEAL_SEAL, F_SEAL_SHRINK, F_SEAL_WRITE, FRAME_SEALS,
                          LATEST_OFFSET, memfd_with, ring_bytes)

# Offsets of the immutable frame-ring header fields (ring.h, docs/abi.md).
FIELDS = {  # name: (offset, struct format)
    "abi_version": (8, "<I"), "header_size": (12, "<I"), "total_size": (16, "<Q"), "slot_count": (24, "<I"),
    "slot_header_size": (28, "<I"), "slot_stride": (32, "<Q"), "payload_capacity": (40, "<Q"),
    "width": (48, "<I"), "height": (52, "<I"), "channels": (56, "<I"), "pixel_format": (60, "<I"),
    "row_stride": (64, "<I"), "colorimetry": (68, "<I"),
}
PUBLISHED_OFFSET = 152


def patch(data: bytes, field: str, value: int) -> bytes:
    off, fmt = FIELDS[field]
    b = bytearray(data)
    struct.pack_into(fmt, b, off, value)
    return bytes(b)


@pytest.fixture(scope="module")
def image():
    return ring_bytes()


def open_ring(data: bytes, seals: int = FRAME_SEALS, **kw) -> ring.FrameReader:
    fd = memfd_with(data, seals)
    try:
        return ring.FrameReader(fd, "stream t", **kw)
    finally:
        os.close(fd)


CASES = [
    ("bad magic", lambda d: b"NOTARING" + d[8:], ring.BadMagic, "bad magic"),
    ("an ABI 1 ring", lambda d: b"EIFRAME1" + d[8:], ring.AbiMismatch, "ABI 1 frame ring"),
    ("future ABI", lambda d: patch(d, "abi_version", 3), ring.AbiMismatch, "ABI version 3"),
    ("shorter than the header", lambda d: d[:100], ring.TruncatedRing, "smaller than the 4096-byte header"),
    ("empty", lambda d: b"", ring.TruncatedRing, "0 bytes"),
    ("shorter than its geometry", lambda d: d[:-64], ring.TruncatedRing, "its geometry needs"),
    ("longer than its geometry", lambda d: d + b"\0" * 4096, ring.BadGeometry, "needs exactly"),
    ("two slots", lambda d: patch(d, "slot_count", 2), ring.BadGeometry, "2 slots"),
    ("65 slots", lambda d: patch(d, "slot_count", 65), ring.BadGeometry, "65 slots"),
    ("width beyond the row", lambda d: patch(d, "width", 1000), ring.BadGeometry, "row stride"),
    ("height beyond the payload", lambda d: patch(d, "height", 9), ring.BadGeometry, "do not hold"),
    ("channels disagree with format", lambda d: patch(d, "channels", 4), ring.BadGeometry, "channels"),
    ("unknown pixel format", lambda d: patch(d, "pixel_format", 99), ring.BadGeometry, "pixel format"),
    ("declared size disagrees", lambda d: patch(d, "total_size", 12345), ring.BadGeometry, "declared size"),
    ("slot stride unaligned", lambda d: patch(d, "slot_stride", 500), ring.BadGeometry, "slot stride"),
    ("zero row stride", lambda d: patch(d, "row_stride", 0), ring.BadGeometry, "row stride 0"),
    ("colorimetry on an RGB ring", lambda d: patch(d, "colorimetry", 2), ring.BadGeometry, "colorimetry 2"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_malformed_ring_is_refused_with_its_reason(image, case):
    _, mutate, exc, text = case
    with pytest.raises(exc, match=text) as info:
        open_ring(mutate(image))
    assert "stream t" in str(info.value)


@pytest.fixture(scope="module")
def nv12_image():
    return ring_bytes(16, 8, pixel_format="nv12:bt709")


YUV_CASES = [  # a producer's header claims that would make the graph read the wrong bytes as chroma
    ("unknown colorimetry", lambda d: patch(d, "colorimetry", 9), "unknown colorimetry 9"),
    ("padded YUV rows", lambda d: patch(d, "row_stride", 32), "packed"),
    ("odd width", lambda d: patch(patch(d, "width", 15), "row_stride", 15), "even width"),
    ("as yuyv (two bytes a pixel)", lambda d: patch(d, "pixel_format", 8), "smaller than a row"),
]


@pytest.mark.parametrize("case", YUV_CASES, ids=[c[0] for c in YUV_CASES])
def test_malformed_yuv_ring_is_refused_with_its_reason(nv12_image, case):
    _, mutate, text = case
    with open_ring(nv12_image) as r:  # the honest ring opens
        assert (r.layout["rows"], r.layout["colorimetry"]) == (12, 2)
    with pytest.raises(ring.BadGeometry, match=text) as info:
        open_ring(mutate(nv12_image))
    assert "stream t" in str(info.value)


def _dev_shm_file(image):
    fd = os.open("/dev/shm", os.O_RDWR | os.O_TMPFILE, 0o600)
    os.write(fd, image)
    return fd


def _named_dev_shm_file(image, tmp_name=f"/dev/shm/edgeinfer-test-{os.getpid()}"):
    fd = os.open(tmp_name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.unlink(tmp_name)  # what is left: a tmpfs file that cannot be sealed
    os.write(fd, image)
    return fd


def _disk_file(image):
    # A file on a disk filesystem, never linked: /var/tmp is on disk on Debian (/tmp may be a tmpfs), and any user
    # may write there (make check runs as any user, the clone perhaps not writable by them).
    fd = os.open("/var/tmp", os.O_RDWR | os.O_TMPFILE, 0o600)
    os.write(fd, image)
    return fd


def _read_only(image):
    fd = memfd_with(image)
    ro = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY)
    os.close(fd)
    return ro


def _pipe(image):
    r, w = os.pipe()
    os.close(w)
    return r


def _socket(image):
    a, b = socket.socketpair()
    b.close()
    return a.detach()


FD_CASES = [  # (name, make an fd from a valid ring image, error, message)
    ("unsealed memfd", lambda d: memfd_with(d, 0), ring.InsecureRing, "not sealed"),
    ("memfd sealed but growable", lambda d: memfd_with(d, F_SEAL_SEAL | F_SEAL_SHRINK), ring.InsecureRing,
     "not sealed"),
    ("memfd sealed but shrinkable", lambda d: memfd_with(d, F_SEAL_SEAL | F_SEAL_GROW), ring.InsecureRing,
     "not sealed"),
    ("memfd sealed without F_SEAL_SEAL", lambda d: memfd_with(d, F_SEAL_SHRINK | F_SEAL_GROW), ring.InsecureRing,
     "not sealed"),
    ("write-sealed memfd", lambda d: memfd_with(d, FRAME_SEALS | F_SEAL_WRITE), ring.InsecureRing, "write-sealed"),
    ("a result ring", lambda d: memfd_with(d, FRAME_SEALS | F_SEAL_FUTURE_WRITE), ring.InsecureRing, "write-sealed"),
    ("read-only fd", _read_only, ring.InsecureRing, "not open read-write"),
    ("anonymous /dev/shm file", _dev_shm_file, ring.InsecureRing, "cannot be sealed|not sealed"),
    ("unlinked /dev/shm file", _named_dev_shm_file, ring.InsecureRing, "cannot be sealed|not sealed"),
    ("disk file", _disk_file, ring.InsecureRing, "not a memfd"),
    ("pipe", _pipe, ring.InsecureRing, "not a memfd"),
    ("socket", _socket, ring.InsecureRing, "not a memfd"),
]


@pytest.mark.parametrize("case", FD_CASES, ids=[c[0] for c in FD_CASES])
def test_an_fd_that_is_not_a_sealed_writable_memfd_is_refused_before_it_is_mapped(image, case):
    _, make, exc, text = case
    fd = make(image)
    try:
        with pytest.raises(exc, match=text):
            ring.FrameReader(fd, "stream t")
    finally:
        os.close(fd)


def test_a_ring_above_the_size_limit_is_refused(image):
    with pytest.raises(ring.BadGeometry, match="larger than the 5000-byte limit"):
        open_ring(image, max_size=5000)


def test_a_named_ring_that_someone_else_could_open_is_refused(image, tmp_path):
    """A tmpfs file with a name (here on /dev/shm) has links: anyone who can open the name could write it."""
    path = f"/dev/shm/edgeinfer-test-named-{os.getpid()}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, image)
        with pytest.raises(ring.InsecureRing, match="named file|not sealed|cannot be sealed"):
            ring.FrameReader(fd, "stream t")
    finally:
        os.close(fd)
        os.unlink(path)


def publish_raw(fd: int, image: bytes, seq: int, slot: int, published: int | None = None) -> None:
    """What an honest producer's publish stores, written by hand: the slot's metadata and word, then
    `published`, then `latest`."""
    slot_off = 4096 + slot * struct.unpack_from("<Q", image, 32)[0]
    frame_bytes = struct.unpack_from("<I", image, 64)[0] * struct.unpack_from("<I", image, 52)[0]
    os.pwrite(fd, struct.pack("<Q", frame_bytes), slot_off + 32)
    os.pwrite(fd, struct.pack("<Q", 1), slot_off + 8)  # a capture time
    os.pwrite(fd, struct.pack("<Q", seq << 8 | 2), slot_off)
    os.pwrite(fd, struct.pack("<Q", seq if published is None else published), PUBLISHED_OFFSET)
    os.pwrite(fd, struct.pack("<Q", seq << 8 | slot), LATEST_OFFSET)


def _with_latest(data: bytes, latest: int, published: int | None = None) -> bytes:
    b = bytearray(data)
    struct.pack_into("<Q", b, LATEST_OFFSET, latest)
    if published is not None:
        struct.pack_into("<Q", b, PUBLISHED_OFFSET, published)
    return bytes(b)


LIES = [  # what a producer can write into `latest`; each is one torn frame and nothing more
    ("out-of-bounds slot", lambda d: _with_latest(d, (1 << 8) | 60)),
    ("seq ahead of published (one 8-byte write: seq 2^50)", lambda d: _with_latest(d, (2 ** 50 << 8) | 0)),
    ("slot not holding the seq", lambda d: _with_latest(d, (1 << 8) | 2)),
]


@pytest.mark.parametrize("case", LIES, ids=[c[0] for c in LIES])
def test_a_lying_latest_is_one_counted_torn_frame_and_the_stream_goes_on(image, case):
    """The attack of the issue: one write of `latest` (seq 2^50) silenced a camera with no counter moving.
    Now it is counted, consumed once (no retry loop), and the next honest publish is served."""
    _, lie = case
    fd = memfd_with(lie(image))
    try:
        r = ring.FrameReader(fd, "stream t")
        assert r.take() is None and r.status == ring.TAKE_CORRUPT
        assert r.take() is None and r.status == 0  # consumed once: not retried, not spinning
        # The same ring, now written by an honest producer: the next frame is served.
        seq = struct.unpack_from("<Q", image, PUBLISHED_OFFSET)[0] + 1
        publish_raw(fd, image, seq, 1)
        with r.take() as f:
            assert f.seq == seq
    finally:
        os.close(fd)


def test_a_backwards_seq_is_torn_and_the_stream_resynchronises(image):
    fd = memfd_with(image)
    try:
        r = ring.FrameReader(fd, "stream t")
        with r.take() as f:
            first = f.seq
        # The producer "publishes" seq 0x100 in slot 1, then goes back to seq 0x10 in slot 2.
        for seq, slot in ((0x100, 1), (0x10, 2)):
            publish_raw(fd, image, seq, slot, published=0x100)
            got = r.take()
            if seq == 0x100:
                assert got is not None and got.seq == 0x100 and got.skipped == 0x100 - first - 1
                got.release()
            else:
                assert got is None and r.status == ring.TAKE_CORRUPT
        publish_raw(fd, image, 0x11, 0, published=0x100)
        with r.take() as f:  # resynchronised on the backwards seq: the frame after it is served
            assert f.seq == 0x11
    finally:
        os.close(fd)


def test_payload_length_beyond_capacity_is_refused(image):
    b = bytearray(image)
    latest = struct.unpack_from("<Q", b, LATEST_OFFSET)[0]
    slot_off = 4096 + (latest & 0xFF) * struct.unpack_from("<Q", b, 32)[0]
    struct.pack_into("<Q", b, slot_off + 32, 1 << 40)  # payload_len
    r = open_ring(bytes(b))
    assert r.take() is None and r.status == ring.TAKE_CORRUPT


u32 = st.one_of(st.integers(0, 16), st.integers(0, 2**32 - 1), st.sampled_from([3, 4, 64, 65, 4096, 2**31]))
u64 = st.one_of(st.integers(0, 2**16), st.integers(0, 2**64 - 1), st.sampled_from([64, 4096, 9216, 2**63]))


@settings(max_examples=3_000, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(data=st.data())
def test_fuzzed_headers_never_crash_the_reader(data, image):
    """3,000 rings (the reliability campaign mutates 100,000 more) with header fields, `latest`, `published`,
    slot words and the length mutated: attach either refuses with a RingError or yields frames whose every byte
    lies inside the ring (a wrong bound would SIGBUS/SIGSEGV this process)."""
    b = bytearray(image)
    for field in data.draw(st.lists(st.sampled_from(sorted(FIELDS)), max_size=4, unique=True)):
        fmt = FIELDS[field][1]
        struct.pack_into(fmt, b, FIELDS[field][0], data.draw(u64 if fmt == "<Q" else u32))
    if data.draw(st.booleans()):
        struct.pack_into("<Q", b, LATEST_OFFSET, data.draw(u64))
    if data.draw(st.booleans()):
        struct.pack_into("<Q", b, PUBLISHED_OFFSET, data.draw(u64))
    if data.draw(st.booleans()):
        for slot in range(3):
            off = 4096 + slot * 448
            if len(b) >= off + 40:
                struct.pack_into("<QQQQQ", b, off, *(data.draw(u64) for _ in range(5)))
    cut = data.draw(st.one_of(st.none(), st.integers(0, len(b))))
    try:
        r = open_ring(bytes(b[:cut] if cut is not None else b))
    except ring.RingError:
        return
    try:
        for _ in range(3):
            f = r.take()
            if f is not None:
                with f:
                    int(f.array.sum())  # touch every byte of the view
                    assert f.payload_len <= r.layout["payload_capacity"]
    finally:
        r.close()


# ------------------------------------------------------------------ the SIGBUS guard (defence in depth)
# A sealed ring cannot shrink, so the daemon never meets a SIGBUS from one. The guard stays, and its
# mechanism is tested on its own in C (tests/native/sigbus_guard_test.c); here: a SIGBUS it does not own
# still kills, as if it were not there.

_OTHER_SIGBUS_CHILD = r"""
import mmap, os, sys
sys.path.insert(0, sys.argv[3])
from edgeinfer.abi import ring
from ring_helpers import ring_bytes, memfd_with
r = ring.FrameReader(memfd_with(ring_bytes()), "guarded")  # installs the guard
if sys.argv[2] == "fault":  # a SIGBUS in memory the guard does not own: must kill as before
    with open(sys.argv[1], "w+b") as f:
        f.truncate(8192)
        m = mmap.mmap(f.fileno(), 8192)
        f.truncate(0)
        m[4096]
else:  # a SIGBUS sent, not a fault
    os.kill(os.getpid(), 7)
print("survived")
"""


@pytest.mark.parametrize("how", ["fault", "kill"])
def test_a_sigbus_the_guard_does_not_own_still_kills(tmp_path, how):
    r = subprocess.run([sys.executable, "-c", _OTHER_SIGBUS_CHILD, str(tmp_path / "other"), how,
                        os.path.dirname(os.path.dirname(os.path.abspath(__file__)))], capture_output=True, text=True, timeout=60)
    assert r.returncode == -signal.SIGBUS and "survived" not in r.stdout, (r.returncode, r.stderr[-1000:])


def test_the_guard_absorbs_a_fault_in_a_mapping_it_guards(tmp_path):
    """The mechanism itself, in C: a guarded mapping whose file shrinks reads zeros and is marked hit."""
    cc = require_tool("cc")
    exe = tmp_path / "guard_test"
    subprocess.run([cc, "-std=gnu11", "-O1", "-Wall", "-Werror", "-I", str(ROOT / "native/include"),
                    "-I", str(ROOT / "native"), str(ROOT / "tests/native/sigbus_guard_test.c"), "-o", str(exe)],
                   check=True)
    r = subprocess.run([str(exe), str(tmp_path / "f")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "absorbed hit=1 hits=1 byte=0", (r.returncode, r.stdout,
                                                                                     r.stderr)
